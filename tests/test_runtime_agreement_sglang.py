"""comfyquant's SGLang verdicts equal what SGLang 0.5.23's own functions do on every case of the
generated defect space and on the example checkpoints.

The oracle is SGLang's ``inspect_comfy_quant_markers`` and ``resolve_comfy_checkpoint_quantization``
(and the config constructors they call), executed from the ``sglang==0.5.23`` wheel with the rest
of SGLang stubbed (``runtimes/sglang_driver.py``). For each file:

* comfyquant's ``check`` verdict for SGLang, up to what these functions cover: FAILS with the same
  exception type and message where they raise, and no failure of theirs where they pass (what
  SGLang does afterwards, building layers and loading weights, is modelled from its source and not
  run here: such a verdict counts as passing these functions);
* the config SGLang resolves (its class) equals the one comfyquant's profile resolves;
* comfyquant's drop-in ``comfyquant.compat.sglang.inspect_comfy_quant_markers`` returns the same
  dict as the real one, or raises the same exception type with the same message.

Skipped with one line when the wheel cannot be downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="SGLang's own functions read marker tensors through torch")

from runtimes import sglang_driver  # noqa: E402
from runtimes.agreement import compare, running, summary, table, write_pairs, write_space  # noqa: E402
from runtimes.cases import GROUPS  # noqa: E402

TARGET = "sglang"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_space(tmp_path_factory.mktemp("sglang-cases"))


@pytest.fixture(scope="module")
def runtime():
    with running(sglang_driver) as drv:
        yield drv


def _example_checkpoints() -> list[list[str]]:
    """Every example checkpoint as SGLang is handed it: one file, or the list of its shards."""
    out = [[str(p)] for p in sorted(EXAMPLES.glob("*.safetensors"))]
    shards = sorted(str(p) for p in (EXAMPLES / "sharded").glob("*.safetensors"))
    if shards:
        out.append(shards)
    return out


def _ours(paths: list[str]) -> tuple[object, str | None]:
    """comfyquant's verdict dict for SGLang on ``paths`` and the config its profile resolves."""
    import comfyquant
    from comfyquant.checkpoint import open_checkpoint
    from comfyquant.targets.sglang import run_all

    verdict = comfyquant.check(paths, target=TARGET).verdicts[TARGET].to_dict()
    with open_checkpoint(paths, damaged_ok=True) as ckpt:
        config = run_all(ckpt)[3]
    return verdict, config


def _dropin(paths: list[str]) -> tuple[str, object]:
    from comfyquant.compat.sglang import inspect_comfy_quant_markers

    try:
        return "ok", _canonical(inspect_comfy_quant_markers(paths))
    except Exception as exc:  # compared with what SGLang raises
        return "raises", f"{type(exc).__name__}: {exc}"


def _real_inspect(oracle, paths: list[str]) -> tuple[str, object]:
    try:
        return "ok", _canonical(oracle.inspect_comfy_quant_markers(paths))
    except Exception as exc:  # the oracle's own exception
        return "raises", f"{type(exc).__name__}: {exc}"


def _canonical(markers: dict) -> str:
    """A marker dict as comparable text (NaN equals NaN, key order does not matter)."""
    return json.dumps(markers, sort_keys=True, default=repr)


def _disagreements(oracle, checkpoints: list[tuple[str, list[str]]]) -> tuple[list[str], int]:
    """One compact line block per checkpoint where comfyquant differs from SGLang's functions."""
    lines: list[str] = []
    raising = 0
    for label, paths in checkpoints:
        real = oracle.outcome(paths)
        raising += real.raises
        verdict, config = _ours(paths)
        predicted = sglang_driver.predict(verdict)
        why = []
        if real.raises:
            if (predicted.kind, predicted.exception, predicted.message) != ("raises", real.exception, real.message):
                why.append(f"verdict: comfyquant {predicted.short()[:100]} | SGLang {real.exception}: {real.message[:100]}")
        else:
            if predicted.kind != "loads":
                why.append(f"verdict: comfyquant {predicted.short()[:100]} | SGLang passes")
            if config != real.config:
                why.append(f"config: comfyquant {config} | SGLang {real.config}")
        if real.stage != "resolve":  # inspect raised or returned: the drop-in must do the same
            ours, theirs = _dropin(paths), _real_inspect(oracle, paths)
            if ours != theirs:
                why.append(f"drop-in: {ours[1][:100]} | SGLang {theirs[1][:100]}")
        if why:
            lines.append(label)
            lines.extend(f"    {w}" for w in why)
    return lines, raising


@pytest.mark.parametrize("group", GROUPS)
def test_verdicts_agree(written, runtime, group):
    """Through the shared harness (``runtimes.agreement``, as ``tools/prove_verdicts.py`` runs it)."""
    rows = compare(runtime, TARGET, [c for c in written if c.group == group])
    assert rows
    bad = table(rows)
    assert not bad, f"{sglang_driver.VERSION}: {summary(rows)}\n{bad}"


def test_verdicts_agree_in_a_whole_checkpoint(tmp_path_factory, runtime):
    """The same space with each case as one layer of a whole checkpoint (every tensor under the
    diffusion model's prefix, beside dense layers and a VAE tensor)."""
    rows = compare(runtime, TARGET, write_space(tmp_path_factory.mktemp("sglang-checkpoint-cases"), checkpoint=True))
    assert rows
    bad = table(rows)
    assert not bad, f"{sglang_driver.VERSION}: {summary(rows)}\n{bad}"


def test_verdicts_agree_on_files_of_two_defective_layers(tmp_path_factory, runtime):
    """Files of two defective layers (400 drawn pairs)."""
    rows = compare(runtime, TARGET, write_pairs(tmp_path_factory.mktemp("sglang-pairs")))
    assert rows
    bad = table(rows)
    assert not bad, f"{sglang_driver.VERSION}: {summary(rows)}\n{bad}"


@pytest.mark.parametrize("group", GROUPS)
def test_config_and_dropin_agree(written, runtime, group):
    """The config each case resolves to, and the drop-in's dict or exception, are SGLang's."""
    cases = [(c.id, [str(c.path)]) for c in written if c.group == group]
    lines, _ = _disagreements(runtime.oracle, cases)
    assert not lines, f"{sglang_driver.VERSION}, {len(cases)} cases of {group!r}:\n" + "\n".join(lines[:60])


def test_examples_agree(runtime):
    """The shipped examples, the sharded one as its list of shards."""
    checkpoints = [(", ".join(Path(p).name for p in paths), paths) for paths in _example_checkpoints()]
    assert len(checkpoints) >= 5
    lines, raising = _disagreements(runtime.oracle, checkpoints)
    assert not lines, "\n".join(lines)
    assert 0 < raising < len(checkpoints)  # some examples load in SGLang and some do not


def test_the_space_is_not_trivial(written, runtime):
    """The oracle really decides: across the space SGLang's functions both raise (several distinct
    messages) and pass, and the valid W4A8 and ConvRot INT8 layers (what SGLang serves) pass."""
    outcomes = {c.id: runtime.oracle.outcome([str(c.path)]) for c in written if c.group in ("valid", "marker")}
    messages = {o.message for o in outcomes.values() if o.raises}
    assert len(messages) >= 20
    passing = {cid for cid, o in outcomes.items() if not o.raises}
    assert "int8_convrot_64x256.valid" in passing and "w4a8_codebook_64x256.valid" in passing
    assert outcomes["fp8_e5m2_64x256.valid"].raises  # SGLang resolves no config for E5M2


def _marker_bytes_cases(folder: Path) -> list[tuple[str, list[str]]]:
    """Checkpoints that exercise how SGLang itself reads markers, beyond the generated space:
    Python's json (NaN, Infinity, 1e400, a BOM, UTF-16), marker tensors of other dtypes (torch's
    ``numpy()``), NaN conflicts between header and tensor markers, ``int()`` and ``str()`` of odd
    values, and the order in which the W4A4 config reads its INT8 companions."""
    from builders import (
        INT8_CONVROT_MARKER,
        W4A8_MARKER,
        header_markers,
        int8_layer,
        w4a4_layer,
        w4a8_layer,
        write,
    )

    p = "blocks.0.attn.qkv"
    w4a8 = json.dumps(W4A8_MARKER)
    out: list[tuple[str, dict, dict | None]] = []
    for label, text in (
        ("nan-unused", w4a8[:-1] + ', "note": NaN}'),
        ("inf-group", w4a8.replace('"group_size": 16', '"group_size": Infinity')),
        ("huge-group", w4a8.replace('"group_size": 16', '"group_size": 1e400')),
        ("nan-convrot", w4a8.replace('"convrot": true', '"convrot": NaN')),
        ("bom", "\ufeff" + w4a8),
    ):
        out.append((f"marker.{label}", w4a8_layer(p, marker=text.encode("utf-8")), None))
    out.append(("marker.utf16", w4a8_layer(p, marker=w4a8.encode("utf-16")), None))
    for dtype in ("BF16", "F16", "F8_E4M3", "F8_E5M2", "I8", "F32"):
        tensors = w4a8_layer(p)
        raw = w4a8.encode()
        width = {"BF16": 2, "F16": 2, "F32": 4}.get(dtype, 1)
        raw += b" " * (-len(raw) % width)
        tensors[f"{p}.comfy_quant"] = (dtype, (len(raw) // width,), raw)
        out.append((f"marker.dtype-{dtype}", tensors, None))
    for value in ("16", "sixteen", True, None, [16], 16.9, -4):
        out.append((f"group_size={value!r}", w4a8_layer(p, marker=dict(W4A8_MARKER, group_size=value)), None))
    for value in (4, None, "INT4", ["int4"]):
        m = {"format": "convrot_w4a4", "convrot_groupsize": 256, "linear_dtype": value}
        out.append((f"w4a4.linear_dtype={value!r}", w4a4_layer(p, marker=m), None))
    bad_w4a4 = {"format": "convrot_w4a4", "convrot_groupsize": 100}
    bad_int8 = dict(INT8_CONVROT_MARKER, convrot_groupsize=100)
    both = {**w4a4_layer("blocks.0.a", marker=bad_w4a4), **int8_layer("blocks.1.b", marker=bad_int8)}
    out.append(("w4a4+int8.both-bad", both, None))
    nan_marker = dict(W4A8_MARKER)
    text = header_markers({p: {"format": "asym_w4a8_int8"}})["_quantization_metadata"]
    assert text.endswith('"asym_w4a8_int8"}}}')
    header = {"_quantization_metadata": text[:-3] + ', "note": NaN}}}'}
    tensors = w4a8_layer(p, marker=(json.dumps(nan_marker)[:-1] + ', "note": NaN}').encode())
    out.append(("nan-in-header-and-tensor", tensors, header))
    out.append(("nan-in-header-only", w4a8_layer(p), header))
    out.append(("nan-as-header-entry", w4a8_layer(p), {"_quantization_metadata": text[:-2] + ', "x": NaN}}'}))
    written = []
    for i, (label, tensors, metadata) in enumerate(out):
        path = write(folder / f"sg{i}.safetensors", tensors, metadata=metadata)
        written.append((label, [path]))
    return written


def test_how_sglang_reads_markers_agrees(tmp_path, runtime):
    checkpoints = _marker_bytes_cases(tmp_path)
    lines, raising = _disagreements(runtime.oracle, checkpoints)
    assert not lines, "\n".join(lines)
    assert 0 < raising < len(checkpoints)


def test_dropin_maps_names_as_sglang_does(tmp_path, runtime):
    """``param_name_mapper`` gets each raw prefix, and a collision after mapping is SGLang's."""
    import re

    from builders import W4A8_MARKER, int8_layer, w4a8_layer, write
    from comfyquant.compat.sglang import inspect_comfy_quant_markers

    root = "model.diffusion_model."
    files = [
        write(tmp_path / "a.safetensors", w4a8_layer(root + "blocks.0.q"), w4a8_layer(root + "blocks.1.k")),
        write(tmp_path / "b.safetensors", w4a8_layer(root + "blocks.0.q"), w4a8_layer("blocks.0.q")),
        write(tmp_path / "c.safetensors", int8_layer("Blocks.0.Q"), int8_layer("blocks.0.q", marker=dict(W4A8_MARKER))),
    ]
    mappers = {
        "strip root": lambda name: name.removeprefix(root),
        "regex on the weight name": lambda name: re.sub(r"^model\.diffusion_model\.(.*)\.weight$", r"\1", name),
        "append": lambda name: name + ".w",
        "lower": str.lower,
    }
    differ = []
    for path in files:
        for label, mapper in mappers.items():
            ours = _call(inspect_comfy_quant_markers, [path], mapper)
            theirs = _call(runtime.oracle.inspect_comfy_quant_markers, [path], mapper)
            if ours != theirs:
                differ.append(f"{Path(path).name} / {label}: comfyquant {ours[:120]} | SGLang {theirs[:120]}")
    assert not differ, "\n".join(differ)


def _call(fn, *args) -> str:
    try:
        return "ok " + _canonical(fn(*args))
    except Exception as exc:  # compared with what SGLang raises
        return f"raises {type(exc).__name__}: {exc}"


def _merge_cases(folder: Path) -> list[tuple[str, list[str]]]:
    """Checkpoints that exercise how SGLang merges markers and reads ``quant_format``: header map
    and tensor marker values that compare equal but differ in type (SGLang keeps the later one),
    header maps in another shard, ``quant_format`` in every case and with every layer kind."""
    from builders import (
        W4A8_MARKER,
        dense_layer,
        fp8_layer,
        header_markers,
        int8_layer,
        mxfp8_layer,
        nvfp4_layer,
        ones,
        w4a8_layer,
        write,
    )

    out: list[tuple[str, list[str]]] = []

    def add(label: str, *shards: tuple[tuple[dict, ...], dict | None]) -> None:
        paths = [write(folder / f"{label}-{i}.safetensors", *parts, metadata=meta) for i, (parts, meta) in enumerate(shards)]
        out.append((label, paths))

    rowwise_mx = ones("U8", (128, 8))
    for key, value in (("convrot", 1), ("group_size", 16.0), ("convrot_groupsize", 256.0), ("group_size", True)):
        add(f"header-{key}={value!r}", ((w4a8_layer("a"),), header_markers({"a": dict(W4A8_MARKER, **{key: value})})))
    add(
        "header-in-other-shard",
        ((w4a8_layer("a", marker=False),), None),
        ((dense_layer("b"),), header_markers({"a": W4A8_MARKER})),
    )
    add(
        "header-conflict-other-shard",
        ((w4a8_layer("a"),), None),
        ((dense_layer("b"),), header_markers({"a": dict(W4A8_MARKER, group_size=32)})),
    )
    for qf in ("mxfp8", "MXFP8", "", "nvfp4"):
        meta = {"quant_format": qf}
        add(f"qf-{qf}-unmarked", ((mxfp8_layer("a", marker=False, scale=rowwise_mx),), meta))
        add(f"qf-{qf}-blocked", ((mxfp8_layer("a", marker=False),), meta))
        add(f"qf-{qf}-marked", ((mxfp8_layer("a", scale=rowwise_mx),), meta))
        add(f"qf-{qf}-int8", ((int8_layer("a"),), meta))
        add(f"qf-{qf}-fp8", ((fp8_layer("a", marker=False),), meta))
        add(f"qf-{qf}-nvfp4", ((nvfp4_layer("a", scale_shape=(128, 16)),), meta))
    add(
        "qf-shards-disagree",
        ((mxfp8_layer("a", marker=False, scale=rowwise_mx),), {"quant_format": "mxfp8"}),
        ((dense_layer("b"),), {"quant_format": "nvfp4"}),
    )
    add(
        "qf-in-one-shard",
        ((mxfp8_layer("a", marker=False, scale=rowwise_mx),), {"quant_format": "mxfp8"}),
        ((mxfp8_layer("b", marker=False, scale=rowwise_mx),), None),
    )
    return out


def test_how_sglang_merges_markers_agrees(tmp_path, runtime):
    checkpoints = _merge_cases(tmp_path)
    lines, raising = _disagreements(runtime.oracle, checkpoints)
    assert not lines, "\n".join(lines)
    assert 0 < raising < len(checkpoints)
