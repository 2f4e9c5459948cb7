"""Every comfy-kitchen release group, run: each group's first release (its sources first on a
worker's path, ``runtimes.kitchen_releases_driver``) builds and runs every format's valid layer,
with its marker as a tensor, in the header map only, and in both, plus the legacy scaled-FP8
forms (``release_agreement.format_cases``), and comfyquant's ``check --target
comfy-kitchen==<release>`` agrees: the same outcome, and the same exception type and message
where the release raises.  The group's other releases share its results (their deciding code is
byte-identical).  Outcomes are cached per group digest and file, so a run after the first
drives nothing.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch", reason="the generated cases and the runtimes need torch")

import runtime_sources  # noqa: E402
from comfyquant.targets import kitchen_releases as product  # noqa: E402
from runtimes import kitchen_releases as oracle  # noqa: E402
from runtimes.outcome import expected  # noqa: E402
from runtimes.release_agreement import format_cases  # noqa: E402


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    from runtimes.agreement import write_space

    return write_space(tmp_path_factory.mktemp("kitchen-release-space"))


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return format_cases(tmp_path_factory.mktemp("kitchen-release-cases"))


def _others() -> list:
    """The groups ``SPACE_RELEASES`` leaves out, which run a share of the space each."""
    return [g for g in product.GROUPS if not set(g.releases) & set(SPACE_RELEASES)]


def _share(space: list, i: int) -> list:
    """The ``i``-th other group's share of the space: the cases whose index is ``i`` modulo ``SHARES``."""
    return [case for j, case in enumerate(space) if j % SHARES == i % SHARES]


@pytest.fixture(scope="module")
def driven(cases, space):
    """Every group driven once on all it runs in this module (its valid layers, and the whole
    space or its share): one worker per group; the tests then read the cached outcomes."""
    for group in product.GROUPS:
        if oracle.source(group.first) is None:
            runtime_sources.skip_missing(oracle.MISSING[group.first])
    others = _others()
    for group in product.GROUPS:
        more = space if group not in others else _share(space, others.index(group))
        oracle.outcomes(group, [*cases, *more])


def test_every_group_agrees_on_every_formats_valid_layer(cases, driven):
    for group in product.GROUPS:
        if oracle.source(group.first) is None:
            runtime_sources.skip_missing(oracle.MISSING[group.first])
    start = time.monotonic()
    bad, driven, lines = [], 0, []
    for group in product.GROUPS:
        got, n = oracle.outcomes(group, cases)
        driven += n
        fails = 0
        for case in cases:
            outcome = got[case.id]
            fails += outcome.kind == "raises"
            why = oracle.judged(case, outcome, expected(oracle.predicted(case, group.first)))
            if why is not None:
                bad.append(f"{group.name} {case.id}: {why}")
        lines.append(f"{', '.join(group.releases)} ({group.digest}): {len(cases) - fails} load, {fails} raise")
    took = time.monotonic() - start
    print(
        f"{len(cases)} cases x {len(product.GROUPS)} groups ({len(cases) * len(product.RELEASES)} cases x releases), "
        f"{driven} driven, {took:.0f} s; releases sharing each group's results:\n  " + "\n  ".join(lines)
    )
    assert not bad, "\n".join(bad[:40])


SPACE_RELEASES = ("0.1.2", "0.2.0", "0.2.2", "0.2.11", "0.2.13", "0.2.31")
"""The groups the whole generated space runs on: a release taking layouts by class, the first
taking names (its FP8 and NVFP4 scales uncast), the last multiplying a missing NVFP4 scale, the
two whose INT8 linear runs unchecked, and the 4-bit-only W4A8 release ComfyUI 0.33.0 pins.  The
other groups run a quarter of the space each (``test_every_other_group_agrees_on_its_share``);
``tools/prove_kitchen_releases.py`` runs the whole space on every group."""

SHARES = 4
"""Every other group runs the cases whose index modulo ``SHARES`` is its own index's: each
quarter of the space runs on several groups, and every case on at least one."""


@pytest.mark.parametrize("release", SPACE_RELEASES)
def test_the_generated_space_agrees_on_the_groups_that_differ_most(space, driven, release):
    """The whole generated single-layer space (every defect of every format) on the group of
    ``release``: what the release raises, computes or computes wrong is what ``check --target
    comfy-kitchen==<release>`` says."""
    group = product.group_of(release)
    if oracle.source(group.first) is None:
        runtime_sources.skip_missing(oracle.MISSING[group.first])
    start = time.monotonic()
    got, driven = oracle.outcomes(group, space)
    bad = []
    for case in space:
        why = oracle.judged(case, got[case.id], expected(oracle.predicted(case, group.first)))
        if why is not None:
            bad.append(f"{case.id}: {why}")
    print(f"{len(space)} cases on comfy-kitchen {group.name}, {driven} driven, {time.monotonic() - start:.0f} s")
    assert not bad, "\n".join(bad[:40])


def test_every_other_group_agrees_on_its_share(space, driven):
    """The groups ``SPACE_RELEASES`` leaves out, each on its share of the generated space (a
    quarter, by case index): what each release raises, computes or computes wrong is what
    ``check --target comfy-kitchen==<release>`` says."""
    others = _others()
    for group in others:
        if oracle.source(group.first) is None:
            runtime_sources.skip_missing(oracle.MISSING[group.first])
    start = time.monotonic()
    said = {case.id: oracle.predicted_all(case) for case in space}  # one check per case: every group's verdict
    bad, driven, ran = [], 0, 0
    for i, group in enumerate(others):
        share = _share(space, i)
        got, n = oracle.outcomes(group, share)
        driven += n
        ran += len(share)
        for case in share:
            why = oracle.judged(case, got[case.id], expected(said[case.id].get(group.first)))
            if why is not None:
                bad.append(f"{group.name} {case.id}: {why}")
    covered = {j % SHARES for j in range(len(others))}
    print(f"{ran} cases on {len(others)} other comfy-kitchen groups, {driven} driven, {time.monotonic() - start:.0f} s")
    assert covered == set(range(SHARES))  # every case runs on some group
    assert not bad, "\n".join(bad[:40])


def test_each_groups_first_failure_is_its_whole_verdicts(space):
    """What check's release lines and JSON say of a group (``GroupVerdict.first``, found without
    ordering every layer) is the first failure of that group's whole verdict (``release_verdict``,
    what ``--target comfy-kitchen==<release>`` shows), on every case of the generated space."""
    from comfyquant.checkpoint import open_checkpoint
    from comfyquant.targets.base import Verdict
    from comfyquant.targets.kitchen import kitchen_verdict

    def said(v):
        return None if v is None else (v.rule, v.message, v.exception, v.layer, v.tensor)

    bad = []
    for case in space:
        try:
            ckpt = open_checkpoint([str(case.path)])
        except Exception:  # a file that does not open has no layers to judge
            continue
        newest = kitchen_verdict(ckpt)
        for group in product.GROUPS:
            fast = product.GroupVerdict(group, ckpt, newest).first
            whole = Verdict("comfy-kitchen", product.release_verdict(group, ckpt, newest).violations).first
            if said(fast) != said(whole):
                bad.append(f"{case.id} on {group.name}: {said(fast)} != {said(whole)}")
    assert not bad, "\n".join(bad[:20])


def test_the_first_failing_layer_is_the_first_in_module_order(tmp_path):
    """Layers stored out of module order (``blocks.10`` before ``blocks.2``, one name of another
    shape): the first failure a group without W4A8 names is the first layer in module order."""
    from builders import fp8_layer, w4a8_layer, write
    from comfyquant.checkpoint import open_checkpoint
    from comfyquant.targets.base import Verdict
    from comfyquant.targets.kitchen import kitchen_verdict

    names = [f"blocks.{i}.attn.qkv" for i in (10, 2, 33, 1, 7, 12, 5, 9, 3)] + ["blocks.0.ff.up", "final.linear"]
    parts = [w4a8_layer(n) if i % 2 == 0 else fp8_layer(n) for i, n in enumerate(names)]
    ckpt = open_checkpoint([write(tmp_path / "order.safetensors", *parts)])
    newest = kitchen_verdict(ckpt)
    group = product.group_of("0.2.20")  # FP8 but no W4A8 layout
    fast = product.GroupVerdict(group, ckpt, newest).first
    whole = Verdict("comfy-kitchen", product.release_verdict(group, ckpt, newest).violations).first
    assert fast is not None and whole is not None
    assert (fast.layer, fast.message) == (whole.layer, whole.message)
    assert fast.layer == "blocks.3.attn.qkv"  # the W4A8 layers: blocks 10, 33, 7, 5, 3 and final.linear
