"""comfyquant's verdict on each ComfyUI release group equals what that release's own code does
(with the comfy-kitchen it pins, or its minimum) on the whole generated single-layer space:
every defect of every format, in each marker form, damaged containers and header maps; and on
each case of it written as one layer of a whole checkpoint (the diffusion-model prefix on every
key, dense layers beside it, a header map named with the prefix where the case has one), where
each release strips the prefix and matches the map's names and builds plain the layers it reads
no marker for.  One ``check`` per case gives every group's verdict (``release_expectations``);
each group is driven by its oldest release, and the releases sharing its deciding code share
its results (printed).

The single-layer cases where the per-release model is known to differ would be listed per group
in ``runtimes/known/comfyui.releases.txt`` (``tools/prove_releases.py --space single
--write-known``); none is listed for the checkpoints.  A disagreement not listed fails, and so
does a listed case that agrees, so the list only shrinks as the model learns.  Outcomes are
cached per group and file (``runtimes.release_agreement.outcomes``): a first run drives 28
releases on 3,873 files and on 3,738 checkpoints, two at a time; later runs drive nothing."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch", reason="the generated cases and the runtimes need torch")

from comfyquant.targets.comfyui_releases import GROUPS  # noqa: E402
from runtimes import releases  # noqa: E402
from runtimes.agreement import summary, table, write_space  # noqa: E402
from runtimes.release_agreement import (  # noqa: E402
    compare_expected,
    drive_groups,
    known_release_disagreements,
    release_expectations,
)


@pytest.fixture(scope="module")
def root():
    return releases.releases_root_or_skip()


@pytest.fixture(scope="module", params=("single", "checkpoint"))
def space(request, tmp_path_factory):
    checkpoint = request.param == "checkpoint"
    return write_space(tmp_path_factory.mktemp(f"comfyui-release-{request.param}"), checkpoint=checkpoint)


@pytest.fixture(scope="module")
def expectations(space):
    return {case.id: release_expectations(case) for case in space}


@pytest.fixture(scope="module")
def driven(root, space):
    start = time.monotonic()
    found = drive_groups(root, GROUPS, space)
    print(f"\n{len(GROUPS)} ComfyUI release groups on {len(space)} cases: {time.monotonic() - start:.1f}s")
    return found


KNOWN = known_release_disagreements()


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.first)
def test_release_verdicts_agree_on_the_space(space, expectations, driven, group):
    got, count = driven[group.first]
    rows = compare_expected(space, got, expectations, group.first)
    assert len(rows) > 3000
    checkpoints = {c.id.startswith("ckpt.") for c in space}
    assert len(checkpoints) == 1
    known = set() if checkpoints.pop() else KNOWN.get(group.first, set())
    shared = f"; {', '.join(group.releases[1:])} share these results" if len(group.releases) > 1 else ""
    print(f"\nComfyUI {group.first} ({group.kitchen_text}): {summary(rows)}; {len(known)} known; {count} driven{shared}")
    new = [r for r in rows if r.why is not None and r.case.id not in known]
    assert not new, f"ComfyUI {group.first}: {len(new)} disagreements not in the known list\n{table(new, 40)}"
    mended = sorted({r.case.id for r in rows if r.why is None} & known)
    assert not mended, f"ComfyUI {group.first}: listed as differing but agreeing (remove them): {mended[:20]}"
