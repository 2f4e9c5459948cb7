"""Shape and message classes of the runtime verdicts, each judged by the real runtime on the
generated files of its class: comfyquant's exception type and message equal the runtime's.

Classes: W4A8 group sizes the marker gets wrong and W6A8 group scales of the wrong shape (the
model's K is what the stored tensors show); AWQ's first forward (group size against K, scale
and zero broadcasting, operand ranks, dtypes); ConvRot W4A4 scales that are not 1-D or not N
long; INT8 per-row scales ``dequantize()`` cannot broadcast; NVFP4 per-tensor scales of
several values; MXFP8 and NVFP4 rows that are no whole blocks; INT8 weights stored transposed; ComfyUI's ``pre_quant_scale`` multiply and its legacy scaled-FP8 translation.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the generated cases and the runtimes need torch")

import runtime_sources  # noqa: E402
from runtimes import comfyui_driver, kitchen_driver  # noqa: E402
from runtimes.agreement import verdict  # noqa: E402
from runtimes.cases import generate  # noqa: E402
from runtimes.outcome import comparable, expected  # noqa: E402

KITCHEN_CLASSES = (
    "w4a8_codebook_64x256.marker.group_size.v6",  # group size 0: the combined geometry message
    "w6a8_64x256.marker.group_size.v8",  # K read as 6-bit rows, not 4-bit
    "w6a8_96x512.marker.group_size.v9",  # a valid group size that the stored groups do not fit
    "w6a8_64x256.weight_s_rel.dim1+1",
    "w6a8_96x512.weight_s_rel.3d-split",
    "w6a8_64x256.weight.dim0+1",  # the model's rows are what s_rel, s_channel and the bias show
    "w4a8_codebook_64x256.weight.dim1+1",
    "awq_64x256.marker.group_size.v0",
    "awq_64x256.marker.group_size.v6",
    "awq_64x256.marker.group_size.v7",
    "awq_64x256.marker.group_size.v8",
    "awq_64x256.weight_scale.transposed",
    "awq_64x256.weight_zeros.3d-split",
    "awq_64x256.weight_zeros.cast-float32",
    "awq_64x256.weight_scale.cast-float16",
    "w4a4_64x256.weight_scale.as-column",
    "w4a4_96x512.weight_scale.dim0-1",
    "int8_rowwise_64x256.weight_scale.as-vector",
    "int8_convrot_64x256.weight_scale.3d-unsqueezed",
    "nvfp4_128x128.weight_scale_2.as-vector4",
    "nvfp4_64x256.weight.dim1+1",  # rows of 258 codes are no whole blocks of 16
    "mxfp8_128x128.weight.dim1-1",
    "int8_convrot_96x512.weight.transposed",  # the scale and the bias show N: the weight is [K, N]
)
COMFYUI_CLASSES = (
    "w6a8_64x256.marker.group_size.v4",
    "w6a8_96x512.weight_s_rel.dim1-1",
    "w4a8_uniform_64x256.weight.transposed",
    "w4a4_int8_64x256.weight_scale.as-scalar",
    "w4a4_64x256.weight_scale.dim0+1",
    "nvfp4_64x256.pre_quant_scale.extra-len257",  # one past the padded K: 255 would be a valid layer of 255 inputs
    "nvfp4_64x256.weight_scale_2.as-vector4",
    "legacy.scale-input-vector",
    "legacy.scale-weight-vector",
    "mxfp8_64x256.weight.dim1+1",
    "int8_rowwise_64x256.weight.transposed",
)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shape-cases")
    wanted = set(KITCHEN_CLASSES) | set(COMFYUI_CLASSES)
    out = {}
    for case in generate(0):
        if case.id in wanted:
            case.write(folder)
            out[case.id] = case
    assert set(out) == wanted
    return out


def _agree(drv, target: str, case) -> None:
    outcome = drv.run(case.path)
    predicted = expected(verdict(case, target))
    assert outcome.status == "raises", f"{case.id}: the runtime {outcome.short()}"
    assert (predicted.kind, predicted.exception) == ("raises", outcome.exception), (case.id, predicted, outcome)
    assert comparable(predicted.message) == comparable(outcome.message), (case.id, predicted.message, outcome.message)


@pytest.fixture(scope="module")
def kitchen():
    drv = kitchen_driver.driver()
    if drv is None:
        runtime_sources.skip_missing(kitchen_driver.MISSING)
    with drv:
        yield drv


@pytest.fixture(scope="module")
def comfyui():
    drv = comfyui_driver.driver()
    if drv is None:
        runtime_sources.skip_missing(comfyui_driver.MISSING)
    with drv:
        yield drv


@pytest.mark.parametrize("case_id", KITCHEN_CLASSES)
def test_kitchen_raises_what_comfyquant_says(cases, kitchen, case_id):
    _agree(kitchen, "comfy-kitchen", cases[case_id])


@pytest.mark.parametrize("case_id", COMFYUI_CLASSES)
def test_comfyui_raises_what_comfyquant_says(cases, comfyui, case_id):
    _agree(comfyui, "comfyui", cases[case_id])
