"""The check ``fix`` and ``migrate`` make of a checkpoint they have open, before they plan."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from ..checker.run import Targets, check_checkpoint

if TYPE_CHECKING:
    from ..checker.report import Report
    from ..checkpoint import Checkpoint


def check_paused_gc(ckpt: Checkpoint, target: Targets = "all") -> Report:
    """``check_checkpoint`` of an open checkpoint with the cyclic GC paused: the report's
    thousands of small objects all live until it ends, so a collection would only rescan them."""
    gc.disable()
    try:
        return check_checkpoint(ckpt, target=target)
    finally:
        gc.enable()
