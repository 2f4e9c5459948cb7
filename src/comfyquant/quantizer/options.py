"""What a ``quantize`` or ``convert`` run was asked to do, as one frozen value.

The command line parses into it (``comfyquant.commands``), the API functions build it from
their keyword arguments, and ``api.run`` takes it: an option is a field here, a keyword of
its API function and (unless its field says ``cli=False``) a flag of its command, and nothing
between them copies it by hand.  ``tests/test_options.py`` holds the three together.

The fields keep the values as given; checking them is the run's first step (``api.run``),
so a bad value gets the same one-line error from the command line and from Python.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

if TYPE_CHECKING:
    from ..checker.run import Targets
    from ..checkpoint import Paths
    from .rules import Rules

OnLayer = Callable[[Any, Any], None]
"""``on_layer(layer_plan, result)``: called as each layer is written (progress in a caller's UI)."""

API_ONLY: Mapping[str, bool] = {"cli": False}
"""Field metadata of an option the command line has no flag for (a Python callable)."""


@dataclass(frozen=True, kw_only=True)
class EncodeOptions:
    """The options ``quantize`` and ``convert`` share (their API keywords of the same names)."""

    command: ClassVar[str]
    """The command's name, as the plan, the report and the messages say it."""
    format_flag: ClassVar[str]
    """The flag naming the format of every layer no rule names."""
    default_tag: ClassVar[str]
    """The default output's tag when only a rules file names formats."""

    paths: Paths
    out: str | None = None
    params: Mapping[str, Any] | None = None
    rules: str | os.PathLike[str] | Rules | None = None
    exclude: Sequence[str] = ()
    target: Targets = "all"
    jobs: int | str | None = None
    report: str | None = None
    dry_run: bool = False
    keep_bad: bool = False
    overwrite: bool = False
    progress: bool | None = None
    on_layer: OnLayer | None = field(default=None, metadata=API_ONLY)
    reference: str | os.PathLike[str] | None = None
    max_error: float | None = None

    def __post_init__(self) -> None:
        # Repeatable options arrive as a list from the command line and as any sequence from
        # Python: held as tuples, so equal requests are equal objects and none changes later.
        object.__setattr__(self, "exclude", tuple(self.exclude))

    @property
    def default_format(self) -> str | None:
        """The format the command gives every layer no rule names (``--format``/``--to``)."""
        raise NotImplementedError

    def path_list(self) -> list[str]:
        """The input paths as strings (one path given alone becomes a list of one)."""
        given = [self.paths] if isinstance(self.paths, (str, os.PathLike)) else list(self.paths)
        return [str(p) for p in given]


@dataclass(frozen=True, kw_only=True)
class QuantizeOptions(EncodeOptions):
    """``comfyquant quantize`` / ``comfyquant.quantize``."""

    command: ClassVar[str] = "quantize"
    format_flag: ClassVar[str] = "--format"
    default_tag: ClassVar[str] = "quantized"

    format: str | None = None
    preset: str | None = None
    include: Sequence[str] = ()
    like: Paths | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "include", tuple(self.include))

    @property
    def default_format(self) -> str | None:
        return self.format


@dataclass(frozen=True, kw_only=True)
class ConvertOptions(EncodeOptions):
    """``comfyquant convert`` / ``comfyquant.convert``."""

    command: ClassVar[str] = "convert"
    format_flag: ClassVar[str] = "--to"
    default_tag: ClassVar[str] = "converted"

    to: str | None = None
    dtype: str | None = None

    @property
    def default_format(self) -> str | None:
        return self.to

    @property
    def dense(self) -> bool:
        """``--to dense``: every layer decoded (the dequantize command's work)."""
        return isinstance(self.to, str) and self.to.strip().lower() in ("dense", "dequantize")


class EncodeKeywords(TypedDict, total=False):
    """The keywords ``quantize`` and ``convert`` share after their positional parameters, for
    type checkers and IDEs (``**kwargs: Unpack[...]``): the fields of ``EncodeOptions``, whose
    defaults they take (``tests/test_options.py`` holds the two together)."""

    rules: str | os.PathLike[str] | Rules | None
    exclude: Sequence[str]
    target: Targets
    jobs: int | str | None
    report: str | None
    dry_run: bool
    keep_bad: bool
    overwrite: bool
    progress: bool | None
    on_layer: OnLayer | None
    reference: str | os.PathLike[str] | None
    max_error: float | None


class QuantizeKeywords(EncodeKeywords, total=False):
    """``quantize``'s keywords: the shared ones and ``QuantizeOptions``'s own."""

    preset: str | None
    include: Sequence[str]
    like: Paths | None


class ConvertKeywords(EncodeKeywords, total=False):
    """``convert``'s keywords: the shared ones and ``ConvertOptions``'s own."""

    dtype: str | None
