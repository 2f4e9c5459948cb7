"""fix: every lossless repair, sharded inputs, dry run, in place, refusals and crash safety."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from builders import (
    W4A8_MARKER,
    dense_layer,
    fp8_layer,
    header_markers,
    int8_layer,
    marker_tensor,
    mxfp8_layer,
    nvfp4_layer,
    ones,
    w4a4_layer,
    w4a8_layer,
    write,
    zeros,
)
from comfyquant import check, open_checkpoint
from comfyquant.cli import main
from comfyquant.errors import InputError
from comfyquant.numerics.bytewise import to_blocked
from comfyquant.repair.run import fix

P = "blocks.0.attn.qkv"


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def tensors_of(path) -> dict:
    with open_checkpoint(path) as ck:
        return {n: (e.dtype, e.shape, ck.read_bytes(e)) for n, e in ck.tensors.items()}


def markers_of(path) -> tuple[dict, dict]:
    """(tensor markers, header markers) of a single file."""
    with open_checkpoint(path) as ck:
        tm = {r.prefix: r.obj for r in ck.markers.records if r.kind == "tensor"}
        hm = {r.prefix: r.obj for r in ck.markers.records if r.kind == "header"}
    return tm, hm


def rand_f32(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("<f4")


def bf16(a: np.ndarray) -> bytes:
    return (a.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()


def assert_fixed(src, out, target="all"):
    r = check(out, target=target)
    assert r.ok, [(f.code, f.message) for f in r.findings if f.severity == "error"]
    tm, hm = markers_of(out)
    assert tm == hm, "tensor and header markers must be written identically"
    return r


def test_seed_case_end_to_end(tmp_path, capsys):
    corr = rand_f32((32, 16))  # stored (N, K/G): transposed, and BF16
    src = write(tmp_path / "seed.safetensors", w4a8_layer(P, correction=("BF16", (32, 16), bf16(corr))), dense_layer("norm"))
    before = digest(src)
    assert main(["check", src]) == 1
    assert main(["fix", src, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "transpose, upcast BF16 -> F32 (exact)" in out and "BF16 (32, 16) -> F32 (16, 32)" in out
    assert os.listdir(tmp_path) == ["seed.safetensors"]  # the dry run wrote nothing
    dest = str(tmp_path / "fixed.safetensors")
    assert main(["fix", src, "-o", dest]) == 0
    assert digest(src) == before
    assert_fixed(src, dest)
    t_in, t_out = tensors_of(src), tensors_of(dest)
    got = np.frombuffer(t_out[f"{P}.weight_correction"][2], "<f4").reshape(16, 32)
    want = np.frombuffer(bf16(corr), "<u2").astype("<u4").__lshift__(16).view("<f4").reshape(32, 16).T
    assert np.array_equal(got, want)  # exactly the stored values, transposed and upcast
    for name, value in t_in.items():
        if not name.endswith(("weight_correction", "comfy_quant")):
            assert t_out[name] == value, name
    with open_checkpoint(dest) as ck:
        stamp = json.loads(ck.metadata()["comfyquant"])
    assert stamp["tool"] == "comfyquant" and any("transpose" in r for r in stamp["repaired"])


REPAIRS = [
    # (name, layer builder, check that the output holds the right thing)
    (
        "f16 codebook",
        lambda: {**w4a8_layer(P, codebook_=False), f"{P}.weight_codebook": ("F16", (16,), np.arange(16, dtype="<f2").tobytes())},
        lambda t: np.array_equal(np.frombuffer(t[f"{P}.weight_codebook"][2], "<f4"), np.arange(16, dtype="<f4")),
    ),
    (
        "bf16 s_channel",
        lambda: {**w4a8_layer(P), f"{P}.weight_s_channel": ("BF16", (32,), b"\x80\x3f" * 32)},
        lambda t: t[f"{P}.weight_s_channel"][:2] == ("F32", (32,)),
    ),
    (
        "u8 s_rel relabel",
        lambda: {**w4a8_layer(P), f"{P}.weight_s_rel": ones("U8", (32, 16))},
        lambda t: t[f"{P}.weight_s_rel"] == ones("F8_E4M3", (32, 16)),
    ),
    (
        "nvfp4 u8 scale relabel",
        lambda: {**nvfp4_layer(P), f"{P}.weight_scale": ones("U8", (128, 16))},
        lambda t: t[f"{P}.weight_scale"][0] == "F8_E4M3",
    ),
    ("int8 [N] scale", lambda: int8_layer(P, scale_shape=(32,)), lambda t: t[f"{P}.weight_scale"][1] == (32, 1)),
    (
        "int8 [1] scale",
        lambda: int8_layer("txt_embed", scale_shape=(1,), marker={"format": "int8_tensorwise"}),
        lambda t: t["txt_embed.weight_scale"][1] == (),
    ),
    (
        "w4a8 missing convrot",
        lambda: w4a8_layer(P, marker={"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256}),
        None,
    ),
    ("w4a8 implicit sizes", lambda: w4a8_layer(P, marker={"format": "asym_w4a8_int8", "convrot": True}), None),
    ("int8 convrot without size", lambda: int8_layer(P, marker={"format": "int8_tensorwise", "convrot": True}), None),
    (
        "nested params",
        lambda: int8_layer(P, marker={"format": "int8_tensorwise", "params": {"convrot": True, "convrot_groupsize": 256}}),
        None,
    ),
    (
        "underscore keys and convrot 1",
        lambda: int8_layer(P, marker={"format": "int8_tensorwise", "convrot": 1, "convrot_groupsize": 256, "_is_rowwise": True}),
        None,
    ),
    ("nvfp4 with convrot", lambda: nvfp4_layer(P, marker={"format": "nvfp4", "convrot": True}), None),
    ("unmarked fp8", lambda: fp8_layer(P, marker=False), None),
    ("unmarked nvfp4", lambda: nvfp4_layer(P, marker=False), None),
    (
        "marker stored as I8",
        lambda: {
            **int8_layer(P, marker=False),
            f"{P}.comfy_quant": ("I8",)
            + marker_tensor({"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256})[1:],
        },
        None,
    ),
]


@pytest.mark.parametrize("name, build, verify", REPAIRS, ids=[r[0] for r in REPAIRS])
def test_lossless_repair(tmp_path, name, build, verify):
    src = write(tmp_path / "in.safetensors", build(), dense_layer("norm"))
    assert [f for f in check(src).findings if f.severity in ("error", "warning")]
    dest = str(tmp_path / "out.safetensors")
    result = fix(src, out=dest)
    assert result.ok and result.outputs == [dest], [f.message for f in result.remaining]
    after = assert_fixed(src, dest)
    assert not [f for f in after.findings if f.severity == "warning"], [f.message for f in after.findings]
    t_in, t_out = tensors_of(src), tensors_of(dest)
    if verify is not None:
        assert verify(t_out)
    # lossless: every weight's bytes are untouched
    for n, v in t_in.items():
        if n.endswith(".weight"):
            assert t_out[n] == v


def test_unblocked_nvfp4_scale_is_blocked(tmp_path):
    logical = bytes((i * 7) % 251 for i in range(32 * 16))
    layer = {**nvfp4_layer(P, n=32, k=256), f"{P}.weight_scale": ("F8_E4M3", (32, 16), logical)}
    src = write(tmp_path / "in.safetensors", layer)
    dest = str(tmp_path / "out.safetensors")
    fix(src, out=dest, target="comfyui")
    assert check(dest, target="comfyui").ok
    assert tensors_of(dest)[f"{P}.weight_scale"] == ("F8_E4M3", (128, 16), to_blocked(logical, 32, 16)[0])


def test_mxfp8_quant_format_scales_relabelled_for_sglang(tmp_path):
    layer = mxfp8_layer(P, n=128, k=128, marker=False, scale=ones("F8_E8M0", (128, 4)))
    src = write(tmp_path / "in.safetensors", layer, metadata={"quant_format": "mxfp8"})
    assert check(src, target="sglang").verdicts["sglang"].first.rule == "sglang.X1"
    dest = str(tmp_path / "out.safetensors")
    assert fix(src, out=dest, target="sglang").ok
    assert tensors_of(dest)[f"{P}.weight_scale"][0] == "U8"
    assert check(dest, target="sglang").verdicts["sglang"].loads


def test_header_tensor_conflict_needs_prefer(tmp_path):
    meta = header_markers({P: {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 64}})
    src = write(tmp_path / "in.safetensors", int8_layer(P), metadata=meta)
    r = fix(src, out=str(tmp_path / "a.safetensors"))
    assert r.plan.refused and "--prefer" in r.plan.refused[0][1]
    for prefer, size in (("header", 64), ("tensor", 256)):
        dest = str(tmp_path / f"{prefer}.safetensors")
        assert fix(src, out=dest, prefer=prefer).ok
        assert markers_of(dest)[0][P]["convrot_groupsize"] == size


def test_header_markers_rekeyed_to_tensor_names(tmp_path):
    layer = int8_layer("model.diffusion_model." + P, marker=False)
    meta = header_markers({P: {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}})
    src = write(tmp_path / "in.safetensors", layer, metadata=meta)
    dest = str(tmp_path / "out.safetensors")
    assert fix(src, out=dest).ok
    tm, hm = markers_of(dest)
    assert list(hm) == ["model.diffusion_model." + P] and tm == hm


def test_rotating_format_needs_convrot_groupsize(tmp_path):
    src = write(tmp_path / "in.safetensors", w4a8_layer(P, marker=False))
    r = fix(src, out=str(tmp_path / "a.safetensors"))
    assert any("pass convrot_groupsize=C" in why for _, why in r.plan.refused)  # the API names its keyword
    assert not os.path.exists(tmp_path / "a.safetensors")
    dest = str(tmp_path / "b.safetensors")
    assert fix(src, out=dest, convrot_groupsize=256).ok
    assert markers_of(dest)[0][P] == W4A8_MARKER


def test_legacy_scaled_fp8(tmp_path):
    layer = {
        f"{P}.weight": zeros("F8_E4M3", (32, 256)),
        f"{P}.scale_weight": ones("F32", ()),
        "scaled_fp8": zeros("F8_E4M3", (2,)),
    }
    src = write(tmp_path / "in.safetensors", layer)
    dest = str(tmp_path / "out.safetensors")
    assert fix(src, out=dest).ok
    t = tensors_of(dest)
    assert f"{P}.weight_scale" in t and "scaled_fp8" not in t and f"{P}.scale_weight" not in t
    assert markers_of(dest)[0][P] == {"format": "float8_e4m3fn", "full_precision_matrix_mult": True}


def test_nothing_fixable_exits_1_without_writing(tmp_path, capsys):
    layer = w4a8_layer(P, g=32, marker=dict(W4A8_MARKER, group_size=32))
    layer[f"{P}.comfy_quant"] = marker_tensor(W4A8_MARKER)
    src = write(tmp_path / "in.safetensors", layer)
    before = sorted(os.listdir(tmp_path))
    assert main(["fix", src]) == 1
    out = capsys.readouterr().out
    assert "made for group_size=32" in out and "comfyquant quantize" in out
    assert sorted(os.listdir(tmp_path)) == before


def test_partial_fix_reports_what_is_left(tmp_path, capsys):
    layer = w4a8_layer(P, g=32, marker=dict(W4A8_MARKER, group_size=32))
    layer[f"{P}.comfy_quant"] = marker_tensor(W4A8_MARKER)
    other = w4a8_layer("b", marker={"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256})
    src = write(tmp_path / "in.safetensors", layer, other)
    dest = str(tmp_path / "out.safetensors")
    assert main(["fix", src, "-o", dest]) == 1
    out = capsys.readouterr().out
    assert "after repair: 1 error left" in out and os.path.exists(dest)
    assert not [f for f in check(dest).findings if f.layer == "b" and f.severity == "error"]


def test_sharded_stays_sharded(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    a = write(d / "model-00001-of-00002.safetensors", w4a8_layer("a", correction=zeros("BF16", (32, 16))))
    b = write(
        d / "model-00002-of-00002.safetensors",
        w4a8_layer("b", marker={"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256}),
        dense_layer("n"),
    )
    wm = {}
    for path in (a, b):
        with open_checkpoint(path) as ck:
            wm.update({n: os.path.basename(path) for n in ck.tensors})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": wm}))
    out = tmp_path / "out"
    r = fix(str(d), out=str(out))
    assert r.ok
    assert sorted(os.listdir(out)) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    assert idx["metadata"] == {"total_size": 1} and idx["weight_map"]["a.comfy_quant"] == "model-00001-of-00002.safetensors"
    report = check(str(out))
    assert report.ok and not [f for f in report.findings if f.code.startswith("C01")]


def test_in_place(tmp_path):
    src = write(tmp_path / "m.safetensors", int8_layer(P, scale_shape=(32,)))
    r = fix(src, in_place=True)
    assert r.ok and r.outputs == [src]
    assert check(src).ok
    assert [n for n in os.listdir(tmp_path) if n.startswith(".comfyquant")] == []


def test_refuses_overwrites(tmp_path):
    src = write(tmp_path / "m.safetensors", int8_layer(P, scale_shape=(32,)))
    other = write(tmp_path / "other.safetensors", dense_layer("x"))
    with pytest.raises(InputError, match="is the input"):
        fix(src, out=src)
    with pytest.raises(InputError, match="exists"):
        fix(src, out=other)
    with pytest.warns(DeprecationWarning, match="overwrite"):  # the old keyword still works, and says so
        assert fix(src, out=other, force=True).ok
    replaced = write(tmp_path / "replaced.safetensors", dense_layer("x"))
    assert fix(src, out=replaced, overwrite=True).ok
    assert open(replaced, "rb").read() == open(other, "rb").read()


def test_enospc_leaves_nothing(tmp_path, monkeypatch):
    import errno

    src = write(tmp_path / "m.safetensors", int8_layer(P, scale_shape=(32,)), dense_layer("n", n=256, k=1024))
    before = digest(src)
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    dest = tmp_path / "out.safetensors"
    with pytest.raises(InputError, match="No space left on device"):
        fix(src, out=str(dest))
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert not dest.exists() and digest(src) == before
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]


def _fix_subprocess(args, env_extra=None, preexec=None):
    env = dict(os.environ, **(env_extra or {}))
    code = "import sys; from comfyquant.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "fix", *args], env=env, capture_output=True, text=True, preexec_fn=preexec)


@pytest.mark.parametrize("stage", ["after-header", "after-tensor:0", "after-tensor:3", "before-rename"])
@pytest.mark.parametrize("in_place", [False, True])
def test_sigkill_leaves_input_intact(tmp_path, stage, in_place):
    src = write(tmp_path / "m.safetensors", int8_layer(P, scale_shape=(32,)), dense_layer("n", n=256, k=1024), w4a4_layer("c"))
    before = digest(src)
    dest = tmp_path / "out.safetensors"
    args = [src, "--in-place"] if in_place else [src, "-o", str(dest)]
    proc = _fix_subprocess(args, {"COMFYQUANT_FAULT": stage})
    assert proc.returncode == -9, proc.stderr
    assert digest(src) == before
    assert not dest.exists()


def test_file_size_limit_is_a_clean_error(tmp_path):
    """A real OS write failure (RLIMIT_FSIZE -> EFBIG): one line, exit 2, nothing left behind."""
    import resource
    import signal

    src = write(tmp_path / "m.safetensors", int8_layer(P, scale_shape=(32,)), dense_layer("n", n=512, k=2048))
    size = os.path.getsize(src)
    dest = tmp_path / "out.safetensors"

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))

    proc = _fix_subprocess([src, "-o", str(dest)], preexec=limit)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "cannot write" in proc.stderr
    assert not dest.exists() and sorted(os.listdir(tmp_path)) == ["m.safetensors"]


def test_json_output(tmp_path, capsys):
    src = write(tmp_path / "m.safetensors", int8_layer(P, scale_shape=(32,)))
    assert main(["fix", src, "--dry-run", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dry_run"] is True and doc["plan"]["changes"][0]["what"] == "reshape"
    assert doc["after"] is None and doc["before"]["ok"] is False


def test_codebook_bf16_upcast_is_exact(tmp_path):
    levels = np.array(
        [-0.98, -0.79, -0.64, -0.5, -0.38, -0.26, -0.16, -0.05, 0.05, 0.16, 0.27, 0.38, 0.5, 0.64, 0.79, 0.98], "<f4"
    )
    layer = {**w4a8_layer(P, codebook_=False), f"{P}.weight_codebook": ("BF16", (16,), bf16(levels))}
    src = write(tmp_path / "in.safetensors", layer)
    dest = str(tmp_path / "out.safetensors")
    assert fix(src, out=dest).ok
    got = np.frombuffer(tensors_of(dest)[f"{P}.weight_codebook"][2], "<f4")
    want = (np.frombuffer(bf16(levels), "<u2").astype("<u4") << 16).view("<f4")
    assert np.array_equal(got, want)


def test_outputs_get_normal_permissions(tmp_path):
    src = write(tmp_path / "m.safetensors", int8_layer(P, scale_shape=(32,)))
    os.chmod(src, 0o640)
    dest = tmp_path / "out.safetensors"
    assert fix(src, out=str(dest)).ok
    mask = os.umask(0)
    os.umask(mask)
    assert (os.stat(dest).st_mode & 0o777) == 0o666 & ~mask
    assert fix(src, in_place=True).ok
    assert (os.stat(src).st_mode & 0o777) == 0o640  # in place keeps the input's mode


def test_corrupted_copy_fails_verification_and_leaves_nothing(tmp_path, monkeypatch):
    """The byte comparison after writing is real: a copy that changes bytes is refused."""
    from comfyquant.repair import execute

    src = write(tmp_path / "m.safetensors", int8_layer(P, scale_shape=(32,)), dense_layer("n", n=256, k=1024))
    before = digest(src)

    def garbled(source, start, length):
        return lambda: iter([bytes(length)])  # right size, wrong bytes (zeros)

    monkeypatch.setattr(execute, "_copy", garbled)
    dest = tmp_path / "out.safetensors"
    with pytest.raises(InputError, match="verification failed: tensor .* differs from the input"):
        fix(src, out=str(dest))
    assert not dest.exists() and digest(src) == before
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]


def test_copies_are_compared_while_writing(tmp_path, monkeypatch):
    """With local inputs every copied tensor is compared in the background thread while the
    writer goes on; the main thread's final pass then has nothing left to compare, and the
    output is still byte-identical where the input was copied."""
    import threading

    from comfyquant.repair import execute

    src = write(
        tmp_path / "m.safetensors", int8_layer(P, scale_shape=(32,)), dense_layer("a", n=64, k=256), dense_layer("b", n=64, k=256)
    )
    where: list[str] = []
    real = execute._same_bytes

    def recording(*args):
        where.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(execute, "_same_bytes", recording)
    dest = tmp_path / "out.safetensors"
    assert fix(src, out=str(dest)).ok
    with open_checkpoint(str(dest)) as ck:
        copied = [n for n in ck.tensors if not n.startswith(P)]
    assert len(where) >= len(copied) >= 4
    assert threading.main_thread().name not in where
    ins, outs = tensors_of(src), tensors_of(dest)
    assert all(outs[n] == ins[n] for n in copied)


def test_background_comparison_is_only_trusted_at_the_compared_place(tmp_path, monkeypatch):
    """A tensor the background thread confirmed at another offset than the re-read header
    gives is compared again by the main thread."""
    from comfyquant.repair import execute

    src = write(tmp_path / "m.safetensors", int8_layer(P, scale_shape=(32,)), dense_layer("n", n=256, k=1024))
    real_watch = execute._EarlyComparison.watch

    def misplaced(self, copied):
        written = real_watch(self, copied)
        return lambda temp, name, offset, length: written(temp, name, offset + 2, length)

    monkeypatch.setattr(execute._EarlyComparison, "watch", misplaced)
    real_same = execute._same_bytes
    calls = {"main": 0}

    def counting(a, a_start, b, b_start, length, bufs):
        import threading

        if threading.current_thread() is not threading.main_thread():
            return True  # the background thread "confirms" the wrong place
        calls["main"] += 1
        return real_same(a, a_start, b, b_start, length, bufs)

    monkeypatch.setattr(execute, "_same_bytes", counting)
    dest = tmp_path / "out.safetensors"
    assert fix(src, out=str(dest)).ok
    assert calls["main"] >= 2  # every copied tensor compared again at its real place


@pytest.mark.parametrize("length", [1, 7, 8, 9, 23])
def test_same_bytes_chunks_and_tails(tmp_path, monkeypatch, length):
    """Range comparison over chunk boundaries and a short tail; one differing byte anywhere is seen."""
    from comfyquant.io.source import LocalFile
    from comfyquant.repair import execute

    monkeypatch.setattr(execute, "CHUNK", 8)
    data = bytes(range(40))
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(data)
    b.write_bytes(b"xx" + data)
    bufs = (bytearray(8), bytearray(8))
    fa, fb = LocalFile(str(a)), LocalFile(str(b))
    try:
        assert execute._same_bytes(fa, 3, fb, 5, length, bufs)
        for pos in range(length):
            changed = bytearray(b"xx" + data)
            changed[5 + pos] ^= 0xFF
            b.write_bytes(bytes(changed))
            assert not execute._same_bytes(fa, 3, fb, 5, length, bufs), pos
        assert not execute._same_bytes(fa, 35, fb, 37, 10, bufs)  # runs past the end of a
    finally:
        fa.close()
        fb.close()


def test_top_level_api_fixes_the_seed_case(tmp_path):
    """``comfyquant.fix`` is the package-level entry point (lazy, like check and dequantize)."""
    import comfyquant

    src = os.path.join(os.path.dirname(__file__), "..", "examples", "seed_broken_w4a8.safetensors")
    before = digest(src)
    out = str(tmp_path / "fixed.safetensors")
    result = comfyquant.fix(src, out=out, target="sglang")
    assert result.after is not None and result.after.ok and result.outputs == [out]
    assert check(out, target="sglang").ok and check(src, target="sglang").ok is False
    assert digest(src) == before and "fix" in comfyquant.__all__
    assert result.to_dict()["plan"]["changes"]


# -- damaged containers: refused whole, or repaired without losing anything -------------------


def _edit_header(path, edit) -> str:
    """Rewrite a written file's header with ``edit(header dict, data) -> data or None``."""
    import struct

    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8 : 8 + n]), bytearray(raw[8 + n :])
    data = edit(header, data) or data
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text + bytes(data))
    return str(path)


def _seed_with(tmp_path, name, edit) -> str:
    """The seed defect (an exact repair exists) plus container damage made by ``edit``."""
    layer = w4a8_layer(P, correction=zeros("BF16", (32, 16)))
    return _edit_header(write(tmp_path / name, layer, dense_layer("blocks.1.ff")), edit)


def _unknown_dtype(h, data):
    h["extra.t"] = {"dtype": "X9", "shape": [4], "data_offsets": [len(data), len(data) + 4]}
    return data + b"abcd"


def _malformed(h, data):
    h["extra.t"] = {"dtype": "F32", "shape": "four", "data_offsets": [len(data), len(data) + 16]}
    return data + b"\0" * 16


def _wrong_span(h, data):
    h[f"{P}.bias"]["dtype"] = "F64"


def _truncated(h, data):
    return data[:-10]


@pytest.mark.parametrize(
    ("edit", "code"), [(_unknown_dtype, "C005"), (_malformed, "C006"), (_wrong_span, "C001"), (_truncated, "C002")]
)
def test_container_damage_that_a_rewrite_cannot_carry_is_refused_whole(tmp_path, capsys, edit, code):
    """An unknown dtype, a malformed entry, a span that does not match dtype x shape, a
    tensor past the end of the file: writing the other repairs would drop or garble data (a
    malformed entry would vanish from the output, the others would crash the writer), so
    nothing is written and the refusal names the damage."""
    src = _seed_with(tmp_path, "in.safetensors", edit)
    before = digest(src)
    out = tmp_path / "out.safetensors"
    assert main(["fix", src, "-o", str(out)]) == 1
    text = capsys.readouterr().out
    assert "not repaired: the checkpoint's container is damaged" in text and f"[{code}]" in text
    assert "nothing was written" in text and not out.exists() and digest(src) == before
    result = fix(src, out=str(out))
    assert result.after is None and result.plan.refused[0][0] is None and not out.exists()


def test_nonstring_metadata_is_kept_as_json_text(tmp_path):
    """C007 (safetensors refuses non-string metadata): the value is written as its JSON text,
    a planned change of its own, instead of being dropped."""
    src = _seed_with(
        tmp_path,
        "in.safetensors",
        lambda h, d: h.setdefault("__metadata__", {}).update({"steps": 42, "cfg": {"a": [1, 2]}, "name": "kept"}),
    )
    assert "C007" in {f.code for f in check(src).findings}
    out = str(tmp_path / "out.safetensors")
    result = fix(src, out=out)
    assert result.after.ok
    with open_checkpoint(out) as ck:
        meta = ck.metadata()
    assert meta["steps"] == "42" and json.loads(meta["cfg"]) == {"a": [1, 2]} and meta["name"] == "kept"
    assert any("__metadata__['steps'] as JSON text" in c.what for c in result.plan.changes)
    assert "C007" not in {f.code for f in check(out).findings}


def test_overlapping_and_gapped_tensors_are_rewritten_without_loss(tmp_path):
    """Overlaps (C003) and gaps (C004) are repaired by the rewrite itself: every tensor keeps
    its bytes, each in its own span."""

    def alias_and_gap(h, data):
        bias = h[f"{P}.bias"]
        h["extra.alias"] = {"dtype": bias["dtype"], "shape": bias["shape"], "data_offsets": list(bias["data_offsets"])}
        for name, e in h.items():
            if name != "__metadata__":
                e["data_offsets"] = [e["data_offsets"][0] + 8, e["data_offsets"][1] + 8]
        return b"\x07" * 8 + data

    src = _seed_with(tmp_path, "in.safetensors", alias_and_gap)
    assert {"C003", "C004"} <= {f.code for f in check(src).findings}
    out = str(tmp_path / "out.safetensors")
    assert fix(src, out=out).after.ok
    before, after = tensors_of(src), tensors_of(out)
    assert after["extra.alias"] == before["extra.alias"] == before[f"{P}.bias"]
    assert set(after) >= set(before) - {f"{P}.comfy_quant"}
    assert {"C003", "C004"}.isdisjoint({f.code for f in check(out).findings})
