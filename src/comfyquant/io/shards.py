"""Resolve user inputs (files, folders, index.json) into checkpoints: lists of shard files.

What is one checkpoint is decided here, the same way for every command and for every folder
of ``check --recursive``:

* An index (``*.safetensors.index.json``) is one checkpoint: exactly the shards its
  ``weight_map`` names.  Those are file names relative to the index's folder (sub-folders
  allowed); an absolute path, a ``..`` step, a NUL character or an empty name is refused (a
  symbolic link *in* the folder may point anywhere: Hugging Face's cache links every shard to
  its blobs folder).
* In a folder, besides its indexes: the ``<stem>-<i>-of-<n>.safetensors`` files with the same
  stem and n that no index names are one checkpoint (a number 1..n without its file is a
  missing shard); every other ``*.safetensors`` file is a checkpoint of its own.  Nothing else
  says "these files are one model": ComfyUI's ``models/diffusion_models`` holds several full
  models side by side.
* Files named on the command line are one checkpoint, the shards of one model, unless they
  repeat tensor names (``.comfy_quant`` markers aside, which shards may repeat): then they are
  grouped by the folder rule (``separate_repeats``, after their headers are read).

More than one checkpoint raises ``SeparateCheckpoints``, a one-line refusal naming them
for the commands that write one output; ``check`` and ``inspect`` catch it and report each.

A folder member that cannot be read (dangling symbolic link, link loop, directory, pipe) is a
missing shard of its group, with the reason; a one-line error when it is a checkpoint of its
own; skipped with a note when the folder has an index (then only the files an index names
matter).  A file reached twice through a link is read once, with a note; two shard names of
one group that are the same file make the second a missing shard.  Missing shards are
findings of the checkpoint (C011), not errors, so the rest is still checked.  URLs
(``is_url``) are resolved by ``comfyquant.io.remote``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from ..errors import InputError
from .jsontext import parse as parse_json

SHARD_NAME = re.compile(r"^(?P<stem>.+)-(?P<i>\d+)-of-(?P<n>\d+)\.safetensors$")
INDEX_SUFFIX = ".safetensors.index.json"
MAX_SERIES = 10_000
"""A ``-of-<n>`` larger than this is not read as a series (its missing numbers would be listed
one by one): the file stands alone.  Real models have at most a few hundred shards."""


class ShardSet:
    """The files of one checkpoint, and the index that named them (if any).

    ``weight_map`` maps tensor name -> shard file name as the index writes it (relative to
    ``index_dir``).  (Plain class, not a dataclass: importing dataclasses costs ~10 ms of
    start-up, a tenth of the budget of ``check``.)"""

    __slots__ = ("files", "missing", "index_path", "weight_map", "index_dir", "index_io", "why", "notes", "count", "explicit")

    def __init__(
        self,
        files: list[str] | None = None,
        missing: list[str] | None = None,
        index_path: str | None = None,
        weight_map: dict[str, str] | None = None,
        index_dir: str = "",
    ) -> None:
        self.files = files if files is not None else []
        self.missing = missing if missing is not None else []
        self.index_path = index_path
        self.weight_map = weight_map if weight_map is not None else {}
        self.index_dir = index_dir
        self.index_io: dict[str, dict[str, int]] = {}
        """Requests and bytes spent fetching a remote index (``Checkpoint.io_stats`` lists them)."""
        self.why: dict[str, str] = {}
        """Why a missing shard is missing when it is not simply absent (a dangling link ...)."""
        self.notes: list[tuple[str, str]] = []
        """(file, text): folder members skipped or read once, reported as info findings (C015)."""
        self.count: int | None = None
        """The shard count the file names give (``-of-00003``) when no index names the shards."""
        self.explicit = False
        """Several files named on the command line: ``separate_repeats`` may split them."""

    def missing_message(self, path: str) -> tuple[str, str]:
        """(message, actual) of the C011 finding for a missing shard."""
        actual = self.why.get(path, "no such file")
        if self.index_path:
            head = f"shard {path} named by {self.index_path} is missing"
        elif self.count:
            head = f"shard {path} is missing (the shard names count {self.count} files)"
        else:
            head = f"shard {path} is missing"
        return (head if path not in self.why else f"{head}: it {actual}"), actual


class Group:
    """One checkpoint found among a folder's files (or the command line's), before it is opened.

    ``kind``: ``"index"`` (``paths`` is the index; ``members`` the shards it names, None when it
    cannot be read), ``"shards"`` (files named ``<stem>-<i>-of-<n>``), ``"file"`` (a file of its
    own) or ``"files"`` (files named on the command line).  ``error`` is set when the checkpoint
    cannot be opened at all (the one-line reason)."""

    __slots__ = ("label", "paths", "missing", "error", "kind", "why", "notes", "count", "members", "folder", "parsed")

    def __init__(
        self,
        label: str,
        paths: list[str],
        missing: list[str] | None = None,
        error: str | None = None,
        kind: str = "file",
        folder: str | None = None,
    ) -> None:
        self.label = label
        self.paths = paths
        self.missing = missing or []
        self.error = error
        self.kind = kind
        self.why: dict[str, str] = {}
        self.notes: list[tuple[str, str]] = []
        self.count: int | None = None
        self.members: list[str] | None = None
        self.folder = folder
        self.parsed: tuple[list[str], dict[str, str]] | None = None
        """The index as ``read_index`` parsed it while grouping (not read twice)."""

    def __repr__(self) -> str:
        return f"Group({self.label!r}, {self.paths}, missing={self.missing})"

    def shardset(self) -> ShardSet:
        """The local files to open (an index is read here), or the group's one-line error."""
        if self.error:
            raise InputError(self.error)
        if self.kind == "index":
            ss = ShardSet()
            _use_index(ss, self.paths[0], self.parsed)
        else:
            ss = ShardSet(files=list(self.paths), missing=list(self.missing))
            ss.why = dict(self.why)
            ss.count = self.count
            ss.explicit = self.kind == "files" and len(self.paths) > 1
        ss.notes.extend(self.notes)
        return ss


class SeparateCheckpoints(InputError):
    """The input is several checkpoints, not the shards of one: commands that write one output
    refuse it with this line; ``check`` and ``inspect`` report each of ``groups``."""

    def __init__(self, where: str, groups: list[Group], reason: str) -> None:
        self.where = where
        self.groups = groups
        self.reason = reason
        names = [g.label + (f" (unreadable: {g.error.split(': ', 1)[-1]})" if g.error else "") for g in groups]
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"{where}: {len(groups)} separate checkpoints, not the shards of one model{why}: "
            f"{shown}; give one of them (check and inspect report each)"
        )

    @property
    def note(self) -> str:
        """The heading ``check`` and ``inspect`` print before their per-checkpoint sections."""
        why = f" ({self.reason})" if self.reason else ""
        return (
            f"{self.where}: {len(self.groups)} separate checkpoints, not the shards of one model{why}; "
            "each is reported on its own"
        )


def is_url(path: str) -> bool:
    """``scheme://...`` (http, https, s3, gs, hf, ...); a Windows drive (``C:\\``) is not a scheme."""
    scheme, sep, _ = path.partition("://")
    return (
        bool(sep)
        and len(scheme) > 1
        and scheme[0].isalpha()
        and scheme.replace("+", "").replace("-", "").replace(".", "").isalnum()
    )


def _outside(shard: str) -> str | None:
    """Why an index entry does not name a file inside the index's folder, or None."""
    if not shard:
        return "an empty file name"
    if "\0" in shard:
        return "a NUL character"
    if shard.startswith(("/", "\\")) or re.match(r"[A-Za-z]:[/\\]", shard):
        return "an absolute path"
    if ".." in re.split(r"[/\\]", shard):
        return "a '..' step out of the index's folder"
    return None


def read_index(path: str, text: str | None = None) -> tuple[list[str], dict[str, str]]:
    """Parse a ``model.safetensors.index.json``: (shard paths in order, raw weight_map).

    Every shard must be a file inside the index's folder (see the module docstring): an index
    that names ``../../x`` or ``/etc/x`` is refused with the entry, not followed."""
    if text is None:
        from .text import read_text_file

        text = read_text_file(path, "a shard index")
    try:
        obj = parse_json(text)
    except ValueError as exc:
        raise InputError(f"{path}: not a checkpoint: index is not valid JSON ({exc})") from None
    wm = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wm, dict) or not {*map(type, wm.values())} <= {str}:
        raise InputError(f"{path}: not a checkpoint: index has no weight_map object of tensor -> shard file names")
    names = sorted(set(wm.values()))
    for shard in names:
        why = _outside(shard)
        if why is not None:
            tensor = next(t for t, s in wm.items() if s == shard)
            raise InputError(
                f"{path}: index maps {tensor!r} to {shard!r}, {why}: an index may only name shard files in its own folder"
            )
    folder = os.path.dirname(path)
    shards = []
    for shard in names:
        joined = f"{folder}/{shard}" if is_url(path) else os.path.normpath(os.path.join(folder, shard))
        if joined not in shards:  # "a.safetensors" and "./a.safetensors" are one shard
            shards.append(joined)
    return shards, wm


# -- grouping a folder's files (names only: shared with check --recursive and URLs) ----------


def group_folder(
    folder: str,
    names: list[str],
    index_shards: Callable[[str], list[str] | None],
    join: Callable[[str, str], str],
    lone: tuple[str, ...] = (),
) -> list[Group]:
    """Group one folder's ``*.safetensors`` and index names into checkpoints by the module's
    rules, from the names alone (``index_shards`` reads an index: its shard paths, or None);
    labels are the names relative to the folder, sorted.  A name ending in one of ``lone``
    (another container's files, ``.gguf``) is a checkpoint of its own."""
    groups: list[Group] = []
    claimed: set[str] = set()
    names = [n for n in names if not _hidden(n)]
    for n in names:
        if n.endswith(INDEX_SUFFIX):
            index = join(folder, n)
            shards = index_shards(index)
            claimed.update(shards or ())
            g = Group(n, [index], kind="index", folder=folder)
            g.members = shards
            groups.append(g)
    stems: dict[tuple[str, str], dict[int, str]] = {}
    for n in names:
        if lone and n.endswith(lone):
            groups.append(Group(n, [join(folder, n)], kind="file", folder=folder))
            continue
        if not n.endswith(".safetensors"):
            continue
        path = join(folder, n)
        if path in claimed:
            continue
        m = SHARD_NAME.match(n)
        if m and 1 <= int(m["i"]) <= int(m["n"]) <= MAX_SERIES and int(m["i"]) not in stems.get((m["stem"], m["n"]), {}):
            stems.setdefault((m["stem"], m["n"]), {})[int(m["i"])] = n
        else:
            groups.append(Group(n, [path], kind="file", folder=folder))
    for (stem, total), present in stems.items():
        width = len(next(iter(present.values())).rsplit("-of-", 1)[0].rsplit("-", 1)[1])
        paths = [join(folder, present[i]) for i in sorted(present)]
        missing = [
            join(folder, f"{stem}-{i:0{width}d}-of-{total}.safetensors") for i in range(1, int(total) + 1) if i not in present
        ]
        g = Group(f"{stem}-{'N' * width}-of-{total}.safetensors", paths, missing, kind="shards", folder=folder)
        g.count = int(total)
        groups.append(g)
    groups.sort(key=lambda g: g.label)
    return groups


def _local_join(folder: str, name: str) -> str:
    return os.path.normpath(os.path.join(folder, name)) if folder else name


def settle(groups: list[Group]) -> list[Group]:
    """Look at one local folder's grouped files on disk (module docstring): unreadable members
    become missing shards, errors or notes; a file reached twice is read once.  Never raises."""
    from .source import member_id

    seen: dict[tuple[int, int], tuple[str, Group]] = {}
    index = next((g for g in groups if g.kind == "index"), None)
    out: list[Group] = []

    def rank(g: Group):  # indexes, then shard names, then lone files (real files before links)
        order = {"index": 0, "shards": 1}.get(g.kind, 2)
        return (order, order == 2 and os.path.islink(g.paths[0]), g.label)

    for g in sorted(groups, key=rank):
        if g.kind == "index":
            for p in g.members or ():
                key = member_id(p)
                if not isinstance(key, str):
                    seen.setdefault(key, (p, g))
            out.append(g)
        elif g.kind == "shards":
            kept: list[str] = []
            for p in g.paths:
                key = member_id(p)
                if isinstance(key, str):
                    problem = key
                else:
                    other = seen.get(key)
                    if other is not None and other[1] is g:
                        problem = f"is the same file as {os.path.basename(other[0])} (a link to it)"
                    else:
                        seen.setdefault(key, (p, g))
                        kept.append(p)
                        continue
                g.missing.append(p)
                g.why[p] = problem
            g.paths = kept
            g.missing.sort()
            if not kept:
                first = g.missing[0]
                g.error = (
                    f"{os.path.join(os.path.dirname(first), os.path.basename(g.label))}: none of its shards can be read "
                    f"({os.path.basename(first)} {g.why.get(first, 'does not exist')})"
                )
            out.append(g)
        else:
            p = g.paths[0]
            key = member_id(p)
            if isinstance(key, str):
                if index is not None:
                    index.notes.append((p, f"{g.label} {key}: skipped (the index names the shards of this folder)"))
                    continue
                g.error = f"{p}: {key}"
            else:
                other = seen.get(key)
                if other is not None:
                    other[1].notes.append(
                        (p, f"{g.label} is the same file as {os.path.basename(other[0])}: read once, as part of {other[1].label}")
                    )
                    continue
                seen[key] = (p, g)
            out.append(g)
    out.sort(key=lambda g: g.label)
    return out


def _hidden(name: str) -> bool:
    """A hidden file (``._model.safetensors``, macOS's AppleDouble companion of a copied file,
    or another tool's ``.partial`` download) is never a checkpoint of a folder: an index may
    still name one as a shard."""
    return name.rsplit("/", 1)[-1].startswith(".")


def folder_groups(folder: str) -> list[Group]:
    """The checkpoints of one local folder (labels relative to it)."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise InputError(f"{folder}: cannot list the folder ({exc.strerror})") from None
    wanted = [n for n in names if (n.endswith(".safetensors") or n.endswith(INDEX_SUFFIX)) and not _hidden(n)]
    if not wanted:
        subs = any(os.path.isdir(os.path.join(folder, n)) and not n.startswith(".") for n in names)
        raise InputError(
            f"{folder}: folder holds no .safetensors files"
            + ("; check --recursive also looks in its sub-folders" if subs else "")
        )
    parsed: dict[str, tuple[list[str], dict[str, str]]] = {}

    def index_shards(index: str) -> list[str] | None:
        try:
            parsed[index] = read_index(index)
        except InputError:
            return None  # opening the group says why
        return parsed[index][0]

    groups = group_folder(folder, wanted, index_shards, _local_join)
    for g in groups:
        g.parsed = parsed.get(g.paths[0]) if g.kind == "index" else None
    return settle(groups)


def plan_local(paths: list[str]) -> list[Group]:
    """Command-line paths -> the checkpoints they hold (module docstring), in argument order."""
    from .source import member_id

    if not paths:
        raise InputError("no input path given")
    groups: list[Group] = []
    files: list[str] = []
    seen: set[tuple[int, int]] = set()
    files_at = -1
    for path in paths:
        if path.endswith(".json"):
            groups.append(Group(path, [path], kind="index"))
        elif os.path.isdir(path):
            found = folder_groups(path)
            if len(paths) > 1:
                for g in found:
                    g.label = _local_join(path, g.label)
            groups.extend(found)
        else:
            key = member_id(path)  # the same file reached by two paths is one shard
            if isinstance(key, str):
                raise InputError(f"{path}: {'no such file or folder' if key == 'no such file' else key}")
            if key not in seen:
                seen.add(key)
                files.append(path)
                if files_at < 0:
                    files_at = len(groups)
    if files:
        label = files[0] if len(files) == 1 else f"{files[0]} (+{len(files) - 1} files)"
        groups.insert(files_at, Group(label, files, kind="files"))
    if len(groups) > 1:  # the same folder, index or file given twice is one checkpoint
        unique: dict[frozenset[str], Group] = {}
        for g in groups:
            unique.setdefault(frozenset(map(os.path.realpath, g.paths)), g)
        groups = list(unique.values())
    return groups


def folder_reason(groups: list[Group]) -> str:
    """Why a folder's files are several checkpoints, for ``SeparateCheckpoints``."""
    if any(g.kind == "index" for g in groups):
        return "an index names its own shards; other files stand alone"
    return "no index names them together, and the file names are not one <stem>-<i>-of-<n> series"


def resolve_local(paths: list[str]) -> ShardSet:
    """Turn command-line paths into one shard set, or raise ``SeparateCheckpoints``."""
    groups = plan_local(paths)
    if len(groups) > 1:
        folders = [p for p in paths if not p.endswith(".json") and os.path.isdir(p)]
        reason = folder_reason(groups) if folders else "each index and each folder is a checkpoint of its own"
        raise SeparateCheckpoints(", ".join(paths), groups, reason)
    return groups[0].shardset()


def separate_repeats(ss: ShardSet, tensors: list[dict]) -> SeparateCheckpoints | None:
    """Files named on the command line that repeat a tensor name are not the shards of one
    model unless their names say so (``<stem>-<i>-of-<n>``): the checkpoints they are, or None
    when they stay one.  ``tensors`` holds each file's names (its header's tensor dict)."""
    union: set[str] = set()
    repeat = None
    for names in tensors:
        common = union.intersection(names) if union else ()
        repeat = next((n for n in sorted(common) if not n.endswith(".comfy_quant")), None)
        if repeat is not None:
            break
        union.update(names)
    if repeat is None:
        return None
    by_folder: dict[str, list[str]] = {}
    for f in ss.files:
        by_folder.setdefault(os.path.dirname(f), []).append(os.path.basename(f))
    groups: list[Group] = []
    for folder, members in by_folder.items():
        for g in group_folder(folder, sorted(members), lambda _i: None, _local_join):
            g.label = _local_join(folder, g.label)
            groups.append(g)
    if len(groups) <= 1:
        return None
    groups = settle(groups)
    return SeparateCheckpoints(", ".join(ss.files), groups, f"the files repeat tensor names, e.g. {repeat!r}")


def _use_index(result: ShardSet, path: str, parsed: tuple[list[str], dict[str, str]] | None = None) -> None:
    """Read an index into ``result`` (``parsed``: already read): its shards in order, the
    missing ones with the reason."""
    from .source import member_id

    if parsed is None:
        found = member_id(path)
        if isinstance(found, str):
            raise InputError(f"{path}: {found}")
    shards, wm = parsed or read_index(path)
    result.index_path = path
    result.index_dir = os.path.dirname(path)
    result.weight_map = wm
    seen: dict[tuple[int, int], str] = {}
    for shard in shards:
        key = member_id(shard)
        if isinstance(key, str):
            problem = key
        else:
            first = seen.get(key)
            if first is None:
                seen[key] = shard
                result.files.append(shard)
                continue
            problem = f"is the same file as {os.path.relpath(first, result.index_dir or '.')} (a link to it)"
        result.missing.append(shard)
        if problem != "no such file":
            result.why[shard] = problem
    if not result.files:
        first = result.missing[0] if result.missing else "(none)"
        raise InputError(
            f"{path}: none of the shards the index names exist or can be read: {first}"
            + (f" {result.why[first]}" if first in result.why else "")
            + (f" (+{len(result.missing) - 1} more)" if len(result.missing) > 1 else "")
        )
