"""The declarative description of a quantization format.

A ``Format`` lists its tensor slots (suffix, dtype, shape as an expression of the layer
geometry), its marker keys (type, default, allowed values), the constraints its geometry must
meet, and a function that infers that geometry (N, K, bit depth, variant) from the stored
tensors.  The checker, inspector, fixer, quantizer and loader all read these descriptions;
adding a format means adding one package under ``formats/`` (its description, its codec and
the ``Params`` that ``quantize`` writes, the last two imported on first use).
``Format.interpret`` is where a layer's marker and tensors are judged against the
description, as data (``LayerReading``); the checker only words that reading as findings.

Shape and constraint expressions are small Python expressions over the geometry names
``N`` (out features), ``K`` (in features), ``bits``, the marker parameters (``group_size``,
``convrot_groupsize`` ...) and the helpers ``pad(x, m)`` (round up to a multiple) and
``is_pow4(x)``.  They are compiled once; their text doubles as documentation, e.g. the
expected correction shape is shown as ``(K // group_size, N)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import CodeType
from typing import TYPE_CHECKING, Any

from ..dtypes import MODEL_FLOAT_DTYPES
from ..errors import ComfyQuantError

if TYPE_CHECKING:
    from .hooks import DroppedPart


def pad(x: int, m: int) -> int:
    """Round ``x`` up to a multiple of ``m``."""
    return -(-x // m) * m


def is_pow4(x: Any) -> bool:
    """True for 4, 16, 64, 256, ... (the ConvRot sizes comfy-kitchen can build)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 4 and (x & (x - 1)) == 0 and (x.bit_length() - 1) % 2 == 0


_GLOBALS: dict[str, Any] = {"__builtins__": {}, "pad": pad, "is_pow4": is_pow4, "len": len, "int": int}


class Expr:
    """An expression with its source text (``str(expr)`` is the text), compiled on first use
    (start-up time: most checks evaluate only a few of the expressions)."""

    __slots__ = ("text", "_code")

    def __init__(self, text: str) -> None:
        self.text = text
        self._code: CodeType | None = None

    def __call__(self, env: dict) -> Any:
        code = self._code
        if code is None:
            code = self._code = compile(self.text, f"<format expr {self.text!r}>", "eval")
        return eval(code, _GLOBALS, env)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"


def _compile_causes(causes: str | tuple[tuple[str, str], ...]) -> tuple[tuple[Expr | None, str], ...]:
    """A finding's cause as data: one text, or ``(condition, text)`` pairs whose first
    condition that holds gives the text (conditions are expressions, like shapes)."""
    if isinstance(causes, str):
        return ((None, causes),) if causes else ()
    return tuple((Expr(cond), text) for cond, text in causes)


def _first_cause(compiled: tuple[tuple[Expr | None, str], ...], env: dict) -> str:
    for cond, text in compiled:
        if cond is None:
            return text
        try:
            if cond(env):
                return text
        except Exception:  # a condition over a value it cannot compare: not this cause
            continue
    return ""


UNPLACED = 100
"""The listing position of a format the ordering table does not name (``Format(order=)``'s
default): after every format the table places, which take the positions from 0 up."""


# Tensor kinds: drive --deep value checks, the inspector's byte accounting and the loader.
WEIGHT = "weight"
SCALE = "scale"
CODEBOOK = "codebook"
CORRECTION = "correction"
AUX = "aux"
BIAS = "bias"


class Slot:
    """One tensor of a layer: ``<prefix>.<suffix>``.

    ``dtype`` may be ``"float"``: any dense float dtype (F16, BF16, F32).  ``shape`` is an
    expression of the geometry.  ``when``: condition for this description to apply (None =
    always); ``forbidden``: condition under which the tensor must not be present at all;
    ``also_dtypes``: dtypes some tool writes or accepts instead, dtype -> (who and why,
    severity); ``alt_shapes``: known other shapes ``(expression, cause[, severity])`` that
    identify how a file went wrong; ``positive``: values must be finite and > 0 (``--deep``);
    ``blocked``: the tensor holds per-block scales of this block size (16, 32) in the blocked
    128x4 layout (comfy-kitchen 0.2.40 ``float_utils.to_blocked``), which the fixer can convert
    from the unblocked ``[N, K/block]``.

    ``rows``: how the tensor follows a split of the layer's output rows (``formats/rows.py``).
    None: read from ``shape`` -- the axis whose size follows N, with the rows one index holds,
    or shared by every part when no axis does; ``"shared"`` or an axis number override it.

    ``forbidden_cause``: why the tensor must not be present, as a finding says it -- one text,
    or ``(condition, text)`` pairs over the geometry when ``forbidden`` has several reasons
    (the first that holds is shown; none: the checker's generic words).

    How ``--deep`` judges a scale's values beyond ``positive`` (the decode the runtimes run):
    ``adds_zero_points``, the decode adds zero points after scaling (code x scale + zeros), so
    every scale zero or subnormal leaves the zero points, a degraded output rather than garbage;
    ``on_int8_grid``, the decode rounds and clamps code x scale onto the INT8 grid, so a
    non-finite scale gives its group one constant code (only every scale non-finite is
    garbage); ``deep_check(np, layer, tensor, values)``, the format's own check of the
    values, the fields of a finding (message, expected, actual, cause, fix) or None.
    """

    __slots__ = (
        "suffix",
        "dtype",
        "shape",
        "kind",
        "required",
        "meaning",
        "when",
        "forbidden",
        "also_dtypes",
        "alt_shapes",
        "positive",
        "blocked",
        "rows",
        "forbidden_cause",
        "adds_zero_points",
        "on_int8_grid",
        "deep_check",
        "_shape",
        "_when",
        "_forbidden",
        "_alts",
        "_forbidden_causes",
    )

    def __init__(
        self,
        suffix: str,
        dtype: str,
        shape: str,
        kind: str = SCALE,
        required: bool = True,
        meaning: str = "",
        when: str | None = None,
        forbidden: str | None = None,
        also_dtypes: dict[str, tuple[str, str]] | None = None,
        alt_shapes: tuple[tuple[str, ...], ...] = (),
        positive: bool = False,
        blocked: int = 0,
        rows: str | int | None = None,
        forbidden_cause: str | tuple[tuple[str, str], ...] = "",
        adds_zero_points: bool = False,
        on_int8_grid: bool = False,
        deep_check: Callable[..., dict | None] | None = None,
    ) -> None:
        self.suffix = suffix
        self.dtype = dtype
        self.shape = shape
        self.kind = kind
        self.required = required
        self.meaning = meaning
        self.when = when
        self.forbidden = forbidden
        self.also_dtypes = also_dtypes or {}
        self.alt_shapes = alt_shapes
        self.positive = positive
        self.blocked = blocked
        self.rows = rows
        self.forbidden_cause = forbidden_cause
        self.adds_zero_points = adds_zero_points
        self.on_int8_grid = on_int8_grid
        self.deep_check = deep_check
        self._shape = Expr(shape)
        self._when = Expr(when) if when else None
        self._forbidden = Expr(forbidden) if forbidden else None
        self._alts = tuple((Expr(a[0]), a[1], a[2] if len(a) > 2 else "error") for a in alt_shapes)
        self._forbidden_causes = _compile_causes(forbidden_cause)

    def applies(self, env: dict) -> bool:
        return self._when is None or bool(self._when(env))

    def accepts(self, dtype: str) -> bool:
        """Whether a tensor stored as ``dtype`` has this slot's dtype (``"float"``: any dense float)."""
        return dtype in MODEL_FLOAT_DTYPES if self.dtype == "float" else dtype == self.dtype

    def is_forbidden(self, env: dict) -> bool:
        return self._forbidden is not None and bool(self._forbidden(env))

    def why_forbidden(self, env: dict) -> str:
        """The format's words for why the tensor is forbidden here ("" when it gives none)."""
        return _first_cause(self._forbidden_causes, env)

    def expected_shape(self, env: dict) -> tuple:
        return tuple(self._shape(env))

    def other_shapes(self, env: dict) -> Iterator[tuple[tuple, str, str]]:
        """(shape, cause, severity) of each known other shape (``alt_shapes``) for this
        geometry, in the declared order; one that does not evaluate here is left out."""
        for expr, cause, severity in self._alts:
            try:
                shape = tuple(expr(env))
            except Exception:
                continue
            yield shape, cause, severity

    def __repr__(self) -> str:
        return f"Slot({self.suffix!r}, {self.dtype}, {self.shape})"


class MarkerKey:
    """A marker key: JSON types, default, allowed values (an expression over ``v``) and whether
    writers must store it (``explicit``: True, or an expression over the parameters).

    ``drop_invalid``: the format never uses the key, so the runtimes that load the layer read
    it the same without it: ``fix`` removes an invalid value instead of leaving it for a
    reader to refuse (NVFP4's ``convrot``).

    What findings say about the key, when the format has its own words for it (empty: the
    checker's generic words): ``missing_text``, what an absent explicit key means (``missing
    ConvRot flag``); ``suggested``, the value text the fix proposes for it (``true``);
    ``invalid_cause``, why a value is refused -- one text, or ``(condition over v, text)``
    pairs whose first that holds is shown (``convrot`` written as ``1`` or ``"true"``)."""

    __slots__ = (
        "name",
        "types",
        "default",
        "allowed",
        "allowed_text",
        "explicit",
        "why_explicit",
        "nested_ok",
        "drop_invalid",
        "missing_text",
        "suggested",
        "invalid_cause",
        "_allowed",
        "_explicit",
        "_invalid_causes",
    )

    def __init__(
        self,
        name: str,
        types: tuple[type, ...],
        default: Any = None,
        allowed: str | None = None,
        allowed_text: str = "",
        explicit: str | bool = False,
        why_explicit: str = "",
        nested_ok: bool = False,
        drop_invalid: bool = False,
        missing_text: str = "",
        suggested: str = "",
        invalid_cause: str | tuple[tuple[str, str], ...] = "",
    ) -> None:
        self.name = name
        self.types = types
        self.default = default
        self.allowed = allowed
        self.allowed_text = allowed_text
        self.explicit = explicit
        self.why_explicit = why_explicit
        self.nested_ok = nested_ok  # ComfyUI also reads this key from a nested ``params`` object
        self.drop_invalid = drop_invalid
        self.missing_text = missing_text
        self.suggested = suggested
        self.invalid_cause = invalid_cause
        self._allowed = Expr(allowed) if allowed else None
        self._explicit = Expr(explicit) if isinstance(explicit, str) else None
        self._invalid_causes = _compile_causes(invalid_cause)

    def valid(self, value: Any) -> bool:
        if not isinstance(value, self.types) or (isinstance(value, bool) and bool not in self.types):
            return False
        return self._allowed is None or bool(self._allowed({"v": value}))

    def why_invalid(self, value: Any) -> str:
        """The format's words for why ``value`` is refused ("" when it gives none)."""
        return _first_cause(self._invalid_causes, {"v": value})

    def must_be_explicit(self, params: dict) -> bool:
        if self._explicit is not None:
            return bool(self._explicit(params))
        return bool(self.explicit)


class Constraint:
    """A property of the geometry that must hold, e.g. ``K % convrot_groupsize == 0``; the
    message is formatted with the geometry."""

    __slots__ = ("expr", "message", "cause", "fix", "_expr")

    def __init__(self, expr: str, message: str, cause: str = "", fix: str = "") -> None:
        self.expr = expr
        self.message = message
        self.cause = cause
        self.fix = fix
        self._expr = Expr(expr)

    def holds(self, env: dict) -> bool:
        try:
            return bool(self._expr(env))
        except (ZeroDivisionError, TypeError, KeyError, NameError):
            return False


class Meta:
    """(dtype, shape) of a tensor in the form slots and geometry functions read: what codecs and
    planners pass when they have no header entry (a torch tensor, a planned output)."""

    __slots__ = ("dtype", "shape")

    def __init__(self, dtype: str, shape: tuple) -> None:
        self.dtype = dtype
        self.shape = tuple(shape)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __repr__(self) -> str:
        return f"Meta({self.dtype}, {self.shape})"


class GeometryError(Exception):
    """The tensors do not determine N and K; the message says why."""


class CodecError(ComfyQuantError):
    """A layer cannot be encoded, decoded or run; the message names the layer and tensor.

    Defined with the description (and re-exported by ``codec``) so that
    ``Format.codec`` can raise it without importing the codec machinery."""


# What ``Format.interpret`` says of one slot (``LayerReading.slots``) ...
MISSING = "missing"
"""A required tensor is absent; the detail is its expected shape (None: not known without it)."""
FORBIDDEN = "forbidden"
"""A tensor the geometry forbids is present; the detail is the format's words why ("": none)."""
MISMATCH = "mismatch"
"""A tensor's dtype or shape is not the slot's; the detail is (expected shape, dtype ok, shape ok)."""
# ... and of one marker key (``LayerReading.keys``).
NESTED = "nested"
"""Keys nested in a ``params`` object: (NESTED, the object)."""
UNDERSCORED = "underscored"
"""A stored ``_`` key: (UNDERSCORED, key, value)."""
INVALID = "invalid"
"""A value the key does not allow: (INVALID, MarkerKey, value, the format's words why or "")."""
IMPLICIT = "implicit"
"""An explicit key left out: (IMPLICIT, MarkerKey)."""


class LayerReading:
    """A layer read against its format (``Format.interpret``), judged but not worded: the
    checker turns it into findings.

    ``params``: the resolved marker parameters; ``keys``: the marker's key problems; ``env``:
    the geometry (None when the tensors do not determine it, ``geometry_error`` then says
    why); ``slots``: (state, slot, tensor entry or None, detail) for each slot that is not
    as described, in slot order; ``unknown``: (suffix, entry) of the tensors the format does
    not define; ``failed``: the constraints the geometry breaks."""

    __slots__ = ("params", "keys", "env", "geometry_error", "slots", "unknown", "failed")

    def __init__(self) -> None:
        self.params: dict = {}
        self.keys: list[tuple] = []
        self.env: dict | None = None
        self.geometry_error = ""
        self.slots: list[tuple[str, Slot, Any, Any]] = []
        self.unknown: list[tuple[str, Any]] = []
        self.failed: list[Constraint] = []


class Format:
    """One quantization format, described once for every command.

    ``geometry(tensors by suffix, resolved params) -> env`` with N, K, bits, variant ... (may
    raise GeometryError); ``rotation`` is "none", "always" or "convrot key"; ``loaders`` the
    runtimes that load it ({"comfyui", "sglang", "comfy-kitchen"}); ``recognize(tensors)`` says
    whether an unmarked layer's tensors look like this format.

    MoE expert banks (ComfyUI only: 0.33.0 ``comfy/ops.py`` ``MoEExperts``) store a leading
    expert dimension ``[E, out, ...]``. ``bank_rows`` names the tensors ComfyUI's loader
    flattens to ``[E*out, ...]``, reading the bank as one 2-D layer of ``E*out`` rows;
    ``bank_rows_if`` names a tensor that must itself be 3-D for that (INT8: a per-row
    ``weight_scale``).  A format without ``bank_rows`` has no flattening rule in ComfyUI, so its
    banks are not validated.

    ``pad`` is (rows, columns): the multiples a writer pads the stored weight to (NVFP4 16,
    MXFP8 32); the model's own N is then known only from an unpadded companion (the bias), K
    from none the encoders write.

    ``quant_format`` is the file-level ``__metadata__["quant_format"]`` value (lower case) that
    makes SGLang read every unmarked ``F8_E4M3``/``I8``/``U8`` weight as this format (SGLang
    0.5.23 ``inspect_comfy_quant_markers``: MXFP8 only); ComfyUI and comfy-kitchen read
    per-layer markers only.

    ``encode_params(env, tensors)`` gives the encoder arguments that reproduce a stored
    layer's variant and parameters (None: nothing here encodes the format), and
    ``reference_factor`` how far a repaired layer's error against its original weights may
    exceed the error of such a fresh encode (``fix --reference``): the layer was written by
    some quantizer of the format from those weights, so its error is that of the format; a
    wrong parameter (another ConvRot size, group size) gives an error of order 1.

    ``codec_module`` is the module (in the format's own package) whose ``CODECS`` holds the
    format's codec, imported on first use so that describing a format never imports torch
    (None: nothing here encodes or decodes it).  ``order`` places the format in listings;
    ``infer_rank`` places ``recognize`` in the inference order (lower is tried first: the more
    specific tensor signatures; None: never inferred).  Both are positions among the other
    formats, so the registry derives them from the table in ``comfyquant.formats.ordering``;
    only a package that table does not name declares them here (by default ``UNPLACED``: listed
    after every format the table places).

    ``heavy_encoder``: encoding is compute bound far below disk speed (least-squares passes,
    a whole-layer GEMM), so ``quantize --jobs auto`` spreads such layers over worker processes,
    one per core (``comfyquant.quantizer.jobs``); for the other encoders reading and
    writing dominate.  A plain flag here, not on the codec: deciding must not import torch in
    the process that only writes.

    ``params_module`` is the module (in the format's own package) whose ``PARAMS`` maps the
    format's name to the frozen ``Params`` class that ``quantize``/``convert`` write (defaults,
    validation, marker); imported on first use, like the codec, because it is a dataclass and
    ``check`` must not pay for ``import dataclasses`` (None: quantize does not write the
    format).  ``aliases`` are the short names the writing commands accept for it (``w4a8``),
    collected by the registry.  ``inspect_text(env)`` is what ``inspect`` shows of a layer's
    parameters beyond its variant (``4-bit G=16 C=256``), from the geometry env; it runs on
    the inspect path, so it stays torch- and dataclass-free (None: nothing to show).

    Hooks for ``fix`` (kept in the format package's ``repair.py``; None = not needed):

    * ``infer_marker(fmt, tensors, convrot_groupsize) -> dict | str``: the marker keys besides
      ``format`` that an unmarked layer recognized as this format gets (``convrot_groupsize``
      is the size the user gave, or None), or the text of a refusal.  None: the generic rule
      (a rotated format takes the given ConvRot size, and ``convrot: true`` if it has that key).
    * ``lossy(fmt, env, tensors, readers) -> Recode | None``: the lossy re-encode that makes
      the layer usable by the runtimes ``readers`` describes (``formats.hooks.Readers``; the
      result a ``formats.hooks.Recode``: why, encoder arguments, the tensors it writes and
      replaces), or None when they can use the layer as stored.
      None: the format has no lossy repair.
    * ``legacy_renames``: old tensor suffix -> suffix, for the legacy layers this format
      replaces (scaled FP8, as ComfyUI 0.33.0 ``convert_old_quants`` renames it:
      ``scale_weight`` -> ``weight_scale``).

    Hook for ``check --deep`` (kept in the format package's ``deep.py``; None = not needed):
    ``dropped``, the part of a layer ComfyUI's loader leaves out and how to measure its share
    of the weight (``formats.hooks.DroppedPart``).  A slot's value checks are the slot's
    (``Slot.adds_zero_points``, ``on_int8_grid``, ``deep_check``)."""

    __slots__ = (
        "name",
        "title",
        "slots",
        "keys",
        "_geometry",
        "constraints",
        "bits_text",
        "rotation",
        "loaders",
        "converter_only",
        "recognize",
        "bank_rows",
        "bank_rows_if",
        "pad",
        "quant_format",
        "encode_params",
        "reference_factor",
        "codec_module",
        "order",
        "infer_rank",
        "params_module",
        "aliases",
        "inspect_text",
        "infer_marker",
        "lossy",
        "legacy_renames",
        "heavy_encoder",
        "dropped",
        "serialized_map",
        "_model_geometry",
    )

    def __init__(
        self,
        name: str,
        title: str,
        slots: tuple[Slot, ...],
        keys: tuple[MarkerKey, ...],
        geometry: Callable[[dict, dict], dict],
        constraints: tuple[Constraint, ...] = (),
        bits_text: str = "",
        rotation: str = "none",
        loaders: frozenset[str] = frozenset(),
        converter_only: bool = False,
        recognize: Callable[[dict], bool] | None = None,
        bank_rows: tuple[str, ...] = (),
        bank_rows_if: str | None = None,
        pad: tuple[int, int] = (1, 1),
        quant_format: str | None = None,
        encode_params: Callable[[dict, dict], dict] | None = None,
        reference_factor: float = 2.0,
        codec_module: str | None = None,
        order: int = UNPLACED,
        infer_rank: int | None = None,
        params_module: str | None = None,
        aliases: tuple[str, ...] = (),
        inspect_text: Callable[[dict], str] | None = None,
        infer_marker: Callable[..., dict | str] | None = None,
        lossy: Callable[..., Any] | None = None,
        legacy_renames: dict[str, str] | None = None,
        heavy_encoder: bool = False,
        dropped: DroppedPart | None = None,
        serialized_map: Callable[[list[str]], tuple[dict, str, dict]] | None = None,
        model_geometry: Callable[[dict, dict], dict] | None = None,
    ) -> None:
        self.name = name
        self.title = title
        self.slots = slots
        self.keys = keys
        self._geometry = geometry
        self.constraints = constraints
        self.bits_text = bits_text
        self.serialized_map = serialized_map
        self._model_geometry = model_geometry
        """For a format a runtime reads from a header map of its own instead of Comfy markers
        (SGLang's rowwise FP8): the header map of a file whose quantized layers (their prefixes)
        are all of this format, as ``markers.marker_map_text``'s (layers, version, further
        keys); such a file has no marker tensors."""
        self.rotation = rotation
        self.loaders = loaders
        self.converter_only = converter_only
        self.heavy_encoder = heavy_encoder
        self.recognize = recognize
        self.bank_rows = bank_rows
        self.bank_rows_if = bank_rows_if
        self.pad = pad
        self.quant_format = quant_format
        self.encode_params = encode_params
        self.reference_factor = reference_factor
        self.codec_module = codec_module
        self.order = order
        self.infer_rank = infer_rank
        self.params_module = params_module
        self.aliases = aliases
        self.inspect_text = inspect_text
        self.infer_marker = infer_marker
        self.lossy = lossy
        self.legacy_renames = legacy_renames or {}
        self.dropped = dropped

    def __repr__(self) -> str:
        return f"Format({self.name!r})"

    def geometry(self, tensors: dict, params: dict) -> dict:
        """The layer's geometry env (N, K, bits, variant ...) from its tensors and resolved
        marker parameters; GeometryError when they do not determine it.

        That includes parameters the description's expressions cannot use for the tensors
        present (a marker ``group_size`` of 0 or ``"x"`` under ``K // group_size``): every
        reader of the env then gets the one error it already handles instead of each
        evaluating the shapes into a ZeroDivisionError or TypeError."""
        return self._read(tensors, params)[0]

    def model_geometry(self, tensors: dict, params: dict) -> dict:
        """The geometry of the model a runtime builds for this layer: ``geometry``, or, for a
        format whose tensors together can outvote the weight's reading (``model_geometry``
        given), that reading; may raise GeometryError."""
        if self._model_geometry is not None:
            return self._model_geometry(tensors, params)
        return self.geometry(tensors, params)

    def _read(self, tensors: dict, params: dict) -> tuple[dict, list[tuple[Slot, bool, tuple | None]]]:
        """The geometry env and, for each suffix, the slot that applies (``slots_for``'s order)
        with whether its present tensor is forbidden and, for a present allowed one, its
        expected shape; every expression evaluated once, so ``interpret`` reuses them."""
        env = self._geometry(tensors, params)
        seen: set[str] = set()
        walk: list[tuple[Slot, bool, tuple | None]] = []
        for slot in self.slots:
            if slot.suffix in seen:
                continue
            try:
                if not slot.applies(env):
                    continue
                seen.add(slot.suffix)
                forbidden = False
                expected = None
                if slot.suffix in tensors:
                    forbidden = slot.is_forbidden(env)
                    if not forbidden:
                        expected = slot.expected_shape(env)
            except (ArithmeticError, TypeError, ValueError, KeyError, NameError):
                used = ", ".join(f"{k}={env[k]!r}" for k in self._names(slot) if k in env)
                raise GeometryError(f"{slot.suffix} has no valid shape for {used or 'this layer'}") from None
            walk.append((slot, forbidden, expected))
        return env, walk

    def interpret(self, marker: dict | None, tensors: dict) -> LayerReading:
        """Read one layer's marker and tensors against this description: every judgement the
        checker words as a finding, as data (``LayerReading``), in the order it reports them.

        ``marker`` None: the layer has no marker and the format was inferred, so its keys are
        not read (defaults stand)."""
        reading = LayerReading()
        params = reading.params = self.params(marker or {})
        if marker is not None:
            reading.keys = self._read_keys(marker, params)
        try:
            env, walk = self._read(tensors, params)
        except GeometryError as exc:
            reading.geometry_error = str(exc)
            return reading
        reading.env = env
        events = reading.slots
        for slot, forbidden, expected in walk:
            entry = tensors.get(slot.suffix)
            if entry is None:
                if slot.required:
                    try:
                        expected = slot.expected_shape(env)
                    except Exception:  # noqa: BLE001 -- the geometry is incomplete without the missing tensor
                        expected = None
                    events.append((MISSING, slot, None, expected))
            elif forbidden:
                events.append((FORBIDDEN, slot, entry, slot.why_forbidden(env)))
            else:
                dtype_ok = slot.accepts(entry.dtype)
                shape_ok = entry.shape == expected
                if not (dtype_ok and shape_ok):
                    events.append((MISMATCH, slot, entry, (expected, dtype_ok, shape_ok)))
        defined = {slot.suffix for slot, _f, _e in walk}
        reading.unknown = [
            (suffix, entry) for suffix, entry in tensors.items() if suffix not in defined and suffix != "comfy_quant"
        ]
        reading.failed = [c for c in self.constraints if not c.holds(env)]
        return reading

    def _read_keys(self, marker: dict, params: dict) -> list[tuple]:
        """The marker's key problems in report order: a nested ``params`` object, stored
        ``_`` keys, then per description key an invalid value or a missing explicit key."""
        out: list[tuple] = []
        nested = marker.get("params")
        if "params" in marker:
            out.append((NESTED, nested))
        for key in marker:
            if key.startswith("_"):
                out.append((UNDERSCORED, key, marker[key]))
        for k in self.keys:
            if k.name in marker or (k.nested_ok and isinstance(nested, dict) and k.name in nested):
                value = params[k.name]
                if not k.valid(value):
                    out.append((INVALID, k, value, k.why_invalid(value)))
            elif k.must_be_explicit(params):
                out.append((IMPLICIT, k))
        return out

    @staticmethod
    def _names(slot: Slot) -> list[str]:
        """The geometry names a slot's expressions read, in order of first use."""
        import re

        text = " ".join(t for t in (slot.when, slot.forbidden, slot.shape) if t)
        return list(dict.fromkeys(n for n in re.findall(r"[A-Za-z_]\w*", text) if n not in _GLOBALS))

    @property
    def has_codec(self) -> bool:
        return self.codec_module is not None

    def codec(self):
        """The format's codec (imports torch); raises CodecError when the format has none."""
        import importlib

        if self.codec_module is None:
            raise CodecError(f"no codec for format {self.name!r}")
        return importlib.import_module(self.codec_module).CODECS[self.name]

    @property
    def writable(self) -> bool:
        """Whether ``quantize``/``convert`` write this format (it has a ``Params`` class)."""
        return self.params_module is not None

    def params_class(self):
        """The frozen ``Params`` class ``quantize`` writes for this format (imports its module:
        a dataclass, never needed by check or inspect); None when quantize does not write it."""
        if self.params_module is None:
            return None
        import importlib

        return importlib.import_module(self.params_module).PARAMS[self.name]

    def key(self, name: str) -> MarkerKey | None:
        for k in self.keys:
            if k.name == name:
                return k
        return None

    def default(self, name: str):
        """The default of this description's marker key ``name`` (what ``Params`` fields start
        from); a KeyError names a key the description does not have."""
        key = self.key(name)
        if key is None:
            raise KeyError(f"format {self.name!r} has no marker key {name!r}")
        return key.default

    def params(self, marker: dict) -> dict:
        """Marker parameters with defaults; a nested ``params`` object is a fallback (ComfyUI)."""
        nested = marker.get("params")
        if not isinstance(nested, dict):
            nested = {}
        out = {}
        for k in self.keys:
            if k.name in marker:
                out[k.name] = marker[k.name]
            elif k.nested_ok and k.name in nested:
                out[k.name] = nested[k.name]
            else:
                out[k.name] = k.default
        return out

    def flattens_bank(self, tensors: dict, experts: int) -> bool:
        """Whether a bank of ``experts`` with these tensors is read as one layer of E*out rows."""
        if not self.bank_rows:
            return False
        cond = tensors.get(self.bank_rows_if) if self.bank_rows_if else None
        return self.bank_rows_if is None or (cond is not None and len(cond.shape) == 3 and cond.shape[0] == experts)

    def slots_for(self, env: dict) -> dict[str, Slot]:
        """The slot description that applies to each suffix for this geometry."""
        out: dict[str, Slot] = {}
        for s in self.slots:
            if s.suffix not in out and s.applies(env):
                out[s.suffix] = s
        return out
