"""comfyquant's comfy-kitchen verdicts equal what comfy-kitchen 0.2.40 alone really does on every
case of the generated defect space (each layer built as ComfyUI hands it over, dequantized and
run): loads / FAILS (same exception type and message) / FAILS silently (garbage measured
against the dense layer)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the generated cases and the runtimes need torch")

from runtimes import kitchen_driver  # noqa: E402
from runtimes.agreement import assert_agreement, compare, running, write_pairs, write_space  # noqa: E402
from runtimes.cases import GROUPS  # noqa: E402

TARGET = "comfy-kitchen"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_space(tmp_path_factory.mktemp("kitchen-cases"))


@pytest.fixture(scope="module")
def runtime():
    with running(kitchen_driver) as drv:
        yield drv


def test_valid_layers_compute_normally(written, runtime):
    """The oracle itself: every valid layer loads and computes within its format's usual error
    (the asymmetric W4A8 layer whose correction was zeroed degrades)."""
    rows = compare(runtime, TARGET, [c for c in written if c.group == "valid"])
    got = {r.case.id: r.outcome.status for r in rows}
    assert got.pop("w4a8_asym_64x256_corr.valid") == "degraded"
    assert set(got.values()) == {"ok"}, got


@pytest.mark.parametrize("group", GROUPS)
def test_verdicts_agree(written, runtime, group):
    """Every case agrees, except the ones ``tests/runtimes/known/`` lists (classes of defect
    the profile does not model yet, each listed case by case): a new disagreement fails, and
    so does a listed case that now agrees (take it off the list)."""
    assert_agreement(runtime, TARGET, [c for c in written if c.group == group], kitchen_driver.VERSION)


def test_verdicts_agree_in_a_whole_checkpoint(tmp_path_factory, runtime):
    """The same space with each case as one layer of a whole checkpoint (every tensor under the
    diffusion model's prefix, the header map's names too, beside dense layers and a VAE
    tensor): the runtime strips the prefix before building its model, and the verdicts name
    the layers as it does."""
    cases = write_space(tmp_path_factory.mktemp("kitchen-checkpoint-cases"), checkpoint=True)
    assert_agreement(runtime, TARGET, cases, kitchen_driver.VERSION, "checkpoint")


def test_verdicts_agree_on_files_of_two_defective_layers(tmp_path_factory, runtime):
    """Files of two defective layers (400 drawn pairs): the runtime meets the layers in its
    model's order, each stage (loading, then the first forward) in turn, and the verdict names
    the failure it meets first."""
    cases = write_pairs(tmp_path_factory.mktemp("kitchen-pairs"))
    assert_agreement(runtime, TARGET, cases, kitchen_driver.VERSION, "pairs")
