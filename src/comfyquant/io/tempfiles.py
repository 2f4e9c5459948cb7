"""Temporary files that name their owner, and the removal of those whose owner is gone.

Every output is first written to a hidden temporary file beside it (``io.writer``), as large
as the output.  A run killed with SIGKILL (or by the OOM killer, or a power cut) cannot remove
it.  So the name says whose it is::

    .comfyquant-<pid>-<start>-<boot>-<host>-<random>.tmp     (.spill: quantize's worker hand-over)

``start`` is the owner's start time (clock ticks since boot, from ``/proc``), ``boot`` the
first 8 hex digits of the boot id and ``host`` 8 hex digits of a hash of the host name: a PID
the system has since given to another process, or a file left before a reboot, is recognised
as dead; a file another machine (or container) writes into a shared folder is left alone,
since its processes cannot be seen from here.  The next comfyquant run that writes into
the same folder removes such files when their owner is no longer running, and says so in one
line on stderr.  A temporary file of a live process is never touched, nor any file whose name
does not have exactly this form (older comfyquant versions' temporary files included: their
owner cannot be known).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

from ..naming import printable

PREFIX = ".comfyquant-"
_NAME = re.compile(r"^\.comfyquant-(\d+)-(\d+)-([0-9a-f]{8})-([0-9a-f]{8})-[A-Za-z0-9_]+\.(tmp|spill)$")
_SWEPT: set[str] = set()


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip().replace("-", "")[:8].lower() or "00000000"
    except OSError:
        return "00000000"


def _host_id() -> str:
    import hashlib
    import socket

    return hashlib.sha256(socket.gethostname().encode("utf-8", "surrogateescape")).hexdigest()[:8]


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process from ``/proc``, or None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[19])
    except (IndexError, ValueError):
        return None


def owner_tag(pid: int | None = None) -> str:
    """``<pid>-<start>-<boot>-<host>`` of this process (or of ``pid`` on this machine)."""
    pid = os.getpid() if pid is None else pid
    st = _stat(pid)
    return f"{pid}-{st[1] if st else 0}-{_boot_id()}-{_host_id()}"


def temp_prefix() -> str:
    """The name prefix of this process's temporary files (``mkstemp`` adds the random part)."""
    return f"{PREFIX}{owner_tag()}-"


def make_temp(folder: str, suffix: str = ".tmp") -> tuple[int, str]:
    """``(fd, path)`` of a new private temporary file in ``folder`` named for this process."""
    return tempfile.mkstemp(prefix=temp_prefix(), suffix=suffix, dir=folder)


def owner_alive(pid: int, start: int, boot: str) -> bool:
    """Whether the process that created a temporary file may still be running.  In doubt
    (no ``/proc``, no permission to signal it) the answer is yes: nothing is removed."""
    if boot != "00000000" and boot != _boot_id():
        return False  # created before the last reboot
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    except OSError:
        return True
    st = _stat(pid)
    if st is None:
        return True
    state, started = st
    if state == "Z":
        return False  # killed, not yet reaped by its parent: it writes nothing any more
    return not (start and started != start)  # another process now has this PID


def sweep_stale(folder: str, announce: bool = True) -> list[tuple[str, int]]:
    """Remove the temporary files of dead comfyquant runs from ``folder`` (once per folder
    and process); returns ``(path, bytes)`` of each removed file."""
    key = os.path.abspath(folder)
    if key in _SWEPT:
        return []
    _SWEPT.add(key)
    try:
        names = [n for n in os.listdir(folder) if n.startswith(PREFIX)]
    except OSError:
        return []
    removed = []
    for name in names:
        m = _NAME.match(name)
        if m is None:
            continue
        pid, start, boot, host = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
        if host != _host_id() or owner_alive(pid, start, boot):  # this process's own files included
            continue
        path = os.path.join(folder, name)
        try:
            size = os.lstat(path).st_size
            os.unlink(path)
        except OSError:
            continue  # gone already, or not ours to remove
        removed.append((path, size))
    if removed and announce:
        from ..units import human_size

        total = human_size(sum(n for _, n in removed))
        shown = ", ".join(os.path.basename(p) for p, _ in removed[:3]) + (" ..." if len(removed) > 3 else "")
        line = (
            f"comfyquant: removed {len(removed)} stale temporary file{'s' * (len(removed) > 1)} "
            f"({total}) of interrupted comfyquant runs from {folder}: {shown}"
        )
        sys.stderr.write(printable(line) + "\n")
    return removed
