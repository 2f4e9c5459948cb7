"""The client side of a runtime worker: a process started once with a module of this package,
which prints ``ready`` once its runtime is imported, then answers each JSON request line with
one JSON line. The ComfyUI drivers (one release, every release, whole models) all talk to
their workers this way."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path


class Worker:
    """One worker process; ``ask`` sends it a request and reads its answer."""

    close_timeout = 30
    """Seconds a worker may take to exit once its input is closed, before it is killed."""

    def __init__(self, python: str | Path, module: str, args: Sequence[str], label: str, paths: Sequence[str] = ()) -> None:
        """Start ``python -m module *args`` with ``paths`` and the tests' folder first on its
        ``PYTHONPATH``; ``label`` names the runtime in errors.  The process is forked from a
        server that has imported the libraries every such worker imports (``preloaded``), or,
        where that is not available, started as a subprocess."""
        from . import preloaded

        self.label = label
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None
        forked = preloaded.spawn(str(python), module, list(args), list(paths))
        if forked is not None:
            self.stdin, self.stdout, self.pid = forked
        else:
            tests = Path(__file__).resolve().parent.parent
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (*paths, str(tests), env.get("PYTHONPATH", "")) if p)
            self.proc = subprocess.Popen(
                [str(python), "-m", module, *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=env,
            )
            self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        ready = self.stdout.readline()
        if ready.strip() != "ready":
            self.close()
            raise RuntimeError(f"{label} worker did not start: {ready.strip() or 'no output'}")

    def ask(self, request: dict, path: Path) -> dict:
        """The worker's answer to ``request`` about the file at ``path``."""
        self.stdin.write(json.dumps(request) + "\n")
        self.stdin.flush()
        line = self.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.label} worker died on {path}")
        return json.loads(line)

    def close(self) -> None:
        if self.pid is not None:
            from . import preloaded

            for stream in (self.stdin, self.stdout):
                try:
                    stream.close()
                except OSError:  # a worker that died leaves a broken pipe
                    pass
            preloaded.end(self.pid, self.close_timeout)
            return
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=self.close_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
