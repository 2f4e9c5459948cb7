"""comfyquant's verdict on each ComfyUI release group equals what that release's own code does
with every case of the generated single-layer space written as one layer of a whole checkpoint
(the diffusion-model prefix on every key, dense layers beside it, a header map named with the
prefix where the case has one): where each release strips the prefix and matches the map's
names, and builds plain the layers it reads no marker for.  One ``check`` per file gives every
group's verdict; each group is driven by its oldest release with the comfy-kitchen it pins (or
its minimum), and the releases sharing its deciding code share its results.

No case is listed as differing: every disagreement fails.  Outcomes are cached per group and
file (``runtimes.release_agreement.outcomes``): a first run drives 28 releases on 3,738 files,
two at a time (forked workers, a few minutes); later runs drive nothing."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch", reason="the generated cases and the runtimes need torch")

from comfyquant.targets.comfyui_releases import GROUPS  # noqa: E402
from runtimes import releases  # noqa: E402
from runtimes.agreement import summary, table, write_space  # noqa: E402
from runtimes.release_agreement import compare_expected, drive_groups, release_expectations  # noqa: E402


@pytest.fixture(scope="module")
def root():
    return releases.releases_root_or_skip()


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    return write_space(tmp_path_factory.mktemp("comfyui-release-checkpoints"), checkpoint=True)


@pytest.fixture(scope="module")
def expectations(space):
    return {case.id: release_expectations(case) for case in space}


@pytest.fixture(scope="module")
def driven(root, space):
    start = time.monotonic()
    found = drive_groups(root, GROUPS, space)
    print(f"\n{len(GROUPS)} ComfyUI release groups on {len(space)} checkpoints: {time.monotonic() - start:.1f}s")
    return found


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.first)
def test_release_verdicts_agree_on_whole_checkpoints(space, expectations, driven, group):
    got, count = driven[group.first]
    rows = compare_expected(space, got, expectations, group.first)
    assert len(rows) > 3000
    assert all(c.id.startswith("ckpt.") for c in space)
    shared = f"; {', '.join(group.releases[1:])} share these results" if len(group.releases) > 1 else ""
    print(f"\nComfyUI {group.first} ({group.kitchen_text}): {summary(rows)}; {count} driven{shared}")
    bad = [r for r in rows if r.why is not None]
    assert not bad, f"ComfyUI {group.first}: {len(bad)} whole checkpoints disagree\n{table(bad, 40)}"
