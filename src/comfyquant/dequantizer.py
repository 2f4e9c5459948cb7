"""Stream a quantized checkpoint into a dense one, one layer at a time.

The checkpoint is checked first (``comfyquant.check`` with comfy-kitchen's rules, whose
arithmetic the codecs reproduce); any error refuses the whole run with the finding's message,
so nothing is ever decoded from tensors that contradict their marker.  Then every output file
is planned from the headers alone (names, dtypes, shapes), refused at once if it cannot fit on
its filesystem, and written by ``comfyquant.io.writer.write_safetensors`` to a temporary
file (fsynced); the written headers are re-read and checked, and only then are all files
renamed into place (a failure anywhere leaves no output file, not even of another shard).

* A quantized layer's ``weight`` becomes the dense weight, decoded in row blocks while it is
  written; its quantization-only tensors (scales, codebooks, corrections, ...) and markers are
  dropped.  Peak memory is one layer's packed tensors plus one block, never the file -- except
  for layers whose decode is one float GEMM over the layer in comfy-kitchen (ConvRot
  un-rotations other than W4A8's exact BF16 case, the SVDQuant low-rank term): their rounding
  is comfy-kitchen's only on the same operands, so such a layer is computed whole (two F32
  copies of it at the peak, as in comfy-kitchen) and then written in blocks.
* Every other tensor (biases, norms, embeddings, unquantized layers) is copied byte for byte:
  by the kernel (``copy_file_range``) from local files, in bounded chunks otherwise.
* One decode thread per output file reads and decodes its layers in file order, a block
  ahead of the writer (the next layer's read and first blocks overlap the end of this one);
  the writer puts the bytes on disk with ``O_DIRECT`` where the filesystem allows
  (``comfyquant.io.direct``: a buffered ``write`` cost as much CPU as the FP8 decode).
* A weight without a marker of its own in a file whose ``quant_format`` SGLang honours
  (``mxfp8``, read by SGLang 0.5.23 ``inspect_comfy_quant_markers``) is decoded with the marker
  SGLang gives it (``comfyquant.markers.file_level_markers``); ComfyUI and comfy-kitchen
  never read the key.
* ``__metadata__`` is kept, minus the marker map ``_quantization_metadata`` and SGLang's
  ``quant_format``, which would describe tensors that no longer exist.

Output: one ``.safetensors`` file, or a folder that keeps the input's sharding (same shard
names, plus a rebuilt ``*.safetensors.index.json``).  The input is never overwritten.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import ComfyQuantError, InputError, option
from .io.outputs import claim
from .markers import DROP_METADATA
from .naming import printable
from .units import human_size

if TYPE_CHECKING:
    from .checkpoint import Paths

ALIGN = 64
"""Byte alignment of each packed tensor in the reused read buffer."""
OUTPUT_DTYPES = ("bf16", "f16", "f32")


class DequantizeError(ComfyQuantError):
    """The checkpoint cannot be dequantized; the message names the layer or file."""


@dataclass
class Summary:
    """What a dequantize run did."""

    inputs: list[str]
    outputs: list[str]
    dtype: str | None
    layers: dict[str, int] = field(default_factory=dict)
    """Decoded layers per format."""
    copied: int = 0
    dropped: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    seconds: float = 0.0
    """Time of the run itself, after ``startup``."""
    startup: float = 0.0
    """Time to import torch and the codecs (paid once per process, before the run)."""
    largest_layer: tuple[str, int] = ("", 0)
    """(name, dense bytes) of the largest decoded weight."""
    overflowed: dict[str, int] = field(default_factory=dict)
    """Layers decoded to F16 with values beyond its range (written as +-inf): layer -> count."""

    def __repr__(self) -> str:
        formats = ", ".join(f"{f} x{n}" for f, n in sorted(self.layers.items())) or "none"
        return (
            f"Summary({self.inputs} -> {self.outputs}, {sum(self.layers.values())} layers decoded ({formats}) "
            f"to {self.dtype or 'each layer model dtype'}, {self.copied} copied, {self.dropped} dropped)"
        )

    def to_dict(self) -> dict:
        return {
            "inputs": self.inputs,
            "outputs": self.outputs,
            "dtype": self.dtype,
            "layers": dict(self.layers),
            "copied": self.copied,
            "dropped": self.dropped,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "seconds": round(self.seconds, 3),
            "startup_seconds": round(self.startup, 3),
            "largest_layer": {"name": self.largest_layer[0], "bytes": self.largest_layer[1]},
            "overflowed": dict(self.overflowed),
        }

    def render(self) -> str:
        decoded = sum(self.layers.values())
        formats = ", ".join(f"{n} {f}" for f, n in sorted(self.layers.items())) or "none"
        mb = self.bytes_read / 1e6
        rate = mb / self.seconds if self.seconds > 0 else 0.0
        lines = [
            f"dequantized {decoded} layer{'s' * (decoded != 1)} ({formats}) to {self.dtype or 'the model dtype of each layer'}",
            f"copied {self.copied} tensor{'s' * (self.copied != 1)} unchanged, dropped {self.dropped} "
            "quantization-only tensors and markers",
            f"read {human_size(self.bytes_read)}, wrote {human_size(self.bytes_written)} in {self.seconds:.1f} s "
            f"({rate:.1f} MB/s of input)" + (f", after {self.startup:.1f} s loading torch" if self.startup >= 0.05 else ""),
        ]
        if self.overflowed:
            worst = max(self.overflowed, key=self.overflowed.get)
            total = sum(self.overflowed.values())
            lines.append(
                f"warning: {total} value{'s' * (total != 1)} in {len(self.overflowed)} layer"
                f"{'s' * (len(self.overflowed) != 1)} exceed F16's range and were written as +-inf "
                f"(most: {worst}, {self.overflowed[worst]}); use {option('--dtype', 'dtype=')} bf16 or f32"
            )
        lines += [f"wrote {p}" for p in self.outputs]
        return "\n".join(printable(line) for line in lines)  # lines quote names from the file


class DecodedLayer:
    """A layer to decode: its codec, validated plan, output dtype and input entries (also what
    ``compare`` decodes)."""

    __slots__ = ("name", "codec", "plan", "dtype", "entries", "drop", "shape", "per_expert")

    def __init__(self, name, codec, plan, dtype, entries, drop, layer=None) -> None:
        self.name = name
        self.codec = codec
        self.plan = plan
        self.dtype = dtype
        self.entries = entries
        self.drop = drop
        n, k = plan.shape
        self.shape = (n, k)
        """The dense weight's shape: a MoE bank's is [E, out, K], as the bank stores it."""
        self.per_expert = None
        """For a stacked bank, each expert's input entries (decoded one expert after another)."""
        bank = layer.bank if layer is not None else None
        if bank is not None and bank.layout == "rows":
            self.shape = (bank.experts, n // bank.experts, k)
        elif bank is not None:
            from .checkpoint import expert_entry

            self.shape = (bank.experts, n, k)
            self.per_expert = [
                {s: expert_entry(e, bank.experts, i) for s, e in layer.stored.items()} for i in range(bank.experts)
            ]

    @property
    def nbytes(self) -> int:
        """Bytes of the dense weight written for this layer."""
        return math.prod(self.shape) * self.dtype.itemsize


def dequantize(
    src: Paths, out: str | None = None, dtype: str | None = None, *, progress: bool | None = None, overwrite: bool = False
) -> Summary:
    """Write a dense copy of the checkpoint ``src`` (file, shards, folder or index) to ``out``.

    ``out`` ending in ``.safetensors`` is one file; anything else is a folder keeping the
    input's shards.  ``dtype`` (``bf16``/``f16``/``f32``) sets every dense weight's dtype;
    by default each layer gets its model dtype (marker ``orig_dtype``, else its bias's dtype,
    else BF16).  ``progress`` shows a progress bar on stderr (default: when it is a terminal).
    An existing folder ``out`` receives the outputs under the input files' names; no ``out``:
    ``<name>.dense.safetensors`` next to the input (``<folder>.dense`` for shards).  An existing
    output file is replaced only with ``overwrite=True``, an input never
    (``comfyquant.io.outputs``).
    """
    from .gate import open_input

    if dtype is not None and dtype not in OUTPUT_DTYPES:
        raise DequantizeError(f"{option('--dtype', 'dtype')} must be one of {', '.join(OUTPUT_DTYPES)}, got {dtype!r}")
    t = time.perf_counter()
    _load_modules()  # torch and the modules a run uses: the start-up, timed apart from the run
    startup = time.perf_counter() - t
    started = time.perf_counter()
    with open_input(src, "dequantize", DequantizeError) as (_stored, ckpt):  # the gate every decoding command shares
        from .markers import file_level_markers

        layers = plan_layers(ckpt, dtype, file_level_markers(ckpt))
        files, index_dest = _plan_outputs(ckpt, out, overwrite)
        summary = Summary(list(ckpt.paths), [p for p, _, _ in files], dtype)
        work = _Work(ckpt, layers, summary)
        _ensure_space(work, files)
        total = sum(e.nbytes for e in ckpt.tensors.values())
        temps: list[str] = []
        from .numerics.pages import reused_outputs

        try:
            # Layer after layer, a decode's large temporaries (a one-GEMM layer's F32 operand
            # and product, its rounded copy, the block buffers) reuse the memory of the last
            # ones instead of fresh pages the kernel must fault in and zero.
            with _progress(progress, total) as bar, reused_outputs():
                work.bar = bar.add
                from .io.writer import data_offsets, write_safetensors

                for path, source, names in files:
                    tensors, metadata = work.output(names, _metadata(ckpt, source))
                    work.start(names, data_offsets(tensors, metadata))
                    try:
                        temps.append(write_safetensors(path, tensors, metadata, commit=False, direct=True))
                    except OSError as exc:
                        raise DequantizeError(f"{path}: cannot write ({exc.strerror or exc}); nothing was written") from None
                    finally:
                        work.stop()
                    work.settle()
            _verify_output(temps, files, work)
            staged = list(zip(temps, [path for path, _, _ in files]))
            if index_dest:  # staged too, and committed with the shards: all of them or none
                staged.append((_stage_index(index_dest, files, work.sizes, ckpt.shardset.index_path), index_dest))
                temps.append(staged[-1][0])
            _commit(staged, temps)
        finally:
            from .io.writer import discard

            for t in temps:
                discard(t)
    summary.layers = dict(sorted(work.formats.items()))
    summary.seconds = time.perf_counter() - started
    summary.startup = startup
    return summary


def _load_modules() -> None:
    """Import what a run needs: torch and the codecs (most of the start-up), and the modules
    the run imports lazily (the checker, the writer...: 0.04 s from compiled files, 0.2 s when
    Python may not write them), so that the run's seconds are the run's."""
    import importlib

    for name in (
        "formats.codec",
        "codecs",
        "dialects.containers",
        "dialects.view",
        "gate",
        "markers",
        "checker.run",
        "checkpoint",
        "io.shards",
        "io.writer",
        "io.direct",
        "io.copying",
        "numerics.dtypes",
        "numerics.rows",
    ):
        importlib.import_module(f"{__package__}.{name}")


# -- checking and planning --------------------------------------------------------------------


def plan_layers(
    ckpt, dtype, implied: dict[str, dict], verb: str = "dequantize", error: type[ComfyQuantError] = DequantizeError
) -> dict[str, DecodedLayer]:
    """Validated decode plans for every marked layer, keyed by the weight tensor's name.  A
    layer without a marker of its own is decoded with the marker the file's ``quant_format``
    implies (``implied``), if any.  ``verb``/``error``: how a refusal reads and what it raises
    (``compare`` plans its inputs' layers with this too)."""
    from . import codecs
    from .formats.codec import CodecError
    from .formats.registry import FORMATS

    out: dict[str, DecodedLayer] = {}
    for prefix, layer in ckpt.layers.items():
        marker = layer.marker if layer.marker is not None else implied.get(prefix)
        if marker is None or layer.weight is None:
            continue
        fmt = layer.format_name if layer.marker is not None else marker["format"]
        if not fmt or not codecs.has(fmt):
            raise error(f"refusing to {verb}: layer {prefix!r} has format {fmt!r}, which has no decoder")
        codec = codecs.get(fmt)
        entries = dict(layer.tensors)
        try:
            plan = codec.plan(entries, marker, prefix)
            out_dtype = codec.output_dtype(dtype, entries, plan.marker)
        except (CodecError, ValueError) as exc:
            why = (
                ""
                if layer.marker is not None
                else f" (it has no marker: the file's quant_format makes it {fmt}, as SGLang reads it)"
            )
            raise error(f"refusing to {verb}: {exc}{why}") from None
        drop = {s.suffix for s in FORMATS[fmt].slots} - {"weight", "bias"}
        drop.add("comfy_quant")
        out[layer.weight.name] = DecodedLayer(prefix, codec, plan, out_dtype, entries, drop, layer)
    return out


def _plan_outputs(ckpt, out: str | None, overwrite: bool) -> tuple[list[tuple[str, str | None, list[str]]], str | None]:
    """(output path, input file or None for all, tensor names in file order) per output file,
    and the index's path (shards kept as shards).  ``comfyquant.io.outputs.claim`` refuses."""
    per_file = []
    for h in ckpt.headers:
        names = sorted((n for n, e in h.tensors.items() if ckpt.tensors.get(n) is e), key=lambda n: h.tensors[n].start)
        per_file.append((h.file, names))
    dest = claim(
        list(ckpt.files),
        ckpt.shardset.index_path,
        out,
        overwrite=overwrite,
        tag="dense",
        merge=True,
        index_for_shards="model.safetensors.index.json",
        error=DequantizeError,
    )
    dests = dest.files
    if dests is None:
        files = [(dest.merged, None, [n for _, names in per_file for n in names])]
    else:
        dest_of = dict(zip(ckpt.files, dests))
        files = [(dest_of[f], f, names) for f, names in per_file]
    dest.make_folder()
    return files, dest.index


def _metadata(ckpt, source: str | None) -> dict[str, str]:
    """The input's metadata (one shard's, or all shards' merged) without the marker keys."""
    meta = ckpt.metadata(source) if source is not None else ckpt.metadata()
    return {k: v for k, v in meta.items() if k not in DROP_METADATA}


def _ensure_space(work, files: list) -> None:
    """Refuse at once when the dense output cannot fit: its tensor bytes are known from the
    plan (the writer checks each file again, header included, before writing it)."""
    from .io.writer import NoSpace, ensure_space

    needs = [(os.path.dirname(os.path.abspath(path)), work.planned_bytes(names)) for path, _source, names in files]
    try:
        ensure_space(needs)
    except NoSpace as exc:
        where = files[0][0] if len(files) == 1 else os.path.dirname(os.path.abspath(files[0][0]))
        raise DequantizeError(f"{where}: cannot write ({exc.strerror}); nothing was written") from None


def _verify_output(temps: list[str], files: list, work) -> None:
    """Re-read the written headers before anything is renamed into place: every planned tensor
    is there with the planned size, and the container passes the checker (no errors)."""
    from .checker.run import check_checkpoint
    from .checkpoint import open_checkpoint
    from .io.shards import ShardSet

    with open_checkpoint(temps, shardset=ShardSet(files=list(temps))) as out:
        for (path, _source, names), temp in zip(files, temps):
            written = {n: e for n, e in out.tensors.items() if e.file == temp}
            planned = {n for n in names if n in work.sizes}
            wrong = [n for n in planned if n not in written or written[n].nbytes != work.sizes[n]]
            if wrong or len(written) != len(planned):
                raise DequantizeError(
                    f"{path}: the written file does not hold the planned tensors "
                    f"(first: {(wrong or sorted(set(written) - planned))[0]!r}); nothing was "
                    "written (please report this)"
                )
        report = check_checkpoint(out, target="comfy-kitchen")
    errors = [f for f in report.findings if f.severity == "error"]
    if errors:
        raise DequantizeError(
            f"the written output fails check: {errors[0].message} [{errors[0].code}]; nothing was written (please report this)"
        )


def _commit(staged: list[tuple[str, str]], pending: list[str]) -> None:
    """Rename each staged ``(temporary file, destination)`` into place; ``pending`` loses each
    one committed (what is left there is discarded by the caller)."""
    from .io.writer import commit_file

    for temp, path in staged:
        commit_file(temp, path)
        pending.remove(temp)


def _stage_index(path: str, files: list, sizes: dict[str, int], previous: str | None) -> str:
    """The shards' index (tensor -> file) staged by the one index writer: the input index's
    metadata kept, ``total_size`` the dense tensors' bytes."""
    from .io.index import write_index

    weight_map = {n: os.path.basename(p) for p, _, names in files for n in names if n in sizes}
    return write_index(weight_map, path, previous, total_size=sum(sizes.values()), commit=False)


# -- streaming --------------------------------------------------------------------------------


class _Work:
    """Builds each output file's tensor table with lazy data and keeps the counts."""

    def __init__(self, ckpt, layers: dict[str, DecodedLayer], summary: Summary) -> None:
        self.ckpt = ckpt
        self.layers = layers
        self.summary = summary
        self.bar = None
        self.pending = 0
        """Bytes of kernel-copied tensors not yet shown on the progress bar."""
        self.formats: dict[str, int] = {}
        self.sizes: dict[str, int] = {}
        self.dropped_names = set()
        for layer in layers.values():
            for suffix, e in layer.entries.items():
                if suffix in layer.drop:
                    self.dropped_names.add(e.name)
        self.largest = max((sum(_aligned(e.nbytes) for e in packed_entries(x)) for x in layers.values()), default=0)
        self.buffer = bytearray()
        """Read buffer for the packed tensors of one layer that are not mapped, reused (see
        ``_read``)."""

    def _dropped(self, name: str) -> bool:
        """A marker or a quantization-only tensor: not written to the dense output."""
        return name in self.dropped_names or name.endswith(".comfy_quant")

    def planned_bytes(self, names: list[str]) -> int:
        """Tensor bytes ``output`` will write for ``names``."""
        return sum(
            self.layers[n].nbytes if n in self.layers else 0 if self._dropped(n) else self.ckpt.tensors[n].nbytes for n in names
        )

    def output(self, names: list[str], metadata: dict) -> tuple[dict, dict]:
        from .io.copying import copy_range
        from .numerics.dtypes import dtype_name

        tensors: dict = {}
        for name in names:
            entry = self.ckpt.tensors[name]
            layer = self.layers.get(name)
            if layer is not None:
                nbytes = layer.nbytes
                tensors[name] = (dtype_name(layer.dtype), layer.shape, self._decoder(layer))
                self.sizes[name] = nbytes
                if nbytes > self.summary.largest_layer[1]:
                    self.summary.largest_layer = (layer.name, nbytes)
            elif self._dropped(name):
                self.summary.dropped += 1
                self._advance(entry.nbytes)
            else:
                # untouched: copied by the kernel (copy_file_range) when the input is a local file
                tensors[name] = (entry.dtype, entry.shape, copy_range(self.ckpt.source(entry.file), entry.start, entry.nbytes))
                self.sizes[name] = entry.nbytes
                self.summary.copied += 1
                self.summary.bytes_written += entry.nbytes
                self.pending += entry.nbytes
        return tensors, metadata

    def _read(self, entries: list) -> dict:
        """The layer's packed tensors.  From local files the large ones are mapped from the page
        cache (``mapped``: no copy on the decoder's path;
        each mapping goes with the layer's tensors) and the rest are read into one buffer
        reused by every layer (no fresh allocation per layer); remote sources coalesce their
        reads instead.  Safe to reuse: a layer's blocks are all decoded and written before
        the next layer is read."""
        sources = [self.ckpt.source(e.file) for e in entries]
        if not all(hasattr(src, "readinto") for src in sources):
            return self.ckpt.read_many(entries)
        out = mapped_entries(self.ckpt, entries, DequantizeError)
        rest = [(e, src) for e, src in zip(entries, sources) if e.name not in out]
        spans, total = [], 0
        for e, _src in rest:
            spans.append(total)
            total += _aligned(e.nbytes)
        if len(self.buffer) < total:
            from .numerics.pages import byte_buffer

            self.buffer = bytearray()  # the old one goes first
            # nothing mapped (a filesystem without mmap): at once for the largest layer
            self.buffer = byte_buffer(total if out else max(total, self.largest))
        view = memoryview(self.buffer)
        for (e, src), at in zip(rest, spans):
            part = view[at : at + e.nbytes]
            if src.readinto(e.start, part) != e.nbytes:
                raise DequantizeError(f"{e.file}: file ended early while reading tensor {e.name!r} (truncated?)")
            out[e.name] = part
        return out

    def _advance(self, n: int) -> None:
        self.summary.bytes_read += n
        if self.bar is not None:
            self.bar(n)

    def settle(self) -> None:
        """Account the copies written since the last decoded layer (the kernel did them)."""
        if self.pending:
            self._advance(self.pending)
            self.pending = 0

    # -- the decode thread ----------------------------------------------------------------------
    # One thread per output file reads and decodes its layers in file order (``_produce``),
    # at most AHEAD blocks ahead of the writer; each layer's ``chunks`` takes its blocks from
    # it.  Reading and decoding the next layer so overlap writing the end of this one (and the
    # kernel copies between them), instead of the writer waiting at every layer.

    def start(self, names: list[str], offsets: dict[str, int] | None = None) -> None:
        """Decode the layers among ``names`` (one output file's tensors, in file order) in a
        thread, as the writer asks for them; ``stop`` ends it.  ``offsets``: where each
        tensor starts in the output file -- blocks are placed in memory for the writer's
        ``O_DIRECT`` writes from where they are (``iter_decode``'s ``phase``)."""
        self.stop()
        order = [self.layers[n] for n in names if n in self.layers]
        self._offsets = {id(self.layers[n]): at for n, at in (offsets or {}).items() if n in self.layers}
        self._done = -1
        self._turn = threading.Condition()
        self._closing = False
        self._items = decoded_ahead(self._produce(order), AHEAD) if order else None

    def stop(self) -> None:
        """Stop the decode thread (after the file, or at an error) and wait for it."""
        items, self._items = getattr(self, "_items", None), None
        if items is not None:
            with self._turn:
                self._closing = True
                self._turn.notify_all()
            items.close()

    def _produce(self, order: list[DecodedLayer]) -> Iterator[tuple]:
        """(layer, kind, value) items: ``read`` (bytes read), ``block`` (a decoded row block
        and its count of infinities for an F16 output), ``blocks`` (a list of those: a layer
        decoded by one GEMM, rounded whole), ``end``.  Runs in the decode thread."""
        import torch

        from .numerics.dtypes import from_bytes
        from .numerics.pages import PAGE
        from .numerics.rows import release_memory

        held = False
        for i, layer in enumerate(order):
            if held:
                # The last layer's blocks are slices of its whole decoded layer (an F32 output of
                # a one-GEMM layer): let the writer finish them before decoding the next one, so
                # that two such layers are never held at once.
                with self._turn:
                    while self._done < i - 1 and not self._closing:
                        self._turn.wait(0.05)
            f16 = layer.dtype == torch.float16  # the only output dtype narrower than the decoders' F32 arithmetic
            at = self._offsets.get(id(layer))
            phase = None if at is None or layer.per_expert else at % PAGE
            held, largest = False, 0
            for entries in layer.per_expert or (layer.entries,):
                needed = packed_entries(layer, entries)
                raw = self._read(needed)
                tensors = {s: from_bytes(raw[e.name], e.dtype, e.shape) for s, e in entries.items() if e.name in raw}
                yield layer, "read", sum(e.nbytes for e in needed)
                if (
                    layer.per_expert is None
                    and layer.dtype != torch.float32
                    and layer.codec.decodes_whole(tensors, layer.plan, layer.dtype)
                ):
                    # One GEMM over the layer (comfy-kitchen's), rounded to the output dtype
                    # whole, its F32 operand and product freed: the blocks (slices of it) go to
                    # the writer as one item, so this thread reads and un-rotates the next
                    # layer while this one is written, instead of after its last block.
                    blocks = list(
                        layer.codec.iter_decode(
                            tensors, layer.plan.marker, dtype=layer.dtype, plan=layer.plan, round_whole=True, phase=phase
                        )
                    )
                    yield layer, "blocks", [(b, int(torch.isinf(b).sum()) if f16 else 0) for b in blocks]
                    del blocks, tensors, raw
                    continue
                for block in layer.codec.iter_decode(
                    tensors, layer.plan.marker, dtype=layer.dtype, plan=layer.plan, buffers=AHEAD + 2, phase=phase
                ):
                    if self._in_buffer(block):  # a view of the packed input: the next read overwrites it
                        block = block.clone()
                    largest = max(largest, block.nbytes)
                    held = held or block.untyped_storage().nbytes() > 2 * largest
                    yield layer, "block", (block, int(torch.isinf(block).sum()) if f16 else 0)
                del tensors, raw
            # Each format's decoder leaves temporaries of its own sizes in the heap; without a
            # trim they add up layer after layer (measured: +150 MB over six formats).  Between
            # layers of one format and dtype the heap is kept: the next layer reuses the same
            # temporaries instead of faulting them in again (a file of four W4A8 layers:
            # 37-40k -> 27-29k page faults, 5-10% of the run).
            following = order[i + 1] if i + 1 < len(order) else None
            if following is None or _decoder_kind(following) != _decoder_kind(layer):
                release_memory()
            yield layer, "end", None

    def _in_buffer(self, block) -> bool:
        """Whether ``block``'s memory lies in the reused read buffer."""
        if not self.buffer:
            return False
        import ctypes

        start = ctypes.addressof(ctypes.c_char.from_buffer(self.buffer))
        at = block.untyped_storage().data_ptr()
        return start <= at < start + len(self.buffer)

    def _next(self, layer: DecodedLayer) -> tuple[str, object]:
        from .formats.codec import CodecError

        try:
            got, kind, value = next(self._items)
        except CodecError as exc:
            raise DequantizeError(f"cannot decode: {exc}") from None
        if got is not layer:  # the writer asks for the tensors in the order given
            raise RuntimeError(f"decoded {got.name!r} while writing {layer.name!r}")
        return kind, value

    def _decoder(self, layer: DecodedLayer):
        def chunks():
            from .numerics.dtypes import to_bytes

            self.settle()
            while True:
                kind, value = self._next(layer)
                if kind == "end":
                    break
                if kind == "read":
                    self._advance(value)
                    continue
                for block, inf in value if kind == "blocks" else [value]:
                    if inf:
                        self.summary.overflowed[layer.name] = self.summary.overflowed.get(layer.name, 0) + inf
                    data = to_bytes(block)
                    self.summary.bytes_written += len(data)
                    yield data
                value = None  # a whole layer's blocks go as soon as they are written
            fmt = layer.plan.marker.get("format")
            self.formats[fmt] = self.formats.get(fmt, 0) + 1
            with self._turn:
                self._done += 1
                self._turn.notify_all()

        return chunks


MAP_MIN = 1 << 20
"""Packed tensors from this size are mapped from a local file rather than read (see
``_Work._read``); smaller ones are not worth a mapping each."""

AHEAD = 2
"""Blocks decoded ahead of the one being written (``decoded_ahead``): with AHEAD in the
queue and one being decoded, ``iter_decode`` needs ``AHEAD + 2`` buffers."""


def decoded_ahead(blocks: Iterator, ahead: int = AHEAD) -> Iterator:
    """The items of ``blocks``, produced in a worker thread up to ``ahead`` (+ the one in
    progress) before the consumer asks for them.

    Decoding (torch, which releases the GIL) then overlaps writing the previous block (a
    ``write`` system call, which does too): a layer takes about the longer of the two
    instead of their sum.  The order is kept and an exception of the producer is raised
    here, at the item it stopped at; if the consumer stops early (an error while writing),
    the worker is told to stop and joined before this returns."""
    items: queue.Queue = queue.Queue(maxsize=ahead)
    stop = threading.Event()
    done = object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for block in blocks:
                if not put((block, None)):
                    return
            put((done, None))
        except BaseException as exc:  # handed to the consumer, raised there
            put((done, exc))

    worker = threading.Thread(target=work, name="comfyquant-decode", daemon=True)
    worker.start()
    try:
        while True:
            block, exc = items.get()
            if block is done:
                if exc is not None:
                    raise exc
                return
            yield block
    finally:
        stop.set()
        worker.join()


def mapped_entries(ckpt, entries: list, error: type[Exception]) -> dict:
    """The entries of ``MAP_MIN`` bytes or more that local files can map from the page
    cache (``mapped``), by name: the caller reads the
    others.  A file truncated since it was checked raises ``error`` naming the tensor."""
    out = {}
    for e in entries:
        src = ckpt.source(e.file)
        if e.nbytes >= MAP_MIN and hasattr(src, "mapped"):
            try:
                view = src.mapped(e.start, e.nbytes)
            except InputError as exc:
                raise error(f"{exc} -- while reading tensor {e.name!r}") from None
            if view is not None:
                out[e.name] = view
    return out


def _decoder_kind(layer: DecodedLayer) -> tuple:
    """What decides a layer's decode temporaries: its format and output dtype."""
    return layer.plan.marker.get("format"), layer.dtype


def packed_entries(layer: DecodedLayer, entries: dict | None = None) -> list:
    """The input entries a layer's decoder reads (of one expert, for a stacked MoE bank): the
    weight and its quantization-only tensors."""
    return [e for s, e in (entries or layer.entries).items() if s in layer.drop or s == "weight"]


def _aligned(nbytes: int) -> int:
    """Bytes a tensor takes in the read buffer: every tensor starts aligned for any dtype view."""
    return -(-nbytes // ALIGN) * ALIGN


def _progress(enabled: bool | None, total: int):
    """dequantize's progress over input bytes: the progress line every long command draws."""
    from .io.progress import Progress

    return Progress(0, total, enabled, label="dequantize")
