"""Declarative format descriptions (one module per format family) and their registry."""

from .base import Format, MarkerKey, Slot
from .registry import FORMATS, LAYER_SUFFIXES, get, infer_format

__all__ = ["FORMATS", "LAYER_SUFFIXES", "Format", "MarkerKey", "Slot", "get", "infer_format"]
