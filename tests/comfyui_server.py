"""A real ComfyUI server for the node tests: one per test module, on 127.0.0.1.

The server runs from a folder of symbolic links to ComfyUI's unpacked source (its own
``custom_nodes``, ``models``, ``input``, ``output``, ``user`` and ``temp`` are real folders of
the test's), started with ``--base-directory`` on that folder, so nothing is ever written
into the source.  comfyquant's nodes are installed by ``comfyquant comfyui install`` itself;
the test probe node (``comfyui_probe``) is linked beside them.  The server's Python is
ComfyUI's environment (``comfyui_env``) with this tree's ``src`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OWN_FOLDERS = ("custom_nodes", "models", "input", "output", "user", "temp")


def overlay(source: Path, folder: Path) -> Path:
    """A ComfyUI folder whose files are links to ``source`` and whose data folders are its own."""
    folder.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.name not in OWN_FOLDERS:
            (folder / entry.name).symlink_to(entry)
    for name in OWN_FOLDERS:
        (folder / name).mkdir()
    (folder / "models" / "diffusion_models").mkdir()
    return folder


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A running ComfyUI: its address, folders and the calls the tests make."""

    def __init__(self, python: Path, folder: Path, log: Path) -> None:
        self.python = python
        self.folder = folder
        self.models = folder / "models" / "diffusion_models"
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300) -> None:
        cmd = [
            str(self.python),
            str(self.folder / "main.py"),
            "--cpu",
            "--listen",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--base-directory",
            str(self.folder),
            "--database-url",
            "sqlite:///:memory:",
            "--disable-auto-launch",
        ]
        out = open(self.log, "wb")  # noqa: SIM115  (closed with the process)
        self.proc = subprocess.Popen(cmd, cwd=self.folder, env=environment(), stdout=out, stderr=subprocess.STDOUT)
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.proc.returncode} while starting:\n{self.tail()}")
            try:
                self.get("/system_stats")
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        raise RuntimeError(f"ComfyUI did not answer within {timeout:.0f} s:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def get(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=30) as resp:
            return json.loads(resp.read())

    def post(self, path: str, value) -> None:
        req = urllib.request.Request(
            self.url + path, data=json.dumps(value).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30):
            pass

    def queue(self, prompt: dict) -> tuple[int, dict]:
        """POST /prompt: (HTTP status, the answer)."""
        body = json.dumps({"prompt": prompt, "client_id": uuid.uuid4().hex}).encode()
        req = urllib.request.Request(self.url + "/prompt", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def run(self, prompt: dict, timeout: float = 600) -> dict:
        """Queue ``prompt`` and wait for its entry in ``/history``."""
        status, answer = self.queue(prompt)
        if status != 200:
            raise AssertionError(f"ComfyUI refused the prompt ({status}): {json.dumps(answer)[:2000]}")
        prompt_id = answer["prompt_id"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            history = self.get(f"/history/{prompt_id}")
            entry = history.get(prompt_id)
            if entry and entry.get("status", {}).get("completed") is not None and entry["status"].get("status_str"):
                return entry
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited while running a prompt:\n{self.tail()}")
            time.sleep(0.2)
        raise AssertionError(f"prompt {prompt_id} did not finish within {timeout:.0f} s:\n{self.tail()}")


def texts(entry: dict, node: str) -> list[str]:
    """The ``text`` a node returned to the UI in a finished prompt."""
    return entry["outputs"][node]["text"]


def error_of(entry: dict) -> dict | None:
    """The ``execution_error`` message of a failed prompt (None if it succeeded)."""
    for kind, data in entry.get("status", {}).get("messages", []):
        if kind == "execution_error":
            return data
    return None


def comfyquant_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``comfyquant ARGS`` from this tree, in the main environment."""
    proc = subprocess.run([sys.executable, "-m", "comfyquant", *args], capture_output=True, text=True, env=environment())
    if check and proc.returncode not in (0, 1):
        raise AssertionError(f"comfyquant {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc
