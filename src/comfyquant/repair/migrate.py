"""Plan the rewrite of a dialect's layers as Comfy layers (``migrate``, and ``fix`` for the
exact ones), or of Comfy layers into a dialect (``migrate --to``).

Each ``Translation`` becomes repair-plan lines: its moves are
renames and byte edits, its drops removals, its marker the layer's final marker.  A lossy
layer is re-quantized only when asked (``--allow-lossy``): decoded by its dialect's exact
decoder, encoded by the format it names, its error measured.  A refused layer refuses.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..dialects.base import EXACT, LOSSY, PERMUTATION, REFUSED, Claim, Translation
from ..dialects.registry import DIALECTS, detect
from ..dialects.report import settle
from ..errors import InputError, option
from ..formats.registry import FORMATS
from .edits import LOSSLESS, Change, Plan, TensorEdit

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint


class MigrateError(InputError):
    """A layer cannot be migrated as asked; nothing was written."""


def claims_for(ckpt: Checkpoint, to: str | None) -> list[Claim]:
    """The claims to rewrite: the file's dialects (into Comfy), or with ``to`` its Comfy
    layers translated into that dialect."""
    if to is None:
        detection = detect(ckpt)
        settle(ckpt, detection)
        return detection.claims
    dialect = DIALECTS.get(to)
    if dialect is None or dialect.export is None:
        can = sorted(n for n, d in DIALECTS.items() if d.export is not None)
        raise MigrateError(
            f"{option('--to ', 'to=')}{to!r}: comfyquant writes no such layout; it can write {', '.join(can) or 'none'}"
        )
    claim = dialect.export(ckpt, set())
    return [claim] if claim is not None else []


def plan_dialects(ckpt: Checkpoint, plan: Plan, markers: dict[str, dict], allow_lossy: bool, claims: list[Claim]) -> None:
    """Add every claimed layer's rewrite to ``plan`` (``markers``: the final markers)."""
    claimed = {p for c in claims for p in c.layers}
    if claimed:
        plan.changes = [c for c in plan.changes if c.layer not in claimed]
        for p in claimed:
            plan.kept.pop(p, None)
    for claim in claims:
        for name in claim.drop:
            plan.drop.add(name)
            plan.changes.append(Change(None, name, f"drop {claim.dialect} file-level tensor", "present", "(removed)"))
        plan.metadata_drop.update(claim.metadata_drop)
        plan.metadata_set.update(claim.metadata_set)
        for tr in claim.layers.values():
            plan.translations.append(tr)
            if tr.verdict in (EXACT, PERMUTATION):
                _apply(ckpt, plan, markers, tr)
            elif tr.verdict == LOSSY and allow_lossy and tr.decoder is not None and tr.lossy is not None:
                _requant(plan, markers, tr)
            elif tr.verdict == LOSSY:
                into = f" as {tr.lossy.format}" if tr.lossy is not None else ""
                how = (
                    f"--allow-lossy re-quantizes it{into}"
                    if tr.decoder is not None and tr.lossy is not None
                    else "no decoder: dequantize cannot read it either"
                )
                plan.refused.append((tr.prefix, f"{tr.label}: {tr.why}; no exact Comfy form ({how})"))
            else:
                plan.refused.append((tr.prefix, f"{tr.label}: {tr.why}"))


def _home(tr: Translation) -> str:
    first = tr.inputs.get("weight") or next(iter(tr.inputs.values()))
    return first.file


def _apply(ckpt: Checkpoint, plan: Plan, markers: dict[str, dict], tr: Translation) -> None:
    moved: set[str] = set()
    steps: list[str] = []
    for m in tr.moves:
        src = ckpt.tensors.get(m.source)
        if src is None:
            raise MigrateError(f"{tr.prefix}: the {tr.dialect} translation reads {m.source!r}, which is not in the file")
        out = f"{tr.out_prefix}.{m.suffix}"
        moved.add(m.source)
        if m.transform is not None or m.dtype != src.dtype or tuple(m.shape) != tuple(src.shape):
            plan.edits[m.source] = TensorEdit(out, m.dtype, tuple(m.shape), m.transform)
        elif out != m.source:
            plan.renames[m.source] = out
        if m.what:
            steps.append(f"{m.suffix}: {m.what}")
    for name in tr.drops:
        plan.drop.add(name)
        moved.add(name)
    if tr.out_prefix != tr.prefix:
        for suffix, e in tr.inputs.items():
            if e.name not in moved and suffix != "comfy_quant":
                plan.renames[e.name] = f"{tr.out_prefix}.{suffix}"
        markers.pop(tr.prefix, None)
    if tr.marker is not None:
        markers[tr.out_prefix] = dict(tr.marker)
        if tr.header_only:
            plan.header_only.add(tr.out_prefix)
        plan.stated.setdefault(tr.out_prefix, []).append(dict(tr.marker))
        plan.homes.setdefault(tr.out_prefix, _home(tr))
    else:
        markers.pop(tr.out_prefix, None)
    plan.markers_changed = True
    after = json.dumps(tr.marker) if tr.marker is not None else "dense layer"
    if tr.drops:
        after += f"; dropped {', '.join(n.rsplit('.', 1)[-1] for n in tr.drops)}" + (
            f" ({tr.dropped_why})" if tr.dropped_why else ""
        )
    if steps:
        after += "; " + "; ".join(steps)
    plan.changes.append(
        Change(
            tr.prefix, None, f"migrate {tr.dialect} layer ({tr.variant}) [{tr.verdict}]", tr.why or tr.variant, after, LOSSLESS
        )
    )


def _requant(plan: Plan, markers: dict[str, dict], tr: Translation) -> None:
    from ..formats.planned import planned_tensors
    from .lossy import DialectRequant

    w = tr.inputs.get("weight")
    if w is None or len(w.shape) != 2:
        plan.refused.append((tr.prefix, f"{tr.label}: no 2-D weight to re-quantize"))
        return
    lossy = tr.lossy
    if lossy is None:  # a lossy translation names the format it re-quantizes into
        plan.refused.append((tr.prefix, f"{tr.label}: names no format to re-quantize into"))
        return
    fmt = FORMATS[lossy.format]
    try:
        params = fmt.params_class().validate(lossy.params, where=f"{tr.dialect} layer {tr.prefix}")
        planned = planned_tensors(params, w.shape[0], w.shape[1])
    except InputError as exc:
        plan.refused.append((tr.prefix, f"{tr.label}: cannot be re-quantized as {fmt.name}: {exc}"))
        return
    op = DialectRequant(tr, params, planned)
    plan.requant[tr.prefix] = op
    markers[tr.out_prefix] = params.marker()
    plan.homes.setdefault(tr.out_prefix, _home(tr))
    if tr.out_prefix != tr.prefix:
        markers.pop(tr.prefix, None)
    plan.markers_changed = True
    op.change = change = Change(
        tr.prefix,
        None,
        f"re-quantize {tr.dialect} layer ({tr.variant}) as {fmt.name} [{LOSSY}]",
        tr.why,
        params.describe(),
        "lossy",
    )
    plan.changes.append(change)


def layer_results(plan: Plan) -> list[dict]:
    """Per dialect layer: its dialect, variant, verdict, Comfy format, why, measured error."""
    out = []
    refused = dict(plan.refused)
    for tr in plan.translations:
        op = plan.requant.get(tr.prefix)
        row = tr.to_dict()
        if tr.prefix in refused and tr.verdict != REFUSED:
            row["verdict"] = REFUSED
            row["why"] = refused[tr.prefix]
        if op is not None:
            row["format"] = op.target_format
            row["error"] = op.error
        else:
            row["error"] = None
        out.append(row)
    return out
