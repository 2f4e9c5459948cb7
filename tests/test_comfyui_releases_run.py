"""comfyquant's verdict on each ComfyUI release group equals what that release's own code does
(with the comfy-kitchen it pins, or its minimum), on every format's valid layer in each marker
form (tensor marker, header map only, both) and ComfyUI's legacy scaled-FP8 forms: the formats a
release lacks raise its own error, a release that reads only the header map computes garbage
from a layer marked by a tensor alone.  One release per group is driven; the releases sharing
its deciding code share its results (printed).  Outcomes are cached per group
(``runtimes.release_agreement``): a first run drives 28 releases, later ones none."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch", reason="the generated cases and the runtimes need torch")

from comfyquant.targets.comfyui_releases import GROUPS, TENSOR  # noqa: E402
from runtimes import releases  # noqa: E402
from runtimes.agreement import summary, table  # noqa: E402
from runtimes.release_agreement import compare_group, format_cases  # noqa: E402


@pytest.fixture(scope="module")
def root():
    return releases.releases_root_or_skip()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return format_cases(tmp_path_factory.mktemp("comfyui-release-cases"))


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.first)
def test_release_verdicts_agree(root, written, group):
    start = time.monotonic()
    rows, driven = compare_group(root, group, written)
    shared = (
        f"; {', '.join(group.releases[1:])} share these results (byte-identical deciding code)" if len(group.releases) > 1 else ""
    )
    print(
        f"\nComfyUI {group.first} ({group.kitchen_text}): {summary(rows)}; {driven} driven in {time.monotonic() - start:.1f}s{shared}"
    )
    bad = [r for r in rows if r.why is not None]
    assert not bad, f"ComfyUI {group.first}: {summary(rows)}\n{table(bad)}"


LAYERS_VALUES = {
    "number": 5,
    "float": 2.5,
    "true": True,
    "zero": 0,
    "false": False,
    "empty-list": [],
    "empty-string": "",
    "list-naming": ["blocks.0.attn.qkv"],
    "list-other": ["blocks.9.other"],
    "string-naming": "blocks.0.attn.qkv",
    "string-other": "zzz",
}
"""``layers`` values of a header map that are no object of layers."""


@pytest.fixture(scope="module")
def odd_layers(tmp_path_factory):
    import json

    from runtimes.cases import VARIANTS, bases, header_cases, in_checkpoint

    folder = tmp_path_factory.mktemp("comfyui-release-layers")
    shapes = {variant: sizes[:1] for variant, sizes in VARIANTS.items()}
    chosen = [b for b in bases(0, shapes) if b.marker["format"] in ("float8_e4m3fn", "asym_w4a8_int8")][:2]
    cases = []
    for base in chosen:
        for name, value in LAYERS_VALUES.items():
            text = json.dumps({"format_version": "1.0", "layers": value})
            case = base.case(f"{base.name}.layers.{name}", "header", metadata={"_quantization_metadata": text})
            case.write(folder)
            cases.append(case)
        # in a whole checkpoint the map names its layers with the diffusion-model prefix, which
        # the loader cuts from the tensors' names only: entries of every kind then match no layer
        for case in header_cases(base):
            if case.id.endswith((".map-only", ".both", ".malformed3", ".malformed4")):
                whole = in_checkpoint(case)
                whole.write(folder)
                cases.append(whole)
    return cases


@pytest.mark.parametrize("group", [g for g in GROUPS if TENSOR not in g.markers], ids=lambda g: g.first)
def test_a_header_maps_layers_that_is_no_object(root, odd_layers, group):
    """The releases that read only the header map, on ``layers`` values other than an object
    of layers (a number, a list or string that names the layer or not, empty values), and on
    maps naming their layers with the diffusion-model prefix (entries that are objects or
    not): what each raises (``len()`` of a number, indexing a list or string by the layer's
    name) or computes with the layer's tensor marker unread is what ``check --target
    comfyui==<release>`` says."""
    rows, driven = compare_group(root, group, odd_layers)
    print(f"\nComfyUI {group.first}: {summary(rows)}; {driven} driven")
    bad = [r for r in rows if r.why is not None]
    assert not bad, f"ComfyUI {group.first}: {summary(rows)}\n{table(bad)}"
