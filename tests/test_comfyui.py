"""comfyquant's nodes in a real ComfyUI server (0.33.0), through its HTTP API and in a browser.

One server serves the module (``comfyui_server``): installed with ``comfyquant comfyui
install``, with a tiny Flux made by ComfyUI's own classes (``comfyui_flux``) and the files
the tests derive from it in its ``diffusion_models`` folder.  The probe node
(``comfyui_probe``) runs a loaded model on fixed inputs; two loads compute the same thing
when their output digests are equal.  The reference for every file the Loader reads is
ComfyUI's own ``UNETLoader`` on the file ``comfyquant migrate``/``fix`` writes for it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import comfyui_env
import comfyui_server
import runtime_sources
from comfyui_server import ROOT, Server, comfyquant_cli, error_of, texts

EXAMPLE = ROOT / "examples" / "comfyui_check_and_load.json"
TIMINGS: dict[str, float] = {}
"""Seconds the module's fixture took (venv, model files, server start): printed at the end."""


# -- files -------------------------------------------------------------------------------------


def tensors_and_metadata(path: Path) -> tuple[dict, dict]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})


def legacy_scaled_fp8(comfy: Path, out: Path, sentinel: bool = True) -> None:
    """The Comfy FP8 file in ComfyUI's legacy scaled-FP8 layout (``scale_weight``, no markers,
    a ``scaled_fp8`` sentinel) or, without the sentinel, musubi-tuner's per-tensor one."""
    sd, _meta = tensors_and_metadata(comfy)
    legacy = {}
    for name, value in sd.items():
        if name.endswith(".comfy_quant"):
            continue
        if name.endswith(".weight_scale"):
            name = name[: -len(".weight_scale")] + ".scale_weight"
        elif name.endswith(".input_scale"):
            name = name[: -len(".input_scale")] + ".scale_input"
        legacy[name] = value
    if sentinel:
        legacy["scaled_fp8"] = torch.zeros(0, dtype=torch.float8_e4m3fn)
    save_file(legacy, str(out))


def int8_fast(comfy: Path, out: Path) -> None:
    """The Comfy INT8 file as ComfyUI-INT8-Fast saves it: every tensor under
    ``model.diffusion_model.``, its own markers (``convrot``/``per_row``, no ``format``), its
    header flags."""
    sd, meta = tensors_and_metadata(comfy)
    layers = json.loads(meta["_quantization_metadata"])["layers"]
    root = "model.diffusion_model."
    saved = {}
    for name, value in sd.items():
        if name.endswith(".comfy_quant"):
            continue
        saved[root + name] = value
    for prefix, marker in layers.items():
        theirs = {"convrot": marker.get("convrot", False), "per_row": sd[f"{prefix}.weight_scale"].numel() > 1}
        if "convrot_groupsize" in marker:
            theirs["convrot_groupsize"] = marker["convrot_groupsize"]
        saved[f"{root}{prefix}.comfy_quant"] = torch.tensor(list(json.dumps(theirs).encode()), dtype=torch.uint8)
    save_file(saved, str(out), metadata={"int8_quantized": "true", "int8_model_type": "flux"})


def without_markers(comfy: Path, out: Path) -> None:
    """Broken: the FP8 layers' markers lost (no ``comfy_quant`` tensors, no header map)."""
    sd, meta = tensors_and_metadata(comfy)
    meta.pop("_quantization_metadata", None)
    save_file({k: v for k, v in sd.items() if not k.endswith(".comfy_quant")}, str(out), metadata=meta or None)


def relabelled(comfy: Path, out: Path) -> str:
    """Broken: one FP8 layer's weight stored as ``U8`` (the same bytes under another dtype
    label: ComfyUI casts it by value); returns the layer."""
    sd, meta = tensors_and_metadata(comfy)
    layer = next(k[: -len(".comfy_quant")] for k in sorted(sd) if k.endswith(".comfy_quant") and "img_mlp.0" in k)
    sd[f"{layer}.weight"] = sd[f"{layer}.weight"].view(torch.uint8)
    save_file(sd, str(out), metadata=meta)
    return layer


def formatless(comfy: Path, out: Path) -> str:
    """Broken: one FP8 layer's marker without its ``format`` key (header map and tensor marker
    alike): ComfyUI refuses the layer at load, which the header alone shows; returns the layer."""
    sd, meta = tensors_and_metadata(comfy)
    key = next(k for k in sorted(sd) if k.endswith(".comfy_quant") and "img_mlp.0" in k)
    layer = key[: -len(".comfy_quant")]
    marker = json.loads(bytes(sd[key].tolist()).decode("utf-8"))
    marker.pop("format", None)
    sd[key] = torch.tensor(list(json.dumps(marker).encode("utf-8")), dtype=torch.uint8)
    if "_quantization_metadata" in meta:
        doc = json.loads(meta["_quantization_metadata"])
        for name in (layer, f"model.diffusion_model.{layer}"):
            if name in doc.get("layers", {}):
                doc["layers"][name].pop("format", None)
        meta["_quantization_metadata"] = json.dumps(doc)
    save_file(sd, str(out), metadata=meta)
    return layer


# -- the server --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    started = time.monotonic()
    python = comfyui_env.comfyui_python()
    if python is None:
        runtime_sources.skip_missing(comfyui_env.MISSING)
    TIMINGS["environment"] = comfyui_env.SECONDS.get("venv", time.monotonic() - started)
    source = runtime_sources.comfyui_source()
    root = tmp_path_factory.mktemp("comfyui")
    folder = comfyui_server.overlay(source, root / "ComfyUI")
    server = Server(python, folder, root / "comfyui.log")

    t0 = time.monotonic()
    install = comfyquant_cli("comfyui", "install", str(folder), "--python", str(python), check=False)
    assert install.returncode == 0, install.stderr
    (folder / "custom_nodes" / "comfyquant_test_probe").symlink_to(comfyui_server.HERE / "comfyui_probe")
    models = server.models
    subprocess.run(
        [str(python), str(comfyui_server.HERE / "comfyui_flux.py"), str(source), str(models / "flux.bf16.safetensors")],
        check=True,
        env=comfyui_server.environment(),
        capture_output=True,
    )
    work = root / "work"
    work.mkdir()
    dense = models / "flux.bf16.safetensors"
    for fmt in ("float8_e4m3fn", "int8_tensorwise"):
        comfyquant_cli("quantize", str(dense), "-o", str(models / f"flux.{fmt}.safetensors"), "--format", fmt)
    fp8 = models / "flux.float8_e4m3fn.safetensors"
    legacy_scaled_fp8(fp8, models / "flux.legacy.safetensors")
    legacy_scaled_fp8(fp8, models / "flux.musubi.safetensors", sentinel=False)
    comfyquant_cli("migrate", str(fp8), "--to", "modelopt", "-o", str(models / "flux.modelopt.safetensors"))
    comfyquant_cli("migrate", str(fp8), "--to", "bfl", "-o", str(models / "flux.bfl.safetensors"))
    int8_fast(models / "flux.int8_tensorwise.safetensors", models / "flux.int8fast.safetensors")
    without_markers(fp8, models / "broken.nomarkers.safetensors")
    relabelled(fp8, models / "broken.u8.safetensors")
    formatless(fp8, models / "broken.noformat.safetensors")
    TIMINGS["model files"] = time.monotonic() - t0

    t0 = time.monotonic()
    server.start()
    TIMINGS["server start"] = time.monotonic() - t0
    server.work = work
    started_tests = time.monotonic()
    yield server
    TIMINGS["tests"] = time.monotonic() - started_tests
    server.stop()
    print("\nComfyUI fixture timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))


def probe(server: Server, loader: dict) -> dict:
    """Run the probe on the MODEL of ``loader`` (a node); its report."""
    entry = server.run({"1": loader, "2": {"class_type": "ComfyQuantTestProbe", "inputs": {"model": ["1", 0]}}})
    error = error_of(entry)
    assert error is None, f"{error['exception_type']}: {error['exception_message']}"
    return json.loads(texts(entry, "2")[0])


def unet_loader(name: str) -> dict:
    return {"class_type": "UNETLoader", "inputs": {"unet_name": name, "weight_dtype": "default"}}


def cq_loader(name: str, allow_lossy: bool = False) -> dict:
    return {
        "class_type": "ComfyQuantLoader",
        "inputs": {"model_name": name, "weight_dtype": "default", "allow_lossy": allow_lossy},
    }


def written_by(server: Server, command: str, name: str, *extra: str) -> str:
    """``comfyquant COMMAND`` (migrate, fix) of a model file for ComfyUI (as the Loader reads
    it), written into diffusion_models."""
    out = server.models / f"{Path(name).stem}.{command}ed.safetensors"
    if not out.exists():
        proc = comfyquant_cli(command, str(server.models / name), "-o", str(out), "--target", "comfyui", *extra)
        assert out.exists(), proc.stdout + proc.stderr
    return out.name


# -- tests -------------------------------------------------------------------------------------


def test_nodes_register_with_their_sockets(server):
    info = server.get("/object_info")
    check, loader, save = info["ComfyQuantCheck"], info["ComfyQuantLoader"], info["ComfyQuantQuantizeSave"]
    assert check["output"] == ["STRING"] and check["output_node"] is True
    assert check["input"]["required"]["targets"][0] == ["all", "comfyui", "sglang", "comfy-kitchen"]
    assert "broken.u8.safetensors" in check["input"]["required"]["model_name"][0]
    assert loader["output"] == ["MODEL", "STRING"]
    assert set(loader["input"]["required"]) == {"model_name", "weight_dtype", "allow_lossy"}
    assert loader["input"]["required"]["weight_dtype"][0] == info["UNETLoader"]["input"]["required"]["weight_dtype"][0]
    assert loader["input"]["required"]["allow_lossy"][1]["default"] is False
    assert save["output"] == ["STRING"]
    assert save["input"]["required"]["model"][0] == "MODEL"
    assert save["input"]["required"]["preset"][1]["default"] == "auto"
    assert "float8_e4m3fn" in save["input"]["required"]["format"][0]
    assert "comfyquant" in server.get("/extensions")[0] or any("comfyquant" in e for e in server.get("/extensions"))


@pytest.mark.parametrize(
    "name, targets",
    # an FP8 weight labelled U8 fails SGLang and comfy-kitchen from the header; what ComfyUI's
    # value cast computes only its values tell (check --deep). A marker without its format
    # fails ComfyUI's load, which the header shows.
    [("broken.u8.safetensors", "all"), ("broken.noformat.safetensors", "comfyui")],
)
def test_check_report_is_comfyquant_checks(server, name, targets):
    entry = server.run({"1": {"class_type": "ComfyQuantCheck", "inputs": {"model_name": name, "targets": targets}}})
    assert error_of(entry) is None
    report = texts(entry, "1")[0]
    cli = comfyquant_cli("check", str(server.models / name), "--target", targets)
    assert cli.returncode == 1
    assert report == cli.stdout.rstrip("\n")
    assert "comfyui" in report and "FAIL" in report


@pytest.mark.parametrize("damage", ["header not JSON", "header cut short"])
def test_check_reports_an_unreadable_header_as_comfyquant_check_does(server, damage):
    """A file whose header cannot be read is a report on the node (C009, and what each runtime
    raises opening it), the very text ``comfyquant check`` prints, not a node error."""
    name = f"damaged.{damage.replace(' ', '-')}.safetensors"
    data = (
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all"
        if damage == "header not JSON"
        else (server.models / "flux.float8_e4m3fn.safetensors").read_bytes()[:200]
    )
    (server.models / name).write_bytes(data)
    entry = server.run({"1": {"class_type": "ComfyQuantCheck", "inputs": {"model_name": name, "targets": "all"}}})
    assert error_of(entry) is None, error_of(entry)
    report = texts(entry, "1")[0]
    cli = comfyquant_cli("check", str(server.models / name), "--target", "all")
    assert cli.returncode == 1 and cli.stderr == ""
    assert report == cli.stdout.rstrip("\n")
    assert "ERROR C009 " in report and report.count("FAILS  SafetensorError") == 3


@pytest.mark.parametrize(
    "name, dialect",
    [
        ("flux.legacy.safetensors", "comfy-legacy-fp8"),
        ("flux.musubi.safetensors", "musubi"),
        ("flux.modelopt.safetensors", "modelopt"),
        ("flux.int8fast.safetensors", "int8-fast"),
    ],
)
def test_loader_translates_other_layouts_exactly(server, name, dialect):
    """The Loader's model computes what ComfyUI computes from the migrated file, bit for bit,
    and holds the same quantized layers; the file itself is untouched."""
    before = (server.models / name).read_bytes()
    files = sorted(p for p in server.folder.rglob("*") if not p.is_symlink() and "user" not in p.parts)
    ours = probe(server, cq_loader(name))
    assert sorted(p for p in server.folder.rglob("*") if not p.is_symlink() and "user" not in p.parts) == files  # nothing written
    reference = probe(server, unet_loader(written_by(server, "migrate", name)))
    assert ours["finite"] and ours["mean_abs"] > 0
    assert ours["quantized"] and ours["quantized"] == reference["quantized"]
    assert ours["sha256"] == reference["sha256"]
    source = "flux.int8_tensorwise.safetensors" if "int8" in name else "flux.float8_e4m3fn.safetensors"
    assert probe(server, unet_loader(source))["sha256"] == ours["sha256"]  # the file it was made from
    assert (server.models / name).read_bytes() == before
    notes = texts(server.run({"1": cq_loader(name)}), "1")[0]
    assert "migrate" in notes and dialect.split("-")[0] in notes.lower()


@pytest.mark.parametrize("name", ["broken.nomarkers.safetensors", "broken.u8.safetensors"])
def test_loader_repairs_what_comfyuis_loader_gets_wrong(server, name):
    """ComfyUI's own loader refuses the broken file or computes something else; the Loader
    computes what ComfyUI computes from ``comfyquant fix``'s output."""
    fixed = written_by(server, "fix", name)
    reference = probe(server, unet_loader(fixed))
    ours = probe(server, cq_loader(name))
    assert ours["sha256"] == reference["sha256"] and ours["quantized"] == reference["quantized"]
    assert ours["quantized"]
    entry = server.run({"1": unet_loader(name), "2": {"class_type": "ComfyQuantTestProbe", "inputs": {"model": ["1", 0]}}})
    if error_of(entry) is None:
        assert json.loads(texts(entry, "2")[0])["sha256"] != reference["sha256"]


def test_loader_refuses_a_lossy_layout_in_one_line_unless_allowed(server):
    """musubi's per-channel scales have no exact Comfy form: refused with the reason (no
    traceback from comfyquant's code) unless ``allow_lossy``."""
    sd, _ = tensors_and_metadata(server.models / "flux.musubi.safetensors")
    layer = next(k[: -len(".scale_weight")] for k in sorted(sd) if k.endswith(".scale_weight"))
    w = sd[f"{layer}.weight"].float() * sd[f"{layer}.scale_weight"].float()
    scale = w.abs().amax(dim=1, keepdim=True) / 448.0
    sd[f"{layer}.weight"] = (w / scale).to(torch.float8_e4m3fn)
    sd[f"{layer}.scale_weight"] = scale
    save_file(sd, str(server.models / "flux.musubi-channel.safetensors"))
    entry = server.run({"1": cq_loader("flux.musubi-channel.safetensors")})
    error = error_of(entry)
    assert error is not None and error["exception_type"].endswith("NodeError")
    message = error["exception_message"].strip()
    assert "\n" not in message and message.startswith("refusing to load ") and layer in message
    package = str(ROOT / "src" / "comfyquant")
    ours = [frame for frame in error["traceback"] if package in frame]
    assert ours and all(str(Path(package) / "comfyui" / "nodes.py") in frame for frame in ours)
    ours = probe(server, cq_loader("flux.musubi-channel.safetensors", allow_lossy=True))
    assert ours["finite"] and ours["quantized"]


def test_loader_reencodes_a_lossy_layout_only_when_allowed(server):
    """BFL's FP8 layers repeat their scale per row, which no Comfy FP8 format stores: refused
    by default; with ``allow_lossy`` the model computes what ComfyUI computes from
    ``comfyquant migrate --allow-lossy``'s file."""
    name = "flux.bfl.safetensors"
    error = error_of(server.run({"1": cq_loader(name)}))
    assert error is not None and error["exception_type"].endswith("NodeError")
    message = error["exception_message"].strip()
    assert message.startswith(f"refusing to load {server.models / name}: layer ") and "--allow-lossy" in message
    ours = probe(server, cq_loader(name, allow_lossy=True))
    reference = probe(server, unet_loader(written_by(server, "migrate", name, "--allow-lossy")))
    assert ours["quantized"] and ours["quantized"] == reference["quantized"]
    assert ours["sha256"] == reference["sha256"]


@pytest.mark.parametrize("damage", ["not a checkpoint", "truncated"])
def test_loader_refuses_an_unreadable_file_in_one_line(server, damage):
    name = f"damaged.{damage.replace(' ', '-')}.safetensors"
    data = (
        b"not a checkpoint at all"
        if damage == "not a checkpoint"
        else (server.models / "flux.float8_e4m3fn.safetensors").read_bytes()[:200_000]
    )
    (server.models / name).write_bytes(data)
    error = error_of(server.run({"1": cq_loader(name)}))
    assert error is not None and error["exception_type"].endswith("NodeError")
    message = error["exception_message"].strip()
    assert "\n" not in message and str(server.models / name) in message
    assert ("not a safetensors file" if damage == "not a checkpoint" else "file truncated?") in message


def test_quantize_save_writes_a_checked_file_in_the_format_and_preset_asked(server):
    prompt = {
        "1": unet_loader("flux.bf16.safetensors"),
        "2": {
            "class_type": "ComfyQuantQuantizeSave",
            "inputs": {"model": ["1", 0], "format": "int8_tensorwise", "preset": "flux", "filename_prefix": "cq/flux"},
        },
    }
    entry = server.run(prompt)
    error = error_of(entry)
    assert error is None, error and error["exception_message"]
    summary = texts(entry, "2")[0]
    written = sorted((server.models / "cq").glob("flux_*_.int8_tensorwise.safetensors"))
    assert len(written) == 1 and f"wrote {written[0]}" in summary
    assert "check --target comfyui: loads" in summary and "per-layer relative L2 error (13 layers)" in summary
    assert comfyquant_cli("check", str(written[0])).returncode == 0
    with safe_open(str(written[0]), "pt") as f:
        layers = json.loads(f.metadata()["_quantization_metadata"])["layers"]
    assert layers and {m["format"] for m in layers.values()} == {"int8_tensorwise"}
    # the command with the same choices, on the weights as ComfyUI holds them (F32 on the CPU)
    held = server.work / "held.safetensors"
    save_file({k: v.float() for k, v in load_file(str(server.models / "flux.bf16.safetensors")).items()}, str(held))
    assert "quantized from the model's weights as ComfyUI holds them: F32" in summary
    cli_out = server.work / "cli.safetensors"
    comfyquant_cli("quantize", str(held), "-o", str(cli_out), "--format", "int8_tensorwise", "--preset", "flux")
    with safe_open(str(cli_out), "pt") as f:
        assert set(json.loads(f.metadata()["_quantization_metadata"])["layers"]) == set(layers)
    assert not any(n.startswith(("img_in", "txt_in", "final_layer", "time_in")) for n in layers)
    ours, cli = load_file(str(written[0])), load_file(str(cli_out))
    assert ours.keys() == cli.keys() and all(torch.equal(ours[k], cli[k]) for k in ours)
    assert not list((server.folder / "temp").glob("comfyquant-dense-*"))


def test_quantize_save_refuses_a_quantized_model_in_one_line(server):
    prompt = {
        "1": unet_loader("flux.float8_e4m3fn.safetensors"),
        "2": {
            "class_type": "ComfyQuantQuantizeSave",
            "inputs": {"model": ["1", 0], "format": "int8_tensorwise", "preset": "auto", "filename_prefix": "cq/requant"},
        },
    }
    error = error_of(server.run(prompt))
    assert error is not None and error["exception_type"].endswith("NodeError")
    message = error["exception_message"].strip()
    assert "\n" not in message and "is already quantized" in message and "load the dense checkpoint" in message
    assert not (server.models / "cq").exists() or not list((server.models / "cq").glob("requant_*"))


def test_example_workflow_runs(server):
    """The shipped example (Check, then Loader) runs as it is, on a file of another layout."""
    prompt = json.loads(EXAMPLE.read_text())
    for node in prompt.values():
        if "model_name" in node["inputs"]:
            node["inputs"]["model_name"] = "flux.legacy.safetensors"
    entry = server.run(prompt)
    assert error_of(entry) is None
    classes = {k: v["class_type"] for k, v in prompt.items()}
    check = next(k for k, c in classes.items() if c == "ComfyQuantCheck")
    assert texts(entry, check)[0] == comfyquant_cli("check", str(server.models / "flux.legacy.safetensors")).stdout.rstrip("\n")


def _json_or_none(payload) -> dict | None:
    if not isinstance(payload, str):
        return None  # binary frames carry preview images
    try:
        return json.loads(payload)
    except ValueError:
        return None


def test_check_node_shows_its_report_in_the_browser(server, tmp_path):
    """Debian's chromium, headless, driven by Playwright: the frontend loads the example
    workflow, queues it, and the Check node shows the report on the node."""
    try:
        import playwright.sync_api as playwright
    except ImportError:
        runtime_sources.skip_missing("playwright is not installed (pip install -e '.[comfyui-test]')")
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(chromium):
        runtime_sources.skip_missing("Debian's chromium is not installed (apt-get install chromium)")
    name = "broken.u8.safetensors"
    prompt = json.loads(EXAMPLE.read_text())
    for node in prompt.values():
        if "model_name" in node["inputs"]:
            node["inputs"]["model_name"] = name
    expected = comfyquant_cli("check", str(server.models / name)).stdout.rstrip("\n")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 760})
            frames: list[str] = []
            page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(payload)))
            server.post("/settings/Comfy.TutorialCompleted", True)  # no first-run templates dialog over the graph
            page.goto(server.url, wait_until="networkidle", timeout=120_000)
            page.wait_for_function("() => window.app && window.app.graph && window.app.extensionManager", timeout=120_000)
            wanted = sorted(node["class_type"] for node in prompt.values())
            shown: list[str] = []
            for _attempt in range(5):  # the frontend may still be restoring its start-up workflow
                page.evaluate("async (api) => { await window.app.loadApiJson(api, 'comfyquant example'); }", prompt)
                page.wait_for_timeout(1000)
                shown = sorted(page.evaluate("() => window.app.graph._nodes.map((n) => n.type)"))
                if shown == wanted:
                    break
            assert shown == wanted
            page.evaluate(  # side by side: the API format carries no positions
                "() => { window.app.graph._nodes.forEach((n, i) => { n.pos = [110 + i * 680, 150]; }); }"
            )
            page.evaluate("async () => { await window.app.queuePrompt(0, 1); }")
            selector = 'textarea.comfyquant-report[data-node-type="ComfyQuantCheck"]'
            report = page.locator(selector)
            report.wait_for(state="attached", timeout=300_000)
            page.wait_for_function(
                "(s) => { const t = document.querySelector(s); return t && t.value.length > 0; }",
                arg=selector,
                timeout=300_000,
            )
            assert report.input_value() == expected
            # the Loader read the file under ComfyUI's progress bar, up to its end
            loader = next(k for k, v in prompt.items() if v["class_type"] == "ComfyQuantLoader")
            page.wait_for_function(  # its notes come after its progress
                "(s) => { const t = document.querySelector(s); return t && t.value.length > 0; }",
                arg='textarea.comfyquant-report[data-node-type="ComfyQuantLoader"]',
                timeout=300_000,
            )
            progress = [m["data"] for m in map(_json_or_none, frames) if m and m.get("type") == "progress"]
            ours = [d for d in progress if d.get("node") == loader]
            assert ours and ours[-1]["value"] == ours[-1]["max"] > 1
            page.keyboard.press("Escape")
            page.evaluate(
                "() => { const c = window.app.canvas; c.ds.scale = 1.0; c.ds.offset = [0, 0]; c.setDirty(true, true); }"
            )
            page.wait_for_timeout(500)
            shot = tmp_path / "comfyui-check.png"
            page.screenshot(path=str(shot))
        finally:
            browser.close()
    assert shot.stat().st_size > 0
    if os.environ.get("COMFYQUANT_UPDATE_SCREENSHOT"):  # the docs page's picture, on request only
        docs = ROOT / "docs" / "img" / "comfyui-check.png"
        docs.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, docs)
