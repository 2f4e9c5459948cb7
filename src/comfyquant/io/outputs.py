"""Where a writing command's outputs go: one rule for ``fix``, ``quantize``, ``convert`` and
``dequantize``, so ``-o OUT`` means the same everywhere.

* ``OUT`` is an existing folder: each output goes into it under its input file's name
  (``OUT/model.safetensors``), whether the input is one file or shards.
* Otherwise one input file gives the file ``OUT``; shards (or an index) give the folder
  ``OUT`` (created).  ``dequantize`` names by suffix instead (``merge``): a ``.safetensors``
  OUT is one file, whatever the input (shards merge into it), any other OUT a folder.
* An output may never be an input (same path, or the same file through a link).
"""

from __future__ import annotations

import os

from ..errors import InputError


def destinations(files: list[str], index: str | None, out: str, merge: bool = False) -> tuple[list[str] | None, str | None, bool]:
    """(destination per input file in order, or None when the inputs merge into the file
    ``OUT``; destination of the index or None; whether ``OUT`` is a folder still to create)."""
    single = len(files) == 1 and not index
    if os.path.isdir(out):
        folder, create = out, False
    elif merge and out.endswith(".safetensors"):
        return None, None, False
    elif single and not merge:
        return [out], None, False
    elif os.path.lexists(out):
        raise InputError(f"{out}: exists and is not a folder; the input has {len(files)} file(s)"
                         f"{' and an index' if index else ''}: give a folder"
                         f"{' or a .safetensors file' if merge else ''} as OUT")
    elif out.endswith(".safetensors"):
        raise InputError(f"{out}: the input has {len(files)} shard(s){' and an index' if index else ''}; "
                         "give a folder as OUT")
    else:
        folder, create = out, True
    dests = [os.path.join(folder, os.path.basename(f)) for f in files]
    if len(set(dests)) != len(dests):
        raise InputError(f"{out}: input shards share a file name; they cannot share one output folder")
    index_dest = os.path.join(folder, os.path.basename(index)) if index else None
    return dests, index_dest, create


def is_input(path: str, inputs: list[str]) -> bool:
    """Whether writing ``path`` would replace one of ``inputs`` (same path once links are
    resolved, or the same file: a hard link)."""
    real = os.path.realpath(path)
    if any(os.path.realpath(f) == real for f in inputs):
        return True
    if not os.path.exists(path):
        return False
    for f in inputs:
        try:
            if os.path.samefile(path, f):
                return True
        except OSError:
            continue
    return False


def output_exists(path: str) -> bool:
    """Whether an output file is already there (to replace only when told to).  Anything but
    a regular file (or a link) is refused outright: renaming a finished file onto
    ``/dev/null``, a FIFO or a socket would replace that node, whatever ``--force`` says."""
    import stat

    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise InputError(f"{path}: cannot use as output ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        raise InputError(f"{path}: is a folder; give the output file's path, or a folder for OUT")
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise InputError(f"{path}: is not a regular file (a device, FIFO or socket); refusing to replace it")
    return True


def refuse_taken(paths: list[str], inputs: list[str], replace: bool, input_says: str, exists_says: str,
                 input_error: type[Exception] = InputError) -> None:
    """The check every writing command runs on its destinations before writing anything: none
    may be an input (``input_error`` "<path>: <input_says>"), and an existing file is replaced
    only when the user said so (``replace``; else "<path>: exists; <exists_says>")."""
    for path in paths:
        if is_input(path, inputs):
            raise input_error(f"{path}: {input_says}")
        if output_exists(path) and not replace:
            raise InputError(f"{path}: exists; {exists_says}")
