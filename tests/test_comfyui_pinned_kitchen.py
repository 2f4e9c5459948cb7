"""``check``'s default ComfyUI verdict is ComfyUI 0.33.0's with the comfy-kitchen it pins
(0.2.31), and it equals what that release does with that comfy-kitchen on every case of the
generated single-layer space, and on each case as one layer of a whole checkpoint (the spaces
``test_runtime_agreement_comfyui`` proves the comfy-kitchen 0.2.40 pairing on).  The release
runs from the releases tarball with comfy-kitchen 0.2.31 installed beside it
(``runtimes.comfyui_release_driver``); its outcomes are cached per file
(``runtimes.release_agreement``), so a run after the first drives nothing."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch", reason="the generated cases and the runtimes need torch")

import runtime_sources  # noqa: E402
from comfyquant.targets.comfyui_releases import NEWEST  # noqa: E402
from runtimes import releases  # noqa: E402
from runtimes.agreement import summary, table, write_space  # noqa: E402
from runtimes.release_agreement import compare_space  # noqa: E402


@pytest.fixture(scope="module")
def root():
    return releases.releases_root_or_skip()


def test_the_default_is_the_pinned_pairing():
    assert NEWEST.first == runtime_sources.COMFYUI_VERSION and NEWEST.kitchen == "0.2.31" and NEWEST.pinned


@pytest.mark.parametrize("checkpoint", [False, True], ids=["single-layer", "whole-checkpoint"])
def test_default_verdicts_agree_with_the_pinned_comfy_kitchen(root, tmp_path_factory, checkpoint):
    """Every case agrees (loads / FAILS with the same exception and message / FAILS silently),
    with no list of known disagreements."""
    start = time.monotonic()
    cases = write_space(tmp_path_factory.mktemp("comfyui-pinned-cases"), checkpoint=checkpoint)
    written = time.monotonic() - start
    rows, driven = compare_space(root, NEWEST, cases, None)
    space = "each case in a whole checkpoint" if checkpoint else "single layers"
    print(
        f"\nComfyUI {NEWEST.first} ({NEWEST.kitchen_text}), {space}: {summary(rows)}; "
        f"{driven} driven; {time.monotonic() - start:.1f}s ({written:.1f}s writing the cases)"
    )
    assert len(rows) > 3000
    bad = [r for r in rows if r.why is not None]
    assert not bad, f"ComfyUI {NEWEST.first} with {NEWEST.kitchen_text}: {summary(rows)}\n{table(bad)}"
