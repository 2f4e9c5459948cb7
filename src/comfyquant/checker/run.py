"""``check``: open a checkpoint, run every rule and the selected runtime profiles, report.

``build_report`` is the one pipeline every check goes through: ``comfyquant.check``, the
``check`` command (one checkpoint, each of several, ``--recursive``) and the ComfyUI Check
node, so they open, judge and report a file alike, a damaged one included.
``check_checkpoint`` judges a checkpoint that is already open (the writing commands use it on
the checkpoints they build in memory).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from ..checkpoint import Checkpoint, NameMapper, Paths, open_checkpoint
from ..dialects.containers import open_any
from ..dialects.registry import detect
from ..dialects.report import dialect_findings, dialect_violations, settle, value_casts
from ..errors import InputError
from ..findings import Finding
from ..io.shards import Group, is_url
from ..targets.select import TARGETS, run_target, split_target, with_releases
from .report import Report, assemble
from .rules import check_layers, check_mapping, check_marker_prefixes

if TYPE_CHECKING:
    from ..io.remote import RemoteOptions

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
    names = {p: layer.name for p, layer in ckpt.layers.items()}
    if values:  # before the releases' verdicts, which are made from these: a value breaks every release reading it
        from .deep import value_failures

        value_failures(values, verdicts, {name: p for p, name in names.items()})
    with_releases(verdicts, target, ckpt, selected)
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


class CheckOptions(NamedTuple):
    """What a check is asked, the same for every caller: the runtimes whose verdicts set the
    severities, whether to read the tensors' values, how tensor names map to the runtime's,
    and how URLs are read (defaults when None)."""

    target: Targets = "all"
    deep: bool = False
    name_mapper: NameMapper | None = None
    remote: RemoteOptions | None = None


DEFAULTS = CheckOptions()
"""Every runtime, the header only, names as stored, URLs read with the default options."""

_RULES_LOCK = threading.Lock()
"""The rules share process-wide caches (the signature memo) not written for concurrent use:
checkpoints open concurrently (``check --recursive --jobs``), and are judged one at a time."""

_LEFT: list[Checkpoint] = []
"""Checkpoints left for the OS to reclaim when the process ends right after their report."""


def build_report(source: Paths | Group, options: CheckOptions = DEFAULTS, exiting: bool = False) -> Report:
    """Open ``source`` (paths, or a ``Group`` of a folder), judge it and return its ``Report``.

    A file whose header cannot be read is reported (a C009 finding, and what each runtime
    raises), not refused; input that cannot be opened at all raises ``InputError``
    (``SeparateCheckpoints`` for a folder of several checkpoints), an unknown target
    ``ValueError``.  A header parse creates thousands of small objects that all live until the
    check ends: the cyclic GC would only rescan them, so it pauses while the report is built.
    ``exiting``: the process ends right after this report (the command line), so the GC stays
    off and the checkpoint's objects are left for the OS to reclaim."""
    parse_targets(options.target)
    paused = gc.isenabled() and not exiting
    gc.disable()
    try:
        ckpt = open_source(source, options)
        try:
            with _RULES_LOCK:
                return check_checkpoint(ckpt, target=options.target, deep=options.deep)
        finally:
            ckpt.close()
            if exiting:
                _LEFT.append(ckpt)
    finally:
        if paused:
            gc.enable()


def open_source(source: Paths | Group, options: CheckOptions = DEFAULTS) -> Checkpoint:
    """Open paths or a group for a check: a file whose header cannot be read opens as a shard
    with a C009 finding, and a file of another container (GGUF) as its safetensors view."""
    if isinstance(source, Group):
        return open_group(source, name_mapper=options.name_mapper, remote=options.remote, damaged_ok=True)
    return open_any(source, name_mapper=options.name_mapper, remote=options.remote, damaged_ok=True)


def open_group(
    grp: Group, name_mapper: NameMapper | None = None, remote: RemoteOptions | None = None, damaged_ok: bool = False
) -> Checkpoint:
    """Open one group as a checkpoint (``check`` and ``inspect`` of separate checkpoints, and
    ``--recursive``); its one-line error as an InputError. ``damaged_ok``: a file whose header
    cannot be read is a shard with a C009 finding (``check`` reports it)."""
    if grp.error:
        raise InputError(grp.error)
    if not any(is_url(p) for p in grp.paths):
        if grp.kind == "file":  # maybe a file of another container (GGUF): its own reader
            return open_any(grp.paths, name_mapper=name_mapper, shardset=grp.shardset(), damaged_ok=damaged_ok)
        return open_checkpoint(grp.paths, name_mapper=name_mapper, shardset=grp.shardset(), damaged_ok=damaged_ok)
    ckpt = open_checkpoint(grp.paths, name_mapper=name_mapper, remote=remote, damaged_ok=damaged_ok)
    for m in grp.missing:  # a remote folder's <stem>-<i>-of-<n> files without number i
        ckpt.findings.append(
            Finding(
                "C011",
                f"shard {m} is missing (the shard names count {len(grp.paths) + len(grp.missing)} files)",
                expected=m,
                actual="no such file",
                cause="incomplete download or copy",
                fix="download the missing shard",
                file=m,
            )
        )
    return ckpt


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
    return build_report(paths, CheckOptions(target, deep, name_mapper))
