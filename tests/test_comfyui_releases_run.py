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

from comfyquant.targets.comfyui_releases import GROUPS  # noqa: E402
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
