"""Every SGLang 0.5.23 rule (``inspect_comfy_quant_markers``, ``resolve_comfy_checkpoint_quantization``,
the layer building): a failing case with SGLang's exact message and exception
(first error, in SGLang's order) and a passing case; the drop-in raises the same."""

from __future__ import annotations

import json

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
from comfyquant import check
from comfyquant.compat.sglang import inspect_comfy_quant_markers

P = "blocks.0.attn.qkv"
Q = f"'{P}'"


def drop(d: dict, suffix: str) -> dict:
    return {k: v for k, v in d.items() if not k.endswith("." + suffix)}


def put(d: dict, suffix: str, value) -> dict:
    return {**d, f"{P}.{suffix}": value}


# (rule, files builder returning tensors+metadata per file, exact message template, exception, inspect-stage?)
CASES = [
    (
        "H1",
        lambda: [(dense_layer(P), {"_quantization_metadata": "{oops"})],
        "Invalid _quantization_metadata in {f0}",
        "ValueError",
        True,
    ),
    (
        "H2",
        lambda: [(dense_layer(P), {"_quantization_metadata": "[1]"})],
        "_quantization_metadata in {f0} must contain an object",
        "ValueError",
        True,
    ),
    (
        "H3",
        lambda: [(dense_layer(P), {"_quantization_metadata": '{"format_version": "1.0"}'})],
        "_quantization_metadata in {f0} must contain a layers object",
        "ValueError",
        True,
    ),
    (
        "H4",
        lambda: [(int8_layer(P, marker=False), header_markers({P: "nvfp4"}))],
        f"Comfy quantization metadata for {Q} must be an object",
        "ValueError",
        True,
    ),
    (
        "P1",
        lambda: [(int8_layer(P), header_markers({P: {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 64}}))],
        f"Conflicting Comfy quantization markers for {Q}",
        "ValueError",
        True,
    ),
    (
        "P2",
        lambda: [
            (
                {**int8_layer(P, marker=False), f"{P}.comfy_quant": marker_tensor(json.dumps({"format": "x"}).encode() + b"\0")},
                None,
            )
        ],
        f"Invalid Comfy quantization marker '{P}.comfy_quant' in {{f0}}",
        "ValueError",
        True,
    ),
    (
        "P3",
        lambda: [({**int8_layer(P, marker=False), f"{P}.comfy_quant": marker_tensor(b"[1, 2]")}, None)],
        f"Comfy quantization marker '{P}.comfy_quant' must contain a JSON object",
        "ValueError",
        True,
    ),
    (
        "X1",
        lambda: [(int8_layer(P), {"quant_format": "MXFP8"})],
        f"MXFP8 layer {Q} has incompatible weight/scale metadata: ('I8', (32, 256)) and ('F32', (32, 1))",
        "ValueError",
        True,
    ),
    (
        "M0",
        lambda: [(int8_layer(P, marker=False), None)],
        f"Quantized weights are missing comfy_quant metadata: ['{P}']",
        "ValueError",
        True,
    ),
    (
        "T1",
        lambda: [(drop(w4a8_layer(P), "weight_s_channel"), None)],
        f"Comfy layer {Q} is missing checkpoint tensors: ['{P}.weight_s_channel']",
        "ValueError",
        True,
    ),
    (
        "W1",
        lambda: [(w4a8_layer(P, g=2, marker=dict(W4A8_MARKER, group_size=2)), None)],
        f"Comfy W4A8 layer {Q} has invalid group_size=2",
        "ValueError",
        True,
    ),
    (
        "W2",
        lambda: [(put(w4a8_layer(P), "weight_s_rel", ones("F32", (32, 16))), None)],
        f"Comfy W4A8 layer {Q} needs I8 weights and FP8 group scales, got I8 and F32",
        "ValueError",
        True,
    ),
    (
        "W3",
        lambda: [(put(w4a8_layer(P), "weight_s_channel", ones("BF16", (32,))), None)],
        f"Comfy W4A8 layer {Q} needs F32 channel scales, got BF16",
        "ValueError",
        True,
    ),
    (
        "W4",
        lambda: [(put(w4a8_layer(P), "weight", zeros("I8", (32, 8, 16))), None)],
        f"Comfy W4A8 layer {Q} needs a 2D packed weight, got (32, 8, 16)",
        "ValueError",
        True,
    ),
    (
        "W5",
        lambda: [(w4a8_layer(P, bits=6), None)],
        f"Comfy W4A8 layer {Q} has incompatible weight/scale shapes: (32, 192), (32, 16), and (32,)",
        "ValueError",
        True,
    ),
    (
        "W6",
        lambda: [(put(w4a8_layer(P), "weight_codebook", ones("BF16", (16,))), None)],
        f"Comfy W4A8 layer {Q} needs an F32[16] codebook",
        "ValueError",
        True,
    ),
    (
        "W7",
        lambda: [(w4a8_layer(P, correction=zeros("BF16", (32, 16))), None)],
        f"Comfy W4A8 layer {Q} has an incompatible correction tensor",
        "ValueError",
        True,
    ),
    (
        "A1",
        lambda: [(put(w4a4_layer(P), "weight_scale", ones("BF16", (32,))), None)],
        f"Comfy W4A4 layer {Q} needs I8 packed weights and F32 scales, got I8 and BF16",
        "ValueError",
        True,
    ),
    (
        "A2",
        lambda: [(put(w4a4_layer(P), "weight_scale", ones("F32", (32, 1))), None)],
        f"Comfy W4A4 layer {Q} has incompatible weight/scale shapes: (32, 128) and (32, 1)",
        "ValueError",
        True,
    ),
    (
        "A3",
        lambda: [(w4a4_layer(P, marker={"format": "convrot_w4a4", "convrot_groupsize": 1024}), None)],
        f"Comfy W4A4 layer {Q} has unsupported convrot_groupsize=1024",
        "ValueError",
        True,
    ),
    (
        "A4",
        lambda: [(w4a4_layer(P, k=288, marker={"format": "convrot_w4a4", "convrot_groupsize": 16}), None)],
        f"Comfy W4A4 layer {Q} has input size 288, incompatible with quant_group_size=64 and convrot_groupsize=16",
        "ValueError",
        True,
    ),
    (
        "F1",
        lambda: [(put(nvfp4_layer(P), "weight_scale", ones("U8", (128, 16))), None)],
        f"Comfy NVFP4 layer {Q} needs U8 packed weights and FP8 block scales, got U8 and U8",
        "ValueError",
        True,
    ),
    (
        "F2",
        lambda: [(put(nvfp4_layer(P), "weight_scale_2", ones("BF16", ())), None)],
        f"Comfy NVFP4 layer {Q} needs a scalar F32 weight_scale_2, got BF16()",
        "ValueError",
        True,
    ),
    (
        "F3",
        lambda: [(put(nvfp4_layer(P), "weight", zeros("U8", (128,))), None)],
        f"Comfy NVFP4 layer {Q} needs a 2D packed weight, got (128,)",
        "ValueError",
        True,
    ),
    (
        "F4",
        lambda: [(nvfp4_layer(P, n=32, k=256), None)],
        f"Comfy NVFP4 layer {Q} has incompatible weight/scale shapes: (32, 128) and (128, 16)",
        "ValueError",
        True,
    ),
    (
        "F5",
        lambda: [(put(nvfp4_layer(P), "pre_quant_scale", ones("BF16", (128,))), None)],
        f"Comfy NVFP4 layer {Q} has an incompatible pre_quant_scale: BF16(128,)",
        "ValueError",
        True,
    ),
    (
        "I1",
        lambda: [(put(int8_layer(P, scale_shape=()), "weight", zeros("I8", (32, 16, 16))), None)],
        f"Comfy tensorwise INT8 layer {Q} needs a 2D weight, got (32, 16, 16)",
        "ValueError",
        True,
    ),
    (
        "I2",
        lambda: [(put(int8_layer(P), "weight_scale", ones("BF16", (32, 1))), None)],
        f"Comfy INT8 layer {Q} needs I8 weights and F32 scales, got I8 and BF16",
        "ValueError",
        True,
    ),
    (
        "I3",
        lambda: [(int8_layer(P, scale_shape=(32,)), None)],
        f"Comfy INT8 layer {Q} has incompatible weight/scale shapes: (32, 256) and (32,)",
        "ValueError",
        True,
    ),
    (
        "R0",
        lambda: [({**fp8_layer("a.fp8"), **int8_layer(P)}, None)],
        "Unsupported Comfy quantization format(s): float8_e4m3fn, int8_tensorwise",
        "NotImplementedError",
        False,
    ),
    (
        "R1",
        lambda: [(int8_layer(P, marker={"format": "int8_tensorwise", "convrot": 1, "convrot_groupsize": 256}), None)],
        f"Serialized convrot_int8 layer {Q} must set convrot=true",
        "ValueError",
        False,
    ),
    (
        "R2",
        lambda: [(int8_layer(P, marker={"format": "int8_tensorwise", "convrot": True}), None)],
        f"Serialized convrot_int8 layer {Q} must declare convrot_groupsize in (16, 64, 256), got None",
        "ValueError",
        False,
    ),
    (
        "R3",
        lambda: [(w4a8_layer(P, marker={"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256}), None)],
        f"Serialized W4A8 layer {Q} must set convrot=true",
        "ValueError",
        False,
    ),
    (
        "R4",
        lambda: [({**w4a8_layer("b.w4a8"), **int8_layer(P)}, None)],
        f"Unsupported Comfy W4A8 format for {Q}: 'int8_tensorwise'",
        "ValueError",
        False,
    ),
    (
        "R5",
        lambda: [
            ({**w4a4_layer("b.w4a4"), **int8_layer(P)}, None),
        ],
        None,
        None,
        False,
    ),  # int8 is allowed with w4a4
    # R6 (W4A4 config) and R13 are unreachable from a file: inspect's A3 rejects the same sizes first.
    (
        "R7",
        lambda: [(w4a4_layer(P, marker={"format": "convrot_w4a4", "convrot_groupsize": 256, "linear_dtype": "fp8"}), None)],
        f"Serialized W4A4 layer {Q} has unsupported linear_dtype='fp8'; expected one of ('int4', 'int8')",
        "ValueError",
        False,
    ),
    (
        "R8",
        lambda: [({**nvfp4_layer("b.nv"), **int8_layer(P)}, None)],
        f"Unsupported Comfy NVFP4 companion for {Q}: 'int8_tensorwise'",
        "ValueError",
        False,
    ),
    (
        "R9",
        lambda: [(nvfp4_layer(P, marker={"format": "nvfp4", "convrot": True}), None)],
        f"Rotated NVFP4 weights are not supported: {Q}",
        "ValueError",
        False,
    ),
    ("B1", lambda: [(w4a8_layer(P, k=256, g=12, marker=dict(W4A8_MARKER, group_size=12)), None)], None, "ValueError", False),
    (
        "B3",
        lambda: [(int8_layer(P, k=320, marker={"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}), None)],
        f"Serialized convrot_int8 layer {Q} has input size 320, which is not divisible by its ConvRot group size 256",
        "ValueError",
        False,
    ),
    (
        "B4",
        lambda: [({**w4a8_layer("b.w4a8"), **int8_layer(P, marker={"format": "int8_tensorwise"})}, None)],
        f"Unsupported quantized linear marker for {Q}",
        "ValueError",
        False,
    ),
]


def _write(tmp_path, files):
    paths = []
    for i, (tensors, meta) in enumerate(files):
        paths.append(write(tmp_path / f"model-{i:05d}.safetensors", tensors, metadata=meta))
    return paths


@pytest.mark.parametrize("rule, build, message, exception, inspect_stage", CASES, ids=[c[0] for c in CASES])
def test_rule_fails_with_exact_message(tmp_path, rule, build, message, exception, inspect_stage):
    paths = _write(tmp_path, build())
    verdict = check(paths, target="sglang").verdicts["sglang"]
    if rule == "R5":
        # W4A4 + INT8: the int8 markers go through the embedded INT8 config, not R5.
        assert all(v.rule != "sglang.R5" for v in verdict.violations)
        return
    first = verdict.first
    assert first is not None, f"{rule}: SGLang predicted to load"
    assert first.rule == f"sglang.{rule}"
    if message is not None:
        assert first.message == message.format(f0=paths[0])
    if exception is not None:
        assert first.exception == exception
    if inspect_stage:
        exc_type = {"ValueError": ValueError}[exception]
        with pytest.raises(exc_type) as info:
            inspect_comfy_quant_markers(paths)
        assert str(info.value) == first.message
    else:
        inspect_comfy_quant_markers(paths)  # inspection itself passes; resolve/build fail


def test_b1_group_size_message(tmp_path):
    paths = _write(tmp_path, [(w4a8_layer(P, k=256, g=12, marker=dict(W4A8_MARKER, group_size=12)), None)])
    first = check(paths, target="sglang").verdicts["sglang"].first
    # G=12 passes inspect (only >= 4 is checked there) and fails when the layer is built
    assert first.message == (
        f"Serialized W4A8 layer {Q} has input size 256, incompatible with group_size=12 and convrot_groupsize=256"
    )


PASSING = [
    ("int8 convrot", lambda: int8_layer(P)),
    ("w4a8 codebook", lambda: w4a8_layer(P)),
    ("w4a8 uniform", lambda: w4a8_layer(P, codebook_=False)),
    ("w4a8 asym F32 correction", lambda: w4a8_layer(P, correction=zeros("F32", (16, 32)))),
    ("w4a4", lambda: w4a4_layer(P)),
    ("nvfp4 N%128", lambda: nvfp4_layer(P, n=128, k=256)),
    ("nvfp4 pre_quant_scale", lambda: put(nvfp4_layer(P), "pre_quant_scale", ones("BF16", (256,)))),
    ("fp8", lambda: fp8_layer(P)),
    ("fp8 static", lambda: fp8_layer(P, input_scale=True)),
    ("mxfp8 marker only", lambda: mxfp8_layer(P)),
    (
        "w4a8 + int8 embedding",
        lambda: {**w4a8_layer(P), **int8_layer("txt_embed", marker={"format": "int8_tensorwise"}, scale_shape=())},
    ),
    ("w4a4 + int8 convrot", lambda: {**w4a4_layer(P), **int8_layer("b.int8")}),
    ("dense only", lambda: dense_layer(P)),
    ("mxfp8 quant_format", None),
]


@pytest.mark.parametrize("name, build", PASSING, ids=[p[0] for p in PASSING])
def test_valid_layers_load_in_sglang(tmp_path, name, build):
    if build is None:
        layer = mxfp8_layer(P, marker=False, scale=ones("U8", (128, 8)))
        paths = _write(tmp_path, [(layer, {"quant_format": "mxfp8"})])
    else:
        paths = _write(tmp_path, [(build(), None)])
    verdict = check(paths, target="sglang").verdicts["sglang"]
    assert verdict.loads, [v.message for v in verdict.violations]
    inspect_comfy_quant_markers(paths)


def test_dropin_returns_sglang_dict(tmp_path):
    files = [
        ({**fp8_layer("a"), **fp8_layer("b", input_scale=True)}, None),
    ]
    paths = _write(tmp_path, files)
    got = inspect_comfy_quant_markers(paths)
    assert got == {
        "a": {"format": "float8_e4m3fn", "_activation_scheme": "dynamic"},
        "b": {"format": "float8_e4m3fn", "_activation_scheme": "static"},
    }
    paths = _write(tmp_path, [({**w4a8_layer(P), **int8_layer("e", marker={"format": "int8_tensorwise"}, scale_shape=())}, None)])
    got = inspect_comfy_quant_markers(paths)
    assert got[P] == dict(W4A8_MARKER, _has_codebook=True, _has_correction=False)
    assert got["e"] == {"format": "int8_tensorwise", "_is_tensorwise_scalar": True}
    paths = _write(tmp_path, [(int8_layer(P), None)])
    assert inspect_comfy_quant_markers(paths)[P]["_is_rowwise"] is True
    paths = _write(tmp_path, [(nvfp4_layer(P), None)])
    assert inspect_comfy_quant_markers(paths)[P]["_has_pre_quant_scale"] is False


def test_dropin_mapper_and_collision(tmp_path):
    layers = {**int8_layer("model.diffusion_model.x"), **int8_layer("x")}
    paths = _write(tmp_path, [(layers, None)])

    def mapper(name):
        return name.removeprefix("model.diffusion_model.")

    with pytest.raises(ValueError, match=r"^Comfy markers collide after parameter mapping at 'x'$"):
        inspect_comfy_quant_markers(paths, mapper)
    paths = _write(tmp_path, [(int8_layer("model.diffusion_model.y"), None)])
    assert list(inspect_comfy_quant_markers(paths, mapper)) == ["y"]


def test_header_subset_merges_with_tensor_marker(tmp_path):
    """The header may hold a subset of the tensor marker's keys (SGLang merges the two as a union)."""
    paths = _write(tmp_path, [(int8_layer(P), header_markers({P: {"format": "int8_tensorwise"}}))])
    verdict = check(paths, target="sglang").verdicts["sglang"]
    assert verdict.loads
    assert inspect_comfy_quant_markers(paths)[P]["convrot"] is True


def test_conflict_across_shards(tmp_path):
    a = int8_layer(P)
    b = {"other.comfy_quant": marker_tensor({"format": "int8_tensorwise"})}
    b[f"{P}.comfy_quant"] = marker_tensor({"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 64})
    a = {k: v for k, v in a.items()}
    paths = _write(tmp_path, [(a, None), ({f"{P}.comfy_quant": b[f"{P}.comfy_quant"]}, None)])
    first = check(paths, target="sglang").verdicts["sglang"].first
    assert first.message == f"Conflicting Comfy quantization markers for {Q}"
