"""What every codec shares: validation against the format description, dtypes, row chunking.

A codec knows arithmetic only.  Which tensors a layer has, their dtypes and shapes, the marker
keys and the layer geometry (N, K, bit depth, variant) come from the declarative
``Format``; before decoding, the tensors are checked with the
same rules as ``comfyquant check`` (``comfyquant.checker.layers.check_layer``), so a codec
never decodes tensors whose shapes or dtypes contradict the marker.

Encoding, decoding (``Codec.iter_decode``) and, on request, the forward run in row
blocks (``comfyquant.numerics.rows``): every format's rows are independent once the
per-tensor reductions are known, so peak memory is bounded by a block, not by the layer,
and the bits do not change -- except through a float matrix product.

Float GEMMs are where bit-exactness could depend on the CPU: BLAS (MKL, oneDNN) picks its
kernel, and with it the summation order, by the operand shapes, the ISA (AVX2, AVX-512,
AVX512-BF16, AMX) and the thread count; a product over a block of rows can round the last
bit differently from the same product over the whole layer (measured: an F32 ConvRot
un-rotation of an 8-row tail on AVX-512).  So no result here rests on a measured BLAS
behaviour: every float GEMM whose rounding is not provably order-independent is made with
comfy-kitchen's own operands -- same shapes, dtypes and strides, hence the same kernel
whatever the CPU picks.  A decode whose product comfy-kitchen computes over the whole layer
(ConvRot un-rotations, the SVDQuant low-rank term) says so in ``Codec._whole_layer``
and computes the layer in one ``Codec._decode_whole``; its row blocks are then slices of
that result (memory: the dense layer, as in comfy-kitchen).  Where blocks stay, the codec
states why their sums are exact (e.g. W4A8's BF16 un-rotation in ``w4a8``).  INT8 GEMMs
are the runtime's own call in ``Codec.linear`` (``torch._int_mm``, which saturates on CPUs
without VNNI, as the runtime does there) and exact F64 products in the quality report.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Literal

import torch

from ..numerics.dtypes import DENSE, DTYPE_NAMES, OUTPUT_DTYPE_NAMES, parse_float_dtype
from ..numerics.hadamard import is_power_of_4
from ..numerics.pages import PAGE, empty_output, empty_result
from ..numerics.rows import RowSource, Weight, row_blocks, row_ranges
from . import registry
from .base import CodecError, Format, Meta
from .validation import check_layer

Forward = tuple[Literal[True], tuple[torch.Tensor, RowSource]] | tuple[Literal[False], object]
"""A layer's forward prepared once for all row blocks (``Codec._forward``): a float matmul
with the decoded weight (the input and the weight's row source), or the format's own GEMM
(its ``_linear_setup`` state)."""

DEFAULT_BLOCK_ELEMENTS = 1 << 22
"""Elements per decoded row block: 16 MB F32 temporaries, small enough for the allocator to
reuse them from block to block instead of mapping (and page-faulting) fresh memory."""
BLOCK_ARENA_HUGE = 4 << 20
"""Block buffers taking turns (a streaming consumer's) are one allocation, advised onto huge
pages from this size: a layer's buffers are fresh memory (the heap is trimmed between
layers), and 4 KiB faults on 7 x 8 MB per layer were a visible share of dequantize's time."""
ROTATED_BLOCK_ELEMENTS = 1 << 20
"""Elements per decoded row block of a rotated (ConvRot) layer.  Where the un-rotation runs
per block (W4A8's exact BF16 case) its GEMM and the elementwise passes around it stay in
cache with 4 MB blocks (measured at 5120x13824: W4A8 1.7x faster than with 16 MB blocks);
layers un-rotated whole (``Codec._whole_layer``) are only rounded to the output dtype
and handed out in blocks of this size.  Unrotated formats are a little faster with the
larger blocks."""


_UNPREPARED = object()
"""No ``Codec._prepare`` result given: compute it."""


def meta_of(t) -> Meta:
    """A ``Meta`` for a torch tensor, a header ``TensorEntry`` or a ``Meta``."""
    if isinstance(t, torch.Tensor):
        try:
            return Meta(DTYPE_NAMES[t.dtype], tuple(t.shape))
        except KeyError:
            raise CodecError(f"tensor dtype {t.dtype} has no safetensors name") from None
    return Meta(t.dtype, tuple(t.shape))


class Encoded(dict):
    """Tensors by suffix (``weight``, ``weight_scale`` ...) plus the layer's ``marker``."""

    def __init__(self, tensors: dict[str, torch.Tensor], marker: dict) -> None:
        super().__init__(tensors)
        self.marker = marker

    def __repr__(self) -> str:
        shapes = {k: (str(v.dtype).replace("torch.", ""), tuple(v.shape)) for k, v in self.items()}
        return f"Encoded({shapes}, marker={self.marker})"


class Plan:
    """A validated layer: its geometry (``env``), marker parameters and dense output shape."""

    __slots__ = ("name", "env", "marker", "shape")

    def __init__(self, name: str, env: dict, marker: dict, shape: tuple[int, int]) -> None:
        self.name = name
        self.env = env
        self.marker = marker
        self.shape = shape


class Codec:
    """Encode, decode and run one format.  Subclasses implement ``_encode``, ``_decode_rows``,
    ``_linear_setup`` and ``_linear_rows``; everything that touches the format description
    lives here."""

    name: str = ""
    can_encode = True
    model_dtype_scales = False
    """The format stores ``weight_scale`` in the model dtype (AWQ, SVDQuant)."""

    @property
    def format(self) -> Format:
        return registry.FORMATS[self.name]

    # -- validation ---------------------------------------------------------------------------
    def plan(self, tensors: dict, marker: dict | None = None, layer: str | None = None) -> Plan:
        """Check tensors (torch tensors or header entries) against the format; raise on errors."""
        name = layer or "layer"
        marker = dict(marker) if marker is not None else {"format": self.name}
        if marker.get("format", self.name) != self.name:
            raise CodecError(f"{name}: marker format {marker.get('format')!r} given to the {self.name} codec")
        metas = {s: meta_of(t) for s, t in tensors.items()}
        findings, env = check_layer(self.format, marker, metas)
        for f in findings:
            if f.severity == "error" and f.code.startswith("L"):
                raise CodecError(f.message.replace("{layer}", repr(name)))
        if env is None:  # pragma: no cover - geometry failures always come with an L finding
            raise CodecError(f"{name}: cannot infer the {self.name} geometry")
        return Plan(name, env, marker, self.dense_shape(env, marker))

    def output_dtype(self, dtype, tensors: dict, marker: dict) -> torch.dtype:
        """``dtype`` if given, else the layer's model dtype (see ``output_dtype``)."""
        return output_dtype(dtype, tensors, marker, self.model_dtype_scales)

    def _resolve(
        self, tensors: dict, marker: dict | None, layer: str | None, dtype, plan: Plan | None = None
    ) -> tuple[Plan, torch.dtype]:
        """What every public decode starts from: the layer's validated plan (``plan`` when the
        caller holds it) and the dtype it decodes to."""
        plan = plan or self.plan(tensors, marker, layer)
        return plan, self.output_dtype(dtype, tensors, plan.marker)

    def dense_shape(self, env: dict, marker: dict) -> tuple[int, int]:
        """The dense weight's ``[N, K]`` (padded formats override this)."""
        return env["N"], env["K"]

    def _whole_layer(self, env: dict, dtype: torch.dtype, tensors: dict) -> bool:
        """Whether decoding to ``dtype`` needs ``_decode_whole``: a float GEMM that
        comfy-kitchen runs over the whole layer and whose rounding may depend on its row
        count (see the module doc).  Such a layer is decoded in one piece and handed out in
        row blocks (slices) afterwards."""
        return False

    def _decode_whole(self, t: dict, plan: Plan, dtype: torch.dtype, state, out: torch.Tensor | None) -> torch.Tensor:
        """The whole dense layer with comfy-kitchen's operand shapes for every float GEMM (see
        ``_whole_layer``): in ``dtype`` (written into ``out``, ``[N, K]``, when given), or
        in a wider dtype whose rounding to ``dtype`` is elementwise (an F32 product that
        comfy-kitchen then casts): the caller rounds it block by block, so no second copy of
        the layer is made."""
        raise NotImplementedError

    def decode_block_elements(self, env: dict) -> int:
        """Default elements per decoded row block: smaller for layers the format description
        says are rotated (always, or by their ``convrot`` key)."""
        rotation = self.format.rotation
        rotated = rotation == "always" or (rotation == "convrot key" and env.get("convrot") is True)
        return ROTATED_BLOCK_ELEMENTS if rotated else DEFAULT_BLOCK_ELEMENTS

    # -- public API ---------------------------------------------------------------------------
    def encode(self, weight: Weight, *, layer: str | None = None, **params) -> Encoded:
        """Quantize a dense ``[N, K]`` weight as comfy-kitchen's reference quantizer does.

        ``weight`` is a tensor or a ``RowSource``; either is
        processed in row blocks, so memory is the encoded tensors plus a block's temporaries
        (and, for a tensor, the tensor)."""
        name = layer or "layer"
        if not self.can_encode:
            raise CodecError(f"{name}: {self.name} cannot be quantized here (offline calibration only, as in comfy-kitchen)")
        amax = check_dense(weight, name, scan=not self._checks_finite(params))
        full = params.pop("full_precision_matrix_mult", False)
        tensors, marker = self._encode(weight, params, name, amax)
        if full:
            marker["full_precision_matrix_mult"] = True
        return Encoded(tensors, marker)

    def _checks_finite(self, params: dict) -> bool:
        """True when ``_encode`` with these parameters needs no ``max|weight|`` and finds NaN/Inf
        itself, from reductions it computes anyway (row scales: see ``refuse_nonfinite``),
        so the separate pass over the weight can be skipped."""
        return False

    def decode(
        self,
        tensors: dict,
        marker: dict | None = None,
        *,
        dtype=None,
        layer: str | None = None,
        block_elements: int | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The dense weight ``[N, K]`` in ``dtype`` (default: the layer's model dtype).

        ``out``: a contiguous ``[N, K]`` tensor of that dtype to decode into (and return)
        instead of a new one.  A caller that decodes layer after layer into one reused
        buffer skips what a fresh large output costs: new pages the kernel faults in and
        zeroes (see ``pages``).  The bits are the same."""
        plan, dtype = self._resolve(tensors, marker, layer, dtype)
        if out is not None:
            check_destination(out, plan.shape, dtype, plan.name)
        return self._dense(tensors, plan, dtype, block_elements, out=out)

    def row_source(self, tensors: dict, marker: dict | None = None, *, dtype=None, layer: str | None = None) -> RowSource:
        """The dense weight as a ``RowSource``: rows decoded when
        asked for (every pass decodes again), so re-encoding never holds the decoded layer --
        except a layer that decodes whole (``_whole_layer``), which is decoded once and
        held while the source lives."""
        return self._source(tensors, *self._resolve(tensors, marker, layer, dtype))

    def _source(self, tensors: dict, plan: Plan, dtype: torch.dtype, exact: bool = True) -> RowSource:
        """``row_source`` of a validated layer.  A layer that decodes whole
        (``_whole_layer``) is decoded once, on the first read, and its rows are views of
        that dense layer: decoding it again for every block would repeat the layer's GEMM
        per block.  ``exact=False``: every read decodes its rows alone (see
        ``iter_decode``)."""
        if not (exact and self._whole_layer(plan.env, dtype, tensors)):
            # The per-layer work (_prepare: unblocked scales, a scan for NaN codes) is done on
            # the first read and kept: done per read, a layer of B blocks was scanned B times.
            prepared: list = []

            def state():
                if not prepared:
                    prepared.append(self._prepare(tensors, plan.env, dtype))
                return prepared[0]

            return RowSource(
                plan.shape,
                dtype,
                lambda r0, r1: self._dense(tensors, plan, dtype, span=(r0, r1), exact=exact, state=state()),
                lambda r0, r1, dest: self._dense(tensors, plan, dtype, span=(r0, r1), exact=exact, state=state(), out=dest),
            )
        held: list[torch.Tensor] = []

        def read(r0: int, r1: int) -> torch.Tensor:
            if not held:
                held.append(self._dense(tensors, plan, dtype))
            return held[0][r0:r1]

        return RowSource(plan.shape, dtype, read)

    def iter_decode(
        self,
        tensors: dict,
        marker: dict | None = None,
        *,
        plan: Plan | None = None,
        dtype=None,
        layer: str | None = None,
        block_elements: int | None = None,
        exact: bool = True,
        buffers: int = 1,
        round_whole: bool = False,
        phase: int | None = None,
    ) -> Iterator[torch.Tensor]:
        """The dense weight in row blocks of about ``block_elements`` elements.  Blocks take
        turns in ``buffers`` block-sized buffers: a block stays valid while the next
        ``buffers - 1`` are produced (one buffer: use or copy each block before requesting
        the next; more let a consumer write one block while others are decoded).

        ``plan``: the layer's plan (``plan``) when the caller has validated it already: the
        tensors are not checked again, and ``marker`` and ``layer`` go unused.

        ``round_whole``: a layer that decodes in one piece (``decodes_whole``) into a wider
        product is rounded to ``dtype`` whole, its product freed, and its blocks are slices of
        that layer, valid as long as the consumer keeps them (same bits: rounding is
        elementwise).  A streaming writer can then hold one layer in the output dtype while
        the next layer's GEMM runs, instead of the product until its last block is written.

        ``exact=False`` decodes every layer block by block, also those that comfy-kitchen
        computes with one GEMM over the layer (``_whole_layer``): memory then follows a
        block, but such a GEMM over a block may round a last bit differently -- for
        measurements (quantize's error report), never for output.

        ``phase``: the remainder modulo ``PAGE`` of the file
        offset the consumer writes the layer's first byte at.  The block buffers (and a layer
        rounded whole) are then placed so that each block's memory starts at the same offset
        within a page as its bytes in the file, and blocks are whole numbers of pages (rows
        rounded up to the fewest that are; not for a ``K`` that needs more than four blocks'
        worth): an ``O_DIRECT`` writer writes them from where they are instead of copying them
        to aligned memory.  The values are the same."""
        plan, dtype = self._resolve(tensors, marker, layer, dtype, plan)
        yield from self._blocks(
            tensors,
            plan,
            dtype,
            block_elements,
            reuse=max(1, buffers),
            exact=exact,
            round_whole=round_whole,
            phase=phase,
        )

    def decodes_whole(self, tensors: dict, plan: Plan, dtype: torch.dtype) -> bool:
        """Whether the layer decodes to ``dtype`` in one piece: one float GEMM over the layer,
        as comfy-kitchen runs it (``_whole_layer``); its row blocks are slices of it."""
        return self._whole_layer(plan.env, dtype, tensors)

    def _blocks(
        self,
        tensors: dict,
        plan: Plan,
        dtype: torch.dtype,
        block_elements: int | None,
        out: torch.Tensor | None = None,
        reuse: int = 0,
        span: tuple[int, int] | None = None,
        exact: bool = True,
        state: object = _UNPREPARED,
        round_whole: bool = False,
        phase: int | None = None,
    ) -> Iterator[torch.Tensor]:
        """Row blocks of rows ``span`` (default: all), written into ``out`` when given.  With
        ``reuse`` (a count) the blocks take turns in that many block-sized buffers: a
        consumer must use a block before ``reuse`` more are produced (the streaming writer
        does), and memory stays ``reuse`` blocks whatever the layer size.  ``state``: the
        layer's ``_prepare`` result when the caller has it already.  ``phase``: see
        ``iter_decode``."""
        n, k = plan.shape
        start, stop = span or (0, n)
        if state is _UNPREPARED:
            state = self._prepare(tensors, plan.env, dtype)
        size = block_elements or self.decode_block_elements(plan.env)
        per_page = None
        if phase is not None and out is None and phase % dtype.itemsize == 0:
            per_page = page_rows(k, dtype, size)  # blocks of whole pages keep the phase
        phase = phase % PAGE if per_page and phase is not None else None
        ranges = row_ranges(stop - start, k, size, multiple=per_page or 1, join_tail=False)
        if exact and self._whole_layer(plan.env, dtype, tensors):
            # One GEMM over the layer (comfy-kitchen's rounding); blocks are slices of it,
            # rounded to ``dtype`` block by block when the product is wider.
            whole = self._decode_whole(tensors, plan, dtype, state, out if (start, stop) == (0, n) else None)
            if round_whole and out is None and whole.dtype != dtype:
                # rounded into huge pages (a fresh layer-sized output); the wider product is freed here
                whole = empty_output((stop - start, k), dtype, phase=phase).copy_(whole[start:stop])
                start = 0
            if whole.dtype == dtype and out is None or whole is out:
                for r0, r1 in ranges:
                    yield whole[start + r0 : start + r1]
                return
            turns = _buffers(reuse if out is None else 0, ranges, k, dtype, phase)
            for i, (r0, r1) in enumerate(ranges):
                dest = turns[i % len(turns)][: r1 - r0] if turns else out[r0:r1] if out is not None else None
                yield finish(whole[start + r0 : start + r1], dtype, dest)
            return
        turns = _buffers(reuse if out is None else 0, ranges, k, dtype, phase)
        for i, (r0, r1) in enumerate(ranges):
            dest = out[r0:r1] if out is not None else turns[i % len(turns)][: r1 - r0] if turns else None
            yield self._decode_rows(tensors, plan, dtype, start + r0, start + r1, state, dest)

    def _dense(
        self,
        tensors: dict,
        plan: Plan,
        dtype: torch.dtype,
        block_elements: int | None = None,
        span: tuple[int, int] | None = None,
        exact: bool = True,
        state: object = _UNPREPARED,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The dense rows ``span`` (default: the whole weight) of an already validated layer,
        decoded block by block straight into one output tensor (``exact``: see
        ``iter_decode``).  A large output is put on huge pages before it is written, or
        is the memory of the last large result once its caller has let it go
        (``empty_result``): fresh memory, faulted in and zeroed
        by the kernel, made large layers slower per byte than small ones."""
        start, stop = span or (0, plan.shape[0])
        if out is None:
            out = empty_result((stop - start, plan.shape[1]), dtype)
        for _ in self._blocks(tensors, plan, dtype, block_elements, out, span=span, exact=exact, state=state):
            pass
        return out

    def linear(
        self,
        x: torch.Tensor,
        tensors: dict,
        marker: dict | None = None,
        bias: torch.Tensor | None = None,
        *,
        layer: str | None = None,
        block_elements: int | None = None,
    ) -> torch.Tensor:
        """``x @ W.T + bias`` the way the runtime executes the format; output in ``x.dtype``.

        ``bias`` defaults to the layer's own ``bias`` tensor when there is one.  By default the
        weight is used whole: the runtime's one GEMM, bit for bit.  With ``block_elements`` the
        output features are computed in row blocks of the weight of about that many elements
        (the activation is quantized once), so memory follows a block instead of a dequantized
        copy of the layer; integer GEMMs give the same bits (their saturation on CPUs without
        VNNI depends on the operands only: tested under AVX2), float GEMMs over fewer columns
        may round the last bit differently (MKL)."""
        plan = self.plan(tensors, marker, layer)
        if x.dtype not in DENSE:
            raise CodecError(f"{plan.name}: activations must be BF16, F16 or F32, got {x.dtype}")
        n, k = plan.shape
        if x.shape[-1] != k:
            raise CodecError(f"{plan.name}: input has {x.shape[-1]} features, the layer takes K={k}")
        if bias is None:
            bias = tensors.get("bias")
        x2 = x.reshape(-1, k)
        forward = self._forward(x2, tensors, plan, block_elements is None)

        def rows(r0: int, r1: int) -> torch.Tensor:
            return self._forward_rows(forward, tensors, plan, None if bias is None else rows_of(bias, r0, r1), r0, r1)

        if block_elements is None:
            y = rows(0, n)
        else:
            y = torch.empty((x2.shape[0], n), dtype=x.dtype)
            for r0, r1 in row_ranges(n, k, block_elements):
                y[:, r0:r1] = rows(r0, r1)
        return y.reshape(*x.shape[:-1], n)

    def _forward(self, x2: torch.Tensor, tensors: dict, plan: Plan, exact: bool, runtime: bool = True) -> Forward:
        """(dense, state): how the runtime runs this layer on ``x2`` -- a float matmul with the
        decoded weight (``_dense_linear``) or the format's own GEMM (``_linear_rows``)
        -- and the work done once for all row blocks.  ``runtime`` False: exact integer
        products where the runtime's own INT8 GEMM call is not exact on this CPU (see
        ``_linear_setup``)."""
        dense = plan.marker.get("full_precision_matrix_mult") is True or self._runs_dense(tensors)
        if dense:
            return True, self._dense_state(x2, tensors, plan, exact)
        return False, self._linear_setup(x2, tensors, plan, runtime)

    def _forward_rows(
        self, forward: Forward, tensors: dict, plan: Plan, bias: torch.Tensor | None, r0: int, r1: int
    ) -> torch.Tensor:
        """Output features ``r0:r1`` of the forward prepared by ``_forward``."""
        if forward[0]:
            return self._dense_linear(forward[1], bias, r0, r1)
        return self._linear_rows(forward[1], tensors, plan, bias, r0, r1)

    def measure_blocks(
        self,
        tensors: dict,
        x: torch.Tensor,
        marker: dict | None = None,
        *,
        dtype=None,
        layer: str | None = None,
        block_elements: int | None = None,
    ) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
        """One pass for a quality measurement: per row block ``(r0, r1, rows, y)``, the decoded
        rows in ``dtype`` (as ``iter_decode`` with ``exact=False``, in one reused buffer)
        and the runtime's forward of ``x`` ``[M, K]`` over those output features (no bias;
        as ``linear`` with ``block_elements``).  A format whose decode and forward share
        per-block work (W4A8's grid) does it once (``_measure_rows``)."""
        plan = self.plan(tensors, marker, layer)
        dtype = self.output_dtype(dtype, tensors, plan.marker)
        n, k = plan.shape
        if x.dim() != 2 or x.shape[1] != k or x.dtype not in DENSE:
            raise CodecError(f"{plan.name}: input must be [M, {k}] in BF16, F16 or F32, got {list(x.shape)} {x.dtype}")
        forward = self._forward(x, tensors, plan, False, runtime=False)
        state = self._prepare(tensors, plan.env, dtype)
        ranges = row_ranges(n, k, block_elements or self.decode_block_elements(plan.env), join_tail=False)
        turns = _buffers(1, ranges, k, dtype)
        for r0, r1 in ranges:
            rows, y = self._measure_rows(tensors, plan, dtype, r0, r1, state, turns[0][: r1 - r0], forward)
            yield r0, r1, rows, y

    def _measure_rows(
        self, t: dict, plan: Plan, dtype: torch.dtype, r0: int, r1: int, state, out: torch.Tensor, forward: Forward
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoded rows ``r0:r1`` (into ``out``) and their forward columns: by default the two
        separately."""
        return self._decode_rows(t, plan, dtype, r0, r1, state, out), self._forward_rows(forward, t, plan, None, r0, r1)

    def _dense_state(self, x2: torch.Tensor, t: dict, plan: Plan, exact: bool = True) -> tuple[torch.Tensor, RowSource]:
        """The input and the decoded weight (a row source) of ``_dense_linear``; not
        ``exact`` (a blocked forward, see ``linear``), the weight is decoded per block."""
        return x2, self._source(t, plan, x2.dtype, exact)

    @staticmethod
    def _dense_linear(state: tuple[torch.Tensor, RowSource], bias: torch.Tensor | None, r0: int, r1: int) -> torch.Tensor:
        """Output features ``r0:r1`` of a float matmul with the decoded weight (what runtimes do
        for ``full_precision_matrix_mult`` layers and for asymmetric W4A8); ``state`` from
        ``_dense_state``.  Over all rows it is the runtime's one ``F.linear``."""
        x2, weight = state
        return torch.nn.functional.linear(x2, weight.rows(r0, r1), None if bias is None else bias.to(x2.dtype))

    # -- subclass hooks -----------------------------------------------------------------------
    def _encode(self, weight: Weight, params: dict, name: str, amax: torch.Tensor | None) -> tuple[dict, dict]:
        """Tensors and marker; ``amax`` is ``max|weight|`` in the weight's dtype (already known),
        None when ``_checks_finite`` says the encoder finds NaN/Inf itself.
        ``weight`` is read through ``row_blocks``, never whole."""
        raise NotImplementedError

    def _prepare(self, t: dict, env: dict, dtype: torch.dtype) -> object:
        """Per-layer work shared by all row blocks (e.g. unblocking scales)."""
        return None

    def _decode_rows(
        self, t: dict, plan: Plan, dtype: torch.dtype, r0: int, r1: int, state, out: torch.Tensor | None
    ) -> torch.Tensor:
        """Dense rows ``r0:r1`` (columns ``:plan.shape[1]``) in ``dtype``, written into ``out``
        (a ``[r1 - r0, K]`` view of the result) when given; returns them."""
        raise NotImplementedError

    def _runs_dense(self, t: dict) -> bool:
        """Whether the runtime runs this layer as dequantize + float matmul whatever its
        marker says (comfy-kitchen's asymmetric W4A8): ``_dense_linear``."""
        return False

    def _linear_setup(self, x2: torch.Tensor, t: dict, plan: Plan, runtime: bool = True) -> object:
        """The activation side of the forward, done once for all row blocks (rotation,
        quantization) of the 2-D input ``x2``.  ``runtime``: the INT8 GEMM is the runtime's own
        call (``linear``, bit for bit on this CPU), else the exact integer product (the
        quality report: the two differ only on CPUs where that call saturates, see
        ``runtime_int8_matmul``)."""
        raise NotImplementedError

    def _linear_rows(self, state, t: dict, plan: Plan, bias: torch.Tensor | None, r0: int, r1: int) -> torch.Tensor:
        """Output features ``r0:r1`` (``[M, r1 - r0]`` in the input's dtype) from weight rows
        ``r0:r1``; ``bias`` is already sliced to those rows."""
        raise NotImplementedError


def _buffers(
    count: int, ranges: list[tuple[int, int]], k: int, dtype: torch.dtype, phase: int | None = None
) -> list[torch.Tensor]:
    """``count`` buffers of the largest block's shape (none for no blocks), made as the
    blocks need them: a layer of fewer blocks than buffers allocates only what it uses.
    ``phase``: see ``empty_output`` (every buffer keeps it when
    a block's bytes are a whole number of pages)."""
    if not count or not ranges:
        return []
    rows = max(r1 - r0 for r0, r1 in ranges)
    count = min(count, len(ranges))
    if count == 1 and phase is None:
        return [torch.empty((rows, k), dtype=dtype)]
    arena = empty_output((count * rows, k), dtype, least=BLOCK_ARENA_HUGE, phase=phase)
    return [arena[i * rows : (i + 1) * rows] for i in range(count)]


def page_rows(k: int, dtype: torch.dtype, block_elements: int) -> int | None:
    """The fewest rows of ``k`` ``dtype`` elements that make a whole number of memory pages
    (``PAGE``), or None when a block of them would be more than
    four times ``block_elements`` (an odd ``K``): blocks of a multiple of it keep one phase."""
    row_bytes = k * dtype.itemsize
    rows = PAGE // math.gcd(PAGE, row_bytes) if row_bytes else 1
    return rows if rows * k <= 4 * block_elements else None


def check_destination(out, shape: tuple[int, int], dtype: torch.dtype, name: str) -> None:
    """Refuse a decode destination that is not a contiguous ``shape`` tensor of ``dtype``."""
    if not isinstance(out, torch.Tensor):
        raise CodecError(f"{name}: out must be a torch tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or not out.is_contiguous():
        raise CodecError(
            f"{name}: out must be a contiguous {list(shape)} {dtype} tensor, got "
            f"{'a non-contiguous ' if not out.is_contiguous() else ''}{list(out.shape)} {out.dtype}"
        )


def check_dense(weight: Weight, name: str, scan: bool = True) -> torch.Tensor | None:
    """Encode input: a finite 2-D BF16/F16/F32 tensor (or row source).  Returns ``max|weight|``
    (exact, in the weight's dtype), which several quantizers need anyway; with ``scan`` False
    only the type, shape and dtype are checked (None: the encoder checks finiteness itself)."""
    if not isinstance(weight, (torch.Tensor, RowSource)):
        raise CodecError(f"{name}: weight must be a torch tensor, got {type(weight).__name__}")
    if len(weight.shape) != 2:
        raise CodecError(f"{name}: weight must be 2-D [N, K], got shape {tuple(weight.shape)}")
    if weight.dtype not in DENSE:
        raise CodecError(f"{name}: weight must be BF16, F16 or F32, got {weight.dtype}")
    if 0 in weight.shape:
        raise CodecError(f"{name}: weight is empty, shape {tuple(weight.shape)}: there is nothing to quantize")
    if not scan:
        return None
    lo, hi = [], []
    for _r0, _r1, rows in row_blocks(weight):
        a, b = torch.aminmax(rows)  # one pass; NaN and +-Inf show up in the extremes
        lo.append(a)
        hi.append(b)
    low, high = torch.stack(lo).amin(), torch.stack(hi).amax()
    if not (torch.isfinite(low) and torch.isfinite(high)):
        refuse_nonfinite(weight, name)
    return torch.maximum(-low, high)


def refuse_nonfinite(weight: Weight, name: str) -> None:
    """Raise the encode error naming the weight's first NaN/Inf, if it has one.

    Also the check of encoders that skip ``check_dense``'s scan: a NaN or Inf makes its
    row's ``max|row|`` (of the rotated row, for ConvRot: every output of a group that holds
    one is NaN or infinite) non-finite, so they call this when a row scale is; if the weight
    is finite after all (a rotation overflowed), nothing is raised and they go on, as the
    reference quantizer would."""
    found = scan_nonfinite(weight)
    if found is not None:
        count, (r, c), value = found
        raise CodecError(
            f"{name}: weight has {count} NaN/Inf value(s), first at [{r}, {c}] ({value}); quantizing needs finite values"
        )


def scan_nonfinite(weight: Weight) -> tuple[int, tuple[int, int], float] | None:
    """How many values are NaN/Inf, where the first one is and what it is (block by block);
    None when every value is finite."""
    count, first = 0, None
    for r0, _r1, rows in row_blocks(weight):
        bad = ~torch.isfinite(rows)
        found = int(bad.sum())
        if found and first is None:
            r, c = (int(v) for v in bad.nonzero()[0])
            first = ((r0 + r, c), rows[r, c].item())
        count += found
    return None if first is None else (count, *first)


def output_dtype(dtype, tensors: dict, marker: dict, model_dtype_scales: bool = False) -> torch.dtype:
    """The dense dtype: the one asked for, else the layer's model dtype.

    The model dtype is the marker's ``orig_dtype`` (convert_to_quant writes it), else the
    dtype of the bias or of another tensor runtimes keep in the model dtype (NVFP4
    ``pre_quant_scale``, SVDQuant smoothing, AWQ/SVDQuant scales), else BF16."""
    if dtype is not None:
        return parse_float_dtype(dtype)
    orig = marker.get("orig_dtype")
    if isinstance(orig, str) and orig.replace("torch.", "") in OUTPUT_DTYPE_NAMES:
        return OUTPUT_DTYPE_NAMES[orig.replace("torch.", "")]
    scales = DENSE if model_dtype_scales else ()
    for suffix, allowed in (
        ("bias", DENSE),
        ("pre_quant_scale", DENSE),
        ("weight_smooth_factor", DENSE),
        ("weight_scale", scales),
    ):
        d = _dense(tensors.get(suffix))
        if d is not None and d in allowed:
            return d
    return torch.bfloat16


def _dense(t) -> torch.dtype | None:
    d = getattr(t, "dtype", None)
    if isinstance(d, str):
        d = OUTPUT_DTYPE_NAMES.get(d)
    return d if d in DENSE else None


def finish(x: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
    """Round ``x`` to ``dtype`` (ties to even) into ``out``, or into a new tensor."""
    return x.to(dtype) if out is None else out.copy_(x)


def reject_unknown(params: dict, name: str) -> None:
    """Encode parameters left over after a codec took its own: a typo, refused by name."""
    if params:
        raise CodecError(f"{name}: unknown encode parameter(s) {', '.join(sorted(params))}")


def rows_of(t: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    """Rows ``r0:r1`` of a per-row tensor (a no-op view for the whole range)."""
    return t if (r0 == 0 and r1 == t.shape[0]) else t[r0:r1]


def per_row(t: torch.Tensor, rows: int, r0: int, r1: int) -> torch.Tensor:
    """Rows ``r0:r1`` of a scale that is either per tensor (one element, kept) or per row."""
    return t if t.numel() == 1 or t.shape[0] != rows else rows_of(t, r0, r1)


def check_convrot(size, k: int, name: str) -> None:
    """comfy-kitchen's ConvRot preconditions, with its messages (every rotating format's encoder)."""
    if not is_power_of_4(size):
        raise CodecError(f"{name}: Regular Hadamard size must be a power of 4, got {size}")
    if k % size:
        raise CodecError(f"{name}: ConvRot group size {size} does not divide input features {k}")
