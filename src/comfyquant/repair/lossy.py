"""Lossy repairs (``fix --allow-lossy``): re-encode a layer the selected runtime cannot use as
stored, from its own decoded weights, and measure what that costs.

Which layers need it, and into what, is the format's own knowledge (``Format.lossy``, e.g.
W4A8's 6-bit rows for SGLang -> 4-bit): it returns a ``Recode`` with the
encoder arguments and the tensors written.  Here the layer is decoded with its codec, encoded
again with those arguments, and the relative L2 error of the new decoded weight against the
old one is reported.  torch is imported only here, only when such a repair runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..formats.base import Format
from ..formats.hooks import Readers, Recode

if TYPE_CHECKING:
    from ..checker.run import Targets
    from ..checkpoint import Checkpoint


class PlanLine(Protocol):
    """The plan line of a re-encode (``repair.edits.Change``): its result is added to ``after``."""

    after: str


class Requant:
    """One layer to re-encode: the format's ``Recode``, the marker the layer is decoded
    with, and the measured error."""

    __slots__ = (
        "prefix",
        "out_prefix",
        "format",
        "recode",
        "source_marker",
        "source_edits",
        "error",
        "change",
        "outputs",
        "_after",
    )

    def __init__(self, prefix: str, fmt: Format, recode: Recode, source_marker: dict) -> None:
        self.prefix = prefix
        self.out_prefix = prefix
        self.format = fmt
        self.recode = recode
        self.source_marker = source_marker
        self.source_edits: dict = {}
        """Suffix -> ``TensorEdit``: the exact repairs of stored tensors the re-encode replaces
        (a transposed or BF16 correction), applied before decoding: the codec reads the layer
        only in its format's own shapes and dtypes."""
        self.error: float | None = None
        self.change: PlanLine | None = None
        self.outputs: dict[str, bytes] | None = None
        """The re-quantized bytes, kept when computed before writing (``--reference``)."""
        self._after: str | None = None

    @property
    def why(self) -> str:
        return self.recode.why

    @property
    def specs(self) -> dict[str, tuple]:
        """Suffix -> (dtype, shape) of every tensor the re-encode writes."""
        return self.recode.writes

    @property
    def replaces(self) -> tuple[str, ...]:
        """The stored suffixes the re-encoded tensors replace."""
        return self.recode.replaces

    @property
    def marker(self) -> dict:
        return self.recode.marker

    @property
    def target_format(self) -> str:
        """The format the layer is encoded into (its own: a re-encode)."""
        return self.format.name

    @property
    def encode_kwargs(self) -> dict:
        return dict(self.recode.params)

    def decode_source(self, ckpt: Checkpoint):
        """The stored layer decoded to F32 by its own codec."""
        import torch

        from ..codecs import get
        from ..numerics.dtypes import from_bytes

        layer = ckpt.layers[self.prefix]
        stored = {}
        for suffix, entry in layer.tensors.items():
            if suffix not in self.replaces:
                continue
            data, dtype, shape = ckpt.read_bytes(entry), entry.dtype, entry.shape
            edit = self.source_edits.get(suffix)
            if edit is not None:
                data = edit.transform(data) if edit.transform is not None else data
                dtype, shape = edit.dtype, edit.shape
            stored[suffix] = from_bytes(data, dtype, shape)
        return get(self.format.name).decode(stored, self.source_marker, dtype=torch.float32, layer=self.prefix)


class DialectRequant(Requant):
    """A dialect's layer with no exact Comfy form (``migrate --allow-lossy``): decoded by its
    dialect's exact decoder, encoded into ``params`` (a format's frozen ``Params``)."""

    __slots__ = ("translation", "params", "planned")

    def __init__(self, translation, params, planned: dict[str, tuple]) -> None:
        self.prefix = translation.prefix
        self.out_prefix = translation.out_prefix
        self.source_edits = {}
        self.translation = translation
        self.params = params
        self.planned = planned
        self.error = None
        self.change = None
        self.outputs = None
        self._after = None
        self.source_marker = {}

    @property
    def why(self) -> str:
        return self.translation.why

    @property
    def specs(self) -> dict[str, tuple]:
        return self.planned

    @property
    def replaces(self) -> tuple[str, ...]:
        return tuple(s for s in self.translation.inputs if s != "bias")

    @property
    def marker(self) -> dict:
        return self.params.marker()

    @property
    def target_format(self) -> str:
        return self.params.FORMAT

    @property
    def encode_kwargs(self) -> dict:
        return self.params.encode_kwargs()

    def decode_source(self, ckpt: Checkpoint):
        from ..numerics.dtypes import from_bytes

        stored = {s: from_bytes(ckpt.read_bytes(e), e.dtype, e.shape) for s, e in self.translation.inputs.items()}
        return self.translation.decoder(stored)


def readers(target: Targets) -> Readers:
    """What the runtimes ``target`` selects read, as the formats' lossy hooks ask it."""
    from ..checker.run import parse_targets
    from ..targets.select import four_bit_w4a8

    names = parse_targets(target)
    return Readers(names, four_bit_w4a8(target, names))


def plan_requant(prefix: str, fmt: Format, env: dict, tensors: dict, marker: dict, target: Targets) -> Requant | None:
    """The re-encode ``target`` needs for this layer (None: none, or the format has no lossy repair)."""
    if fmt.lossy is None:
        return None
    recode = fmt.lossy(fmt, env, tensors, readers(target))
    return None if recode is None else Requant(prefix, fmt, recode, marker)


def requantize(ckpt: Checkpoint, op: Requant, keep: bool = False) -> dict[str, bytes]:
    """Decode the stored layer, re-encode it, record the error; returns new bytes by suffix.
    With ``keep`` the bytes stay on ``op`` and the next call returns them (computed once)."""
    if op.outputs is not None:
        out, op.outputs = op.outputs, None
        return out
    import torch

    from ..codecs import get
    from ..numerics.dtypes import dtype_name, to_bytes

    old = op.decode_source(ckpt)
    codec = get(op.target_format)
    encoded = codec.encode(old, layer=op.prefix, **op.encode_kwargs)
    new = codec.decode(dict(encoded), encoded.marker, dtype=torch.float32, layer=op.prefix)
    denom = torch.linalg.vector_norm(old).item() or 1.0
    op.error = torch.linalg.vector_norm(new - old).item() / denom
    if op.change is not None:
        if op._after is None:
            op._after = op.change.after
        op.change.after = op._after + f"; relative L2 error {op.error:.4f}"
    out = {}
    for suffix, (dtype, shape) in op.specs.items():
        t = encoded[suffix]
        if tuple(t.shape) != shape or dtype_name(t.dtype) != dtype:
            raise ValueError(
                f"{op.prefix}.{suffix}: re-quantized {dtype_name(t.dtype)} {tuple(t.shape)} != planned {dtype} {shape}"
            )
        out[suffix] = bytes(to_bytes(t))
    if keep:
        op.outputs = dict(out)
    return out
