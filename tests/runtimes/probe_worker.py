"""A worker that reports the process it runs in (``tests/test_runtime_workers.py``): its
arguments, the first entries of its path, which of the heavy libraries were imported before it
ran, where a module of its folders comes from, and its pid; ``{"die": true}`` ends it at once."""

from __future__ import annotations

import json
import os
import sys


def _serve() -> None:
    imported = {name: name in sys.modules for name in ("torch", "comfy_kitchen", "comfy")}
    out = os.fdopen(os.dup(1), "w")
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("die"):
            os._exit(3)
        found = None
        if request.get("module"):
            module = __import__(request["module"])
            found = getattr(module, "__file__", None)
        answer = {"argv": sys.argv[1:], "path": sys.path[:4], "imported": imported, "found": found, "pid": os.getpid()}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve()
