"""``check``: open a checkpoint, run every rule and the selected runtime profiles, report."""

from __future__ import annotations

import gc
from collections.abc import Iterable

from ..checkpoint import Checkpoint, NameMapper, Paths
from ..dialects.containers import open_any
from ..dialects.registry import detect
from ..dialects.report import dialect_findings, dialect_violations, settle, value_casts
from ..targets.select import TARGETS, run_target, split_target, with_releases
from .report import Report, assemble
from .rules import check_layers, check_mapping, check_marker_prefixes

Targets = str | Iterable[str] | None
"""Runtime targets to judge by: a name from ``TARGETS``, several, or "all" (None: all)."""


def parse_targets(target: Targets) -> tuple[str, ...]:
    """The selected runtimes: ``"all"``/None, one name, a comma list (``"comfyui,sglang"``, as
    the command line takes it) or an iterable of names; each named once, in the order given."""
    if target is None or target == "all":
        return TARGETS
    names = [target] if isinstance(target, str) else list(target)
    out: list[str] = []
    for item in names:
        parts = [p.strip() for p in item.split(",")] if isinstance(item, str) else [item]
        if not any(parts):
            raise ValueError(f"empty target {item!r}: choose from {', '.join(TARGETS)}, all")
        for n in parts:
            n = split_target(n)[0] if isinstance(n, str) else n
            if n == "all":
                return TARGETS
            if n not in TARGETS:
                raise ValueError(f"unknown target {n!r}: choose from {', '.join(TARGETS)}, all")
            if n not in out:
                out.append(n)
    return tuple(out)


def strip_prefix_mapper(prefix: str) -> NameMapper:
    def mapper(name: str) -> str:
        return name[len(prefix) :] if name.startswith(prefix) else name

    return mapper


def check_checkpoint(ckpt: Checkpoint, target: Targets = "all", deep: bool = False) -> Report:
    selected = parse_targets(target)
    detection = detect(ckpt)
    findings = list(ckpt.findings)
    findings.extend(ckpt.markers.findings)
    findings.extend(check_marker_prefixes(ckpt))
    layer_findings, _envs = check_layers(ckpt)
    findings.extend(layer_findings)
    findings.extend(check_mapping(ckpt))
    settled: list = settle(ckpt, detection) if deep and detection.claims else []
    if detection.claims:  # after settling (--deep): what the data told is no longer "unsettled"
        findings.extend(dialect_findings(detection))
    findings.extend(settled)
    values: list = []
    measured: list = []
    if deep:
        from .deep import deep_findings

        values = deep_findings(ckpt, value_casts(detection) if detection.claims else None, measured)
        findings.extend(values)
    # Every profile runs so findings can say which runtimes they break; severities follow
    # the selection.
    verdicts = {name: run_target(name, ckpt) for name in TARGETS}
    if detection.claims:
        for name, verdict in verdicts.items():
            extra = dialect_violations(ckpt, detection, name)
            # a runtime that cannot read the file as a whole (a GGUF container) stops there,
            # after the container's own damage and before it builds any model
            whole = [v for v in extra if v.blocking and v.layer is None]
            at = next((i for i, v in enumerate(verdict.violations) if v.file is None), len(verdict.violations))
            verdict.violations[at:at] = whole
            verdict.violations.extend(v for v in extra if not (v.blocking and v.layer is None))
    if "comfyui" in selected:
        with_releases(verdicts, target, ckpt)
    names = {p: layer.name for p, layer in ckpt.layers.items()}
    if values:
        from .deep import value_failures

        value_failures(values, verdicts, {name: p for p, name in names.items()})
    findings = assemble(findings, verdicts, selected, names)
    if deep:  # every finding that rests on or promises a --deep measurement carries it
        from .deep import attach

        attach(findings, measured)
    report = Report(
        ckpt.paths,
        ckpt.files,
        sum(1 for x in ckpt.layers.values() if x.weight is not None),
        findings,
        {n: verdicts[n] for n in selected},
        selected,
    )
    report.io = ckpt.io_stats()
    report.dialect = {"dialect": detection.name, "dialects": detection.names, "quantized_layers": detection.quantized}
    return report


def check(
    paths: Paths,
    target: Targets = "all",
    deep: bool = False,
    name_mapper: NameMapper | None = None,
    strip_prefix: str | None = None,
) -> Report:
    """Check a checkpoint (file, shards, folder, index.json or URL) and return a ``Report``.

    ``target`` selects the runtimes whose verdicts set the severities; ``deep`` also reads
    the tensors' values; ``name_mapper`` (or ``strip_prefix``) maps tensor names to the
    runtime's names.  A file whose header cannot be read is reported (a C009 finding, and each
    runtime's ``SafetensorError``); raises ``InputError`` for input it
    cannot open at all (a missing path, an empty folder; ``SeparateCheckpoints`` for several
    checkpoints)."""
    if strip_prefix and name_mapper is None:
        name_mapper = strip_prefix_mapper(strip_prefix)
    parse_targets(target)
    # A header parse creates thousands of small objects that all live until the check ends:
    # the cyclic GC would only rescan them, so it pauses for the duration.
    paused = gc.isenabled()
    gc.disable()
    try:
        # a file whose header cannot be read is reported (what each runtime raises), not refused
        with open_any(paths, name_mapper=name_mapper, damaged_ok=True) as ckpt:
            return check_checkpoint(ckpt, target=target, deep=deep)
    finally:
        if paused:
            gc.enable()
