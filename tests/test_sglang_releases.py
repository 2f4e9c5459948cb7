"""comfyquant's SGLang release groups (``comfyquant.targets.sglang_releases``) are what each SGLang
release from 0.5.14 to 0.5.23 does, proven against each release's own code:

* the groups are the releases whose Comfy reader files are byte-identical (each wheel's reader
  files hashed, ``runtimes.sglang_releases.reader_digest``);
* on the generated single-layer space (and with each case in a whole checkpoint, and on the
  shipped examples), each group's verdict equals what its first release's own
  functions do: the same exception type and message where they raise, no failure of theirs where
  they pass, and the config they resolve (for releases before 0.5.19: the quantization method
  their header and tensor scan choose).

Wheels are downloaded once into the test cache; skipped with one line when they cannot be had
(a failure under CI).
"""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="SGLang's own functions read marker tensors through torch")

import runtime_sources  # noqa: E402
from comfyquant.targets import sglang_releases as product  # noqa: E402
from runtimes import sglang_driver  # noqa: E402
from runtimes import sglang_releases as oracle  # noqa: E402
from runtimes.agreement import twin_messages, write_space  # noqa: E402


def _wheels() -> dict[str, Path]:
    out = {}
    for version in oracle.RELEASES:
        path = oracle.wheel(version)
        if path is None:
            runtime_sources.skip_missing(oracle.MISSING[version])
        out[version] = path
    return out


def test_releases_are_the_products():
    assert oracle.RELEASES == product.RELEASES
    assert product.GROUPS[-1].releases == (product.NEWEST,)


def test_groups_are_the_releases_with_byte_identical_readers():
    wheels = _wheels()
    digests = {v: oracle.reader_digest(p)[:12] for v, p in wheels.items()}
    measured = collections.defaultdict(list)
    for version, digest in digests.items():
        measured[digest].append(version)
    ours = {g.digest: list(g.releases) for g in product.GROUPS}
    lines = [f"{', '.join(vs)}: {d}" for d, vs in measured.items()]
    print("SGLang release groups (reader files' digest):\n  " + "\n  ".join(lines))
    assert ours == dict(measured), "\n".join(lines)


def _judged(cases) -> list:
    """Each case with comfyquant's 0.5.23 verdict, its release facts and the config it resolves."""
    import comfyquant
    from comfyquant.checkpoint import open_checkpoint
    from comfyquant.targets.sglang import run_all

    out = []
    for case in cases:
        paths = [str(case.path)]
        verdict = comfyquant.check(paths, target="sglang").verdicts["sglang"].to_dict()
        with open_checkpoint(paths, damaged_ok=True) as ckpt:
            facts = product.facts_from_checkpoint(ckpt)
            config = run_all(ckpt)[3]
        out.append((case.id, paths, verdict, facts, config))
    return out


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    """The single-layer space, judged by comfyquant."""
    return _judged(write_space(tmp_path_factory.mktemp("sglang-release-cases")))


def _disagreement(group, real, verdict, facts, config, paths) -> str | None:
    ours = product.group_verdict(group, verdict, facts)
    if group.reader == "metadata":
        legacy = facts.legacy
        if real.raises:
            head = f"raises {real.exception}: "
            if legacy != head + real.message:
                if legacy and legacy.startswith(head) and twin_messages(paths[0], legacy[len(head) :], real.message):
                    return None  # two tensors at the same offsets (as below)
                return f"comfyquant {legacy} | SGLang raises {real.exception}: {real.message}"
        elif legacy != real.config:
            return f"comfyquant {legacy} | SGLang {real.config}"
        return None
    expected = sglang_driver.predict({"loads": ours.loads, "error": ours.error, "exception": ours.exception, "rule": ours.rule})
    if real.raises:
        if (expected.kind, expected.exception, expected.message) != ("raises", real.exception, real.message):
            # two tensors at the same offsets: which one safetensors names is not the file's to decide
            if (expected.kind, expected.exception) == ("raises", real.exception) and twin_messages(
                paths[0], expected.message, real.message
            ):
                return None
            return f"comfyquant {expected.short()[:140]} | SGLang {real.exception}: {real.message[:140]}"
        return None
    if expected.kind != "loads":
        return f"comfyquant {expected.short()[:140]} | SGLang passes"
    mapped = group.configs.get(config, config) if config else config
    if mapped != real.config:
        return f"config: comfyquant {mapped} | SGLang {real.config}"
    return None


def _agree(space: list, label: str) -> None:
    """Every release group's first release run on each judged case of ``space``."""
    _wheels()
    lines, summary = [], []
    for group in product.GROUPS:
        release = oracle.release(group.releases[0])
        assert release is not None
        started = time.perf_counter()
        bad = []
        raising = 0
        for cid, paths, verdict, facts, config in space:
            real = release.outcome(paths)
            raising += real.raises
            why = _disagreement(group, real, verdict, facts, config, paths)
            if why:
                bad.append(f"  {cid}: {why}")
        summary.append(
            f"SGLang {group.name}: {len(space) - len(bad)}/{len(space)} agree ({raising} raise) "
            f"in {time.perf_counter() - started:.1f}s"
        )
        if bad:
            lines.append(f"SGLang {group.name}: {len(bad)} disagree")
            lines.extend(bad[:30])
    total = len(space) * len(product.GROUPS)
    print(f"{label}: {len(space)} cases x {len(product.GROUPS)} release groups = {total}:\n  " + "\n  ".join(summary))
    assert not lines, "\n".join(summary + lines)


def test_each_release_group_agrees_on_the_single_layer_space(space):
    _agree(space, "single layer")


def test_each_release_group_agrees_with_each_case_in_a_whole_checkpoint(tmp_path_factory):
    """The same space with each case as one layer of a whole checkpoint (under the diffusion
    model's prefix, beside dense layers and a VAE tensor)."""
    _wheels()
    _agree(_judged(write_space(tmp_path_factory.mktemp("sglang-release-checkpoints"), checkpoint=True)), "whole checkpoint")


def test_each_release_group_agrees_at_the_held_out_geometries(tmp_path_factory):
    """The single-layer space of another seed at geometries the other tests do not use
    (``cases.HELD_OUT``): files the model was not written against."""
    from runtimes.cases import HELD_OUT, generate

    folder = tmp_path_factory.mktemp("sglang-release-held-out")
    cases = generate(1, HELD_OUT)
    for case in cases:
        case.write(folder)
    _agree(_judged(cases), "held-out geometries, seed 1")


def test_first_loading_release():
    groups = product.GROUPS

    def v(*loads: bool) -> list:
        return [product.ReleaseVerdict(g, ok) for g, ok in zip(groups, loads, strict=True)]

    assert product.first_loading_release(v(*[True] * 7)) == "0.5.14"
    assert product.first_loading_release(v(False, False, False, True, True, True, True)) == "0.5.19"
    assert product.first_loading_release(v(True, True, True, False, True, True, True)) == "0.5.20"
    assert product.first_loading_release(v(*[True] * 6, False)) is None
    assert product.first_reading_release("asym_w4a8_int8") == "0.5.19"
    assert product.first_reading_release("rowwise-float8_e4m3fn") == product.NEWEST


def test_the_runtimes_page_lists_every_release_group():
    import importlib.util

    hook = Path(__file__).resolve().parent.parent / "docs" / "hooks" / "generated.py"
    spec = importlib.util.spec_from_file_location("docs_generated", hook)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = (hook.parent.parent / "runtimes.md").read_text(encoding="utf-8")
    assert "<!-- generated: sglangreleases -->" in page
    rendered = module.on_page_markdown(page, None, None, None)
    for group in product.GROUPS:
        assert f"| {', '.join(group.releases)} | `{group.digest}` |" in rendered
    for fmt in product.FORMATS:
        assert f"| `{fmt}` | {product.first_reading_release(fmt)} |" in rendered


def test_a_rowwise_fp8_file_in_each_release_group(tmp_path):
    """SGLang's row-wise FP8 layout (a header map of format_version 1.1): only 0.5.23 has a reader
    for it; the marker readers before refuse the format, the readers before 0.5.19 take its
    ``float8`` format name for their generic FP8 config."""
    import json

    import torch
    from safetensors.torch import save_file

    import comfyquant
    from comfyquant.checkpoint import open_checkpoint

    _wheels()
    path = tmp_path / "rowwise.safetensors"
    layer = "blocks.0.attn.qkv"
    marker = {"format_version": "1.1", "layers": {layer: {"format": "rowwise-float8_e4m3fn"}}}
    weight = (torch.randn(64, 256) * 0.1).to(torch.float8_e4m3fn)
    save_file(
        {f"{layer}.weight": weight, f"{layer}.weight_scale": torch.ones(64)},
        str(path),
        metadata={"_quantization_metadata": json.dumps(marker)},
    )
    paths = [str(path)]
    verdict = comfyquant.check(paths, target="sglang").verdicts["sglang"].to_dict()
    with open_checkpoint(paths, damaged_ok=True) as ckpt:
        facts = product.facts_from_checkpoint(ckpt)
    for group in product.GROUPS[:-1]:
        real = oracle.release(group.releases[0]).outcome(paths)
        ours = product.group_verdict(group, verdict, facts)
        if group.reader == "metadata":
            assert (real.config, ours.loads) == ("fp8", True), group.name
        else:
            assert real.raises and (ours.exception, ours.error) == (real.exception, real.message), group.name


def test_each_release_group_agrees_on_the_examples():
    """The shipped examples (held out of the generated space), the sharded one as its shards."""
    import comfyquant
    from comfyquant.checkpoint import open_checkpoint
    from comfyquant.targets.sglang import run_all

    _wheels()
    examples = Path(__file__).resolve().parent.parent / "examples"
    checkpoints = [[str(p)] for p in sorted(examples.glob("*.safetensors"))]
    shards = sorted(str(p) for p in (examples / "sharded").glob("*.safetensors"))
    if shards:
        checkpoints.append(shards)
    bad = []
    for paths in checkpoints:
        verdict = comfyquant.check(paths, target="sglang").verdicts["sglang"].to_dict()
        with open_checkpoint(paths, damaged_ok=True) as ckpt:
            facts = product.facts_from_checkpoint(ckpt)
            config = run_all(ckpt)[3]
        for group in product.GROUPS:
            real = oracle.release(group.releases[0]).outcome(paths)
            why = _disagreement(group, real, verdict, facts, config, paths)
            if why:
                bad.append(f"{Path(paths[0]).name} / SGLang {group.name}: {why}")
    print(f"{len(checkpoints)} example checkpoints x {len(product.GROUPS)} release groups")
    assert not bad, "\n".join(bad)


def test_each_release_group_agrees_on_the_rowwise_fp8_space(tmp_path_factory):
    """SGLang's own row-wise FP8 files (its ``format_version`` 1.1 header map, valid and
    defective, ``runtimes.rowwise_cases``): 0.5.23 reads them with its row-wise reader; the marker
    readers before it inspect the map as Comfy markers (an entry that is a format name, not an
    object, is refused), the readers before 0.5.19 read it as header metadata."""
    from runtimes import rowwise_cases

    _wheels()
    folder = tmp_path_factory.mktemp("sglang-release-rowwise")
    cases = rowwise_cases.generate(0)
    for case in cases:
        case.write(folder)
    _agree(_judged(cases), "row-wise FP8")


SERVES = {"fp8": "float8_e4m3fn", "modelopt_fp4": "nvfp4"}
"""The quantization method a release before 0.5.19 picks -> the end of the Comfy format names its
layers are built for (SGLang's FP8 config serves E4M3 weights with tensor or row scales): a
layer of another format is built unquantized, which its stored weights do not fit."""


def _real_loads(group, real, formats: set[str], quantized: bool) -> bool:
    """Whether the group's first release loads a file, from what its own code does (``real``):
    a marker reader loads what it resolves without raising; an older reader loads what the config
    it picks (or none) serves."""
    if real.raises:
        return False
    if group.reader == "markers":
        return True
    if real.config is None:
        return not quantized
    return all(f.endswith(SERVES[real.config]) for f in formats)


def _release_files(tmp_path) -> dict:
    """Files written by the code whose first loading SGLang release differs: name -> (path, the
    formats written, quantized, the first loading release)."""
    import json

    from builders import (
        W4A8_MARKER,
        fp8_layer,
        header_markers,
        int8_layer,
        nvfp4_layer,
        ones,
        w4a8_layer,
        write,
        zeros,
    )

    layer, other = "blocks.0.attn.qkv", "blocks.0.mlp.fc1"
    rowwise = "rowwise-float8_e4m3fn"
    rowwise_map = {
        "format_version": "1.1",
        "layers": {layer: rowwise, other: "bf16"},
        "quant_configs": {rowwise: {"scale_recipe": "rowwise"}},
    }
    made = {
        "w4a8": (w4a8_layer(layer), {}, {"asym_w4a8_int8"}, "0.5.19"),
        "int8-convrot": (int8_layer(layer), {}, {"int8_tensorwise"}, "0.5.19"),
        "fp8-header-map": (
            fp8_layer(layer, marker=False),
            header_markers({layer: {"format": "float8_e4m3fn"}}),
            {"float8_e4m3fn"},
            "0.5.14",
        ),
        "fp8-tensor-marker": (fp8_layer(layer), {}, {"float8_e4m3fn"}, "0.5.19"),
        "nvfp4": (nvfp4_layer(layer), {}, {"nvfp4"}, "0.5.20"),
        "rowwise-fp8": (
            {
                f"{layer}.weight": zeros("F8_E4M3", (64, 256)),
                f"{layer}.weight_scale": ones("F32", (64,)),
                f"{other}.weight": zeros("BF16", (32, 256)),
            },
            {"_quantization_metadata": json.dumps(rowwise_map)},
            {rowwise},
            "0.5.23",
        ),
        "fp8-and-w4a8": (
            {**fp8_layer(layer, marker=False), **w4a8_layer(other, marker=False)},
            header_markers({layer: {"format": "float8_e4m3fn"}, other: dict(W4A8_MARKER)}),
            {"float8_e4m3fn", "asym_w4a8_int8"},
            None,
        ),
    }
    return {
        name: (write(tmp_path / f"{name}.safetensors", tensors, metadata=meta or None), formats, True, first)
        for name, (tensors, meta, formats, first) in made.items()
    }


def test_the_first_loading_release_check_names_is_the_real_releases(tmp_path, capsys):
    """``check``'s ``targets.sglang.releases`` (its ``first_loading`` and each group's ``loads``)
    equals what each release group's own code does with the file (the modelled part: a layer
    built for a config it does not fit fails to load); 0.5.23's verdicts here rest on no
    modelled rule."""
    import json

    from comfyquant.cli import main
    from comfyquant.targets.proven import modelled

    _wheels()
    bad = []
    for name, (path, formats, quantized, first) in _release_files(tmp_path).items():
        main(["check", path, "--target", "sglang", "--json"])
        target = json.loads(capsys.readouterr().out)["targets"]["sglang"]
        assert modelled("sglang", target["rule"]) is None, (name, target["rule"])
        listed = target["releases"]["releases"]
        assert [tuple(g["releases"]) for g in listed] == [g.releases for g in product.GROUPS]
        real = [_real_loads(g, oracle.release(g.releases[0]).outcome([path]), formats, quantized) for g in product.GROUPS]
        ours = [g["loads"] for g in listed]
        loading = [product.ReleaseVerdict(g, loads) for g, loads in zip(product.GROUPS, real, strict=True)]
        real_first = product.first_loading_release(loading)
        if ours != real or target["releases"]["first_loading"] != real_first or real_first != first:
            bad.append(
                f"{name}: comfyquant {ours} first {target['releases']['first_loading']} | SGLang {real} first {real_first}"
            )
    assert not bad, "\n".join(bad)
