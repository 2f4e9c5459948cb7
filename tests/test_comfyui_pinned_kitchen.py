"""``check``'s default ComfyUI verdict is ComfyUI 0.33.0's with the comfy-kitchen it pins
(0.2.31), and it equals what that release does with that comfy-kitchen on every case of the
generated single-layer space, on each case as one layer of a whole checkpoint, and on files of
two defective layers (the spaces ``test_runtime_agreement_comfyui`` proves the comfy-kitchen
0.2.40 pairing on; the whole models are ``test_comfyui_releases_whole_model``'s).  The release
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
from runtimes.agreement import summary, table, write_pairs, write_space  # noqa: E402
from runtimes.release_agreement import compare_space  # noqa: E402


@pytest.fixture(scope="module")
def root():
    return releases.releases_root_or_skip()


def test_the_default_is_the_pinned_pairing():
    assert NEWEST.first == runtime_sources.COMFYUI_VERSION and NEWEST.kitchen == "0.2.31" and NEWEST.pinned


@pytest.mark.parametrize("space", ["single layers", "each case in a whole checkpoint", "two defective layers a file"])
def test_default_verdicts_agree_with_the_pinned_comfy_kitchen(root, tmp_path_factory, space):
    """Every case agrees (loads / FAILS with the same exception and message / FAILS silently),
    with no list of known disagreements: on two layers, the pinned W4A8 forward error of one
    layer placed in module order among the other's errors."""
    start = time.monotonic()
    folder = tmp_path_factory.mktemp("comfyui-pinned-cases")
    if space.startswith("two"):
        cases = write_pairs(folder)
    else:
        cases = write_space(folder, checkpoint=space.startswith("each"))
    written = time.monotonic() - start
    rows, driven = compare_space(root, NEWEST, cases, None)
    print(
        f"\nComfyUI {NEWEST.first} ({NEWEST.kitchen_text}), {space}: {summary(rows)}; "
        f"{driven} driven; {time.monotonic() - start:.1f}s ({written:.1f}s writing the cases)"
    )
    assert len(rows) >= (400 if space.startswith("two") else 3000)
    bad = [r for r in rows if r.why is not None]
    assert not bad, f"ComfyUI {NEWEST.first} with {NEWEST.kitchen_text}: {summary(rows)}\n{table(bad)}"
