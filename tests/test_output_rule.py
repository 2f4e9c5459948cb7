"""One output rule and one writer for every file a command emits.

* ``compare --plot PATH`` is claimed like a model output before any work: never an input, an
  existing file only with ``--overwrite``, never a FIFO, a device or a folder (a link is an
  existing file: replaced only with ``--overwrite``, and then the link, never its target).
* Every destination folder must take a new file before the work starts: a read-only or
  immutable folder is refused in one line, not found out after the quantization.
* A late failure leaves nothing: the ``--report`` files are staged and committed with the
  model, so a report that cannot be written leaves neither report nor model.
* The index, the JSON report and the PNG go through the one writer (owner-named temporary
  files a killed run's successor sweeps, fsync, durable rename); the index keeps the input
  index's metadata.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess

import pytest

import foreign_seeds as fs
from builders import dense_layer, fp8_layer, w4a8_layer, write
from comfyquant.cli import main

pytestmark = pytest.mark.needs_torch

TEMP_NAME = re.compile(r"^\.comfyquant-\d+-\d+-[0-9a-f]{8}-[0-9a-f]{8}-[A-Za-z0-9_]+\.tmp$")


def quantized(tmp_path) -> str:
    return write(tmp_path / "q.safetensors", fp8_layer("blocks.0.a", 32, 64), dense_layer("norm", 8, 16))


def dense(tmp_path, name="d.safetensors") -> str:
    return write(tmp_path / name, dense_layer("blocks.0.a", 32, 64), dense_layer("blocks.0.b", 32, 64))


def run(capsys, args) -> tuple[int, str]:
    rc = main(args)
    return rc, capsys.readouterr().err


# -- compare --plot ---------------------------------------------------------------------------


@pytest.fixture
def pair(tmp_path):
    pytest.importorskip("matplotlib")
    return quantized(tmp_path), dense(tmp_path)


def test_plot_onto_a_fifo_is_refused_and_the_fifo_stays(tmp_path, capsys, pair):
    plot = tmp_path / "p.png"
    os.mkfifo(plot)
    before = fs.snapshot(tmp_path)
    for extra in ([], ["--overwrite"]):
        rc, err = run(capsys, ["compare", *pair, "--plot", str(plot), "--no-progress", *extra])
        assert (
            rc == 2 and err == f"comfyquant: {plot}: is not a regular file (a device, FIFO or socket); refusing to replace it\n"
        )
    assert stat.S_ISFIFO(os.lstat(plot).st_mode) and fs.snapshot(tmp_path) == before


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="making a device node needs root")
def test_plot_onto_a_character_device_is_refused_and_the_device_stays(tmp_path, capsys, pair):
    """A node like /dev/full (made here, so a failure never touches the real one)."""
    plot = tmp_path / "full"
    try:
        os.mknod(plot, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("this process may not make device nodes")
    for extra in ([], ["--overwrite"]):
        rc, err = run(capsys, ["compare", *pair, "--plot", str(plot), "--no-progress", *extra])
        assert rc == 2 and "is not a regular file" in err and err.count("\n") == 1
    assert stat.S_ISCHR(os.lstat(plot).st_mode)


def test_plot_onto_a_link_or_a_file_needs_overwrite(tmp_path, capsys, pair):
    target = tmp_path / "kept.png"
    target.write_bytes(b"someone's picture")
    link = tmp_path / "link.png"
    os.symlink(target, link)
    for plot in (link, target):
        before = fs.snapshot(tmp_path)
        rc, err = run(capsys, ["compare", *pair, "--plot", str(plot), "--no-progress"])
        assert rc == 2 and err == f"comfyquant: {plot}: exists; pass --overwrite to replace it\n"
        assert fs.snapshot(tmp_path) == before
    rc, _ = run(capsys, ["compare", *pair, "--plot", str(target), "--no-progress", "--overwrite"])
    assert rc == 0 and target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".comfyquant")]


def test_plot_onto_an_input_is_refused(tmp_path, capsys, pair):
    a, b = pair
    before = fs.snapshot(tmp_path)
    rc, err = run(capsys, ["compare", a, b, "--plot", b, "--no-progress", "--overwrite"])
    assert rc == 2 and err == f"comfyquant: {b}: is the input; refusing to overwrite the input checkpoint\n"
    assert fs.snapshot(tmp_path) == before


def test_plot_into_a_missing_folder_is_refused_before_the_comparison(tmp_path, capsys, pair):
    plot = tmp_path / "nope" / "p.png"
    rc, err = run(capsys, ["compare", *pair, "--plot", str(plot), "--no-progress"])
    assert rc == 2 and err == f"comfyquant: {plot}: the folder {tmp_path / 'nope'} does not exist\n"


# -- destinations that cannot be written --------------------------------------------------------


@pytest.fixture
def locked(tmp_path):
    """A folder no new file can be created in: immutable (root), else read-only."""
    folder = tmp_path / "locked"
    folder.mkdir()
    immutable = False
    if os.geteuid() == 0:
        immutable = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
    else:
        os.chmod(folder, 0o555)
    try:
        (folder / "probe").write_bytes(b"")
    except OSError:
        pass
    else:
        os.unlink(folder / "probe")
        pytest.skip("this filesystem lets the process write into a read-only folder")
    yield folder
    if immutable:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    os.chmod(folder, 0o755)


def test_a_report_into_an_unwritable_folder_is_refused_before_the_work(tmp_path, capsys, locked, monkeypatch):
    pytest.importorskip("matplotlib")
    import comfyquant.quantizer.runner as runner

    monkeypatch.setattr(runner, "execute", lambda *a, **k: pytest.fail("the quantization started"))
    src = dense(tmp_path)
    out = tmp_path / "m.safetensors"
    report = locked / "rep"
    before = fs.snapshot(tmp_path)
    rc, err = run(capsys, ["quantize", src, "-f", "fp8", "-o", str(out), "--report", str(report), "--no-progress"])
    assert rc == 2 and err.count("\n") == 1 and "internal error" not in err, err
    assert err.startswith(f"comfyquant: {locked / 'rep.json'}: cannot write in {locked} ("), err
    assert fs.snapshot(tmp_path) == before  # no model, no report, no temporary file


@pytest.mark.parametrize(
    "command",
    [
        ["dequantize", "{src}", "{out}", "--no-progress"],
        ["convert", "{src}", "-t", "int8", "-o", "{out}", "--no-progress"],
        ["fix", "{src}", "-o", "{out}"],
        ["migrate", "{src}", "-o", "{out}"],
    ],
)
def test_a_model_into_an_unwritable_folder_is_refused_before_the_work(tmp_path, capsys, locked, command):
    if command[0] == "fix":  # a file fix repairs (its marker misses the group size)
        src = write(tmp_path / "q.safetensors", w4a8_layer("a.b", marker={"format": "asym_w4a8_int8"}), dense_layer("n"))
    elif command[0] == "migrate":
        src = fs.seed("legacy", tmp_path)
    else:
        src = quantized(tmp_path)
    out = locked / "o.safetensors"
    before = fs.snapshot(tmp_path)
    rc, err = run(capsys, [a.replace("{src}", src).replace("{out}", str(out)) for a in command])
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"comfyquant: {out}: cannot write in {locked} ("), err
    assert fs.snapshot(tmp_path) == before


def test_a_report_that_fails_late_leaves_no_model_and_no_report(tmp_path, capsys, monkeypatch):
    """The plot cannot be saved (a full disk, say) after the model was written and checked:
    nothing of the run is left, not the model, not the JSON, not a temporary file."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    src = dense(tmp_path)
    out = tmp_path / "m.safetensors"
    before = fs.snapshot(tmp_path)
    rc, err = run(capsys, ["quantize", src, "-f", "fp8", "-o", str(out), "--report", str(tmp_path / "rep"), "--no-progress"])
    assert (
        rc == 2
        and err == f"comfyquant: {tmp_path / 'rep.png'}: cannot write the plot (No space left on device); nothing was written\n"
    )
    assert fs.snapshot(tmp_path) == before


# -- one writer ------------------------------------------------------------------------------------


def test_every_file_of_a_run_is_committed_from_an_owner_named_temporary_file(tmp_path, capsys, monkeypatch):
    """Shards, index, JSON report and PNG: each renamed into place by the one writer from a
    temporary file named for its owner (so a killed run's leftovers are swept)."""
    pytest.importorskip("matplotlib")
    from comfyquant.io import writer

    committed: list[tuple[str, str]] = []
    real = writer.commit_file

    def record(tmp, path):
        committed.append((os.path.basename(tmp), os.path.basename(path)))
        real(tmp, path)

    monkeypatch.setattr(writer, "commit_file", record)
    for module in ("comfyquant.quantizer.runner", "comfyquant.io.index", "comfyquant.dequantizer"):
        mod = __import__(module, fromlist=["x"])
        if hasattr(mod, "commit_file"):
            monkeypatch.setattr(mod, "commit_file", record)
    one = dense(tmp_path)
    folder = str(tmp_path / "in")
    fs.split_shards(one, folder)
    committed.clear()
    out = tmp_path / "out"
    rc, err = run(capsys, ["quantize", folder, "-f", "fp8", "-o", str(out), "--report", str(tmp_path / "rep"), "--no-progress"])
    assert rc == 0, err
    names = sorted(dest for _tmp, dest in committed)
    assert names == sorted(
        [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "rep.json",
            "rep.png",
        ]
    )
    assert all(TEMP_NAME.match(tmp) for tmp, _dest in committed), committed
    rc, err = run(capsys, ["dequantize", str(out), str(tmp_path / "dense"), "--no-progress"])
    assert rc == 0, err
    assert ("model.safetensors.index.json" in [d for _t, d in committed[-3:]]) and all(TEMP_NAME.match(t) for t, _d in committed)


def test_the_dequantized_index_keeps_the_input_index_metadata(tmp_path, capsys):
    src = quantized(tmp_path)
    folder = str(tmp_path / "in")
    fs.split_shards(src, folder)
    index = os.path.join(folder, "model.safetensors.index.json")
    with open(index, encoding="utf-8") as fh:
        doc = json.load(fh)
    doc["metadata"] = {"total_size": 1, "producer": "someone's tool"}
    with open(index, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    out = tmp_path / "dense"
    assert main(["dequantize", folder, str(out), "--no-progress"]) == 0
    with open(out / "model.safetensors.index.json", encoding="utf-8") as fh:
        written = json.load(fh)
    from safetensors import safe_open

    size = 0
    for shard in sorted(set(written["weight_map"].values())):
        with safe_open(str(out / shard), "pt") as f:
            size += sum(f.get_tensor(k).nbytes for k in f.keys())
    assert written["metadata"] == {"total_size": size, "producer": "someone's tool"}
    assert not [n for n in os.listdir(out) if not n.endswith((".safetensors", ".json"))]


def test_one_plot_helper_and_no_fixed_temporary_names():
    """Source scan: matplotlib is required and figures are saved in one place (``io/plots``),
    and no module outside ``io/`` names a temporary file itself."""
    root = os.path.join(os.path.dirname(__file__), "..", "src", "comfyquant")
    found: dict[str, list[str]] = {"require": [], "tmp": [], "savefig": []}
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            if "def require_matplotlib" in text:
                found["require"].append(rel)
            if "savefig(" in text:
                found["savefig"].append(rel)
            if not rel.startswith("io" + os.sep) and re.search(r"""\+ ?["']\.(comfyquant\.)?tmp""", text):
                found["tmp"].append(rel)
    assert found == {"require": [os.path.join("io", "plots.py")], "tmp": [], "savefig": [os.path.join("io", "plots.py")]}


def test_save_quantized_follows_the_output_rule(tmp_path):
    """The Python API's writer refuses what every command refuses (it replaces an existing
    file, as ``torch.save`` does)."""
    import torch

    from comfyquant.errors import InputError
    from comfyquant.torch import save_quantized

    model = torch.nn.Sequential(torch.nn.Linear(16, 8))
    fifo = tmp_path / "m.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="is not a regular file"):
        save_quantized(model, fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(InputError, match="does not exist"):
        save_quantized(model, tmp_path / "nope" / "m.safetensors")
    done = tmp_path / "ok.safetensors"
    done.write_bytes(b"old")
    assert save_quantized(model, done) == str(done) and done.read_bytes()[:8] != b"old"


def test_fix_in_place_in_an_unwritable_folder_is_refused_before_the_work(tmp_path, capsys, locked, monkeypatch):
    """The replacement is written beside the input: its folder must take a new file, known
    before a byte of it is built."""
    import comfyquant.repair.execute as execute

    monkeypatch.setattr(execute, "build_shards", lambda *a, **k: pytest.fail("the work started"))
    subprocess.run(["chattr", "-i", str(locked)], capture_output=True)
    os.chmod(locked, 0o755)
    src = write(locked / "q.safetensors", w4a8_layer("a.b", marker={"format": "asym_w4a8_int8"}), dense_layer("n"))
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(locked)], check=True)
    else:
        os.chmod(locked, 0o555)
    before = fs.snapshot(tmp_path)
    rc, err = run(capsys, ["fix", src, "--in-place"])
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"comfyquant: {src}: cannot write in {locked} ("), err
    assert fs.snapshot(tmp_path) == before


# -- a folder as the output -----------------------------------------------------------------------


def _folder_sources(tmp_path, command: str) -> tuple[list[str], str]:
    """(the command's arguments before ``-o``, the default name of its output)."""
    from builders import W4A8_MARKER

    if command == "fix":
        broken = {k: v for k, v in W4A8_MARKER.items() if k != "convrot"}
        return ["fix", write(tmp_path / "m.safetensors", w4a8_layer("a.b", marker=broken), dense_layer("n", 8, 16))], "fixed"
    if command == "migrate":
        return ["migrate", fs.seed("legacy", tmp_path)], "comfy"
    if command == "quantize":
        return ["quantize", dense(tmp_path, "m.safetensors"), "-f", "fp8", "--no-progress"], "float8_e4m3fn"
    src = write(tmp_path / "m.safetensors", fp8_layer("blocks.0.a", 32, 64), dense_layer("norm", 8, 16))
    if command == "convert":
        return ["convert", src, "-t", "int8", "--no-progress"], "int8_tensorwise"
    return ["dequantize", src, "--no-progress"], "dense"


@pytest.mark.parametrize("command", ["fix", "migrate", "quantize", "convert", "dequantize"])
@pytest.mark.parametrize("how", ["existing", "slash"])
def test_a_folder_as_the_output_holds_the_file_under_its_default_name(tmp_path, capsys, command, how):
    """``-o FOLDER`` (an existing folder, or a new one written ``FOLDER/``) puts the output in
    it under the name it gets without ``-o`` -- never under the input's own name (an FP8 file
    called ``dense.safetensors``) -- and the file passes check."""
    args, tag = _folder_sources(tmp_path, command)
    stem = os.path.basename(args[1]).rsplit(".", 1)[0]
    out = tmp_path / "outdir"
    if how == "existing":
        out.mkdir()
    rc = main([*args, "-o", str(out) + ("/" if how == "slash" else "")])
    text = capsys.readouterr().out
    assert rc == 0, text
    written = out / f"{stem}.{tag}.safetensors"
    assert os.listdir(out) == [written.name] and str(written) in text
    assert main(["check", str(written), "--target", "comfyui"]) == 0
    capsys.readouterr()


def test_a_folder_for_a_file_without_a_default_name_is_refused(tmp_path, capsys):
    """``compare --plot``, ``quantize --report`` and ``save_quantized`` write files that have no
    default name: a folder given for one is refused before the work, in one line, and nothing
    is written."""
    import torch

    from comfyquant.errors import InputError
    from comfyquant.torch import save_quantized

    pytest.importorskip("matplotlib")
    q, d = quantized(tmp_path), dense(tmp_path)
    folder = tmp_path / "here"
    folder.mkdir()
    before = fs.snapshot(tmp_path)
    rc, err = run(capsys, ["compare", q, d, "--plot", str(folder), "--no-progress", "--overwrite"])
    assert rc == 2 and err == f"comfyquant: {folder}: is a folder; give the file's own path\n"
    report = tmp_path / "rep.json"
    report.mkdir()
    before = fs.snapshot(tmp_path)
    args = ["quantize", d, "-f", "fp8", "-o", str(tmp_path / "m.safetensors"), "--report", str(tmp_path / "rep")]
    rc, err = run(capsys, [*args, "--no-progress", "--overwrite"])
    assert rc == 2 and err == f"comfyquant: {report}: is a folder; give the file's own path\n"
    with pytest.raises(InputError, match="is a folder; give the file's own path"):
        save_quantized(torch.nn.Sequential(torch.nn.Linear(16, 8)), folder)
    assert fs.snapshot(tmp_path) == before
