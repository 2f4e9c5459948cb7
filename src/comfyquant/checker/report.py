"""Assemble a check report: canonical findings + runtime verdicts, severities per target.

A runtime violation on a layer that a canonical finding already describes is attached to that
finding (its ``targets`` list); one that nothing describes becomes a finding of its own with
the runtime's rule code (``sglang.W5`` ...).  A file a runtime cannot open (safetensors
refuses it) is explained by that file's container findings.  A finding is an error exactly
when it stops a selected runtime; one that only concerns runtimes the user did not select is
``info``; anything else that deviates is a ``warning`` (see ``assemble``).
"""

from __future__ import annotations

from ..findings import ERROR, INFO, ONE_RUNTIME, SEVERITY_ORDER, WARNING, Finding
from ..targets.base import Verdict
from ..targets.proven import PROVEN, modelled
from ..targets.select import TARGETS

SCHEMA = 1
HEADER_CODES = frozenset({"C001", "C002", "C003", "C004", "C005", "C006", "C007", "C008", "C009", "C016"})
"""Findings about one file's header and data area: what explains safetensors refusing it."""


class Report:
    """The result of ``check``: findings, one verdict per selected runtime, I/O counts."""

    __slots__ = ("paths", "files", "layers", "findings", "verdicts", "selected", "io", "dialect")

    def __init__(
        self,
        paths: list[str],
        files: list[str],
        layers: int,
        findings: list[Finding] | None = None,
        verdicts: dict[str, Verdict] | None = None,
        selected: tuple[str, ...] = TARGETS,
        io: dict | None = None,
    ):
        self.paths = paths
        self.files = files
        self.layers = layers
        self.findings = findings if findings is not None else []
        self.verdicts = verdicts if verdicts is not None else {}
        self.selected = selected
        self.io = io if io is not None else {}
        self.dialect: dict | None = None
        """The file's layout: ``{"dialect": "comfy-legacy-fp8", "dialects": [...], "quantized": n}``."""

    def __repr__(self) -> str:
        return f"Report({self.paths}, ok={self.ok}, {self.counts})"

    @property
    def ok(self) -> bool:
        return not any(f.severity == ERROR for f in self.findings)

    @property
    def counts(self) -> dict[str, int]:
        c = {"error": 0, "warning": 0, "info": 0}
        for f in self.findings:
            c[f.severity] = c.get(f.severity, 0) + 1
        return c

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "paths": list(self.paths),
            "files": list(self.files),
            "ok": self.ok,
            "layers": self.layers,
            "counts": self.counts,
            "findings": [f.to_dict() for f in self.findings],
            "targets": {name: target_dict(name, v) for name, v in self.verdicts.items()},
            "io": self.io,
            **(self.dialect or {}),
        }


def proven_for(target: str) -> list[dict]:
    """The runtime versions ``target``'s verdicts are proven for, as JSON lists them."""
    return [r.to_dict() for r in PROVEN[target]]


def target_dict(target: str, verdict: Verdict) -> dict:
    """One target's verdict in the JSON report, with the runtime versions it is proven for and,
    when the failure that decides it is modelled from the runtime's source rather than proven by
    running it, what is modelled."""
    out = verdict.to_dict()
    out["proven_for"] = proven_for(target)
    out["modelled"] = modelled(target, out["rule"])
    return out


def assemble(
    findings: list[Finding], verdicts: dict[str, Verdict], selected: tuple[str, ...], names: dict[str, str]
) -> list[Finding]:
    """Merge runtime violations into findings and set severities for the selected targets.

    Severity follows the verdicts: a finding is an error exactly when it stops a selected
    runtime (that runtime's verdict FAILS on it: it raises, or it runs and silently computes
    garbage), so every error names such a runtime in
    ``targets`` and every FAILS verdict has an error finding.  A finding whose default is
    error but that stops no selected runtime is a warning when it still matters to a selected
    one (silently wrong output) or to every runtime alike (empty ``targets``), and info when it
    only concerns runtimes that were not selected."""
    by_layer: dict[str | None, list[Finding]] = {}
    by_file: dict[str, list[Finding]] = {}
    for f in findings:
        by_layer.setdefault(f.layer, []).append(f)
        if f.file and f.code in HEADER_CODES:
            by_file.setdefault(f.file, []).append(f)
    extra: list[Finding] = []
    stops: dict[int, set[str]] = {}
    for target, verdict in verdicts.items():
        for v in verdict.violations:
            layer = names.get(v.layer, v.layer) if v.layer else None
            # Load failures and silent errors (garbage output) attach to the canonical finding
            # that explains them; silent losses (warnings) stay visible as findings of their own.
            serious = v.blocking or v.severity == ERROR
            if v.covers is not None:
                covering = [v.covers]
            elif v.file is not None:
                covering = by_file.get(v.file, [])  # a file the runtime cannot open
            else:
                covering = _covering(by_layer.get(layer, []), v.tensor) if layer and serious else []
                covering = [f for f in covering if ONE_RUNTIME.get(f.code, target) == target]
            if covering:
                for f in covering:
                    if target not in f.targets:
                        f.targets.append(target)
                    if v.fails:
                        stops.setdefault(id(f), set()).add(target)
                continue
            f = Finding(
                v.rule,
                v.message,
                layer=layer,
                tensor=f"{v.layer}.{v.tensor}" if v.tensor and v.layer else v.tensor,
                cause=v.cause,
                fix=v.fix,
                severity=v.severity,
                targets=[target],
                file=v.file,
            )
            if v.fails:
                stops[id(f)] = {target}
            extra.append(f)
            if layer:
                by_layer.setdefault(layer, []).append(f)
    out = findings + extra
    sel = set(selected)
    for f in out:
        if stops.get(id(f), set()) & sel:
            f.severity = ERROR
        elif f.targets and not (set(f.targets) & sel):
            f.severity = INFO
        elif f.severity == ERROR:
            f.severity = WARNING
    out.sort(key=lambda f: SEVERITY_ORDER.get(f.severity, 3))
    return out


def _covering(candidates: list[Finding], tensor_suffix: str | None) -> list[Finding]:
    """Canonical findings of a layer that explain a runtime violation on it: those on the same
    tensor, or for a violation about the layer as a whole, the first layer-level finding."""
    canonical = [f for f in candidates if "." not in f.code]
    if tensor_suffix:
        return [f for f in canonical if f.tensor and f.tensor.endswith("." + tensor_suffix)]
    layer_level = [f for f in canonical if not f.tensor]
    errors = [f for f in layer_level if f.severity == ERROR]
    return (errors or layer_level)[:1]
