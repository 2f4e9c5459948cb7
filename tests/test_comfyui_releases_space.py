"""comfyquant's verdict on each ComfyUI release group equals what that release's own code does
(with the comfy-kitchen it pins, or its minimum) on the whole generated single-layer space:
every defect of every format, in each marker form, damaged containers and header maps.  One
``check`` per case gives every group's verdict (``release_expectations``); each group is driven
by its oldest release, and the releases sharing its deciding code share its results (printed).

The cases where the per-release model is known to differ are listed per group in
``runtimes/known/comfyui.releases.txt`` (``tools/prove_releases.py --space single
--write-known``): a disagreement not listed fails, and so does a listed case that agrees, so
the list only shrinks as the model learns.  Outcomes are cached per group and file
(``runtimes.release_agreement.outcomes``): a first run drives 28 releases on 3,873 files each,
two at a time; later runs drive nothing."""

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


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    return write_space(tmp_path_factory.mktemp("comfyui-release-space"))


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
    known = KNOWN.get(group.first, set())
    shared = f"; {', '.join(group.releases[1:])} share these results" if len(group.releases) > 1 else ""
    print(f"\nComfyUI {group.first} ({group.kitchen_text}): {summary(rows)}; {len(known)} known; {count} driven{shared}")
    new = [r for r in rows if r.why is not None and r.case.id not in known]
    assert not new, f"ComfyUI {group.first}: {len(new)} disagreements not in the known list\n{table(new, 40)}"
    mended = sorted({r.case.id for r in rows if r.why is None} & known)
    assert not mended, f"ComfyUI {group.first}: listed as differing but agreeing (remove them): {mended[:20]}"
