"""comfyquant's ComfyUI verdicts equal what ComfyUI 0.33.0 (783545f, with comfy-kitchen 0.2.40)
really does on every case of the generated defect space: loads / FAILS (same exception type
and message) / FAILS silently (garbage measured against the dense layer)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the generated cases and the runtimes need torch")

from runtimes import comfyui_driver  # noqa: E402
from runtimes.agreement import assert_agreement, compare, running, write_pairs, write_space  # noqa: E402
from runtimes.cases import GROUPS  # noqa: E402

TARGET = "comfyui"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_space(tmp_path_factory.mktemp("comfyui-cases"))


@pytest.fixture(scope="module")
def runtime():
    with running(comfyui_driver) as drv:
        yield drv


def test_valid_layers_compute(written, runtime):
    """The oracle itself: every valid layer of a format ComfyUI has loads and computes (an
    asymmetric W4A8 layer degrades: ComfyUI drops its correction), and AWQ, which its
    ``QUANT_ALGOS`` lacks, raises at load."""
    rows = compare(runtime, TARGET, [c for c in written if c.group == "valid"])
    got = {r.case.id: (r.outcome.status, r.outcome.exception) for r in rows}
    assert got.pop("awq_64x256.valid") == ("raises", "KeyError")
    assert got.pop("w4a8_asym_64x256.valid")[0] == "degraded"
    assert got.pop("w4a8_asym_64x256_corr.valid")[0] == "degraded"
    assert {status for status, _ in got.values()} == {"ok"}, got


@pytest.mark.parametrize("group", GROUPS)
def test_verdicts_agree(written, runtime, group):
    """Every case agrees, except the ones ``tests/runtimes/known/`` lists (classes of defect
    the profile does not model yet, each listed case by case): a new disagreement fails, and
    so does a listed case that now agrees (take it off the list)."""
    assert_agreement(runtime, TARGET, [c for c in written if c.group == group], comfyui_driver.VERSION)


def test_verdicts_agree_in_a_whole_checkpoint(tmp_path_factory, runtime):
    """The same space with each case as one layer of a whole checkpoint (every tensor under the
    diffusion model's prefix, the header map's names too, beside dense layers and a VAE
    tensor): the runtime strips the prefix before building its model, and the verdicts name
    the layers as it does."""
    cases = write_space(tmp_path_factory.mktemp("comfyui-checkpoint-cases"), checkpoint=True)
    assert_agreement(runtime, TARGET, cases, comfyui_driver.VERSION, "checkpoint")


def test_verdicts_agree_on_files_of_two_defective_layers(tmp_path_factory, runtime):
    """Files of two defective layers (400 drawn pairs): the runtime meets the layers in its
    model's order, each stage (loading, then the first forward) in turn, and the verdict names
    the failure it meets first."""
    cases = write_pairs(tmp_path_factory.mktemp("comfyui-pairs"))
    assert_agreement(runtime, TARGET, cases, comfyui_driver.VERSION, "pairs")
