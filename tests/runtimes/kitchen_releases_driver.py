"""Any comfy-kitchen release running ``kitchen_driver``'s steps: a worker process with the
release's sources (``kitchen_releases.source``) first on its path, so ``comfy_kitchen`` is that
release's and not the environment's.  The dense layers are read without ``cases``, whose
fixtures import the environment's comfy-kitchen."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .outcome import Outcome
from .worker import Worker

TARGET = "comfy-kitchen"


class KitchenReleaseDriver(Worker):
    """A worker with one comfy-kitchen release imported once; ``run`` sends it one file."""

    target = TARGET

    def __init__(self, folder: Path, version: str) -> None:
        self.version = f"comfy-kitchen {version}"
        super().__init__(sys.executable, "runtimes.kitchen_releases_driver", [version], self.version, [str(folder)])

    def run(self, path: Path) -> Outcome:
        return Outcome(**self.ask({"path": str(path)}, path))


def _serve(version: str) -> None:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import comfy_kitchen

    from .comfyui_release_driver import read_dense
    from .kitchen_driver import KitchenDriver

    folder = Path(comfy_kitchen.__file__).resolve().parent.parent
    if not folder.name.endswith(f"-{version}"):
        raise SystemExit(f"comfy-kitchen {version} is not first on the path ({folder})")

    class Driver(KitchenDriver):
        def dense(self, path: Path) -> dict:
            return read_dense(path)

    driver = Driver()
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            outcome = driver.run(Path(request["path"]))
        except Exception as exc:  # outside the driver's stages: the release's import of an op
            outcome = Outcome("raises", "load", type(exc).__name__, str(exc))
        out.write(json.dumps(outcome.to_dict()) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve(sys.argv[1])
