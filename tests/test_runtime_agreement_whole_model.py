"""comfyquant's ComfyUI verdicts equal what ComfyUI 0.33.0 (783545f, with comfy-kitchen 0.2.40)
does with whole models: tiny Flux and Wan 2.1 models built with ComfyUI's own classes,
quantized by comfy-kitchen in every format ComfyUI knows, and a generated space of realistic
defects (``runtimes.whole_models``), each file loaded, detected, built and run by ComfyUI's
own path (``runtimes.comfyui_models``)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the generated models and the runtimes need torch")

from runtimes import comfyui_models  # noqa: E402
from runtimes.agreement import running  # noqa: E402
from runtimes.model_agreement import assert_agreement, compare, space_cases  # noqa: E402


@pytest.fixture(scope="module")
def runtime():
    with running(comfyui_models) as drv:
        yield drv


@pytest.fixture(scope="module")
def cases(runtime):
    found = space_cases(0)
    if isinstance(found, str):
        pytest.skip(found)
    assert len(found) >= 300
    return found


@pytest.fixture(scope="module")
def rows(runtime, cases):
    return compare(runtime, cases)


def test_the_oracle_is_sane(rows):
    """The oracle itself: the dense models compute exactly what they are (error 0 against
    themselves); every format's valid file computes (ok or degraded), except the asymmetric
    W4A8 file, whose correction ComfyUI never reads (garbage), and AWQ, which ComfyUI's
    ``QUANT_ALGOS`` lacks (KeyError at load); each model is detected as itself."""
    valid = {r.case.id: r.outcome for r in rows if r.case.group == "valid"}
    for model, arch in (("flux", "Flux("), ("wan", "WAN21_T2V(")):
        dense = valid.pop(f"{model}.dense.valid")
        assert dense.status == "ok" and dense.error == 0.0 and dense.model_error == 0.0, dense
        assert dense.architecture.startswith(arch), dense
        awq = valid.pop(f"{model}.awq.valid")
        assert (awq.status, awq.stage, awq.exception, awq.message) == ("raises", "load", "KeyError", "'awq_w4a16'")
        asym = valid.pop(f"{model}.w4a8_asym.valid")
        assert asym.status == "garbage", asym
    bad = {cid: o.short() for cid, o in valid.items() if o.status not in ("ok", "degraded")}
    assert not bad, bad
    assert all(o.architecture and 0 < o.error < 0.3 for o in valid.values()), valid


def test_the_space_covers_every_outcome(rows):
    """The space is not one-sided: ComfyUI raises at detection, at load and at the forward,
    computes garbage, runs on unfilled parameters, and computes."""
    stages = {(r.outcome.status, r.outcome.stage) for r in rows}
    for wanted in (
        ("raises", "detect"),
        ("raises", "load"),
        ("raises", "forward"),
        ("garbage", None),
        ("undefined", None),
        ("ok", None),
    ):
        assert wanted in stages, wanted


def test_verdicts_agree_on_whole_models(rows):
    """Every file agrees, except the ones ``tests/runtimes/known/comfyui.models.txt`` lists
    (classes of defect the profile does not model yet, each listed case by case): a new
    disagreement fails, and so does a listed file that now agrees (take it off the list)."""
    assert_agreement(rows, comfyui_models.VERSION)
