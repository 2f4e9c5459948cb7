"""Where a writing command's outputs go, and what it refuses: one rule for every file a command
writes (the model of ``fix``, ``migrate``, ``quantize``, ``convert`` and ``dequantize``, its
index, ``--report``'s JSON and PNG, ``compare --plot``), so ``-o OUT`` and ``--overwrite`` mean
the same everywhere and every refusal is the same line for the same situation.

* No ``OUT``: the output is named after the input with a tag (``fixed``, the format, ``dense``):
  ``<stem>.<tag>.safetensors`` next to one input file, ``<folder>.<tag>`` next to the folder of
  shards (a URL input: in the current folder).
* ``OUT`` is a folder (an existing one, or a new one written ``OUT/``): the output goes into
  it under the name it gets without ``OUT``: ``OUT/<stem>.<tag>.safetensors`` for one input
  file, the shards' own names (and the index) for shards.
* Otherwise one input file gives the file ``OUT``; shards (or an index) give the folder
  ``OUT`` (created).  ``dequantize`` names by suffix instead (``merge``): a ``.safetensors``
  OUT is one file, whatever the input (shards merge into it), any other OUT a folder.
* Refused before anything is written (``claim``): an output that is an input (same
  path, or the same file through a link), an existing output unless ``overwrite`` (never a
  folder, device, FIFO or socket, whatever ``overwrite`` says), an output whose folder does not
  exist, an output in a folder this process cannot create files in (read-only, immutable, a
  read-only filesystem).
  Only ``fix --in-place`` writes over its input, and it says so explicitly.
* Files beside the model (``--report``, ``--plot``) are claimed by the same rules
  (``claim_files``), before any work.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import InputError, option
from .shards import is_url

SUFFIX = ".safetensors"


@dataclass(frozen=True)
class Outputs:
    """The destinations of one run, all refusals passed."""

    files: list[str] | None
    """Destination of each input file, in input order; None when the inputs merge into ``merged``."""
    index: str | None
    """Destination of the ``*.safetensors.index.json``, or None when the output has none."""
    merged: str | None = None
    """The one output file the inputs merge into (``dequantize`` with a ``.safetensors`` OUT)."""
    folder: str | None = None
    """The output folder still to create (``make_folder``), or None."""

    @property
    def per_file(self) -> list[str]:
        """``files`` of a run that writes one output per input (claimed without ``merge``)."""
        if self.files is None:
            raise ValueError(f"the inputs merge into {self.merged}: there is no output per input")
        return self.files

    @property
    def merged_file(self) -> str:
        """``merged`` of a run whose inputs merge into one file (claimed with ``merge``)."""
        if self.merged is None:
            raise ValueError("the inputs are not merged: there is one output per input")
        return self.merged

    @property
    def paths(self) -> list[str]:
        """Every path the run may write, index last."""
        return [*(self.files if self.files is not None else [self.merged]), *([self.index] if self.index else [])]

    def make_folder(self) -> None:
        """Create the output folder (its parent exists: ``claim`` checked it)."""
        if self.folder:
            os.makedirs(self.folder, exist_ok=True)


def default_output(files: list[str], index: str | None, tag: str) -> str:
    """The output's name when the user gives none: ``<stem>.<tag>.safetensors`` for one input
    file, ``<folder>.<tag>`` for shards.  Next to the input, so a default never lands in an
    unrelated folder; a URL's output goes in the current folder under the URL's file name."""
    if len(files) == 1 and not index:
        return _without_extension(_local_name(files[0])) + f".{tag}{SUFFIX}"
    first = index or files[0]
    if is_url(first):
        tail = _url_path(first).rpartition("/")[0]
        folder = os.path.abspath(os.path.basename(tail) or "model")
    else:
        folder = os.path.dirname(os.path.abspath(first))
    return (folder.rstrip(os.sep) or os.path.join(folder, "model")) + f".{tag}"  # shards in / give /model.<tag>


_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,11}$")
"""A file name's extension (``.safetensors``, ``.gguf``, ``.sft``): a dot, then a letter first
(``flux.1-dev`` has none)."""


def _without_extension(path: str) -> str:
    """``x.gguf`` -> ``x``, ``x.safetensors`` -> ``x``: an output is named for its model, not
    for the container it was read from (never ``x.gguf.comfy.safetensors``)."""
    folder, name = os.path.split(path)
    stem = _EXTENSION.sub("", name)
    return os.path.join(folder, stem or name)


def _local_name(path: str) -> str:
    """A URL's file name (query and fragment dropped), a local path as it is."""
    if not is_url(path):
        return path
    return os.path.basename(_url_path(path)) or "model"


def _url_path(url: str) -> str:
    return url.partition("://")[2].split("?", 1)[0].split("#", 1)[0].rstrip("/")


def claim(
    files: list[str],
    index: str | None,
    out: str | None,
    *,
    overwrite: bool,
    tag: str,
    merge: bool = False,
    in_place: bool = False,
    index_for_shards: str | None = None,
    also: list[str] | tuple[str, ...] = (),
    error: type[Exception] = InputError,
) -> Outputs:
    """The destinations of a run, refused (``error``, one line naming the path) before any work
    when they cannot be written as asked.

    ``out``: the user's OUT, or None for the default name (``default_output`` with ``tag``).
    ``overwrite``: replace existing output files.  ``merge``: ``dequantize``'s rule (a
    ``.safetensors`` OUT is one file whatever the input).  ``in_place``: ``fix --in-place``, the
    inputs themselves (through links, their targets).  ``index_for_shards``: the name of the index
    a command writes for a sharded output even when the input has none.  ``also``: more files the
    run writes (``--report``), held to the same rules."""
    inputs = list(files) + ([index] if index else [])
    if in_place:
        if out is not None:
            raise error("give either -o OUT or --in-place, not both")
        if any(is_url(f) for f in inputs):
            raise error(f"{next(f for f in inputs if is_url(f))}: a URL cannot be replaced in place; give -o OUT")
        # Through a symbolic link, the link's target is what gets replaced (temp file next to
        # it, renamed onto it): the link stays a link.
        result = Outputs([os.path.realpath(f) for f in files], index and os.path.realpath(index))
        _refuse_unwritable(result.paths, error)
        return result
    if out is None:
        out = default_output(list(files), index, tag)
    dests, index_dest, create = _destinations(list(files), index, out, merge, tag, error)
    if create:
        _refuse_missing_parent(out, error)  # OUT itself is created, never the folders above it
    if dests is not None and index_dest is None and index_for_shards and len(dests) > 1:
        index_dest = os.path.join(os.path.dirname(dests[0]), index_for_shards)
    result = Outputs(dests, index_dest, None if dests is not None else out, out if create else None)
    for path in result.paths:  # in a folder still to create: no file there yet, its parent checked
        _refuse_taken(path, inputs, overwrite, error, parent=not create)
    claim_files(also, inputs, overwrite=overwrite, error=error)
    _refuse_unwritable([*result.paths, *also] if not create else [out.rstrip("/" + os.sep), *also], error)
    return result


def claim_files(
    paths: list[str] | tuple[str, ...],
    inputs: list[str] | tuple[str, ...] = (),
    *,
    overwrite: bool,
    error: type[Exception] = InputError,
) -> None:
    """Refuse (``error``, one line naming the path) any of ``paths`` -- files a run writes beside
    its model, or alone (``compare --plot``) -- that the output rule refuses: an input, an
    existing file without ``overwrite``, a folder, device, FIFO or socket, a missing or
    unwritable folder.  Called before any work."""
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            # Only a model's OUT names a folder to write into; these files have no default name.
            raise error(f"{path}: is a folder; give the file's own path")
        _refuse_taken(path, list(inputs), overwrite, error)
    _refuse_unwritable(list(paths), error)


def _refuse_unwritable(paths: list[str], error: type[Exception]) -> None:
    """Each folder the ``paths`` go into must take a new file: a read-only or immutable folder,
    or a read-only filesystem, is refused before the work, not found out when the finished file
    cannot be created.  Asked of the kernel (``access``, as this process's effective user),
    without creating anything."""
    seen: set[str] = set()
    for path in paths:
        folder = os.path.dirname(os.path.abspath(path))
        if folder in seen or not os.path.isdir(folder):
            continue  # a missing folder is refused by its own rule
        seen.add(folder)
        if not _can_create_in(folder):
            raise error(f"{path}: cannot write in {folder} ({_why_not(folder)})")


def _can_create_in(folder: str) -> bool:
    effective = os.access in os.supports_effective_ids
    return os.access(folder, os.W_OK | os.X_OK, effective_ids=effective)


def _why_not(folder: str) -> str:
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "a read-only filesystem"
    except (OSError, AttributeError):
        pass
    return "no permission to create files there: a read-only or immutable folder"


def _destinations(
    files: list[str], index: str | None, out: str, merge: bool, tag: str, error: type[Exception]
) -> tuple[list[str] | None, str | None, bool]:
    """(destination per input file, or None when the inputs merge into the file ``out``;
    destination of the index or None; whether ``out`` is a folder still to create).

    A folder ``out`` holds the output under the name it gets without ``out``: one input file's
    output is ``out/<stem>.<tag>.safetensors`` (never the input's own name: a quantized file
    named like its dense source would be taken for it), shards keep their names (a sharded
    model is its folder)."""
    single = len(files) == 1 and not index
    if os.path.isdir(out):
        folder, create = out, False
    elif out.endswith(("/", os.sep)) and not os.path.lexists(
        out.rstrip("/" + os.sep)
    ):  # "OUT/" says a folder, whatever the input
        folder, create = out, True
    elif merge and out.endswith(SUFFIX):
        return None, None, False
    elif single and not merge:
        return [out], None, False
    elif os.path.lexists(out):
        raise error(
            f"{out}: exists and is not a folder; the input has {len(files)} file(s)"
            f"{' and an index' if index else ''}: give a folder"
            f"{' or a .safetensors file' if merge else ''} as OUT"
        )
    elif out.endswith(SUFFIX):
        raise error(f"{out}: the input has {len(files)} shard(s){' and an index' if index else ''}; give a folder as OUT")
    else:
        folder, create = out, True
    if single:
        return [os.path.join(folder, os.path.basename(default_output(files, None, tag)))], None, create
    dests = [os.path.join(folder, os.path.basename(_local_name(f))) for f in files]
    if len(set(dests)) != len(dests):
        raise error(f"{out}: input shards share a file name; they cannot share one output folder")
    index_dest = os.path.join(folder, os.path.basename(_local_name(index))) if index else None
    return dests, index_dest, create


def _refuse_taken(path: str, inputs: list[str], overwrite: bool, error: type[Exception], parent: bool = True) -> None:
    """The check every destination passes before anything is written: it is no input, its
    folder exists, and an existing file there is replaced only when the user said so."""
    if _is_input(path, inputs):
        raise error(f"{path}: is the input; refusing to overwrite the input checkpoint")
    if parent:
        _refuse_missing_parent(path, error)
    if _output_exists(path, error) and not overwrite:
        raise error(f"{path}: exists; pass {option('--overwrite', 'overwrite=True')} to replace it")


def _refuse_missing_parent(path: str, error: type[Exception]) -> None:
    """A path's folder must exist: a typo in OUT's folder is refused up front, not after the
    work (and folders other than OUT itself are never created)."""
    parent = os.path.dirname(path.rstrip("/" + os.sep)) or "."
    if os.path.isdir(parent):
        return
    if os.path.lexists(parent):
        raise error(f"{path}: {parent} is not a folder")
    raise error(f"{path}: the folder {parent} does not exist")


def _is_input(path: str, inputs: list[str]) -> bool:
    """Whether writing ``path`` would replace one of ``inputs`` (same path once links are
    resolved, or the same file: a hard link)."""
    real = os.path.realpath(path)
    if any(not is_url(f) and os.path.realpath(f) == real for f in inputs):
        return True
    if not os.path.exists(path):
        return False
    for f in inputs:
        try:
            if not is_url(f) and os.path.samefile(path, f):
                return True
        except OSError:
            continue
    return False


def _output_exists(path: str, error: type[Exception]) -> bool:
    """Whether an output file is already there (to replace only when told to).  Anything but
    a regular file (or a link) is refused outright: renaming a finished file onto
    ``/dev/null``, a FIFO or a socket would replace that node, whatever ``--overwrite`` says."""
    import stat

    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise error(f"{path}: cannot use as output ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        raise error(f"{path}: is a folder; give the output file's path, or a folder for OUT")
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise error(f"{path}: is not a regular file (a device, FIFO or socket); refusing to replace it")
    return True
