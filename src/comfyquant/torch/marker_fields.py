"""The marker fields a ``QuantLinear`` reads, checked for their JSON types before any is used.

A marker is JSON from the file: ``format`` may be a list, a number or null, ``group_size``
a string or an object.  ``comfyquant check`` reports such values (a wrong-typed key is a
warning where a runtime reads it loosely); a layer built from them would fail far from the
cause (``int([16])`` in comfy-kitchen's parameters at the first forward) or silently read
``full_precision_matrix_mult: 1`` as false.  So the loader and ``QuantWeight`` refuse every
field of the wrong type, naming the layer and the field, before a tensor is read.

The fields are the format description's marker keys (``formats/<family>``: each key's JSON
types), read where ComfyUI reads them -- the marker itself or, for the keys ComfyUI also takes
from a nested ``params`` object, there -- plus ``full_precision_matrix_mult``, which the layer
reads for every format.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .. import codecs
from ..formats.base import MarkerKey
from ..formats.common import FULL_PRECISION_KEY
from ..formats.registry import FORMATS

_TYPE_WORDS = {bool: "true or false", int: "an integer", str: "a string", float: "a number"}
_JSON_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "an object"}


def _json_type(value: Any) -> str:
    return "null" if value is None else _JSON_NAMES.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    """The value as the file's JSON spells it (``null``, ``[16]``), cut to one short line."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _described(value: Any) -> str:
    """``null``, or the value and its JSON type: ``[16] (a list)``."""
    return "null" if value is None else f"{_shown(value)} ({_json_type(value)})"


def _has_type(key: MarkerKey, value: Any) -> bool:
    if isinstance(value, bool):
        return bool in key.types
    return isinstance(value, key.types)


def marker_problem(marker: Any, layer: str) -> str | None:
    """What is wrong with ``marker``'s types, one line starting with ``layer`` (how the caller
    names the layer, e.g. ``layer 'blocks.0.fc'``); None: every field the layer reads has its
    format's type and the format has a codec."""
    if not isinstance(marker, Mapping):
        return f"{layer}: marker is {_described(marker)}, not an object"
    if "format" not in marker:
        return f"{layer}: marker has no 'format'"
    fmt_name = marker["format"]
    if not isinstance(fmt_name, str):
        return f"{layer}: marker 'format' is {_described(fmt_name)}, not a format name"
    if not codecs.has(fmt_name):
        return f"{layer}: format {fmt_name!r} cannot run here; formats: {', '.join(codecs.NAMES)}"
    fmt = FORMATS[fmt_name]
    nested = marker.get("params")
    keys = list(fmt.keys)
    if fmt.key(FULL_PRECISION_KEY.name) is None:
        keys.append(FULL_PRECISION_KEY)
    for key in keys:
        if key.name == "format":
            continue
        if key.name in marker:
            value, where = marker[key.name], repr(key.name)
        elif key.nested_ok and isinstance(nested, Mapping) and key.name in nested:
            value, where = nested[key.name], f"'params.{key.name}'"
        else:
            continue
        if not _has_type(key, value):
            wanted = " or ".join(_TYPE_WORDS.get(t, t.__name__) for t in key.types)
            return f"{layer} ({fmt_name}): marker {where} is {_described(value)}, not {wanted}"
    return None
