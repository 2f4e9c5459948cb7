"""``quantize`` and ``convert``: the API behind the commands of the same names.

Both run the same pipeline: open the input (headers and markers only), plan every layer,
judge the plan with the checker on a virtual output (refusing what the target cannot load
before computing anything), stream the output through temporary files on the cores ``jobs`` asks for (``jobs``),
check the written files with ``check --target``, rename them into place, and
report the quality of every quantized layer.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import InputError, option
from ..io.progress import Progress
from .plan import COPY, DENSE, QUANTIZE, Options, Plan, PlanRefused, build_plan
from .rules import Choice, Rules, load_rules

if TYPE_CHECKING:
    from ..checker.run import Targets
    from ..checkpoint import Paths

OnLayer = Callable[[Any, Any], None]
"""``on_layer(layer_plan, result)``: called as each layer is written (progress in a caller's UI)."""


class Result:
    """What a run did: the plan, the report document, the output check, the files written."""

    def __init__(
        self,
        plan: Plan | None,
        doc: dict,
        check=None,
        outputs: list[str] | None = None,
        report_files: list[str] | None = None,
        dense_summary=None,
    ) -> None:
        self.plan = plan
        self.doc = doc
        self.check = check
        self.outputs = outputs or []
        self.report_files = report_files or []
        self.dense_summary = dense_summary

    def __repr__(self) -> str:
        plan = repr(self.plan) if self.plan is not None else "no plan"
        over = f", {len(self.over_max_error)} over --max-error" if self.over_max_error else ""
        return f"Result(ok={self.ok}, {plan}, outputs={self.outputs}{over})"

    @property
    def over_max_error(self) -> list[dict]:
        """The layers above ``--max-error`` (worst first): ``{"layer", "rel_l2"}`` each."""
        gate = self.doc.get("max_error") or {}
        return list(gate.get("over") or [])

    @property
    def ok(self) -> bool:
        refused = self.plan is not None and self.plan.refusal is not None
        return (self.check is None or self.check.ok) and not self.over_max_error and not refused

    def to_dict(self) -> dict:
        return self.doc


def _targets(target) -> None:
    from ..checker.run import parse_targets

    try:
        parse_targets(target)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _default_choice(fmt: str | None, params: dict | None, flag: str) -> Choice | None:
    from .params import resolve_format, validate

    given = {k: v for k, v in (params or {}).items() if v is not None}
    if fmt is None:
        if given:
            raise InputError(f"format parameters ({', '.join(sorted(given))}) need {flag} F")
        return None
    name = resolve_format(fmt, flag)
    return Choice(name, validate(name, given, flag), flag)


def _rules(rules) -> Rules | None:
    if rules is None or isinstance(rules, Rules):
        return rules
    return load_rules(str(rules))


def quantize(
    paths: Paths,
    out: str | None = None,
    format: str | None = None,
    params: dict | None = None,
    *,
    rules: str | os.PathLike[str] | Rules | None = None,
    exclude: list[str] | tuple = (),
    target: Targets = "all",
    jobs: int | str | None = None,
    report: str | None = None,
    dry_run: bool = False,
    keep_bad: bool = False,
    overwrite: bool = False,
    progress: bool | None = None,
    on_layer: OnLayer | None = None,
    reference: str | os.PathLike[str] | None = None,
    max_error: float | None = None,
    preset: str | None = None,
    include: list[str] | tuple = (),
    like: Paths | None = None,
) -> Result:
    """Quantize a dense checkpoint (file, shards, folder or index) into ``out``.

    ``format``/``params``: the format of every layer no rule names (``params``: fields of the
    format's ``Params``, e.g. ``{"group_size": 32}``); ``rules``: a rules file path or
    ``Rules``; ``exclude``: regular expressions of layers to keep dense;
    ``target``: runtime(s) the output must load in; ``report``: write ``<stem>.json`` and
    ``<stem>.png``; ``out``: default ``<name>.<format>.safetensors`` next to the input
    (``<folder>.<format>`` for shards); ``overwrite``: replace existing output files (never an
    input; ``comfyquant.io.outputs``); ``jobs``: the cores to compute on -- 1 is this process
    with one torch thread, N > 1 is N worker processes, None or ``"auto"`` every core in the
    shape ``jobs`` picks.  Raises ``InputError`` for bad input.

    ``reference``: the original dense checkpoint; every quantized layer is measured against
    its weight too (the report's ``reference`` figures).  ``max_error``: the quality gate on
    each quantized layer's relative L2 weight error (against ``reference`` when given, else
    against the source): above it the output is kept as ``<out stem>.over-max-error.safetensors``
    (``<folder>.over-max-error`` for shards), never at ``out``, and ``Result.ok`` is False.

    ``preset``: a model family's keep-dense list (``presets``; None detects it from the
    tensor names, ``"none"`` turns presets off); ``include``: the parts of a ComfyUI all-in-one
    checkpoint quantized besides the diffusion model (``"text-encoders"``, ``"vae"``, ``"all"``);
    ``like``: a quantized checkpoint whose per-layer formats and parameters the output repeats
    (``recipe``)."""
    default = _default_choice(format, params, "--format")
    select = _select_args(like, rules, default, preset, include)
    return _run(
        "quantize",
        paths,
        out,
        default,
        select.rules if select.recipe is not None else rules,
        exclude,
        target,
        jobs,
        report,
        dry_run,
        keep_bad,
        overwrite,
        progress,
        on_layer,
        reference,
        max_error,
        select=select,
    )


def convert(
    paths: Paths,
    out: str | None = None,
    to: str | None = None,
    params: dict | None = None,
    *,
    rules: str | os.PathLike[str] | Rules | None = None,
    exclude: list[str] | tuple = (),
    target: Targets = "all",
    jobs: int | str | None = None,
    report: str | None = None,
    dry_run: bool = False,
    keep_bad: bool = False,
    overwrite: bool = False,
    progress: bool | None = None,
    dtype: str | None = None,
    on_layer: OnLayer | None = None,
    reference: str | os.PathLike[str] | None = None,
    max_error: float | None = None,
) -> Result:
    """Re-encode a quantized checkpoint's layers in another format or with other parameters
    (decode, then encode), or decode everything (``to="dense"``, via ``comfyquant.dequantize``).

    ``reference``/``max_error`` as for ``quantize``: with a reference, the re-encoded
    layers are measured against the original weights, not only against the decoded input."""
    if isinstance(to, str) and to.strip().lower() in ("dense", "dequantize"):
        if (
            rules is not None
            or exclude
            or report
            or params
            and any(v is not None for v in params.values())
            or reference is not None
            or max_error is not None
        ):
            raise InputError(
                "--to dense decodes every layer exactly: --rules, --exclude, --report, --reference, "
                "--max-error and format parameters do not apply (comfyquant compare measures a file "
                "against its original)"
            )
        return _dense(paths, out, dtype, overwrite, dry_run, progress)
    if dtype is not None:
        raise InputError(
            f"{option('--dtype', 'dtype')} applies to {option('--to dense', 'to=' + repr('dense'))} only "
            "(quantized layers keep their model dtype)"
        )
    return _run(
        "convert",
        paths,
        out,
        _default_choice(to, params, "--to"),
        rules,
        exclude,
        target,
        jobs,
        report,
        dry_run,
        keep_bad,
        overwrite,
        progress,
        on_layer,
        reference,
        max_error,
    )


def _run(
    mode,
    paths,
    out,
    default,
    rules,
    exclude,
    target,
    jobs,
    report,
    dry_run,
    keep_bad,
    overwrite,
    progress,
    on_layer,
    reference=None,
    max_error=None,
    select=None,
) -> Result:
    from ..comparison import check_limit
    from ..gate import check_input, open_input
    from ..io.shards import is_url
    from . import report as rep
    from .work import use_sources

    _targets(target)
    if max_error is not None:
        max_error = check_limit(max_error)
    from .jobs import parse, resolve

    parse(jobs)  # refused before any work
    if report and not dry_run:
        from ..io.plots import require_matplotlib

        require_matplotlib("--report")
    rules = _rules(rules)
    if (
        default is None
        and (rules is None or (not rules.rules and rules.default is None))
        and (select is None or not select.may_default)
    ):
        flag = option("--format F", "format=...") if mode == "quantize" else option("--to F", "to=...")
        raise InputError(f"nothing to do: give {flag} or {option('--rules FILE', 'rules=...')}")
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    paths = [str(p) for p in paths]
    if any(is_url(p) for p in paths):
        raise InputError(f"{mode} reads local files; download the checkpoint first")
    started = time.perf_counter()
    with open_input(paths, mode, check=False) as (raw, ckpt):
        if ckpt is not raw:  # another layout, read through its translation in this process
            use_sources(ckpt.sources)
        check_input(ckpt, mode)  # the gate dequantize shares: check's errors refuse the input
        selection = select.apply(ckpt) if select is not None else None
        if selection is not None:
            default = select.default(default, rules, selection)  # a preset's format when none is given
        if not dry_run:
            tag = default.format if default is not None else {"quantize": "quantized", "convert": "converted"}[mode]
            dest = _outputs(ckpt, out, overwrite, tag, rep.report_paths(report) if report else ())  # refuse before any work
            dests, index_dest = dest.files, dest.index
            over = _over_outputs(ckpt, dest, overwrite) if max_error is not None else None
        try:
            plan = build_plan(ckpt, mode, Options(rules, default, list(exclude), target, selection))
        except PlanRefused as refused:
            if not dry_run:
                raise
            plan = refused.plan  # a dry run prints the plan, and the refusal after it
        if select is not None:
            select.annotate(plan)
        if keep_bad:
            _keep_bad(plan)
        references = _references(plan, str(reference)) if reference is not None else None
        if dry_run:
            doc = rep.build(plan, list(ckpt.paths), [], {}, dry_run=True)
            if select is not None:
                doc["selection"] = select.to_dict(plan)
            return Result(plan, doc)
        gate = _Gate(max_error, reference is not None, over) if max_error is not None else None
        bar = Progress(len(plan.layers), plan.bytes_in, progress, label=mode)
        created = dest.folder
        compute = resolve(jobs, plan, in_process_only=ckpt is not raw)

        def document(results, check, dests, index_dest) -> dict:
            outputs = dests + ([index_dest] if index_dest else [])
            doc = rep.build(plan, list(ckpt.paths), outputs, results, check, time.perf_counter() - started)
            doc["jobs"] = compute.to_dict()
            if reference is not None:
                doc["reference"] = str(reference)
            if gate is not None:
                doc["max_error"] = gate.to_dict()
            if select is not None:
                doc["selection"] = select.to_dict(plan)
            return doc

        made: list[dict] = []

        def staged_report(results, check, dests, index_dest) -> list[tuple[str, str]]:
            """The report's files, staged once the output passed its check (and the gate chose
            its destinations) and committed with it: all of the run's files, or none."""
            made.append(document(results, check, dests, index_dest))
            return rep.stage_report(made[0], *rep.report_paths(report))

        try:
            dest.make_folder()
            from .runner import execute

            results, check = execute(
                ckpt,
                plan,
                dests,
                index_dest,
                jobs=compute,
                progress=bar,
                on_layer=on_layer,
                references=references,
                redirect=gate.redirect if gate is not None else None,
                also=staged_report if report else None,
            )
        except BaseException:
            if created and os.path.isdir(created) and not os.listdir(created):
                shutil.rmtree(created, ignore_errors=True)
            raise
        if gate is not None and gate.over:
            dests, index_dest = gate.dests, gate.index
            if created and os.path.isdir(created) and not os.listdir(created):
                shutil.rmtree(created, ignore_errors=True)  # the requested folder stays unwritten
    outputs = dests + ([index_dest] if index_dest else [])
    doc = made[0] if made else document(results, check, dests, index_dest)
    return Result(plan, doc, check, outputs, list(rep.report_paths(report)) if report else [])


def _select_args(like, rules, default, preset, include):
    from .presets import Request

    return Request(like, rules, default, preset, include)


def _outputs(ckpt, out: str | None, overwrite: bool, tag: str, also):
    from .runner import output_paths

    return output_paths(ckpt, out, overwrite, tag, also)


def _over_outputs(ckpt, dest, overwrite: bool):
    """Where an output over ``--max-error`` goes (claimed now, before any work)."""
    from ..comparison import over_outputs

    return over_outputs(list(ckpt.files), ckpt.shardset.index_path, dest, overwrite)


def _references(plan: Plan, reference: str) -> dict[str, tuple]:
    """``--reference DENSE``: the read spec of each quantized layer's original weight, refused
    up front (one line naming the file and layer) when the reference cannot serve."""
    from ..checkpoint import open_checkpoint
    from ..comparison import reference_weight
    from ..gate import refuse_damage
    from ..io.shards import is_url
    from .work import entry_spec

    if is_url(reference):
        raise InputError(f"{option('--reference', 'reference=')} {reference}: reads local files; download the checkpoint first")
    out: dict[str, tuple] = {}
    with open_checkpoint(reference) as ref:
        refuse_damage(ref, "read --reference")
        for lp in plan.quantized:
            entry = reference_weight(ref, f"{option('--reference', 'reference=')} {reference}", lp.name, (lp.n, lp.k), InputError)
            out[lp.name] = entry_spec(entry)
    return out


class _Gate:
    """``--max-error``: decides, once the output passed its check and before it is renamed
    into place, whether it goes to the requested path or to the over-max-error name."""

    def __init__(self, limit: float, against_reference: bool, over_dest) -> None:
        self.limit = limit
        self.against = "reference" if against_reference else "source"
        self.over_dest = over_dest
        self.over: list[tuple[str, float]] = []
        self.errors: dict[str, float] = {}
        self.dests: list[str] = []
        self.index: str | None = None

    def redirect(self, results: dict, dests: list[str], index_dest: str | None):
        from ..comparison import over_limit

        for name, res in results.items():
            quality = res.get("quality") or {}
            figures = quality.get("reference") if self.against == "reference" else quality
            self.errors[name] = figures["weight"]["rel_l2"]
        self.over = over_limit(self.errors, self.limit)
        if not self.over:
            return dests, index_dest
        self.over_dest.make_folder()
        self.dests, self.index = list(self.over_dest.files), self.over_dest.index
        return self.dests, self.index

    def to_dict(self) -> dict:
        return {
            "limit": self.limit,
            "against": self.against,
            "ok": not self.over,
            "measured": len(self.errors),
            "over": [{"layer": n, "rel_l2": e} for n, e in self.over],
        }


def _keep_bad(plan: Plan) -> None:
    """``--keep-bad``: layers whose source weight has NaN/Inf stay as they are, with the reason."""
    from .work import close_sources, find_nonfinite, task_for

    try:
        for lp in plan.layers:
            if lp.action != QUANTIZE:
                continue
            bad = find_nonfinite(task_for(lp, quality=False))
            if bad:
                lp.action = DENSE if lp.source == "dense" else COPY
                lp.reason = f"{'weight' if lp.source == 'dense' else 'decoded weight'} has {bad} (--keep-bad)"
                if lp.action == DENSE:
                    lp.marker = None
                else:
                    lp.marker = lp.src_marker
    finally:
        close_sources()


def _dense(paths, out: str | None, dtype: str | None, overwrite: bool, dry_run: bool, progress) -> Result:
    """``convert --to dense``: the dequantize command's streaming decoder does the work."""
    try:
        from ..dequantizer import dequantize
    except ImportError:  # pragma: no cover - shipped together
        raise InputError("convert --to dense needs comfyquant.dequantize, which this installation lacks") from None
    if dry_run:
        raise InputError("--to dense has no plan to show: every quantized layer is decoded, everything else copied")
    summary = dequantize(paths, out, dtype, progress=progress, overwrite=overwrite)
    doc = {"schema": 1, "tool": "comfyquant", "command": "convert", "to": "dense", **summary.to_dict()}
    return Result(None, doc, outputs=list(summary.outputs), dense_summary=summary)
