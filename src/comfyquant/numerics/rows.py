"""Row blocking: the one way encode, decode, the forward and quantize's quality report split a
``[N, K]`` weight, so that temporaries scale with a block, not with the layer.

Every quantizer and decoder here is row-independent once its per-tensor reductions (a tensor
scale, a codebook) are known, so processing rows in blocks changes nothing but memory -- with
one exception: a float matrix product (the ConvRot rotation) may sum in another order when
its row count changes, on some CPUs even for large blocks (BLAS picks kernels by shape, ISA
and thread count).  So no float GEMM is ever computed over these blocks unless its sums are
provably exact: the rotations run on comfy-kitchen's own operands (the whole layer, or
comfy-kitchen's W4A8 row chunks; ``materialize`` assembles a row source for them) and
only the row-independent work after them is blocked.  Blocks still have at least
``min_rows`` rows (16, and at least ``MIN_BLOCK_ELEMENTS`` elements) unless the
whole tensor is smaller -- a short tail joins the block before it -- which keeps per-block
overhead small; bit-exactness does not rest on it.

A weight need not be in memory at all: a ``RowSource`` hands out rows on demand (read
from the file, or decoded from a quantized layer), so ``quantize`` holds one block of the
source at a time instead of the whole layer; every function here takes either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Literal

import torch

from .pages import empty_result

MIN_BLOCK_ROWS = 16
MIN_BLOCK_ELEMENTS = 1 << 14
"""A block has at least ``MIN_BLOCK_ROWS`` rows and this many elements (64 rows of 256)."""
ENCODE_BLOCK_ELEMENTS = 1 << 19
"""Encoded elements per row block and torch thread (see ``encode_block_elements``)."""
MAX_ENCODE_BLOCK_ELEMENTS = 1 << 22


def min_rows(k: int) -> int:
    """Fewest rows of a block of ``k`` columns (a tensor with fewer rows is one block)."""
    return max(MIN_BLOCK_ROWS, -(-MIN_BLOCK_ELEMENTS // max(k, 1)))


def encode_block_elements() -> int:
    """Elements per encoded row block: ``ENCODE_BLOCK_ELEMENTS`` per torch thread, at
    most ``MAX_ENCODE_BLOCK_ELEMENTS`` (comfy-kitchen's W4A8 chunk).

    The encoders' temporaries are about 20 bytes per element of a block (W4A8), so one
    thread's stay near 10 MB; with more threads each parallel operation gets more work,
    fewer synchronizations per layer (which cost most when the cores are shared), and the
    temporaries of all ``--jobs`` together stay the same."""
    import torch

    return min(MAX_ENCODE_BLOCK_ELEMENTS, ENCODE_BLOCK_ELEMENTS * max(1, torch.get_num_threads()))


def rotation_encode_block_elements() -> int:
    """Elements per row block for encoders that are mostly a rotation GEMM over elementwise
    work with small temporaries (INT8 ConvRot): four times ``encode_block_elements``,
    at most ``MAX_ENCODE_BLOCK_ELEMENTS``.  The GEMM runs faster on larger blocks
    (measured at 5120x13824 with 2 threads: 1M -> 4M elements, 231 -> 218 ms)."""
    return min(MAX_ENCODE_BLOCK_ELEMENTS, 4 * encode_block_elements())


def row_ranges(n: int, k: int, block_elements: int, multiple: int = 1, join_tail: bool = True) -> list[tuple[int, int]]:
    """``[r0, r1)`` blocks covering ``n`` rows of ``k`` columns, about ``block_elements`` each.

    Blocks have at least ``min_rows`` rows and start at multiples of ``multiple``
    (formats that pad rows to 16 or 32 then pad only their last block).  With ``join_tail`` a
    last block shorter than that joins the one before it, so no block is a small-M product;
    without it every block but the last has the nominal size (decoding: its un-rotation of
    dequantized values gives the reference bits for tails of any size, and the streaming
    writer's buffer is one nominal block)."""
    least = min_rows(k)
    rows = max(least, block_elements // max(k, 1))
    rows = -(-rows // multiple) * multiple
    starts = list(range(0, n, rows))
    if join_tail and len(starts) > 1 and n - starts[-1] < least:
        starts.pop()
    return list(zip(starts, starts[1:] + [n]))


class RowSource:
    """A dense ``[N, K]`` weight handed out in row blocks, never held whole.

    ``read(r0, r1)`` returns rows ``r0:r1`` as a tensor of ``dtype``: read from a file or
    decoded, fresh on every call (each pass over the weight reads again), or a view of a
    tensor held anyway (``as_source``).  ``read_into(r0, r1, dest)``, when given, writes
    those rows into ``dest`` (a contiguous ``[r1 - r0, K]`` tensor of ``dtype``) instead:
    a decoder then writes its result where it is wanted, with no block-sized copy."""

    __slots__ = ("shape", "dtype", "_read", "_read_into")

    def __init__(
        self,
        shape: tuple[int, int],
        dtype: torch.dtype,
        read: Callable[[int, int], torch.Tensor],
        read_into: Callable[[int, int, torch.Tensor], object] | None = None,
    ) -> None:
        self.shape = (int(shape[0]), int(shape[1]))
        self.dtype = dtype
        self._read = read
        self._read_into = read_into

    def rows(self, r0: int, r1: int) -> torch.Tensor:
        """Rows ``r0:r1``, shape ``[r1 - r0, K]``."""
        return self._read(r0, r1)

    @property
    def writes_into(self) -> bool:
        """Whether ``rows_into`` writes rows where they are wanted (no block-sized copy):
        a decoder, which splits any range into its own row blocks."""
        return self._read_into is not None

    def rows_into(self, r0: int, r1: int, dest: torch.Tensor) -> torch.Tensor:
        """Rows ``r0:r1`` written into ``dest`` (contiguous ``[r1 - r0, K]``, ``dtype``)."""
        if self._read_into is None:
            return dest.copy_(self._read(r0, r1))
        self._read_into(r0, r1, dest)
        return dest

    def select(self, index: torch.Tensor) -> torch.Tensor:
        """The rows at ``index``, as ``index_select(0, index)`` gives them."""
        picked = [self.rows(i, i + 1) for i in index.tolist()]
        return torch.cat(picked) if picked else torch.empty((0, self.shape[1]), dtype=self.dtype)

    def __repr__(self) -> str:
        return f"RowSource({self.shape}, {self.dtype})"


Weight = torch.Tensor | RowSource
"""What the encoders take: a 2-D tensor or a ``RowSource``."""


def as_source(weight: Weight) -> RowSource:
    """``weight`` as a ``RowSource`` (a 2-D tensor's rows are views of it)."""
    if isinstance(weight, RowSource):
        return weight
    return RowSource((weight.shape[0], weight.shape[1]), weight.dtype, lambda r0, r1: weight[r0:r1])


def row_blocks(t: Weight, block_elements: int | None = None, multiple: int = 1) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(r0, r1, rows r0:r1)`` for the blocks of ``row_ranges`` (views of a tensor; a
    ``RowSource`` reads each block when it is reached).  ``block_elements`` defaults
    to ``encode_block_elements``."""
    source = as_source(t)
    n, k = source.shape
    for r0, r1 in row_ranges(n, k, block_elements or encode_block_elements(), multiple):
        yield r0, r1, source.rows(r0, r1)


def materialize(weight: Weight, r0: int = 0, r1: int | None = None) -> torch.Tensor:
    """Rows ``r0:r1`` (default: all) of ``weight`` as one tensor: a view of a tensor, or a
    ``RowSource`` read into one new tensor -- block by block (no read is larger than a
    block), or, by a source that writes into a destination (a decoder), in one call that
    blocks itself.  For the products comfy-kitchen computes over a whole layer or row chunk,
    whose rounding may depend on the row count (ConvRot weight rotations): those rows are
    then held together, as comfy-kitchen holds them."""
    n, k = weight.shape
    r1 = n if r1 is None else r1
    if isinstance(weight, torch.Tensor):
        return weight[r0:r1]
    out = empty_result((r1 - r0, k), weight.dtype)
    if weight.writes_into:
        # One call: the decoder writes ``out`` in its own row blocks, exactly as
        # ``decode(out=...)`` does (one path, one bound), instead of 1M-element reads that
        # each set up a decode of their own.
        weight.rows_into(r0, r1, out)
        return out
    for b0, b1 in row_ranges(r1 - r0, k, encode_block_elements()):
        weight.rows_into(r0 + b0, r0 + b1, out[b0:b1])
    return out


def gather_rows(
    blocks: Iterable[tuple[int, int, torch.Tensor]],
    fn: Callable[[torch.Tensor], Sequence[torch.Tensor]],
    rows: int,
    dtypes: Sequence[torch.dtype | None] = (),
    workers: int = 1,
) -> list[torch.Tensor]:
    """Apply ``fn`` to every block and write each of its results into rows ``r0:`` of one
    output tensor of ``rows`` rows (dtype and trailing shape from the first block, or the
    dtype ``dtypes`` gives for that result: the copy is then also the cast, e.g. INT8 levels
    computed in floats need no conversion pass of their own).

    The outputs are allocated once and filled in place: no list of parts and no ``cat``,
    which would hold the encoded layer twice.  A block's result may have more rows than the
    block (the padded last block of NVFP4 and MXFP8).

    ``workers`` > 1: up to that many blocks are computed at once, in threads (see
    ``_computed_in_order``); ``fn`` must then depend on its block alone."""
    outs: list[torch.Tensor] | None = None
    for r0, parts in _computed_in_order(blocks, fn, workers):
        if outs is None:
            casts = list(dtypes) + [None] * (len(parts) - len(dtypes))
            outs = [torch.empty((rows, *p.shape[1:]), dtype=d or p.dtype) for p, d in zip(parts, casts)]
        for out, part in zip(outs, parts):
            out[r0 : r0 + part.shape[0]].copy_(part)
        del parts
    if outs is None:
        raise ValueError("gather_rows needs at least one row block")
    return outs


def _computed_in_order(blocks: Iterable[tuple[int, int, torch.Tensor]], fn: Callable, workers: int) -> Iterator[tuple]:
    """``(r0, fn(block))`` in block order.  With ``workers`` > 1 up to that many blocks are
    computed at once in a pool of threads while this thread produces the next block: an
    encoder whose per-block steps are many small operations (below torch's parallel grain,
    so each runs on one core) uses every core that way, as torch's own threads do for large
    operations.  Each block's operations and operands are those of the serial order, so the
    results are the same bits.  The caller's grad mode is the workers' (it is per thread)."""
    if workers <= 1:
        for r0, _r1, block in blocks:
            yield r0, fn(block)
        return
    import collections
    from concurrent.futures import ThreadPoolExecutor

    grad = torch.is_grad_enabled()

    def run(block: torch.Tensor):
        with torch.set_grad_enabled(grad):
            return fn(block)

    pending: collections.deque = collections.deque()
    with ThreadPoolExecutor(workers, thread_name_prefix="comfyquant-rows") as pool:
        try:
            for r0, _r1, block in blocks:
                pending.append((r0, pool.submit(run, block)))
                del block
                if len(pending) >= workers:
                    r, done = pending.popleft()
                    yield r, done.result()
            while pending:
                r, done = pending.popleft()
                yield r, done.result()
        finally:  # an error or an interrupt: blocks not started are dropped, running ones end
            for _, future in pending:
                future.cancel()


def cast_rows(weight: Weight, dtype: torch.dtype, compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """One ``dtype`` tensor of the weight's shape, filled block by block with
    ``compute(rows, scratch)``: the block's values in the weight's dtype, computed in place
    in ``scratch`` (one reused buffer of the block's shape).  The copy into the output is the
    cast (FP8, INT8), so an elementwise encoder allocates nothing per block and makes no
    separate conversion pass (measured: about a tenth of the FP8 and INT8 encoders' time)."""
    source = as_source(weight)
    n, k = source.shape
    out = torch.empty((n, k), dtype=dtype)
    ranges = row_ranges(n, k, encode_block_elements())
    if not ranges:
        return out
    scratch = torch.empty((max(r1 - r0 for r0, r1 in ranges), k), dtype=source.dtype)
    for r0, r1 in ranges:
        out[r0:r1].copy_(compute(source.rows(r0, r1), scratch[: r1 - r0]))
    return out


_TRIM: Callable[[int], int] | Literal[False] | None = None
"""glibc's ``malloc_trim`` once looked up, or False where there is none."""


def release_memory() -> None:
    """Hand the heap's free memory back to the system (glibc's ``malloc_trim``).

    Freed blocks stay in glibc's heap for reuse, fragmented between the sizes of the phase
    just done (a codebook decision, an encode, a measurement); the next phase allocates
    other sizes, so without a trim what one phase left behind adds to the next one's peak.
    A call costs well under a millisecond, plus page faults for the memory used again;
    encoders and ``quantize`` call it between phases, not per block.  Elsewhere (no glibc)
    this does nothing."""
    global _TRIM
    if _TRIM is None:
        import ctypes

        try:  # the process's own symbols: no library search (ctypes.util would run ldconfig)
            _TRIM = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)
