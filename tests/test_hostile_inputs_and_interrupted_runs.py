"""Hostile inputs and interrupted runs: every
command ends with exit 0, 1 or 2 and one clear line, never an internal error (3), a hang, a
partial output or a modified input; output paths follow one rule; temporary files of killed
runs are cleaned up; ``fix`` repairs unused bytes and writes through symbolic links."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import struct
import subprocess
import sys
import threading
import time

import pytest

import comfyquant
from builders import W4A8_MARKER, dense_layer, fp8_layer, int8_layer, w4a4_layer, w4a8_layer, write
from comfyquant import check
from comfyquant.cli import main
from conftest import HAS_TORCH

SRC = os.path.dirname(os.path.dirname(os.path.abspath(comfyquant.__file__)))
"""Where the comfyquant under test lives: subprocesses run the same code."""


def raw_checkpoint(path, tensors: dict, metadata: dict | None = None, tail: bytes = b"") -> str:
    """A safetensors file written byte by byte from ``{name: (dtype, shape, bytes)}``: no
    validation, so names, numbers and spans can be anything JSON (or Python's json) allows."""
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset, data = 0, b""
    for name, (dtype, shape, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        data += blob
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text + data + tail)
    return str(path)


def run(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def digest(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def every_command(tmp_path, src: str) -> list[tuple[str, list[str], str | None]]:
    """(name, arguments, output path or None) of each command on ``src``, text and JSON."""
    o = lambda n: str(tmp_path / n)  # noqa: E731
    return [
        ("check", ["check", src], None),
        ("check --json", ["check", src, "--json"], None),
        ("check --deep", ["check", src, "--deep"], None),
        ("inspect", ["inspect", src], None),
        ("inspect --json", ["inspect", src, "--json"], None),
        ("fix", ["fix", src, "-o", o("fixed.safetensors")], o("fixed.safetensors")),
        ("fix --json", ["fix", src, "-o", o("fixed2.safetensors"), "--json"], o("fixed2.safetensors")),
        ("dequantize", ["dequantize", src, o("dense.safetensors")], o("dense.safetensors")),
        ("dequantize --json", ["dequantize", src, o("dense2.safetensors"), "--json"], o("dense2.safetensors")),
        ("convert", ["convert", src, o("conv.safetensors"), "-t", "fp8", "--no-progress"], o("conv.safetensors")),
        (
            "convert --json",
            ["convert", src, o("conv2.safetensors"), "-t", "int8", "--json", "--no-progress"],
            o("conv2.safetensors"),
        ),
        ("convert dense", ["convert", src, o("cd.safetensors"), "-t", "dense", "--no-progress"], o("cd.safetensors")),
        ("quantize", ["quantize", src, o("q.safetensors"), "-f", "fp8", "--no-progress"], o("q.safetensors")),
    ]


def assert_no_crash(capsys, tmp_path, src: str, expect_check: int | None = 1) -> dict[str, tuple[int, str, str]]:
    """Run every command on ``src``: exit 0/1/2 with the error on one line, the input intact,
    no output of a refusing command and no temporary file left."""
    before = digest(src)
    results = {}
    for name, args, out in every_command(tmp_path, src):
        rc, stdout, err = run(capsys, *args)
        results[name] = (rc, stdout, err)
        assert rc in (0, 1, 2), f"{name}: exit {rc}: {err}"
        assert "internal error" not in err, f"{name}: {err}"
        if rc == 2:
            assert err.count("\n") == 1, f"{name}: {err!r}"
            if out is not None:
                assert not os.path.exists(out), f"{name} refused but wrote {out}"
        if "--json" in args and rc in (0, 1):
            json.loads(stdout)
    assert digest(src) == before
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".comfyquant-")]
    if expect_check is not None:
        assert results["check"][0] == expect_check
    return results


# -- numbers that are not finite ----------------------------------------------------------------

NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]


@pytest.mark.parametrize("number", NON_FINITE)
def test_non_finite_number_in_a_tensor_marker(tmp_path, capsys, number):
    raw = json.dumps(W4A8_MARKER).replace('"group_size": 16', f'"group_size": {number}').encode()
    src = write(tmp_path / "in.safetensors", w4a8_layer("a.b", marker=raw), dense_layer("n"))
    results = assert_no_crash(capsys, tmp_path, src)
    said = f"holds the number {number}" if "e4" in number else f"holds {number}"
    assert "M001" in results["check"][1] and said in results["check"][1]
    for name in ("dequantize", "convert", "convert dense"):
        assert results[name][0] == 2 and "refusing to" in results[name][2]


@pytest.mark.parametrize("number", NON_FINITE)
def test_non_finite_number_in_the_header_map(tmp_path, capsys, number):
    layers = {"a.b": {**W4A8_MARKER}, "c": {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}}
    text = json.dumps({"format_version": "1.0", "layers": layers})
    text = text.replace('"convrot_groupsize": 256}}', f'"convrot_groupsize": {number}}}}}')
    src = write(
        tmp_path / "in.safetensors",
        w4a8_layer("a.b", marker=False),
        int8_layer("c", marker=False),
        metadata={"_quantization_metadata": text},
    )
    results = assert_no_crash(capsys, tmp_path, src)
    assert "M010" in results["check"][1]


@pytest.mark.parametrize("value", ["1e400", "NaN", "10" * 200, "-16", "true", "16.5", "[16]", '"16"'])
def test_odd_numbers_in_every_marker_key(tmp_path, capsys, value):
    """Every numeric key of every format, set to an odd JSON value: never an internal error."""
    parts = [
        w4a8_layer("w", marker=json.dumps(W4A8_MARKER).replace('"group_size": 16', f'"group_size": {value}').encode()),
        int8_layer("i", marker=f'{{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": {value}}}'.encode()),
        fp8_layer("f", marker=f'{{"format": "float8_e4m3fn", "full_precision_matrix_mult": {value}}}'.encode()),
        dense_layer("n"),
    ]
    src = write(tmp_path / "in.safetensors", *parts)
    assert_no_crash(capsys, tmp_path, src)


# -- names that are not Unicode -----------------------------------------------------------------


def surrogate_checkpoint(tmp_path) -> str:
    tensors = {}
    tensors.update(w4a8_layer("\ud800x.b", marker=dict(W4A8_MARKER, group_size=32)))  # also a finding
    tensors.update(fp8_layer("f\udfff"))
    tensors.update(dense_layer("n\ud83d"))
    return raw_checkpoint(tmp_path / "in.safetensors", tensors, metadata={"note\udc80": "x\ud800"})


def test_lone_surrogate_names_in_every_command(tmp_path, capsys):
    src = surrogate_checkpoint(tmp_path)
    results = assert_no_crash(capsys, tmp_path, src)
    out = results["check"][1]
    assert "ERROR C006" in out and "\\ud800x.b.weight" in out and "ERROR C007" in out
    doc = json.loads(results["check --json"][1])
    assert any(
        f["code"] == "C006" and f["tensor"] == "\ud800x.b.weight" and "lone UTF-16 surrogate" in f["message"]
        for f in doc["findings"]
    )
    # fix cannot carry a name safetensors refuses: it says so and writes nothing
    assert results["fix"][0] == 1 and "C006" in results["fix"][1]


def test_lone_surrogate_names_on_a_real_stdout(tmp_path):
    """The console script with stdout a pipe (UTF-8, strict): the names print escaped."""
    src = surrogate_checkpoint(tmp_path)
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONIOENCODING": "utf-8"}
    for args in (["check", src], ["inspect", src], ["fix", src, "-o", str(tmp_path / "f.safetensors")]):
        p = subprocess.run([sys.executable, "-m", "comfyquant.cli", *args], capture_output=True, env=env, timeout=120)
        assert p.returncode in (0, 1), p.stderr
        assert b"internal error" not in p.stderr
    assert b"\\ud800x.b" in p.stdout or args[0] == "inspect"


# -- --deep on a span that is not dtype x shape -------------------------------------------------


def test_deep_on_a_c001_scale_is_a_finding(tmp_path, capsys):
    tensors = fp8_layer("a.b")
    tensors["a.b.weight_scale"] = ("F32", (), b"\x00\x00\x80?\x00")  # 5 bytes for one F32
    src = raw_checkpoint(tmp_path / "in.safetensors", tensors)
    rc, out, err = run(capsys, "check", src, "--deep")
    assert rc == 1 and "C001" in out and "internal error" not in err
    tensors["a.b.weight_scale"] = ("F32", (2,), b"\x00\x00\x80?\x00\x00")  # 6 bytes for two F32
    src = raw_checkpoint(tmp_path / "in2.safetensors", tensors)
    rc, out, err = run(capsys, "check", src, "--deep", "--json")
    assert rc == 1 and "C001" in out and "internal error" not in err


# -- output paths -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    ["fix", *(pytest.param(c, marks=pytest.mark.needs_torch) for c in ("dequantize", "quantize", "convert", "convert-dense"))],
)
def test_existing_folder_as_output_receives_the_default_name(tmp_path, capsys, command):
    """An existing folder as OUT holds the output under the name it gets without OUT
    (``model.<tag>.safetensors``), never the input's own name."""
    if command == "quantize":
        src = write(tmp_path / "model.safetensors", dense_layer("a"), dense_layer("b"))
    elif command == "fix":
        src = write(
            tmp_path / "model.safetensors",
            w4a8_layer("a.b", marker={k: v for k, v in W4A8_MARKER.items() if k != "convrot"}),
            dense_layer("n"),
        )
    else:
        src = write(tmp_path / "model.safetensors", w4a8_layer("a.b"), dense_layer("n"))
    folder = tmp_path / "X.safetensors"
    folder.mkdir()
    extra = {
        "fix": [],
        "dequantize": [],
        "quantize": ["-f", "fp8", "--no-progress"],
        "convert": ["-t", "int8", "--no-progress"],
        "convert-dense": ["-t", "dense", "--no-progress"],
    }[command]
    name = {
        "fix": "model.fixed.safetensors",
        "dequantize": "model.dense.safetensors",
        "quantize": "model.float8_e4m3fn.safetensors",
        "convert": "model.int8_tensorwise.safetensors",
        "convert-dense": "model.dense.safetensors",
    }[command]
    rc, out, err = run(capsys, command.split("-")[0], src, "-o", folder, *extra)
    assert rc in (0, 1) and "internal error" not in err, err
    assert os.listdir(folder) == [name]
    assert run(capsys, "check", folder / name, "--target", "comfy-kitchen")[0] == 0
    # the same again: the file exists now; every command refuses alike unless told to replace it
    rc, _, err = run(capsys, command.split("-")[0], src, "-o", folder, *extra)
    # dequantize refuses alike (one output rule for every command)
    assert rc == 2 and f"{name}: exists" in err
    before = (folder / name).read_bytes()
    rc, _, err = run(capsys, command.split("-")[0], src, "-o", folder, *extra, "--overwrite")
    assert rc in (0, 1) and "internal error" not in err, err
    assert os.listdir(folder) == [name] and (folder / name).read_bytes() == before
    if command == "dequantize":  # it still replaces its outputs, when told to
        assert rc == 0


def test_shards_into_a_file_path_are_refused_alike(tmp_path, capsys):
    shards = tmp_path / "src"
    shards.mkdir()
    # named as one model's shards: other names would be two separate checkpoints (refused as such)
    write(
        shards / "m-00001-of-00002.safetensors",
        w4a8_layer("a.b", marker={k: v for k, v in W4A8_MARKER.items() if k != "convrot"}),
    )
    write(shards / "m-00002-of-00002.safetensors", dense_layer("n"))
    target = tmp_path / "out.safetensors"
    for args in (["fix", shards, "-o", target], ["convert", shards, target, "-t", "int8", "--no-progress"]):
        rc, _, err = run(capsys, *args)
        assert rc == 2 and "give a folder as OUT" in err and not target.exists()


# -- fix: unused bytes, symbolic links ----------------------------------------------------------


@pytest.mark.needs_torch
@pytest.mark.parametrize("where", ["trailing", "gap"])
def test_fix_removes_unused_bytes(tmp_path, capsys, where):
    import torch
    from safetensors import safe_open

    tensors = {**w4a8_layer("a.b"), **dense_layer("n")}
    if where == "trailing":
        src = raw_checkpoint(tmp_path / "in.safetensors", tensors, tail=b"\x00" * 13)
    else:
        # a 16-byte hole after the first tensor: shift every later tensor's offsets
        src = raw_checkpoint(tmp_path / "in.safetensors", tensors)
        with open(src, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
            data = fh.read()
        first = min(header, key=lambda k: header[k]["data_offsets"][0])
        cut = header[first]["data_offsets"][1]
        for k, e in header.items():
            if k != first:
                e["data_offsets"] = [e["data_offsets"][0] + 16, e["data_offsets"][1] + 16]
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(src, "wb") as fh:
            fh.write(struct.pack("<Q", len(text)) + text + data[:cut] + b"\xaa" * 16 + data[cut:])
    rc, out, _ = run(capsys, "check", src)
    assert rc == 1 and "C004" in out
    before = digest(src)
    dest = tmp_path / "fixed.safetensors"
    rc, out, err = run(capsys, "fix", src, "-o", dest)
    assert rc == 0, out + err
    assert "drop unused bytes" in out and digest(src) == before
    assert run(capsys, "check", dest)[0] == 0
    with safe_open(str(dest), "pt") as f:  # the safetensors library accepts the file now
        got = {k: f.get_tensor(k).view(-1).view(torch.uint8).numpy().tobytes() for k in f.keys()}
    for name, (_dtype, _shape, blob) in tensors.items():
        if not name.endswith(".comfy_quant"):
            assert got[name] == blob


def test_fix_in_place_through_a_symlink_writes_the_target(tmp_path, capsys):
    real_dir = tmp_path / "store"
    real_dir.mkdir()
    target = write(
        real_dir / "model.safetensors",
        w4a8_layer("a.b", marker={k: v for k, v in W4A8_MARKER.items() if k != "convrot"}),
        dense_layer("n"),
    )
    link = tmp_path / "model.safetensors"
    link.symlink_to(target)
    before = digest(target)
    rc, out, err = run(capsys, "fix", link, "--in-place")
    assert rc == 0, out + err
    assert link.is_symlink() and os.readlink(link) == target
    assert digest(target) != before
    assert run(capsys, "check", target)[0] == 0
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".comfyquant-")]
    assert not [n for n in os.listdir(real_dir) if n.startswith(".comfyquant-")]


# -- the input gate -----------------------------------------------------------------------------


def test_decoding_commands_refuse_what_check_fails(tmp_path, capsys):
    """A marker value the format does not allow (M035; comfy-kitchen raises on it): check fails,
    and dequantize, convert (to a format or to dense) and quantize all refuse it with the same
    reason.  (A string "16" would not do: every runtime int()s it, so it is a warning, severity
    following the verdicts.)"""
    src = write(tmp_path / "in.safetensors", w4a8_layer("a.b", marker=dict(W4A8_MARKER, group_size=24)), dense_layer("n"))
    rc, out, _ = run(capsys, "check", src, "--target", "comfy-kitchen")
    assert rc == 1 and "M035" in out
    reasons = set()
    for args in (
        ["dequantize", src, tmp_path / "d.safetensors"],
        ["convert", src, tmp_path / "c.safetensors", "-t", "int8", "--no-progress"],
        ["convert", src, tmp_path / "cd.safetensors", "-t", "dense", "--no-progress"],
        ["quantize", src, tmp_path / "q.safetensors", "-f", "fp8", "--no-progress"],
    ):
        rc, _, err = run(capsys, *args)
        assert rc == 2 and "refusing to" in err and "[M035]" in err, err
        reasons.add(err.split(": ", 2)[-1])
    assert len(reasons) == 1
    assert [n for n in os.listdir(tmp_path)] == ["in.safetensors"]


# -- stale temporary files ----------------------------------------------------------------------


def test_temp_file_of_a_killed_run_is_removed_by_the_next_run(tmp_path):
    from comfyquant.io.tempfiles import make_temp

    src = write(
        tmp_path / "in.safetensors",
        w4a8_layer("a.b", marker={k: v for k, v in W4A8_MARKER.items() if k != "convrot"}),
        dense_layer("n"),
    )
    env = {**os.environ, "PYTHONPATH": SRC, "COMFYQUANT_FAULT": "after-tensor:2"}
    cmd = [sys.executable, "-m", "comfyquant.cli", "fix", src, "-o", str(tmp_path / "out.safetensors")]
    killed = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    assert killed.wait(timeout=120) == -9  # SIGKILL
    stale = [n for n in os.listdir(tmp_path) if n.startswith(".comfyquant-")]
    assert len(stale) == 1 and stale[0].startswith(f".comfyquant-{killed.pid}-")
    assert not (tmp_path / "out.safetensors").exists()
    # a temporary file of a live process (this one) and one of unknown owner stay
    fd, mine = make_temp(str(tmp_path))
    os.close(fd)
    (tmp_path / ".comfyquant-oldstyle.tmp").write_bytes(b"x")
    env.pop("COMFYQUANT_FAULT")
    p = subprocess.run(cmd, capture_output=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    err = p.stderr.decode()
    assert err.count("\n") == 1 and "removed 1 stale temporary file" in err and stale[0] in err
    left = sorted(n for n in os.listdir(tmp_path) if n.startswith(".comfyquant-"))
    assert left == sorted([os.path.basename(mine), ".comfyquant-oldstyle.tmp"])


def test_temp_owner_identity_survives_pid_reuse(tmp_path):
    """Same PID, another start time: the PID now belongs to another process; the file is stale.
    Another boot: stale.  Another host: left alone.  A live process: left alone."""
    from comfyquant.io.tempfiles import owner_tag, sweep_stale

    pid, start, boot, host = owner_tag().split("-")
    reused = tmp_path / f".comfyquant-{pid}-{int(start) + 1}-{boot}-{host}-abc123.tmp"
    reused.write_bytes(b"x" * 10)
    old_boot = tmp_path / f".comfyquant-{pid}-{start}-{'0' * 7}1-{host}-abc124.tmp"
    old_boot.write_bytes(b"x")
    other_host = tmp_path / f".comfyquant-{pid}-{int(start) + 1}-{boot}-{'f' * 8 if host != 'f' * 8 else '0' * 8}-abc126.tmp"
    other_host.write_bytes(b"x")  # another machine's (or container's) run in a shared folder: not ours to judge
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        live = tmp_path / f".comfyquant-{owner_tag(sleeper.pid)}-abc125.tmp"
        live.write_bytes(b"x")
        removed = sweep_stale(str(tmp_path), announce=False)
        assert sorted(os.path.basename(p) for p, _ in removed) == sorted([reused.name, old_boot.name])
        assert live.exists() and other_host.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


# -- --timeout bounds the whole remote read -----------------------------------------------------


class TrickleServer:
    """Answers range requests at once, then sends the body one byte every 0.5 s; counts the
    bytes it managed to send (``sent``) and the bodies it was asked for (``asked``)."""

    def __init__(self, path: str) -> None:
        data = open(path, "rb").read()
        self.sent = 0
        self.asked = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                a, _, b = self.headers.get("Range", "bytes=0-").removeprefix("bytes=").partition("-")
                start, stop = int(a), min(int(b) + 1 if b else len(data), len(data))
                body = data[start:stop]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                server.asked += len(body)
                try:
                    for i in range(len(body)):
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                        server.sent += 1
                        time.sleep(0.5)
                except OSError:
                    pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/{os.path.basename(path)}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("command", ["check", "inspect"])
def test_timeout_bounds_a_trickling_server(tmp_path, capsys, command):
    src = write(tmp_path / "m.safetensors", w4a8_layer("a.b"), dense_layer("n"))
    server = TrickleServer(src)
    try:
        rc, _, err = run(capsys, command, server.url, "--timeout", "1.5")
        sent, asked = server.sent, server.asked
    finally:
        server.close()
    # Each byte of every wait arrives within the per-wait timeout, so only a bound on the
    # whole read ends this: the run stopped with --timeout's error long before the server had
    # sent what it was asked for (a byte every 0.5 s: minutes).  No clock is read.
    assert rc == 2, err
    assert err.count("\n") == 1 and server.url in err and "within 1.5 s" in err and "--timeout" in err
    assert sent < asked // 4, (sent, asked)


def test_a_string_among_large_dimensions_is_a_finding_not_a_huge_allocation(tmp_path):
    """``[30000, 30000, "ab"]``: multiplying the dimensions would build a 1.8 GB string (a
    list element, a list).  Under a 1 GB address-space limit the check must still answer."""
    import resource

    tensors = {**fp8_layer("a.b"), **dense_layer("n")}
    src = raw_checkpoint(tmp_path / "in.safetensors", tensors)
    with open(src, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
        data = fh.read()
    header["a.b.weight"]["shape"] = [30000, 30000, "ab"]
    header["n.weight"]["shape"] = [30000, 30000, [1]]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(src, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text + data)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = {**os.environ, "PYTHONPATH": SRC}
    p = subprocess.run(
        [sys.executable, "-m", "comfyquant.cli", "check", src, "--json"],
        capture_output=True,
        env=env,
        timeout=120,
        preexec_fn=limit,
    )
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    assert {f["tensor"] for f in doc["findings"] if f["code"] == "C006"} >= {"a.b.weight", "n.weight"}


@pytest.mark.parametrize("value", ["0", "0.5", "-0.0", "1e-400"])
def test_zero_convrot_size_in_every_format(tmp_path, capsys, value):
    """A ConvRot size that is (or truncates to) zero: the runtimes' own divisibility tests
    divide by it; the profiles say so (ZeroDivisionError) instead of raising it themselves."""
    parts = [
        w4a8_layer(
            "w", marker=json.dumps(W4A8_MARKER).replace('"convrot_groupsize": 256', f'"convrot_groupsize": {value}').encode()
        ),
        w4a4_layer("a", marker=f'{{"format": "convrot_w4a4", "convrot_groupsize": {value}}}'.encode()),
        int8_layer("i", marker=f'{{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": {value}}}'.encode()),
        dense_layer("n"),
    ]
    src = write(tmp_path / "in.safetensors", *parts)
    results = assert_no_crash(capsys, tmp_path, src)
    assert "M035" in results["check"][1]


def test_an_output_that_is_not_a_regular_file_is_never_replaced(tmp_path, capsys):
    """A FIFO (or device) at the output path: renaming the finished file onto it would replace
    the node, whatever --force/--overwrite say; every command refuses, nothing blocks."""
    import stat

    dense = write(tmp_path / "d.safetensors", dense_layer("a"))
    quant = write(tmp_path / "q.safetensors", w4a8_layer("a.b", marker={k: v for k, v in W4A8_MARKER.items() if k != "convrot"}))
    fifo = tmp_path / "out.safetensors"
    os.mkfifo(fifo)
    for args in (
        ["fix", quant, "-o", fifo, "--force"],
        ["fix", quant, "-o", fifo, "--overwrite"],
        ["dequantize", quant, fifo],
        ["dequantize", quant, fifo, "--overwrite"],
        ["quantize", dense, fifo, "-f", "fp8", "--overwrite", "--no-progress"],
        ["convert", quant, fifo, "-t", "int8", "--overwrite", "--no-progress"],
        ["convert", quant, fifo, "-t", "dense", "--overwrite", "--no-progress"],
    ):
        rc, _, err = run(capsys, *args)
        light = not HAS_TORCH and args[0] != "fix" and "needs torch" in err  # the extra is named first
        assert rc == 2 and ("not a regular file" in err or light), (args, err)
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".comfyquant-")]


@pytest.mark.parametrize("command", ["fix", *(pytest.param(c, marks=pytest.mark.needs_torch) for c in ("dequantize", "convert"))])
def test_shards_into_an_existing_folder_keep_their_names(tmp_path, capsys, command):
    shards = tmp_path / "src"
    shards.mkdir()
    broken = {k: v for k, v in W4A8_MARKER.items() if k != "convrot"} if command == "fix" else None
    write(shards / "m-1.safetensors", w4a8_layer("a.b", marker=broken))
    write(shards / "m-2.safetensors", dense_layer("n"))
    wm = {
        "a.b.weight": "m-1.safetensors",
        "a.b.weight_s_rel": "m-1.safetensors",
        "a.b.weight_s_channel": "m-1.safetensors",
        "a.b.weight_codebook": "m-1.safetensors",
        "a.b.bias": "m-1.safetensors",
        "a.b.comfy_quant": "m-1.safetensors",
        "n.weight": "m-2.safetensors",
        "n.bias": "m-2.safetensors",
    }
    (shards / "m.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    out = tmp_path / "out.safetensors"  # an existing folder, whatever its name says
    out.mkdir()
    extra = {"fix": [], "dequantize": [], "convert": ["-t", "int8", "--no-progress"]}[command]
    rc, _, err = run(capsys, command, shards / "m.safetensors.index.json", "-o", out, *extra)
    assert rc == 0, err
    assert sorted(os.listdir(out)) == ["m-1.safetensors", "m-2.safetensors", "m.safetensors.index.json"]
    assert run(capsys, "check", out / "m.safetensors.index.json", "--target", "comfy-kitchen")[0] == 0


@pytest.mark.parametrize("number", NON_FINITE)
def test_runtimes_parse_a_non_finite_size_in_the_header_map_and_int_fails(tmp_path, number):
    """SGLang reads the header map with Python's json, which takes NaN/Infinity/1e400, then
    int()s the group size: its verdict is Python's own int() error (not "Invalid
    _quantization_metadata", which it raises only for text json refuses)."""
    text = json.dumps({"format_version": "1.0", "layers": {"a.b": dict(W4A8_MARKER)}}).replace(
        '"group_size": 16', f'"group_size": {number}'
    )
    src = write(tmp_path / "in.safetensors", w4a8_layer("a.b", marker=False), metadata={"_quantization_metadata": text})
    value = json.loads(text)["layers"]["a.b"]["group_size"]
    with pytest.raises((ValueError, OverflowError)) as exc:
        int(value)
    report = check(src)
    first = report.verdicts["sglang"].first
    assert (first.exception, first.message) == (type(exc.value).__name__, str(exc.value))
    assert not report.verdicts["comfyui"].loads
    assert any(f.code == "M010" for f in report.findings) and not report.ok


def test_a_non_finite_value_in_an_unused_key_of_the_header_map_leaves_sglang_its_tensor_markers(tmp_path):
    """SGLang parses the map (Python's json takes NaN) and reads the file's tensor markers as
    usual: a NaN in a key nothing int()s does not stop it."""
    text = json.dumps({"format_version": "1.0", "layers": {"a.b": {**W4A8_MARKER, "note": 1}}}).replace(
        '"note": 1', '"note": NaN'
    )
    src = write(tmp_path / "in.safetensors", w4a8_layer("a.b"), metadata={"_quantization_metadata": text})
    report = check(src)
    assert report.verdicts["sglang"].loads and report.verdicts["comfyui"].loads
    assert any(f.code == "M010" for f in report.findings)
