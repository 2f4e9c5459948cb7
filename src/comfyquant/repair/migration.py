"""``migrate``: rewrite a file of another writer's layout as a Comfy quantized checkpoint (or
Comfy layers into a dialect, ``to=``), with a verdict per layer.

The same pipeline as ``fix`` (it *is* fix's planner, which applies exact dialect translations
as repairs): plan, judge the planned file with the selected runtimes before writing (a
migrated layer the target would not load is refused, with the runtime's message), write to a
temporary file, re-check, verify every copied tensor, rename into place.  Any refused layer
refuses the run: nothing is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..checker.run import check_checkpoint, parse_targets
from ..checkpoint import Paths, open_checkpoint
from ..dialects.containers import open_any
from ..dialects.registry import detect
from ..findings import ERROR
from ..io.outputs import claim
from ..io.shards import ShardSet
from ..io.virtual import VirtualSource
from ..keywords import keywords_of
from .before import check_paused_gc
from .execute import build_shards, write_and_verify
from .migrate import MigrateError, layer_results
from .options import MigrateKeywords, MigrateOptions
from .plan import Plan, plan_repairs

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..checker.report import Report
    from ..checkpoint import Checkpoint


class MigrateResult:
    """What ``migrate`` did: the plan (``layers``: one row per dialect layer), the report of
    the input, of the planned output (``preview``) and of the written output (``after``)."""

    __slots__ = ("plan", "before", "preview", "after", "outputs", "dry_run", "dialect", "to")

    def __init__(self, plan: Plan, before: Report, dialect: str, dry_run: bool, to: str | None) -> None:
        self.plan = plan
        self.before = before
        self.preview = None
        self.after = None
        self.outputs: list[str] = []
        self.dry_run = dry_run
        self.dialect = dialect
        self.to = to

    @property
    def layers(self) -> list[dict]:
        return layer_results(self.plan)

    def __repr__(self) -> str:
        verdicts: dict[str, int] = {}
        for row in self.layers:
            verdicts[row["verdict"]] = verdicts.get(row["verdict"], 0) + 1
        counted = ", ".join(f"{n} {v}" for v, n in verdicts.items()) or "none"
        done = "dry run" if self.dry_run else f"outputs={self.outputs}"
        return (
            f"MigrateResult({self.before.paths}, {self.dialect} -> {self.to or 'comfy'}, "
            f"{len(self.layers)} layers ({counted}), ok={self.ok}, {done})"
        )

    @property
    def nothing(self) -> bool:
        """The file has no layer of another layout: there is nothing to migrate."""
        return not self.plan.translations and not self.plan.refused

    @property
    def ok(self) -> bool:
        return not self.plan.refused

    def to_dict(self) -> dict:
        return {
            "schema": 1,
            "ok": self.ok,
            "dry_run": self.dry_run,
            "dialect": self.dialect,
            "to": self.to or "comfy",
            "layers": self.layers,
            "refused": [{"layer": layer, "why": why} for layer, why in self.plan.refused],
            "plan": self.plan.to_dict(),
            "outputs": self.outputs,
            "before": self.before.to_dict(),
            "preview": self.preview.to_dict() if self.preview else None,
            "after": self.after.to_dict() if self.after else None,
        }


@keywords_of(MigrateOptions)
def migrate(paths: Paths, out: str | None = None, **keywords: Unpack[MigrateKeywords]) -> MigrateResult:
    """Rewrite a dialect file (see ``comfyquant.dialects``) as a Comfy quantized checkpoint.

    ``out``: default ``<name>.comfy.safetensors`` (``<name>.<to>.safetensors`` with ``to``);
    ``allow_lossy``: re-quantize layers with no exact Comfy form (their error is measured);
    ``to``: write Comfy layers in that dialect's layout instead (``bfl``, ``modelopt``).
    Raises ``MigrateError`` (nothing written) when a layer is refused.  The keywords are the
    fields of ``MigrateOptions``, with its defaults (``in_place``, ``target``, ``dry_run``,
    ``overwrite`` as for ``fix``)."""
    return run_migrate(MigrateOptions(paths=paths, out=out, **keywords))


def run_migrate(options: MigrateOptions) -> MigrateResult:
    """Carry out a ``migrate`` run as ``options`` describe it: what the command line and ``migrate`` call."""
    target, to, dry_run = options.target, options.to, options.dry_run
    parse_targets(target)
    with open_any(options.paths) as ckpt:
        before = check_paused_gc(ckpt, target)
        detection = detect(ckpt)
        plan = plan_repairs(ckpt, options.planner())
        result = MigrateResult(plan, before, detection.name, dry_run, to)
        if result.nothing:
            return result
        if not plan.refused:
            result.preview = _preview(ckpt, plan, target)
            if to is None:
                _refuse_unloadable(plan, result.preview, before)
        if dry_run and plan.requant and not plan.refused:
            from .lossy import requantize

            for op in plan.requant.values():
                requantize(ckpt, op)
        if plan.refused:
            if dry_run:
                return result
            raise MigrateError(_refusal(ckpt, plan))
        if dry_run:
            return result
        tag = to or "comfy"
        dest = claim(
            list(ckpt.files),
            ckpt.shardset.index_path,
            options.out,
            overwrite=options.overwrite,
            tag=tag,
            in_place=options.in_place,
        )
        dest.make_folder()
        result.after, result.outputs = write_and_verify(
            ckpt, plan, dest.per_file, dest.index, target, lambda c, t: check_checkpoint(c, target=t)
        )
    return result


def _preview(ckpt: Checkpoint, plan: Plan, target):
    """The selected runtimes' verdict on the planned file, from its header and markers alone
    (nothing is encoded or transformed for it)."""
    shards = build_shards(ckpt, plan)
    sources = []
    for (tensors, metadata, _copied), file in zip(shards, ckpt.files):
        plain = {n: (d, s, data if isinstance(data, (bytes, bytearray)) else None) for n, (d, s, data) in tensors.items()}
        sources.append(VirtualSource(f"{file} (planned)", plain, metadata))
    names = [s.name for s in sources]
    with open_checkpoint(names, sources=sources, shardset=ShardSet(files=names)) as planned:
        return check_checkpoint(planned, target=target)


def _refuse_unloadable(plan: Plan, preview, before) -> None:
    """A migrated layer the selected runtimes would refuse, or run into garbage, is refused
    before anything is written (e5m2 weights for SGLang, say): named with the runtime's words.
    A file-level error the input did not have (SGLang refusing the planned set of formats)
    refuses the file."""
    migrated = {tr.out_prefix: tr.prefix for tr in plan.translations}
    seen: set[str] = set()
    had = {(f.code, f.message) for f in before.findings}
    for f in preview.findings:
        if f.severity != ERROR:
            continue
        if f.layer is None:
            if (f.code, f.message) not in had and migrated:
                runtimes = f" ({', '.join(f.targets)})" if f.targets else ""
                plan.refused.append((None, f"the migrated file would not load{runtimes}: {f.message}"))
            continue
        prefix = migrated.get(f.layer) or next((p for out, p in migrated.items() if f.layer.endswith(out)), None)
        if prefix is None or prefix in seen:
            continue
        seen.add(prefix)
        runtimes = f" ({', '.join(f.targets)})" if f.targets else ""
        plan.refused.append((prefix, f"the migrated layer would not load{runtimes}: {f.message}"))


def _refusal(ckpt: Checkpoint, plan: Plan) -> str:
    layer, why = plan.refused[0]
    more = len(plan.refused) - 1
    others = f" (and {more} more: see --dry-run)" if more else ""
    where = f"layer {layer!r}: " if layer is not None else ""
    line = f"{ckpt.files[0]}: not migrated: {where}{why}{others}; nothing was written"
    if not plan.translations:  # no layer of another layout: what stops it is a Comfy file's defect
        label = ckpt.files[0] if len(ckpt.files) == 1 else (ckpt.shardset.index_path or ckpt.files[0])
        line += f"; it is a Comfy checkpoint: comfyquant fix {label} repairs it (comfyquant check {label} lists its defects)"
    return line
