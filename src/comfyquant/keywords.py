"""An API function's keywords as its options dataclass states them.

``quantize``, ``convert`` and ``migrate`` take their options after the leading parameters as
``**kwargs`` typed by a ``TypedDict`` (``Unpack``: what type checkers and IDEs complete), and
build their options object from them, so each option's name, type and default is written
once, as a field.  ``keywords_of`` gives such a function the signature those fields state,
which ``help()``, ``inspect.signature`` and the documentation show: the function's own
parameters, then one keyword-only parameter per other field, with its type and default.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


def keywords_of(options: type) -> Callable[[F], F]:
    """Decorate an API function whose ``**kwargs`` are the other fields of the dataclass
    ``options``: its signature becomes its own parameters followed by those fields, and an
    unknown keyword is refused in the function's name."""

    def give(function: F) -> F:
        signature = inspect.signature(function)
        own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        named = {p.name for p in own}
        fields = [
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=_default(f), annotation=f.type)
            for f in dataclasses.fields(options)
            if f.name not in named
        ]
        known = frozenset(p.name for p in own + fields)

        @functools.wraps(function)
        def checked(*args: Any, **kwargs: Any) -> Any:
            # a misspelt keyword is the caller's error: name the function called, as Python does
            for name in kwargs:
                if name not in known:
                    raise TypeError(f"{function.__name__}() got an unexpected keyword argument {name!r}")
            return function(*args, **kwargs)

        checked.__signature__ = signature.replace(parameters=own + fields)  # type: ignore[attr-defined]
        return cast(F, checked)

    return give


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return inspect.Parameter.empty
