"""``ComfyQuantParameter``: one quantized layer as the single tensor a diffusers converter sees.

diffusers' single-file converters move ``<layer>.weight`` around, chunk or split it along
rows (fused QKV, QKV+MLP, the adaLN shift/scale swap) and concatenate parts again.  They know
nothing of scales or markers: Flux.1's converter pops only the keys it knows (the others are
silently dropped), Flux.2's and Z-Image's substring tests would chunk a scalar
``weight_scale`` and orphan the marker.  So before a converter runs, each quantized layer's
tensors -- weight, scales, codebooks, corrections -- and its marker become this one object
under ``<layer>.weight``; the converter carries them together.

It poses as the dense ``[out, in]`` weight in the model's dtype (a tensor without storage on
the meta device) and implements what the converters do with a weight, exactly:

* ``torch.chunk`` / ``torch.split`` / ``tensor[a:b]`` along dim 0: every stored tensor is cut
  by ``comfyquant.formats.rows.split_rows`` (which axis of each tensor follows the rows,
  which tensors every part shares, where a blocked-scale split may fall) -- the format's own
  description decides, no format is named here;
* ``torch.cat`` along dim 0: ``join_rows``, and the tensors every
  part shares must be equal (NVFP4 parts with different ``weight_scale_2``, W4A8 parts with
  different codebooks cannot be one layer exactly);
* a float cast (``.to(dtype)``, ``.float()`` ...): the dequantized weight.

Anything else (a K-dim operation, a reshape, arithmetic) raises ``InexactOperation``
naming the layer: a silent dense fallback is what this object exists to prevent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .. import codecs
from ..formats.codec import CodecError, meta_of
from ..formats.registry import FORMATS
from ..formats.rows import join_rows, split_rows
from ..torch.linear import QuantWeight
from ..torch.tensors import LoadError


class InexactOperation(LoadError):
    """A converter asked for an operation on a quantized weight that is not exact (or not a
    row operation at all); the message names the layer."""


_PROPERTIES = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "ndim",
        "is_meta",
        "layout",
        "requires_grad",
        "is_cuda",
        "is_cpu",
        "is_sparse",
        "is_quantized",
        "is_leaf",
        "grad_fn",
        "grad",
        "names",
        "is_nested",
        "itemsize",
    }
)
"""Tensor attributes a converter may read from the pose (metadata only)."""


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality (float8 and NaN payloads included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


class ComfyQuantParameter(torch.Tensor):
    """A quantized layer's stored tensors and marker, posing as its dense ``[out, in]`` weight.

    ``source``: the checkpoint layer it came from (messages name it); ``rows``: which of the
    source's model rows it holds (after splits and joins); ``names``: the checkpoint tensor
    names it carries (the load report's)."""

    quant: QuantWeight
    env: dict
    source: str
    rows: str
    names: tuple[str, ...]

    @staticmethod
    def __new__(
        cls,
        quant: QuantWeight,
        shape: Sequence[int],
        dtype: torch.dtype,
        *,
        env: Mapping,
        source: str,
        rows: str = "",
        names: Sequence[str] = (),
    ):
        self = torch.Tensor._make_wrapper_subclass(
            cls, tuple(shape), dtype=dtype, device=torch.device("meta"), requires_grad=False
        )
        self.quant = quant
        self.env = dict(env)
        self.source = source
        self.rows = rows
        self.names = tuple(names)
        return self

    def __init__(self, *args, **kwargs) -> None:  # everything is set by __new__
        pass

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_layer(
        cls,
        tensors: Mapping[str, torch.Tensor],
        marker: Mapping,
        source: str,
        dtype: torch.dtype,
        names: Sequence[str] = (),
        bias: torch.Tensor | None = None,
    ) -> ComfyQuantParameter:
        """The parameter of one checkpoint layer; its model shape is the codec's (a padded
        format reads the model's rows from ``bias`` when there is one, as every reader does)."""
        quant = QuantWeight(tensors, marker, source)
        probe = dict(quant.tensors)
        if bias is not None:
            probe["bias"] = bias
        plan = codecs.get(quant.format).plan(probe, quant.marker, source)
        return cls(quant, plan.shape, dtype, env=plan.env, source=source, names=names)

    def derived(
        self,
        tensors: dict[str, torch.Tensor],
        rows: int,
        where: str,
        source: str | None = None,
        names: Sequence[str] | None = None,
    ) -> ComfyQuantParameter:
        """A part (or a join) of this layer: ``rows`` model rows; its geometry is read back
        from its tensors (a padded format keeps the model's row count)."""
        fmt = self.format
        name = source or self.source
        try:
            plan = codecs.get(fmt).plan(tensors, self.quant.marker, name)
        except CodecError as exc:  # rows.py promised a valid part: a contradiction is a bug, said plainly
            raise InexactOperation(f"layer {name!r}{where}: the {fmt} part is not a valid layer ({exc})") from None
        env = dict(plan.env)
        if "N_model" in env:
            env["N_model"] = rows
        quant = QuantWeight(tensors, self.quant.marker, name)
        return ComfyQuantParameter(
            quant,
            (rows, self.shape[1]),
            self.dtype,
            env=env,
            source=name,
            rows=where,
            names=self.names if names is None else names,
        )

    # -- what it is ------------------------------------------------------------------------------
    @property
    def format(self) -> str:
        return self.quant.format

    @property
    def marker(self) -> dict:
        return self.quant.marker

    @property
    def stored(self) -> dict[str, torch.Tensor]:
        return self.quant.tensors

    # The place the messages name; torch's elementwise Tensor.where is no operation a quantized
    # weight supports, so the stubs' signature for that name does not apply.
    def where(self) -> str:  # type: ignore[override]
        return f"layer {self.source!r}{self.rows}"

    # torch's stubs give Tensor.__repr__ a keyword-only parameter without a usable name.
    def __repr__(self, *args, **kwargs) -> str:  # type: ignore[override]
        shapes = ", ".join(f"{s} {list(t.shape)}" for s, t in self.stored.items())
        return f"ComfyQuantParameter({self.where()}, {self.format}, model shape {list(self.shape)}: {shapes})"

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The dense weight ``[out, in]`` (default: the posed dtype), bit-identical to the codec's
        (and comfy-kitchen's) decode."""
        dense = codecs.get(self.format).decode(dict(self.stored), self.marker, dtype=dtype or self.dtype, layer=self.source)
        return dense[: self.shape[0], : self.shape[1]]

    # -- the operations converters use ------------------------------------------------------------
    def check_row_dim(self, dim, op: str) -> None:
        if dim not in (0, -2):
            raise InexactOperation(
                f"{self.where()}: {op} along dim {dim} of a quantized {self.format} weight: only row (dim 0) operations are exact"
            )

    def split_rows(self, sections: Sequence[int], op: str) -> tuple[ComfyQuantParameter, ...]:
        """Parts of ``sections`` model rows each, in order (exact or ``InexactOperation``)."""
        sections = [int(s) for s in sections]
        if len(sections) == 1:
            return (self,)
        metas = {s: meta_of(t) for s, t in self.stored.items()}
        parts = split_rows(FORMATS[self.format], self.env, metas, sections)
        if isinstance(parts, str):
            raise InexactOperation(f"{self.where()}: {op} into {sections} rows is not exact for {self.format}: {parts}")
        out = []
        start = 0
        for size, cuts in zip(sections, parts):
            tensors = {s: self.stored[s][c.index] for s, c in cuts.items()}
            out.append(self.derived(tensors, size, self._span(start, start + size)))
            start += size
        return tuple(out)

    def _span(self, a: int, b: int) -> str:
        """Rows ``a:b`` of this object as rows of its source (for messages)."""
        offset = 0
        if self.rows.startswith(" rows ") and ":" in self.rows and "+" not in self.rows:
            try:
                offset = int(self.rows[6:].split(":")[0])
            except ValueError:
                offset = 0
        return f" rows {offset + a}:{offset + b}"

    def chunk_rows(self, chunks: int) -> tuple[ComfyQuantParameter, ...]:
        n = self.shape[0]
        size = -(-n // chunks)
        sections = [min(size, n - i) for i in range(0, n, size)]
        return self.split_rows(sections, f"chunk({chunks})")

    def slice_rows(self, key) -> ComfyQuantParameter:
        rows = key[0] if isinstance(key, tuple) and key and all(k == slice(None) for k in key[1:]) else key
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise InexactOperation(
                f"{self.where()}: indexing a quantized {self.format} weight with {key!r}: only a row range [a:b] is exact"
            )
        n = self.shape[0]
        a, b, _ = rows.indices(n)
        b = max(a, b)
        if (a, b) == (0, n):
            return self
        if a == b:
            raise InexactOperation(f"{self.where()}: an empty row range [{a}:{b}] of a quantized weight")
        sections = [s for s in (a, b - a, n - b) if s]
        parts = self.split_rows(sections, f"[{a}:{b}]")
        return parts[1 if a else 0]

    @staticmethod
    def cat_rows(parts: Sequence, dim=0) -> ComfyQuantParameter:
        parts = list(parts)
        quant = [p for p in parts if isinstance(p, ComfyQuantParameter)]
        names = " + ".join(dict.fromkeys(p.where() if isinstance(p, ComfyQuantParameter) else "a dense tensor" for p in parts))
        if len(quant) != len(parts):
            raise InexactOperation(f"{names}: concatenating a quantized weight with dense tensors")
        first = quant[0]
        first.check_row_dim(dim, "torch.cat")
        if len(quant) == 1:
            return first
        if any(p.format != first.format or p.marker != first.marker for p in quant):
            raise InexactOperation(
                f"{names}: the parts differ in format or marker ({', '.join(str(p.marker) for p in quant)}): "
                "they cannot be one quantized layer"
            )
        if any(p.shape[1] != first.shape[1] or p.dtype != first.dtype for p in quant):
            raise InexactOperation(f"{names}: the parts differ in columns or dtype")
        fmt = FORMATS[first.format]
        rules = join_rows(fmt, [p.env for p in quant], [{s: meta_of(t) for s, t in p.stored.items()} for p in quant])
        if isinstance(rules, str):
            raise InexactOperation(f"{names}: joining the rows is not exact for {first.format}: {rules}")
        extra = set(first.stored) - set(rules)
        if extra:
            raise InexactOperation(f"{names}: {', '.join(sorted(extra))} has no row rule in {first.format}: cannot join")
        joined: dict[str, torch.Tensor] = {}
        for suffix, rule in rules.items():
            if rule.axis is None:
                for p in quant[1:]:
                    if not _same(p.stored[suffix], first.stored[suffix]):
                        raise InexactOperation(
                            f"{names}: joining them is not exact for {first.format}: their {suffix} differs "
                            f"(every part must share one {suffix}; re-quantize the fused layer instead)"
                        )
                joined[suffix] = first.stored[suffix]
            else:
                joined[suffix] = torch.cat([p.stored[suffix] for p in quant], dim=rule.axis)
        sources = list(dict.fromkeys(p.source for p in quant))
        source = sources[0] if len(sources) == 1 else " + ".join(sources)
        spans = " +".join(p.rows for p in quant) if len(sources) == 1 else ""
        carried = tuple(dict.fromkeys(n for p in quant for n in p.names))
        return first.derived(joined, sum(p.shape[0] for p in quant), spans, source, carried)

    def to_dense_or_moved(self, *args, **kwargs):
        device, dtype, _non_blocking, _fmt = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None and (dtype.is_floating_point or dtype.is_complex):
            return self.dequantize(dtype).to(device) if device is not None else self.dequantize(dtype)
        if dtype is not None:
            raise InexactOperation(f"{self.where()}: casting a quantized weight to {dtype}")
        if device is None:
            return self
        tensors = {s: t.to(device) for s, t in self.stored.items()}
        quant = QuantWeight(tensors, self.marker, self.source)
        return ComfyQuantParameter(
            quant, self.shape, self.dtype, env=self.env, source=self.source, rows=self.rows, names=self.names
        )

    # -- dispatch ----------------------------------------------------------------------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is not None:
            return handler(*args, **kwargs)
        attr = getattr(getattr(func, "__self__", None), "__name__", None)
        if (getattr(func, "__name__", None) == "__get__" and attr in _PROPERTIES) or func in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        who = next(
            (
                a
                for a in list(args) + [x for a in args if isinstance(a, (list, tuple)) for x in a]
                if isinstance(a, ComfyQuantParameter)
            ),
            None,
        )
        where = who.where() if who is not None else "a quantized layer"
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
        if attr is not None and getattr(func, "__name__", None) == "__get__":
            name = attr
        raise InexactOperation(
            f"{where}: {name} is not an exact operation on a quantized weight "
            "(only row chunk/split/[a:b]/cat and a float cast are)"
        )

    # torch calls it as a classmethod with the operation first; its stubs declare the disabled
    # default, (types, args, kwargs), instead.
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        raise InexactOperation(f"a quantized weight reached the torch operation {func} (only row operations are exact)")


def _chunk(t, chunks, dim=0):
    if not isinstance(t, ComfyQuantParameter):
        raise InexactOperation("torch.chunk of a quantized weight with a dense first argument")
    t.check_row_dim(dim, "chunk")
    return t.chunk_rows(int(chunks))


def _split(t, split_size_or_sections, dim=0):
    t.check_row_dim(dim, "split")
    n = t.shape[0]
    if isinstance(split_size_or_sections, int):
        size = split_size_or_sections
        sections = [min(size, n - i) for i in range(0, n, size)]
    else:
        sections = list(split_size_or_sections)
    return t.split_rows(sections, f"split({split_size_or_sections})")


def _cat(tensors, dim=0, *, out=None):
    if out is not None:
        raise InexactOperation("torch.cat(..., out=) of quantized weights")
    return ComfyQuantParameter.cat_rows(tensors, dim)


def _getitem(t, key):
    return t.slice_rows(key)


def _same_object(t, *args, **kwargs):
    return t


def _float_cast(dtype):
    return lambda t, *a, **k: t.dequantize(dtype)


_HANDLERS = {
    torch.chunk: _chunk,
    torch.Tensor.chunk: _chunk,
    torch.split: _split,
    torch.Tensor.split: _split,
    torch.cat: _cat,
    torch.concat: _cat,
    torch.concatenate: _cat,
    torch.Tensor.__getitem__: _getitem,
    torch.Tensor.to: ComfyQuantParameter.to_dense_or_moved,
    torch.Tensor.float: _float_cast(torch.float32),
    torch.Tensor.bfloat16: _float_cast(torch.bfloat16),
    torch.Tensor.half: _float_cast(torch.float16),
    torch.Tensor.double: _float_cast(torch.float64),
    torch.Tensor.contiguous: _same_object,
    torch.Tensor.detach: _same_object,
    torch.Tensor.__hash__: lambda t: id(t),
    torch.Tensor.__repr__: lambda t, *a, **k: ComfyQuantParameter.__repr__(t),
}

_METADATA = frozenset(
    {
        torch.Tensor.size,
        torch.Tensor.dim,
        torch.Tensor.numel,
        torch.Tensor.__len__,
        torch.Tensor.is_floating_point,
        torch.Tensor.is_complex,
        torch.Tensor.element_size,
        torch.Tensor.nelement,
        torch.Tensor.get_device,
    }
)
