"""Resolve user inputs (files, folders, index.json) into an ordered list of shard files.

A folder means its ``*.safetensors`` files, unless it holds a ``*.safetensors.index.json``, in
which case the index decides which shards belong to the checkpoint.  Missing shards an index
names are reported by the checkpoint as findings, not raised, so the rest is still checked.
URLs (``is_url``) are resolved the same way by :mod:`comfyquant.io.remote`.
"""

from __future__ import annotations

import json
import os
from stat import S_ISREG

from ..errors import InputError


class ShardSet:
    """The files of one checkpoint, and the index that named them (if any).

    ``weight_map`` maps tensor name -> shard file name as the index writes it (relative to
    ``index_dir``).  (Plain class, not a dataclass: importing dataclasses costs ~10 ms of
    start-up, a tenth of the budget of ``check``.)"""

    __slots__ = ("files", "missing", "index_path", "weight_map", "index_dir", "index_io")

    def __init__(self, files: list[str] | None = None, missing: list[str] | None = None, index_path: str | None = None,
                 weight_map: dict[str, str] | None = None, index_dir: str = "") -> None:
        self.files = files if files is not None else []
        self.missing = missing if missing is not None else []
        self.index_path = index_path
        self.weight_map = weight_map if weight_map is not None else {}
        self.index_dir = index_dir
        self.index_io: dict[str, dict[str, int]] = {}
        """Requests and bytes spent fetching a remote index (``Checkpoint.io_stats`` lists them)."""


def is_url(path: str) -> bool:
    """``scheme://...`` (http, https, s3, gs, hf, ...); a Windows drive (``C:\\``) is not a scheme."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and len(scheme) > 1 and scheme[0].isalpha() and scheme.replace("+", "").replace("-", "").replace(".", "").isalnum()


def read_index(path: str, text: str | None = None) -> tuple[list[str], dict[str, str]]:
    """Parse a ``model.safetensors.index.json``: (shard paths in order, raw weight_map)."""
    if text is None:
        from .source import require_regular

        require_regular(path)
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            raise InputError(f"{path}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read index ({exc})") from None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: index is not valid JSON ({exc})") from None
    wm = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wm, dict) or not {*map(type, wm.values())} <= {str}:
        raise InputError(f"{path}: index has no weight_map object of tensor -> shard file names")
    folder = os.path.dirname(path)
    shards = [os.path.join(folder, shard) for shard in sorted(set(wm.values()))]
    return shards, wm


def resolve_local(paths: list[str]) -> ShardSet:
    """Turn command-line paths into one shard set (see the module docstring)."""
    if not paths:
        raise InputError("no input path given")
    result = ShardSet()
    seen: set[tuple[int, int]] = set()

    def add(p: str) -> None:
        st = os.stat(p)  # one system call; the same file reached by two paths is one shard
        if not S_ISREG(st.st_mode):
            from .source import not_regular

            raise not_regular(p, st.st_mode)
        key = (st.st_dev, st.st_ino)
        if key not in seen:
            seen.add(key)
            result.files.append(p)

    for path in paths:
        if path.endswith(".json"):
            _use_index(result, path, add)
        elif os.path.isdir(path):
            names = sorted(os.listdir(path))
            indexes = [n for n in names if n.endswith(".safetensors.index.json")]
            if indexes:
                for n in indexes:
                    _use_index(result, os.path.join(path, n), add)
                continue
            files = [n for n in names if n.endswith(".safetensors")]
            if not files:
                raise InputError(f"{path}: folder holds no .safetensors files")
            for n in files:
                add(os.path.join(path, n))
        elif os.path.exists(path):
            add(path)
        else:
            raise InputError(f"{path}: no such file or folder")
    if not result.files:
        where = result.index_path or ", ".join(paths)
        raise InputError(f"{where}: none of the shards the index names exist: {', '.join(result.missing[:3])}")
    return result


def _use_index(result: ShardSet, path: str, add) -> None:
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    shards, wm = read_index(path)
    result.index_path = path
    result.index_dir = os.path.dirname(path)
    if result.weight_map:
        result.weight_map.update(wm)
    else:
        result.weight_map = wm  # the usual single index: no copy
    for shard in shards:
        if os.path.isfile(shard):
            add(shard)
        else:
            result.missing.append(shard)
