"""``fix``: check, plan, write, re-check, verify, commit — the API behind ``comfyquant fix``."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from ..checker.run import Targets, check_checkpoint, parse_targets
from ..checkpoint import Paths, open_checkpoint
from ..dialects.containers import container_of
from ..errors import InputError, option
from ..findings import ERROR
from .before import check_paused_gc
from .execute import output_paths, write_and_verify
from .options import FixOptions
from .plan import Change, Plan, plan_repairs

if TYPE_CHECKING:
    from ..checker.report import Report
    from ..checkpoint import Checkpoint


class FixResult:
    """What ``fix`` did: the plan, the reports before and after, outputs, what is left."""

    __slots__ = ("plan", "before", "after", "outputs", "dry_run", "gate")

    def __init__(
        self,
        plan: Plan,
        before: Report,
        after: Report | None = None,
        outputs: list[str] | None = None,
        dry_run: bool = False,
        gate: dict | None = None,
    ):
        self.plan = plan
        self.before = before
        self.after = after
        self.outputs = outputs or []
        self.dry_run = dry_run
        self.gate = gate
        """``--max-error``: ``{"limit", "against", "ok", "measured", "over": [{"layer", "rel_l2"}]}``."""

    def __repr__(self) -> str:
        done = "dry run" if self.dry_run else f"outputs={self.outputs}"
        return f"FixResult({self.before.paths}, ok={self.ok}, {self.plan.summary()}, {len(self.remaining)} errors left, {done})"

    @property
    def remaining(self) -> list:
        """Error findings left after the repair; for a dry run, the errors no planned change
        touches (the real re-check after writing is the authority)."""
        if self.after is not None:
            return [f for f in self.after.findings if f.severity == ERROR]
        errors = [f for f in self.before.findings if f.severity == ERROR]
        if not self.dry_run:
            return errors
        return [f for f in errors if not self.plan.touches(f.layer, f.tensor)]

    @property
    def ok(self) -> bool:
        if self.gate is not None and not self.gate["ok"]:
            return False
        if self.after is not None:
            return self.after.ok
        if self.dry_run:
            return not self.plan.refused and not self.remaining
        return self.before.ok

    def to_dict(self) -> dict:
        return {
            "schema": 1,
            "ok": self.ok,
            "dry_run": self.dry_run,
            "plan": self.plan.to_dict(),
            "outputs": self.outputs,
            "before": self.before.to_dict(),
            "after": self.after.to_dict() if self.after is not None else None,
            "remaining": [f.to_dict() for f in self.remaining],
            "max_error": self.gate,
        }


def fix(
    paths: Paths,
    out: str | None = None,
    in_place: bool = False,
    target: Targets = "all",
    dry_run: bool = False,
    allow_lossy: bool = False,
    prefer: str | None = None,
    convrot_groupsize: int | None = None,
    overwrite: bool = False,
    reference: str | os.PathLike[str] | None = None,
    *,
    force: bool | None = None,
    max_error: float | None = None,
) -> FixResult:
    """Repair a checkpoint.  Writes nothing when ``dry_run`` or when nothing can be fixed.

    ``out``: default ``<name>.fixed.safetensors`` (``<folder>.fixed`` for shards);
    ``overwrite``: replace an existing output file (never an input: that is ``in_place``).
    ``force`` is the deprecated name of ``overwrite``.

    ``reference``: the original dense checkpoint; every repaired layer is decoded and measured
    against its weight, and the whole repair is refused (``ReferenceRefused``, nothing
    written) when a layer's error is not that of its format.

    ``max_error``: a quality gate on the measured layers' relative L2 error (needs
    ``reference``): above it the repaired output is written as ``<out stem>.over-max-error.safetensors``
    (``<folder>.over-max-error`` for shards), never at ``out`` or over the input, and the result
    is not ``ok``."""
    keywords = dict(locals())  # first, before any other name is bound here: the fields, and force
    force = keywords.pop("force")  # the deprecated spelling of overwrite, not an option of its own
    if force is not None:
        import warnings

        warnings.warn("fix(force=...) is deprecated: use overwrite=...", DeprecationWarning, stacklevel=2)
        keywords["overwrite"] = overwrite or force
    return run_fix(FixOptions(**keywords))  # the keywords are the fields (tests/test_options.py)


def run_fix(options: FixOptions) -> FixResult:
    """Carry out a ``fix`` run as ``options`` describe it: what the command line and ``fix`` call."""
    target = options.target
    parse_targets(target)
    max_error = None
    if options.max_error is not None:
        from ..comparison import check_limit

        max_error = check_limit(options.max_error)
        if options.reference is None:
            raise InputError(
                f"{option('--max-error', 'max_error')} needs {option('--reference DENSE', 'reference=')} for fix: "
                "the repaired layers are measured against the original weights"
            )
    convrot = options.convrot_groupsize
    if convrot is not None and (isinstance(convrot, bool) or not isinstance(convrot, int) or convrot < 1):
        raise InputError(f"{option('--convrot-groupsize', 'convrot_groupsize')} must be a positive whole number, got {convrot!r}")
    found = container_of(options.paths)
    if found is not None:  # read as safetensors it would be "header length ... exceeds the 100 MB limit"
        raise InputError(
            f"{found[0]}: a {found[1].name.upper()} file: fix repairs safetensors checkpoints; rewrite it as "
            "one with comfyquant migrate --allow-lossy, convert --to FORMAT or dequantize"
        )
    with open_checkpoint(options.paths) as ckpt:
        before = check_paused_gc(ckpt, target)
        plan = plan_repairs(ckpt, options.planner())
        if not plan.refused:
            _retile(ckpt, plan)
        if options.reference is not None and not plan.empty:
            _measure(ckpt, plan, str(options.reference))
        gate = _gate(plan, max_error) if max_error is not None else None
        if options.dry_run and plan.requant:
            from .lossy import requantize

            for op in plan.requant.values():
                requantize(ckpt, op)  # the error is part of the plan; the bytes are discarded
        if options.dry_run or plan.empty:
            return FixResult(plan, before, dry_run=options.dry_run, gate=gate)
        out, in_place, overwrite = options.out, options.in_place, options.overwrite
        dests, index_dest = output_paths(ckpt, out, in_place, overwrite)
        if gate is not None and not gate["ok"]:
            dests, index_dest = _over_paths(ckpt, out, in_place, overwrite)
        after, written = write_and_verify(ckpt, plan, dests, index_dest, target, lambda c, t: check_checkpoint(c, target=t))
    return FixResult(plan, before, after, written, gate=gate)


def _gate(plan: Plan, limit: float) -> dict:
    """``--max-error``: the measured layers above ``limit``, worst first."""
    from ..comparison import over_limit

    over = over_limit({m.layer: m.error for m in plan.measured}, limit)
    return {
        "limit": limit,
        "against": "reference",
        "ok": not over,
        "measured": len(plan.measured),
        "over": [{"layer": n, "rel_l2": e} for n, e in over],
    }


def _over_paths(ckpt: Checkpoint, out: str | None, in_place: bool, overwrite: bool) -> tuple[list[str], str | None]:
    """Where a repair over ``--max-error`` is written instead of the requested output (or the
    input, with ``--in-place``): ``comfyquant.comparison.over_outputs``."""
    from ..comparison import over_outputs
    from ..io.outputs import claim

    primary = claim(list(ckpt.files), ckpt.shardset.index_path, out, overwrite=overwrite, tag="fixed", in_place=in_place)
    dest = over_outputs(list(ckpt.files), ckpt.shardset.index_path, primary, overwrite)
    dest.make_folder()
    return dest.files, dest.index


class ReferenceRefused(InputError):
    """A repaired layer does not decode to its original weights within its format's error."""


def _measure(ckpt: Checkpoint, plan: Plan, reference: str) -> None:
    from .reference import measure

    plan.measured = measure(ckpt, plan, reference)
    bad = [m for m in plan.measured if not m.ok]
    if not bad:
        return
    m = bad[0]
    assumed = [f"{a.key}={json.dumps(a.value)} ({a.source})" for a in plan.assumptions if a.layer == m.layer]
    why = (
        f": a value fix assumed is wrong: {'; '.join(assumed)}"
        if assumed
        else ": the repaired layer does not decode to its original"
    )
    more = f" (and {len(bad) - 1} more layer{'s' * (len(bad) > 2)})" if len(bad) > 1 else ""
    raise ReferenceRefused(
        f"refusing the repair: layer {m.layer!r} decodes with {m.text} against {reference}{why}{more}; nothing was written"
    )


def _retile(ckpt: Checkpoint, plan: Plan) -> None:
    """Unused bytes in a data area (C004: a gap between tensors or trailing bytes) are a repair
    of their own: the writer lays tensors out end to end, so rewriting the file removes them,
    and every tensor's bytes are carried over (and compared) as they are."""
    for h in ckpt.headers:
        unused = [f for f in h.findings if f.code == "C004"]
        if unused:
            plan.changes.append(
                Change(
                    None,
                    None,
                    "drop unused bytes from the data area",
                    "; ".join(f.message for f in unused),
                    f"{h.file}: tensors tile the data area",
                )
            )
