"""``quantize`` and ``convert``: the API behind the commands of the same names.

Both run the same pipeline: open the input (headers and markers only), plan every layer,
judge the plan with the checker on a virtual output (refusing what the target cannot load
before computing anything), stream the output through temporary files on the cores ``jobs`` asks for (``jobs``),
check the written files with ``check --target``, rename them into place, and
report the quality of every quantized layer.

``quantize`` and ``convert`` build the run's options object (``options``) from their keywords,
the commands from their command lines; ``run`` takes it either way.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..comparison import check_limit
from ..errors import InputError, option
from ..gate import check_input, open_input
from ..io.progress import Progress
from ..keywords import keywords_of
from . import report as rep
from .options import ConvertKeywords, ConvertOptions, EncodeOptions, OnLayer, QuantizeKeywords, QuantizeOptions
from .plan import COPY, DENSE, QUANTIZE, Options, Plan, PlanRefused, build_plan
from .rules import Choice, Rules, load_rules
from .work import use_sources

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..checker.report import Report
    from ..checker.run import Targets
    from ..checkpoint import Checkpoint, Paths
    from ..dequantizer import Summary
    from ..io.outputs import Outputs
    from .presets import Request, Selection

__all__ = ["Result", "OnLayer", "quantize", "convert", "run"]


class Result:
    """What a run did: the plan, the report document, the output check, the files written."""

    def __init__(
        self,
        plan: Plan | None,
        doc: dict,
        check: Report | None = None,
        outputs: list[str] | None = None,
        report_files: list[str] | None = None,
        dense_summary: Summary | None = None,
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


def _targets(target: Targets) -> None:
    from ..checker.run import parse_targets

    try:
        parse_targets(target)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _default_choice(fmt: str | None, params: Mapping[str, Any] | None, flag: str) -> Choice | None:
    from .params import resolve_format, validate

    given = {k: v for k, v in (params or {}).items() if v is not None}
    if fmt is None:
        if given:
            raise InputError(f"format parameters ({', '.join(sorted(given))}) need {flag} F")
        return None
    name = resolve_format(fmt, flag)
    return Choice(name, validate(name, given, flag), flag)


def _rules(rules: str | os.PathLike[str] | Rules | None) -> Rules | None:
    if rules is None or isinstance(rules, Rules):
        return rules
    return load_rules(str(rules))


@keywords_of(QuantizeOptions)
def quantize(
    paths: Paths,
    out: str | None = None,
    format: str | None = None,
    params: Mapping[str, Any] | None = None,
    **keywords: Unpack[QuantizeKeywords],
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
    (``recipe``).

    The keywords are the fields of ``QuantizeOptions``, with its defaults."""
    return run(QuantizeOptions(paths=paths, out=out, format=format, params=params, **keywords))


@keywords_of(ConvertOptions)
def convert(
    paths: Paths,
    out: str | None = None,
    to: str | None = None,
    params: Mapping[str, Any] | None = None,
    **keywords: Unpack[ConvertKeywords],
) -> Result:
    """Re-encode a quantized checkpoint's layers in another format or with other parameters
    (decode, then encode), or decode everything (``to="dense"``, via ``comfyquant.dequantize``).

    ``reference``/``max_error`` as for ``quantize``: with a reference, the re-encoded
    layers are measured against the original weights, not only against the decoded input.
    ``dtype``: the output dtype of ``to="dense"``.  The keywords are the fields of
    ``ConvertOptions``, with its defaults."""
    return run(ConvertOptions(paths=paths, out=out, to=to, params=params, **keywords))


def run(options: EncodeOptions) -> Result:
    """Carry out a ``quantize`` or ``convert`` run as ``options`` describe it: what the command
    line and the API functions both call."""
    if isinstance(options, ConvertOptions):
        _refuse_convert(options)
        if options.dense:
            return _dense(options)
    default = _default_choice(options.default_format, options.params, options.format_flag)
    select = _request(options, default) if isinstance(options, QuantizeOptions) else None
    rules = _refuse_early(options, default, select)
    paths = options.path_list()
    started = time.perf_counter()
    with open_input(paths, options.command, check=False) as (raw, ckpt):
        if ckpt is not raw:  # another layout, read through its translation in this process
            use_sources(ckpt.sources)
        check_input(ckpt, options.command)  # the gate dequantize shares: check's errors refuse the input
        selection = select.apply(ckpt) if select is not None else None
        if select is not None and selection is not None:
            default = select.default(default, rules, selection)  # a preset's format when none is given
        plan, dest, over = _plan(ckpt, options, rules, default, selection)
        if select is not None:
            select.annotate(plan)
        if options.keep_bad:
            _keep_bad(plan)
        references = _references(plan, str(options.reference)) if options.reference is not None else None
        if dest is None:  # a dry run
            doc = rep.build(plan, list(ckpt.paths), [], {}, dry_run=True)
            if select is not None:
                doc["selection"] = select.to_dict(plan)
            return Result(plan, doc)
        return _write(ckpt, raw, options, plan, dest, over, references, select, started)


def _refuse_convert(options: ConvertOptions) -> None:
    """``convert``'s own refusals: what does not apply to ``--to dense``, and ``--dtype`` without it."""
    if options.dense:
        params = options.params
        if (
            options.rules is not None
            or options.exclude
            or options.report
            or params
            and any(v is not None for v in params.values())
            or options.reference is not None
            or options.max_error is not None
        ):
            raise InputError(
                "--to dense decodes every layer exactly: --rules, --exclude, --report, --reference, "
                "--max-error and format parameters do not apply (comfyquant compare measures a file "
                "against its original)"
            )
    elif options.dtype is not None:
        raise InputError(
            f"{option('--dtype', 'dtype')} applies to {option('--to dense', 'to=' + repr('dense'))} only "
            "(quantized layers keep their model dtype)"
        )


def _request(options: QuantizeOptions, default: Choice | None) -> Request:
    """``quantize``'s selection (``--preset``, ``--include``, ``--like``), checked before the
    input is opened."""
    from .presets import Request

    return Request(options.like, options.rules, default, options.preset, options.include)


def _refuse_early(options: EncodeOptions, default: Choice | None, select: Request | None) -> Rules | None:
    """Every refusal that needs no input file, before any is opened; the rules the run uses."""
    from ..io.shards import is_url
    from .jobs import parse

    _targets(options.target)
    if options.max_error is not None:
        check_limit(options.max_error)
    parse(options.jobs)  # refused before any work
    if options.report and not options.dry_run:
        from ..io.plots import require_matplotlib

        require_matplotlib("--report")
    rules = _rules(select.rules if select is not None and select.recipe is not None else options.rules)
    if (
        default is None
        and (rules is None or (not rules.rules and rules.default is None))
        and (select is None or not select.may_default)
    ):
        flag = option(f"{options.format_flag} F", f"{options.format_flag[2:]}=...")
        raise InputError(f"nothing to do: give {flag} or {option('--rules FILE', 'rules=...')}")
    if any(is_url(p) for p in options.path_list()):
        raise InputError(f"{options.command} reads local files; download the checkpoint first")
    return rules


def _plan(
    ckpt: Checkpoint, options: EncodeOptions, rules: Rules | None, default: Choice | None, selection: Selection | None
) -> tuple[Plan, Outputs | None, Outputs | None]:
    """The plan, and (unless a dry run) the claimed outputs: the requested one and where an
    output over ``--max-error`` goes, claimed before any work."""
    dest = over = None
    if not options.dry_run:
        tag = default.format if default is not None else options.default_tag
        also = rep.report_paths(options.report) if options.report else ()
        dest = _outputs(ckpt, options.out, options.overwrite, tag, also)
        over = _over_outputs(ckpt, dest, options.overwrite) if options.max_error is not None else None
    try:
        plan = build_plan(ckpt, options.command, Options(rules, default, list(options.exclude), options.target, selection))
    except PlanRefused as refused:
        if not options.dry_run:
            raise
        plan = refused.plan  # a dry run prints the plan, and the refusal after it
    return plan, dest, over


def _write(
    ckpt: Checkpoint,
    raw: Checkpoint,
    options: EncodeOptions,
    plan: Plan,
    dest: Outputs,
    over: Outputs | None,
    references: dict[str, tuple] | None,
    select: Request | None,
    started: float,
) -> Result:
    """Compute, write, check and commit the planned output (and the report files with it)."""
    from .jobs import resolve
    from .runner import execute

    gate = None
    if options.max_error is not None and over is not None:
        gate = _Gate(check_limit(options.max_error), options.reference is not None, over)
    bar = Progress(len(plan.layers), plan.bytes_in, options.progress, label=options.command)
    compute = resolve(options.jobs, plan, in_process_only=ckpt is not raw)
    dests, index_dest = list(dest.files or ()), dest.index

    def document(results: dict, check: Report | None, dests: list[str], index_dest: str | None) -> dict:
        outputs = dests + ([index_dest] if index_dest else [])
        doc = rep.build(plan, list(ckpt.paths), outputs, results, check, time.perf_counter() - started)
        doc["jobs"] = compute.to_dict()
        if options.reference is not None:
            doc["reference"] = str(options.reference)
        if gate is not None:
            doc["max_error"] = gate.to_dict()
        if select is not None:
            doc["selection"] = select.to_dict(plan)
        return doc

    made: list[dict] = []

    json_path, png_path = rep.report_paths(options.report) if options.report else ("", "")

    def staged_report(results: dict, check: Report, dests: list[str], index_dest: str | None) -> list[tuple[str, str]]:
        """The report's files, staged once the output passed its check (and the gate chose
        its destinations) and committed with it: all of the run's files, or none."""
        made.append(document(results, check, dests, index_dest))
        return rep.stage_report(made[0], json_path, png_path)

    created = dest.folder
    try:
        dest.make_folder()
        results, check = execute(
            ckpt,
            plan,
            dests,
            index_dest,
            jobs=compute,
            progress=bar,
            on_layer=options.on_layer,
            references=references,
            redirect=gate.redirect if gate is not None else None,
            also=staged_report if options.report else None,
        )
    except BaseException:
        _remove_empty(created)
        raise
    if gate is not None and gate.over:
        dests, index_dest = gate.dests, gate.index
        _remove_empty(created)  # the requested folder stays unwritten
    outputs = dests + ([index_dest] if index_dest else [])
    doc = made[0] if made else document(results, check, dests, index_dest)
    return Result(plan, doc, check, outputs, [json_path, png_path] if options.report else [])


def _remove_empty(folder: str | None) -> None:
    """Remove an output folder this run made and left empty."""
    if folder and os.path.isdir(folder) and not os.listdir(folder):
        shutil.rmtree(folder, ignore_errors=True)


def _outputs(ckpt: Checkpoint, out: str | None, overwrite: bool, tag: str, also: Sequence[str]) -> Outputs:
    from .runner import output_paths

    return output_paths(ckpt, out, overwrite, tag, also)


def _over_outputs(ckpt: Checkpoint, dest: Outputs, overwrite: bool) -> Outputs:
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

    def __init__(self, limit: float, against_reference: bool, over_dest: Outputs) -> None:
        self.limit = limit
        self.against = "reference" if against_reference else "source"
        self.over_dest = over_dest
        self.over: list[tuple[str, float]] = []
        self.errors: dict[str, float] = {}
        self.dests: list[str] = []
        self.index: str | None = None

    def redirect(self, results: dict, dests: list[str], index_dest: str | None) -> tuple[list[str], str | None]:
        from ..comparison import over_limit

        for name, res in results.items():
            quality = res.get("quality") or {}
            figures = quality["reference"] if self.against == "reference" else quality
            self.errors[name] = figures["weight"]["rel_l2"]
        self.over = over_limit(self.errors, self.limit)
        if not self.over:
            return dests, index_dest
        self.over_dest.make_folder()
        self.dests, self.index = list(self.over_dest.files or ()), self.over_dest.index
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


def _dense(options: ConvertOptions) -> Result:
    """``convert --to dense``: the dequantize command's streaming decoder does the work."""
    try:
        from ..dequantizer import dequantize
    except ImportError:  # pragma: no cover - shipped together
        raise InputError("convert --to dense needs comfyquant.dequantize, which this installation lacks") from None
    if options.dry_run:
        raise InputError("--to dense has no plan to show: every quantized layer is decoded, everything else copied")
    summary = dequantize(options.paths, options.out, options.dtype, progress=options.progress, overwrite=options.overwrite)
    doc = {"schema": 1, "tool": "comfyquant", "command": "convert", "to": "dense", **summary.to_dict()}
    return Result(None, doc, outputs=list(summary.outputs), dense_summary=summary)
