"""comfyquant's comfy-kitchen release groups (``comfyquant.targets.kitchen_releases``) and the
release lines ``check`` prints and ``--json`` gives.

The groups are recomputed from the releases' wheels (the deciding modules hashed,
``runtimes.kitchen_releases.digest``), and each group's facts read off its sources: the layouts
``comfy_kitchen.tensor`` exports, whether ``QuantizedTensor`` looks layouts up by name, whether
the eager W4A8 op reads 6-bit rows.  Wheels are downloaded once into the test cache; skipped
with one line when they cannot be had (a failure under CI).  What the releases do with each
format's layers is run in ``test_kitchen_releases_run.py``.
"""

from __future__ import annotations

import collections
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

import runtime_sources
from comfyquant.targets import kitchen_releases as product
from runtimes import kitchen_releases as oracle

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@functools.cache
def _fetched() -> tuple[Path | None, ...]:
    """Every release's sources, fetched a few at a time (each a ``pip download`` and an unpack,
    mostly waiting; each release's own lock keeps them apart), once per session."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        return tuple(pool.map(oracle.source, oracle.RELEASES))


def _sources() -> dict[str, Path]:
    out = {}
    for version, path in zip(oracle.RELEASES, _fetched()):
        if path is None:
            runtime_sources.skip_missing(oracle.MISSING[version])
        out[version] = path
    return out


def test_releases_are_the_indexs():
    assert product.RELEASES == oracle.RELEASES
    assert product.NEWEST.releases[-1] == runtime_sources.KITCHEN_VERSION


def test_groups_are_the_releases_with_byte_identical_deciding_code():
    measured = collections.defaultdict(list)
    for version, path in _sources().items():
        measured[oracle.digest(path)].append(version)
    lines = [f"{', '.join(vs)}: {d}" for d, vs in measured.items()]
    print("comfy-kitchen release groups (deciding modules' digest):\n  " + "\n  ".join(lines))
    assert {g.digest: list(g.releases) for g in product.GROUPS} == dict(measured), "\n".join(lines)


def test_each_groups_facts_are_its_sources():
    sources = _sources()
    for group in product.GROUPS:
        for version in group.releases:
            root = sources[version]
            layouts = oracle.exported_layouts(root)
            assert set(group.formats) == {f for f, layout in product.LAYOUTS.items() if layout in layouts}, version
            assert group.by_name == oracle.takes_layout_names(root), version
            assert group.six_bit == oracle.six_bit_w4a8(root), version
            assert group.scale_cast == oracle.casts_scales(root), version
            assert group.scale_to == oracle.converts_nvfp4_scale(root), version


def test_selection_and_its_one_line_errors():
    assert product.selected_releases(("==", "0.2.31")) == ("0.2.31",)
    assert product.selected_releases(("==", "0.1")) == ("0.1.2", "0.1.3", "0.1.4", "0.1.5", "0.1.6")
    assert product.selected_releases((">=", "0.2.38")) == ("0.2.38", "0.2.39", "0.2.40")
    assert product.selected_releases(("<", "0.1.4")) == ("0.1.2", "0.1.3")
    with pytest.raises(
        ValueError,
        match=r"no comfy-kitchen release ==0.2.29 is modelled: choose from 0.1.2 \.\. 0\.2\.40 \(0.1.2, .*0.2.28, 0.2.30",
    ):
        product.selected_releases(("==", "0.2.29"))


def test_first_running_release_per_format():
    got = {f: g.first for f in product.LAYOUTS if (g := product.first_running(f)) is not None}
    assert got == {
        "float8_e4m3fn": "0.2.0",
        "float8_e5m2": "0.2.0",
        "nvfp4": "0.2.0",
        "mxfp8": "0.2.8",
        "awq_w4a16": "0.2.9",
        "svdquant_w4a4": "0.2.9",
        "int8_tensorwise": "0.2.11",
        "convrot_w4a4": "0.2.17",
        "asym_w4a8_int8": "0.2.27",
    }
    assert product.first_running("asym_w4a8_int8/6-bit").first == "0.2.36"


def _check(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "comfyquant", "check", str(path), *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def w6a8(tmp_path_factory) -> Path:
    """A real W6A8 layer written by the project's own quantizer."""
    pytest.importorskip("torch", reason="the W6A8 layer is written with torch")
    from runtimes.cases import bases

    base = next(b for b in bases(0, {"w6a8": ((64, 256),)}) if b.name.startswith("w6a8"))
    case = base.case(f"{base.name}.valid", "valid")
    folder = tmp_path_factory.mktemp("kitchen-releases")
    case.write(folder)
    return case.path


def test_default_lines_name_the_first_loading_release(w6a8):
    out = _check(w6a8, "--target", "comfy-kitchen").stdout
    assert "comfy-kitchen  loads" in out
    assert (
        "loads from comfy-kitchen 0.2.36 on; fails before: ValueError: K=384 must be divisible by 16, group_size=16, "
        "and convrot_groupsize=256; group_size must be >=4 and divide 16 or be a multiple of 16"
    ) in out


def test_a_release_spec_gives_that_releases_verdict(w6a8):
    out = _check(w6a8, "--target", "comfy-kitchen==0.2.31").stdout
    assert "comfy-kitchen  FAILS  ValueError: K=384 must be divisible by 16" in out
    assert "verdict of comfy-kitchen 0.2.31; releases checked: 0.2.31" in out
    out = _check(w6a8, "--target", "comfy-kitchen<0.2.20").stdout
    assert "FAILS  AttributeError: module 'comfy_kitchen.tensor' has no attribute 'AsymW4A8Int8Layout'" in out
    assert "verdict of comfy-kitchen 0.2.19; releases checked: 0.1.2 .. 0.2.19" in out
    out = _check(w6a8, "--target", "comfy-kitchen>=0.2.36").stdout
    assert "comfy-kitchen  loads" in out and "releases checked: 0.2.36 .. 0.2.40" in out


def test_an_unknown_release_is_one_line(w6a8):
    proc = _check(w6a8, "--target", "comfy-kitchen==0.2.29")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "no comfy-kitchen release ==0.2.29 is modelled: choose from 0.1.2 .. 0.2.40 (0.1.2," in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_json_lists_the_selected_releases(w6a8):
    data = json.loads(_check(w6a8, "--target", "comfy-kitchen>=0.2.27", "--json").stdout)
    releases = data["targets"]["comfy-kitchen"]["releases"]
    assert releases["first_loading"] == "0.2.36"
    groups = releases["releases"]
    assert groups[0]["releases"] == ["0.2.27"] and groups[0]["loads"] is False
    assert groups[0]["exception"] == "ValueError" and groups[0]["layer"]
    assert [g["loads"] for g in groups] == [False] * 5 + [True] * 4
    assert all(set(g) >= {"releases", "digest", "formats", "loads", "error", "exception", "rule", "layer"} for g in groups)


def test_shipped_examples():
    """Every shipped example's default lines come out of the real file, in one line each."""
    found = sorted(EXAMPLES.glob("*.safetensors"))
    if not found:
        pytest.skip("no shipped examples")
    for path in found:
        out = _check(path, "--target", "comfy-kitchen").stdout
        assert "comfy-kitchen release" in out or "comfy-kitchen 0." in out, (path.name, out)


def test_the_runtimes_page_names_the_first_release_per_format():
    import importlib.util

    spec = importlib.util.spec_from_file_location("generated_hook", ROOT / "docs" / "hooks" / "generated.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (ROOT / "docs" / "runtimes.md").read_text(encoding="utf-8")
    assert "<!-- generated: releases comfy-kitchen -->" in page
    rendered = hook.on_page_markdown(page, None, None, None)
    for fmt, layout in product.LAYOUTS.items():
        assert f"| `{fmt}` | `{layout}` | {product.first_running(fmt).first} |" in rendered
    for group in product.GROUPS:
        assert f"| {', '.join(group.releases)} | `{group.digest}` |" in rendered
