"""The quality report of a ``quantize``/``convert`` run: JSON document, PNG plot, text.

Per quantized layer: relative L2 error and cosine similarity of the decoded weight against
the source, and of the layer output on a fixed random input (see ``work``); totals per
format and overall; the worst layers.  matplotlib is imported only to draw the PNG, and only
if it is installed (the ``plot`` extra).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from ..errors import InputError
from ..naming import printable
from ..units import human_size
from ..version import __version__
from .plan import COPY, DECODE, DENSE, QUANTIZE, Plan
from .work import QUALITY_ROWS, QUALITY_SEED

SCHEMA = 1
WORST = 5


def report_paths(path: str) -> tuple[str, str]:
    """``--report PATH`` -> (JSON path, PNG path): ``PATH`` minus a .json/.png suffix, plus each."""
    stem = path[:-5] if path.endswith(".json") else path[:-4] if path.endswith(".png") else path
    return stem + ".json", stem + ".png"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _totals(rows: list[dict]) -> dict:
    done = [r for r in rows if r.get("weight")]
    out = {
        "quantized": len(done),
        "weight_rel_l2_mean": _mean([r["weight"]["rel_l2"] for r in done]),
        "weight_rel_l2_max": max((r["weight"]["rel_l2"] for r in done), default=None),
        "weight_cosine_min": min((r["weight"]["cosine"] for r in done), default=None),
        "output_rel_l2_mean": _mean([r["output"]["rel_l2"] for r in done]),
        "output_rel_l2_max": max((r["output"]["rel_l2"] for r in done), default=None),
        "output_cosine_min": min((r["output"]["cosine"] for r in done), default=None),
    }
    against = [r["reference"] for r in done if r.get("reference")]
    if against:
        out["reference_weight_rel_l2_mean"] = _mean([r["weight"]["rel_l2"] for r in against])
        out["reference_weight_rel_l2_max"] = max(r["weight"]["rel_l2"] for r in against)
        out["reference_output_rel_l2_mean"] = _mean([r["output"]["rel_l2"] for r in against])
    return out


def build(
    plan: Plan,
    inputs: list[str],
    outputs: list[str],
    results: dict[str, dict],
    check=None,
    seconds: float = 0.0,
    dry_run: bool = False,
) -> dict:
    """The report document (also what ``--json`` prints)."""
    rows = []
    for lp in plan.layers:
        row = lp.to_dict()
        res = results.get(lp.name) or {}
        quality = res.get("quality") or {}
        row["weight"] = quality.get("weight")
        row["output"] = quality.get("output")
        if "reference" in quality:  # --reference: against the original dense weight
            row["reference"] = quality["reference"]
        row["seconds"] = round(res["seconds"], 4) if "seconds" in res else None
        rows.append(row)
    by_format: dict[str, list[dict]] = {}
    for r in rows:
        if r["action"] == QUANTIZE:
            by_format.setdefault(r["format"], []).append(r)
    bytes_in, bytes_out = plan.bytes_in, plan.bytes_out
    totals = {
        "layers": len(rows),
        "to_quantize": sum(1 for r in rows if r["action"] == QUANTIZE),
        "dense": sum(1 for r in rows if r["action"] == DENSE),
        "copied": sum(1 for r in rows if r["action"] == COPY),
        "other_tensors": len(plan.others),
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "compression": round(bytes_in / bytes_out, 4) if bytes_out else None,
        "seconds": round(seconds, 3),
        "throughput_mb_s": round(sum(r["bytes_in"] for r in rows if r["action"] == QUANTIZE) / 1e6 / seconds, 2)
        if seconds > 0 and not dry_run
        else None,
        **_totals(rows),
        "by_format": {f: {"layers": len(rs), **_totals(rs)} for f, rs in sorted(by_format.items())},
    }
    measured = [r for r in rows if r.get("output")]
    worst = sorted(measured, key=lambda r: -r["output"]["rel_l2"])[:WORST]
    doc = {
        "schema": SCHEMA,
        "tool": "comfyquant",
        "version": __version__,
        "command": plan.mode,
        "dry_run": dry_run,
        "inputs": inputs,
        "outputs": outputs,
        "target": plan.target,
        "quality_input": {
            "rows": QUALITY_ROWS,
            "seed": QUALITY_SEED,
            "distribution": "standard normal, model dtype",
            "reference": "dense weight, F32 product",
        },
        "layers": rows,
        "other_tensors": [e.name for e in plan.others],
        "totals": totals,
        "worst": [r["layer"] for r in worst],
        "check": None
        if check is None
        else {"ok": check.ok, "counts": check.counts, "targets": {n: v.to_dict() for n, v in check.verdicts.items()}},
    }
    return doc


def stage_report(doc: dict, json_path: str, png_path: str) -> list[tuple[str, str]]:
    """``(temporary file, destination)`` of the report's JSON and PNG, written by the one
    writer but not yet in place: the run commits them with its model files, so a failure
    leaves neither a model without its report nor a report without its model."""
    from ..io.plots import stage_figure
    from ..io.writer import discard, json_filler, stage_file

    try:
        staged = [(stage_file(json_path, json_filler(doc)), json_path)]
    except OSError as exc:
        raise InputError(f"{json_path}: cannot write the report ({exc.strerror or exc}); nothing was written") from None
    try:
        staged.append((stage_figure(figure(doc), png_path), png_path))
    except BaseException:
        discard(staged[0][0])
        raise
    return staged


def figure(doc: dict):
    """Error per layer in model order, coloured by format: weight (top) and output (bottom)."""
    from ..io.plots import pyplot, title_figure

    plt = pyplot()
    rows = [r for r in doc["layers"] if r.get("weight")]
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, min(24.0, 0.12 * len(rows) + 6)), 7), sharex=True)
    formats = sorted({r["format"] for r in rows})
    colors = plt.get_cmap("tab10")
    for ax, key, title in (
        (axes[0], "weight", "decoded weight vs source"),
        (axes[1], "output", f"layer output on a fixed random input ({QUALITY_ROWS} rows)"),
    ):
        for i, fmt in enumerate(formats):
            pts = [(j, r[key]["rel_l2"]) for j, r in enumerate(rows) if r["format"] == fmt]
            ax.bar([p[0] for p in pts], [p[1] for p in pts], width=0.8, color=colors(i % 10), label=fmt)
        ax.set_ylabel("relative L2 error")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    # outside the axes, right of the plot: a legend inside would cover the last bars
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0)
    if len(rows) <= 60:
        axes[1].set_xticks(range(len(rows)))
        axes[1].set_xticklabels([r["layer"] for r in rows], rotation=90, fontsize=6)
    else:
        axes[1].set_xlabel("quantized layer (model order)")
    t = doc["totals"]
    title_figure(
        fig,
        f"comfyquant {doc['command']}: {len(rows)} layers, mean weight error {t['weight_rel_l2_mean'] or 0:.4f}, "
        f"mean output error {t['output_rel_l2_mean'] or 0:.4f}",
        fontsize=11,
    )
    return fig


# -- text -------------------------------------------------------------------------------------


def _table(header: list[str], rows: list[list[str]], right: AbstractSet[int] = frozenset()) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def render_plan(plan: Plan, full: bool) -> str:
    """The per-layer plan (``full``) or its summary: what is quantized, what stays and why."""
    lines = []
    q = plan.quantized
    verb = "quantize" if plan.mode == "quantize" else "re-encode"
    kinds = ", ".join(f"{n} {f}" for f, n in sorted(_count(q).items())) or "none"
    lines.append(
        f"plan: {verb} {len(q)} of {len(plan.layers)} layers ({kinds}); "
        f"{human_size(plan.bytes_in)} -> {human_size(plan.bytes_out)}"
    )
    if full:
        rows = []
        for lp in plan.layers:
            w = lp.entries.get("weight")
            shape = "x".join(str(d) for d in w.shape) if w is not None else "-"
            rows.append(
                [
                    lp.name,
                    shape,
                    w.dtype if w is not None else "-",
                    lp.action,
                    lp.describe(),
                    human_size(lp.bytes_in),
                    human_size(lp.bytes_out),
                ]
            )
        lines += ["  " + x for x in _table(["layer", "shape", "dtype", "action", "format / reason", "in", "out"], rows, {5, 6})]
        if plan.others:
            lines.append(f"  other tensors (copied): {len(plan.others)}, {human_size(sum(e.nbytes for e in plan.others))}")
    else:
        reasons: dict[tuple[str, str], list[str]] = {}
        for lp in plan.layers:
            if lp.action != QUANTIZE:
                kind, detail = _reason_kind(lp.reason or lp.action)
                verb = "decoded" if lp.action == DECODE else "kept" if plan.mode == "quantize" else "copied"
                reasons.setdefault((verb, kind), []).append(f"{lp.name} ({detail})" if detail else lp.name)
        for (verb, reason), names in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
            shown = ", ".join(names[:4]) + (f", ... ({len(names)} layers)" if len(names) > 4 else "")
            lines.append(f"  {verb} ({len(names)}): {reason}: {shown}")
    return "\n".join(printable(line) for line in lines)  # lines quote names from the file


def _count(layers) -> dict[str, int]:
    out: dict[str, int] = {}
    for lp in layers:
        out[lp.format] = out.get(lp.format, 0) + 1
    return out


def _reason_kind(reason: str) -> tuple[str, str]:
    """(group, per-layer detail): shape refusals differ per layer, so they group by format."""
    if " cannot take [" in reason:
        fmt, rest = reason.split(" cannot take ", 1)
        shape, _, why = rest.partition(": ")
        return f"{fmt} cannot take the shape", f"{shape}: {why}"
    return reason, ""


def render_result(doc: dict, check=None) -> str:
    t = doc["totals"]
    lines = []
    if not doc["dry_run"]:
        rate = f" ({t['throughput_mb_s']:.1f} MB/s quantized)" if t.get("throughput_mb_s") else ""
        comp = f" ({t['compression']:.2f}x)" if t.get("compression") else ""
        lines.append(
            f"{'quantized' if doc['command'] == 'quantize' else 'converted'} {t['quantized']} layers, "
            f"{human_size(t['bytes_in'])} -> {human_size(t['bytes_out'])}{comp} in {t['seconds']:.1f} s{rate}"
        )
    if check is not None:
        for name, v in check.verdicts.items():
            state = "loads" if v.loads else f"FAILS {v.first.message}"
            lines.append(f"check --target {name}: {state}")
    rows = [r for r in doc["layers"] if r["layer"] in doc["worst"]]
    rows.sort(key=lambda r: -r["output"]["rel_l2"])
    if rows:
        lines.append(
            f"mean relative L2 error: weight {t['weight_rel_l2_mean']:.4f}, output {t['output_rel_l2_mean']:.4f}; "
            f"worst layers (output error):"
        )
        table = [
            [
                r["layer"],
                r["format"],
                f"{r['weight']['rel_l2']:.4f}",
                f"{r['weight']['cosine']:.5f}",
                f"{r['output']['rel_l2']:.4f}",
                f"{r['output']['cosine']:.5f}",
            ]
            for r in rows
        ]
        head = ["layer", "format", "weight relL2", "cos", "output relL2", "cos"]
        if t.get("reference_weight_rel_l2_mean") is not None:  # --reference: the error against the original
            head += ["vs reference: weight", "output"]
            for cells, r in zip(table, rows):
                ref = r.get("reference") or {}
                cells += [f"{ref['weight']['rel_l2']:.4f}", f"{ref['output']['rel_l2']:.4f}"] if ref else ["-", "-"]
        lines += ["  " + x for x in _table(head, table, set(range(2, len(head))))]
    if t.get("reference_weight_rel_l2_mean") is not None:
        lines.append(
            f"against the reference {doc.get('reference')}: mean relative L2 error weight "
            f"{t['reference_weight_rel_l2_mean']:.4f} (max {t['reference_weight_rel_l2_max']:.4f}), "
            f"output {t['reference_output_rel_l2_mean']:.4f}"
        )
    lines += render_gate(doc)
    return "\n".join(printable(line) for line in lines)  # lines quote names from the file


def render_gate(doc: dict) -> list[str]:
    """The ``--max-error`` verdict: the layers above the limit, worst first, and where the
    output was kept instead."""
    gate = doc.get("max_error")
    if not gate:
        return []
    what = "the reference" if gate["against"] == "reference" else "the source"
    if gate["ok"]:
        return [f"max-error gate: passed ({gate['measured']} layers at most {gate['limit']:g} relative L2 error against {what})"]
    over = gate["over"]
    shown = ", ".join(f"{o['layer']} {o['rel_l2']:.4f}" for o in over[:10])
    more = f", ... ({len(over)} layers)" if len(over) > 10 else ""
    return [
        f"max-error gate: FAILED: {len(over)} layer{'s' * (len(over) != 1)} above {gate['limit']:g} relative L2 "
        f"error against {what} (worst first): {shown}{more}",
        f"the output was kept as {', '.join(doc['outputs'])}, not at the requested path",
    ]
