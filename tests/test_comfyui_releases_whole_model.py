"""comfyquant's verdict on older ComfyUI release groups equals what each group's first release
(with the comfy-kitchen it pins, or none) does with whole models: the whole-model space of
seed 0 (``runtimes.whole_models``: tiny Flux and Wan 2.1 models in every format, with
generated defects), each file loaded, detected, built and run by the release's own path
(``runtimes.comfyui_models.release_driver``).  One ``check --deep`` per file gives every
group's verdict (``release_agreement.release_expectations``).

The whole space runs on the groups that differ most in quantized loading: 0.4.0 (no
comfy-kitchen, tensor markers), 0.8.2 (the first with comfy-kitchen, raising on a missing
weight), 0.18.1 (MXFP8), 0.27.0 (INT8), 0.31.0 (W4A8); every other group from 0.4.0 on runs a
quarter of it (each quarter on several groups; ``tools/prove_whole_models.py --release`` runs
the whole space on any group).  Disagreements known per group are listed in
``runtimes/known/comfyui.release-models.txt`` (``tools/prove_whole_models.py --release ...
--write-known``): an unlisted one fails, and so does a listed case that agrees.  Outcomes are
cached per group and file (``release_model_agreement.outcomes``): a run after the first drives
nothing."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch", reason="the generated models and the runtimes need torch")

import runtime_sources  # noqa: E402
from comfyquant.targets.comfyui_releases import GROUPS, TENSOR  # noqa: E402
from runtimes import release_model_agreement as rma  # noqa: E402
from runtimes import releases  # noqa: E402
from runtimes.model_agreement import space_cases, summary  # noqa: E402

RELEASES = ("0.4.0", "0.8.2", "0.18.1", "0.27.0", "0.31.0")


@pytest.fixture(scope="module")
def root():
    return releases.releases_root_or_skip()


@pytest.fixture(scope="module")
def cases(root):
    found = space_cases(0)
    if isinstance(found, str):
        pytest.skip(found)
    assert len(found) >= 300
    return found


@pytest.fixture(scope="module")
def said(cases):
    return rma.expectations(cases)


SHARES = 4
OTHERS = tuple(g.first for g in GROUPS if g.first not in RELEASES and TENSOR in g.markers)
"""The groups from 0.4.0 on (those reading tensor markers) but ``RELEASES``, the newest with
the comfy-kitchen it pins (0.33.0 with 0.2.31: ``check``'s default pairing) among them: each
runs its share of the files."""


@pytest.mark.parametrize("release", OTHERS)
def test_every_other_group_agrees_on_its_share_of_whole_models(root, cases, said, release):
    """Every file of the group's share (by its index among ``OTHERS``, modulo ``SHARES``)
    agrees with the group's first release except the listed ones."""
    group = next(g for g in GROUPS if g.first == release)
    share = [c for i, c in enumerate(cases) if i % SHARES == OTHERS.index(release) % SHARES]
    got = rma.outcomes(root, group, share)
    if isinstance(got, str):
        runtime_sources.skip_missing(got)
    results, driven = got
    rows = rma.compare(share, results, said, release)
    print(f"\nComfyUI {release} ({group.kitchen_text}), {len(share)} of {len(cases)} files: {summary(rows)}; {driven} driven")
    problem = rma.problems(rows, release)
    assert problem is None, problem


def test_the_shares_cover_the_space():
    assert len(OTHERS) >= SHARES and {i % SHARES for i in range(len(OTHERS))} == set(range(SHARES))


@pytest.mark.parametrize("release", RELEASES)
def test_release_verdicts_agree_on_whole_models(root, cases, said, release):
    """Every file agrees with the group's first release except the listed ones; the oracle is
    sane (the dense Wan model computes exactly itself in every release)."""
    group = next(g for g in GROUPS if g.first == release)
    start = time.monotonic()
    got = rma.outcomes(root, group, cases)
    if isinstance(got, str):
        runtime_sources.skip_missing(got)
    results, driven = got
    dense = results["wan.dense.valid"]
    assert dense.status == "ok" and dense.error == 0.0 and dense.model_error == 0.0, dense
    rows = rma.compare(cases, results, said, release)
    known = rma.known_disagreements().get(release, set())
    shared = f"; {', '.join(group.releases[1:])} share these results" if len(group.releases) > 1 else ""
    print(
        f"\nComfyUI {release} ({group.kitchen_text}): {summary(rows)}; {len(known)} known; "
        f"{driven} driven in {time.monotonic() - start:.0f}s{shared}"
    )
    problem = rma.problems(rows, release)
    assert problem is None, problem
