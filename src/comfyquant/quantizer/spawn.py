"""Worker processes that start without the caller's ``__main__``.

multiprocessing's ``spawn`` start method imports the parent's main module again in every
child (as ``__mp_main__``), so that functions defined there can be unpickled.  The workers
of ``quantize --jobs N`` run only tasks of ``work``, which they import by name, so that
import buys nothing and costs two things:

* it runs the top-level code of the caller's script again in every worker; a script that
  calls ``comfyquant.quantize`` at top level without an ``if __name__ == "__main__":`` guard
  (the API's default ``jobs="auto"`` starts workers for heavy formats) makes each worker call
  it again, which multiprocessing refuses during start-up: the worker died and the run failed
  with "a worker process died", naming nothing the user could fix;
* it adds the script's imports to every worker's start-up.

So workers are started while ``sys.modules["__main__"]`` is a bare module: the child starts
from a plain interpreter and imports what its tasks need.  The swap lasts as long as starting
the process (the child's start-up data is taken then) and is serialised by a lock.  SIGINT is
blocked meanwhile, and so in the child until its initializer handles it (see
``_sigint_blocked``).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import types
from multiprocessing.context import SpawnContext, SpawnProcess

_SWAP = threading.Lock()


class _BareMainProcess(SpawnProcess):
    """A spawned process whose start-up data names no main module to import."""

    def start(self) -> None:
        with _SWAP, _sigint_blocked():
            main = sys.modules.get("__main__")
            sys.modules["__main__"] = types.ModuleType("__main__")
            try:
                super().start()
            finally:
                if main is None:
                    del sys.modules["__main__"]
                else:
                    sys.modules["__main__"] = main


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT blocked in this thread while a worker is started: the child inherits the blocked
    mask through ``exec`` and starts without being interruptible until its initializer takes
    SIGINT up (``work.init_worker``), so a Ctrl-C during its start-up prints no traceback.
    Here the signal is only deferred: it is delivered when the mask is restored."""
    block = getattr(signal, "pthread_sigmask", None)
    if block is None:
        yield
        return
    old = block(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        block(signal.SIG_SETMASK, old)


class _BareMainContext(SpawnContext):
    Process = _BareMainProcess


def worker_context() -> SpawnContext:
    """The multiprocessing context for quantize's worker pool."""
    return _BareMainContext()
