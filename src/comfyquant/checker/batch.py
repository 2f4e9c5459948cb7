"""``check --recursive``: every checkpoint of a folder tree, one report each, and a summary.

Teams publish folders of many checkpoints; checking them one command at a time is slow to
type and slow to run.  Each folder of the tree is grouped into checkpoints by the one rule
every command uses (``comfyquant.io.shards``):

1. each ``*.safetensors.index.json`` is one checkpoint with the shards it names;
2. the remaining ``<stem>-0000N-of-0000M.safetensors`` files with the same stem and M are one
   checkpoint; a number 1..M without its file is reported as a missing shard (``C011``), as
   a missing shard an index names would be;
3. every other ``*.safetensors`` file is a checkpoint of its own, and so is every file of
   another container a dialect reads (``*.gguf``, local folders only).

The same machinery checks the separate checkpoints of one folder given to plain ``check``
(``check_groups``).  Roots are local folders, fsspec folder URLs (``s3://bucket/models/``;
HTTP cannot list), or single files and URLs.  Hidden folders (``.git``, ``.cache``) are skipped.

Each checkpoint is checked by ``comfyquant.checker.run.build_report``, as a single one is.
``jobs`` threads open checkpoints concurrently: reading headers and markers is I/O (network
round trips for URLs), which threads overlap well.  The rules then run one checkpoint at a time
under ``build_report``'s lock: they are pure Python (the GIL would serialise them anyway) and
share process-wide caches (the signature memo) that are not written for concurrent use.  Results come back in
the grouping order whatever finishes first, so output is deterministic.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..checkpoint import NameMapper
from ..errors import InputError
from ..io.shards import INDEX_SUFFIX, SHARD_NAME, Group, group_folder, is_url, read_index, settle
from .report import Report, proven_for
from .run import DEFAULTS, CheckOptions, Targets, build_report, open_group, parse_targets

if TYPE_CHECKING:
    from ..io.remote import RemoteOptions

__all__ = [
    "INDEX_SUFFIX",
    "SHARD_NAME",
    "Group",
    "Item",
    "TreeResult",
    "check_group",
    "check_groups",
    "open_group",
    "check_tree",
    "discover",
    "group",
]


class Item:
    """The outcome for one checkpoint: a report, or the one-line error that stopped it."""

    __slots__ = ("label", "paths", "report", "error", "seconds")

    def __init__(
        self, label: str, paths: list[str], report: Report | None = None, error: str | None = None, seconds: float = 0.0
    ) -> None:
        self.label = label
        self.paths = paths
        self.report = report
        self.error = error
        self.seconds = seconds

    @property
    def status(self) -> str:
        if self.report is None:
            return "unreadable"
        return "ok" if self.report.ok else "failed"

    def to_dict(self) -> dict:
        head = {"checkpoint": self.label, "status": self.status, "error": self.error, "seconds": round(self.seconds, 4)}
        if self.report is None:
            return {**head, "paths": list(self.paths)}
        return {**head, **self.report.to_dict()}


class TreeResult:
    """Every checkpoint of the roots, in grouping order."""

    def __init__(self, roots: list[str], items: list[Item], targets: tuple[str, ...]) -> None:
        self.roots = roots
        self.items = items
        self.targets = targets

    @property
    def ok(self) -> bool:
        return bool(self.items) and all(i.status == "ok" for i in self.items)

    @property
    def exit_code(self) -> int:
        """2 when a checkpoint could not be read, else 1 when one has errors, else 0."""
        if not self.items or any(i.report is None for i in self.items):
            return 2
        return 0 if self.ok else 1

    def summary(self) -> dict:
        reports = [i.report for i in self.items if i.report is not None]
        statuses = [i.status for i in self.items]
        out = {
            "checkpoints": len(self.items),
            "ok": statuses.count("ok"),
            "failed": statuses.count("failed"),
            "unreadable": statuses.count("unreadable"),
            "errors": sum(r.counts["error"] for r in reports),
            "warnings": sum(r.counts["warning"] for r in reports),
            "targets": {},
            "requests": sum(s["requests"] for r in reports for s in r.io.values()),
            "bytes": sum(s["bytes"] for r in reports for s in r.io.values()),
        }
        for t in self.targets:
            loads = sum(1 for r in reports if t in r.verdicts and r.verdicts[t].loads)
            out["targets"][t] = {"loads": loads, "fails": len(reports) - loads, "proven_for": proven_for(t)}
        return out

    def to_dict(self) -> dict:
        return {
            "schema": 1,
            "roots": list(self.roots),
            "ok": self.ok,
            "summary": self.summary(),
            "checkpoints": [i.to_dict() for i in self.items],
        }


# -- finding the files ------------------------------------------------------------------------


def _wanted(name: str) -> bool:
    return name.endswith(".safetensors") or name.endswith(INDEX_SUFFIX)


def _lone() -> tuple[str, ...]:
    """File endings of the other containers (``.gguf``): read locally, each its own checkpoint."""
    from ..dialects.containers import container_suffixes

    return container_suffixes()


def discover(root: str) -> list[str]:
    """Every ``.safetensors`` and ``.safetensors.index.json`` under ``root`` (sorted), and
    under a local folder every file of another container (``.gguf``)."""
    if is_url(root):
        from ..io.remote import filesystem, is_http

        if is_http(root):
            if _wanted(root.split("?", 1)[0]):
                return [root]
            raise InputError(f"{root}: an HTTP server cannot list a folder: give the URLs of the files or indexes")
        fs, path = filesystem(root)
        try:
            if not fs.isdir(path):
                return [root] if fs.exists(path) else _missing(root)
            base = path.rstrip("/")
            found = fs.find(base)
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"{root}: cannot list ({type(exc).__name__}: {exc})") from None
        prefix = root.rstrip("/")
        out = []
        for p in found:
            rel = p[len(base) :].lstrip("/") if p.startswith(base) else p.rsplit("/", 1)[-1]
            if _wanted(rel) and not any(part.startswith(".") for part in rel.split("/")[:-1]):
                out.append(f"{prefix}/{rel}")
        return sorted(out)
    if os.path.isfile(root):
        return [root]
    if not os.path.isdir(root):
        return _missing(root)
    out = []
    lone = _lone()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out.extend(os.path.join(folder, f) for f in sorted(files) if _wanted(f) or f.endswith(lone))
    return out


def _missing(root: str) -> list[str]:
    raise InputError(f"{root}: no such file or folder")


def _split(path: str) -> tuple[str, str]:
    """(folder, name) of a local path or a URL."""
    if is_url(path):
        folder, _, name = path.rpartition("/")
        return folder, name
    return os.path.dirname(path), os.path.basename(path)


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if is_url(folder) else os.path.normpath(os.path.join(folder, name))


def _index_shards(index: str, remote: RemoteOptions | None) -> list[str] | None:
    """The shard paths an index names (None when it cannot be read: the check will say why)."""
    try:
        if is_url(index):
            from ..io.remote import RemoteOptions, fetch_index

            text, _io = fetch_index(index, remote or RemoteOptions())
            _shards, wm = read_index(index, text)
        else:
            _shards, wm = read_index(index)
    except InputError:
        return None
    folder, _ = _split(index)
    return [_join(folder, s) for s in sorted(set(wm.values()))]


def group(files: list[str], root: str = "", remote: RemoteOptions | None = None) -> list[Group]:
    """Group found files into checkpoints (see the module docstring); labels are relative to root.

    Names only: ``settle`` then looks at local files on disk."""
    by_folder: dict[str, list[str]] = {}
    for f in files:
        folder, name = _split(f)
        by_folder.setdefault(folder, []).append(name)
    groups: list[Group] = []

    top = (root.rstrip("/") if is_url(root) else os.path.normpath(root)) if root else ""
    sep = "/" if is_url(root) else os.sep

    def label(path: str) -> str:
        """The path relative to the root (the root's own name when it is the root itself)."""
        if top and path.startswith(top + sep):
            return path[len(top) + 1 :]
        return path

    def join(folder: str, name: str) -> str:
        return _join(folder, name) if folder else name

    lone = () if is_url(root) else _lone()
    for folder in sorted(by_folder):
        for g in group_folder(folder, sorted(by_folder[folder]), lambda index: _index_shards(index, remote), join, lone=lone):
            g.label = label(join(folder, g.label))
            groups.append(g)
    groups.sort(key=lambda g: g.label)
    return groups


def settle_local(groups: list[Group]) -> list[Group]:
    """``settle`` each local folder's groups (URL groups pass as they are)."""
    by_folder: dict[str | None, list[Group]] = {}
    for g in groups:
        by_folder.setdefault(g.folder, []).append(g)
    out: list[Group] = []
    for folder, members in by_folder.items():
        out.extend(members if folder is None or is_url(folder) else settle(members))
    out.sort(key=lambda g: g.label)
    return out


# -- checking -------------------------------------------------------------------------------


def check_group(grp: Group, options: CheckOptions = DEFAULTS) -> Item:
    """Check one group; an unreadable checkpoint becomes an Item with its error."""
    t0 = time.perf_counter()
    try:
        report = build_report(grp, options)
    except InputError as exc:  # unreadable, or a --deep read failed on the network
        return Item(grp.label, grp.paths, error=str(exc), seconds=time.perf_counter() - t0)
    return Item(grp.label, grp.paths, report=report, seconds=time.perf_counter() - t0)


def check_groups(
    roots: list[str],
    groups: list[Group],
    options: CheckOptions = DEFAULTS,
    jobs: int = 1,
    on_result: Callable[[Item], None] | None = None,
) -> TreeResult:
    """Check each group as ``options`` ask (``on_result`` sees each Item in order as it is done)."""
    selected = parse_targets(options.target)

    def one(g: Group) -> Item:
        return check_group(g, options)

    items: list[Item] = []
    if jobs <= 1 or len(groups) <= 1:
        for g in groups:
            items.append(one(g))
            if on_result:
                on_result(items[-1])
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for item in pool.map(one, groups):
                items.append(item)
                if on_result:
                    on_result(item)
    return TreeResult(list(roots), items, selected)


def check_tree(
    roots: list[str],
    target: Targets = "all",
    deep: bool = False,
    name_mapper: NameMapper | None = None,
    jobs: int = 1,
    remote: RemoteOptions | None = None,
    on_result: Callable[[Item], None] | None = None,
) -> TreeResult:
    """Check every checkpoint under ``roots``; ``on_result`` sees each Item in order as it is done."""
    parse_targets(target)
    groups: list[Group] = []
    for root in roots:
        try:
            found = discover(root)
        except InputError as exc:
            groups.append(Group(root, [root], error=str(exc)))
            continue
        if not found:
            groups.append(Group(root, [root], error=f"{root}: no .safetensors or .gguf files under this folder"))
            continue
        base = root if (is_url(root) or os.path.isdir(root)) else ""
        groups.extend(settle_local(group(found, base, remote)))
    return check_groups(roots, groups, CheckOptions(target, deep, name_mapper, remote), jobs, on_result)
