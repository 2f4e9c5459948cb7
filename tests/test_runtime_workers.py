"""The runtime workers the agreement tests drive (``runtimes.worker.Worker``), forked from a
server that has imported the shared libraries (``runtimes.preloaded``) or started as a fresh
interpreter: the same module runs with the same arguments and path, nothing of a release is
imported before it, a worker that dies is reported instead of waited for, a closed worker's
process is gone, and a comfy-kitchen release computes the same outcomes either way."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from runtimes import preloaded
from runtimes.worker import Worker

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="forked workers need os.fork")


@pytest.fixture(params=["forked", "fresh"])
def mode(request, monkeypatch):
    if request.param == "fresh":
        monkeypatch.setenv("COMFYQUANT_TESTS_NO_FORK", "1")
    return request.param


def _shadow(folder: Path) -> Path:
    """A folder holding a module ``probe_shadow``, to put first on a worker's path."""
    folder.mkdir()
    (folder / "probe_shadow.py").write_text("VALUE = 1\n")
    return folder


def test_a_worker_runs_its_module_with_its_arguments_and_folders_first(tmp_path, mode):
    folder = _shadow(tmp_path / "first")
    with Worker(sys.executable, "runtimes.probe_worker", ["a", "b c"], "probe", [str(folder)]) as w:
        assert (w.pid is not None) == (mode == "forked")
        answer = w.ask({"module": "probe_shadow"}, tmp_path)
        assert answer["argv"] == ["a", "b c"]
        assert Path(answer["found"]).parent == folder
        assert str(folder) in answer["path"][:2]  # before the tests' folder and site-packages
        assert not answer["imported"]["comfy_kitchen"] and not answer["imported"]["comfy"]
        if mode == "forked":
            assert answer["pid"] == w.pid != os.getpid()
            has_torch = importlib.util.find_spec("torch") is not None
            assert answer["imported"]["torch"] == has_torch  # the server's import, shared by the fork


def test_a_closed_forked_worker_is_gone(tmp_path):
    w = Worker(sys.executable, "runtimes.probe_worker", [], "probe")
    if w.pid is None:
        pytest.skip("no preloaded server here")
    pid = w.ask({}, tmp_path)["pid"]
    w.close()
    assert not preloaded.alive(pid)


def test_a_worker_that_dies_is_reported(tmp_path, mode):
    with Worker(sys.executable, "runtimes.probe_worker", [], "probe") as w:
        with pytest.raises((RuntimeError, BrokenPipeError), match="probe worker died|Broken pipe"):
            w.ask({"die": True}, tmp_path / "file.safetensors")
            w.ask({}, tmp_path / "file.safetensors")


def test_a_worker_that_never_starts_says_so(tmp_path, mode):
    with pytest.raises(RuntimeError, match="probe worker did not start"):
        Worker(sys.executable, "runtimes.no_such_worker_module", [], "probe")


def test_a_forked_kitchen_release_computes_what_a_fresh_one_does(tmp_path, monkeypatch):
    """comfy-kitchen 0.2.31 on every format's valid layer, forked and fresh: the same outcome,
    message and measured error on every case."""
    pytest.importorskip("torch")
    from runtimes import kitchen_releases
    from runtimes.kitchen_releases_driver import KitchenReleaseDriver
    from runtimes.release_agreement import format_cases

    folder = kitchen_releases.source("0.2.31")
    if folder is None:
        import runtime_sources

        runtime_sources.skip_missing(kitchen_releases.MISSING["0.2.31"])
    (tmp_path / "cases").mkdir()
    cases = format_cases(tmp_path / "cases")
    got = {}
    for mode in ("forked", "fresh"):
        if mode == "fresh":
            monkeypatch.setenv("COMFYQUANT_TESTS_NO_FORK", "1")
        with KitchenReleaseDriver(folder, "0.2.31") as drv:
            assert (drv.pid is not None) == (mode == "forked")
            got[mode] = [drv.run(case.path).to_dict() for case in cases]
    assert got["forked"] == got["fresh"]
    assert any(o["status"] == "raises" for o in got["fresh"]) and any(o["status"] != "raises" for o in got["fresh"])
