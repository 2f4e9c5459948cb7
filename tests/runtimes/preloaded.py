"""Runtime workers forked from a process that has already imported their heavy libraries.

A worker (``worker.Worker``) runs one runtime release: ComfyUI's, comfy-kitchen's, each in a
process of its own, because each release is a different ``comfy`` or ``comfy_kitchen`` package
first on the path.  What they all import first is the same: torch, and in ComfyUI's environment
transformers and the rest of its requirements, which take most of a worker's start.  One server
per interpreter (``python -m runtimes.preloaded``) imports those once; each worker is then a
fork of it, which puts its release's folders first on the path and runs its module as
``python -m`` would.  Nothing a release decides is imported before the fork: only libraries
every release of that interpreter shares (``SHARED``), never ``comfy`` or ``comfy_kitchen``.

The worker talks over two named pipes the client makes, as it would over its standard input
and output.  ``spawn`` returns None where forking is not available (no ``os.fork``, or the
server did not start), and the client then starts the worker as a plain subprocess.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

SHARED = (
    "numpy",
    "torch",
    "safetensors",
    "safetensors.torch",
    "torchvision",
    "torchaudio",
    "transformers",
    "sympy",
    "jinja2",
    "einops",
    "scipy",
    "PIL.Image",
    "yaml",
    "psutil",
    "tqdm",
)
"""The libraries a server imports before forking (those its interpreter has): the same files
for every worker of that interpreter, whatever release the worker then imports."""


class _Server:
    """The client's side of one server: ask it for a worker, get the worker's pipes."""

    def __init__(self, python: str, tests: str) -> None:
        import subprocess

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tests, env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            [python, "-m", "runtimes.preloaded"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.lock = threading.Lock()
        ready = self.proc.stdout.readline()
        self.ok = ready.strip() == "ready"

    def spawn(self, module: str, args: list[str], paths: list[str]):
        """A forked worker running ``module``: (its input, its output, its pid), or None."""
        folder = tempfile.mkdtemp(prefix="worker-")
        inp, out = os.path.join(folder, "in"), os.path.join(folder, "out")
        os.mkfifo(inp)
        os.mkfifo(out)
        request = {"module": module, "args": args, "paths": paths, "stdin": inp, "stdout": out}
        try:
            with self.lock:
                if self.proc.poll() is not None:
                    return None
                self.proc.stdin.write(json.dumps(request) + "\n")
                self.proc.stdin.flush()
                answer = self.proc.stdout.readline()
            if not answer:
                return None
            pid = json.loads(answer)["pid"]
            # the same order as the worker opens them: its input, then its output
            stdin = open(inp, "w")  # noqa: SIM115 (the worker's lifetime)
            stdout = open(out)  # noqa: SIM115
            return stdin, stdout, pid
        finally:
            for name in (inp, out):
                try:
                    os.unlink(name)
                except OSError:
                    pass
            os.rmdir(folder)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()


_SERVERS: dict[str, _Server | None] = {}
_LOCK = threading.Lock()


def spawn(python: str, module: str, args: list[str], paths: list[str]):
    """A worker running ``python -m module *args`` with ``paths`` first on its path, forked
    from ``python``'s server: (its input, its output, its pid), or None (start it yourself)."""
    if not hasattr(os, "fork") or os.environ.get("COMFYQUANT_TESTS_NO_FORK"):
        return None
    tests = str(Path(__file__).resolve().parent.parent)
    with _LOCK:
        if python not in _SERVERS:
            server = _Server(python, tests)
            _SERVERS[python] = server if server.ok else None
            if not server.ok:
                server.close()
        server = _SERVERS[python]
    return server.spawn(module, args, paths) if server is not None else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for a forked worker to exit (its input closed), then kill it."""
    stop = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > stop:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        time.sleep(0.02)


@atexit.register
def _close_servers() -> None:
    for server in _SERVERS.values():
        if server is not None:
            server.close()


def _child(request: dict) -> None:
    """In the forked worker: its pipes as standard input and output, its folders first on the
    path, then its module run as ``python -m`` runs it."""
    import runpy

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the worker's own subprocesses are waited for
    inp = os.open(request["stdin"], os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY)
    os.dup2(inp, 0)
    os.dup2(out, 1)
    os.close(inp)
    os.close(out)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    paths = list(request["paths"])
    sys.path[1:1] = paths
    if paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])
    sys.argv = [request["module"], *request["args"]]
    code = 0
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        code = 1
    finally:
        try:
            sys.stdout.flush()
        except Exception:
            pass
    os._exit(code)


def _serve() -> None:
    """The server: import ``SHARED``, then fork one worker per request line."""
    import importlib

    control_in = sys.stdin
    control_out = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # what the libraries print does not reach the control pipe
    for name in SHARED:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # forked workers are reaped as they exit
    control_out.write("ready\n")
    control_out.flush()
    for line in control_in:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            control_out.close()
            _child(request)
        control_out.write(json.dumps({"pid": pid}) + "\n")
        control_out.flush()


if __name__ == "__main__":
    _serve()
