"""How torch's OpenMP threads wait between parallel regions: passively, on a shared machine.

Every torch elementwise operation on a large tensor is an OpenMP parallel region, and each
ends in a barrier.  By default libgomp's threads spin at a barrier for a while (some 300,000
iterations) before they sleep.  When the cores are shared with other processes, the thread
a barrier waits for is often not running, and the waiting one spins away its time slice
instead of handing the core over (bench/codec_speed.py prints the policy beside its rates; the
README's numerics section has the measurement).  On an idle machine the passive policy costs a
wake-up per region, microseconds against a decode block's milliseconds.

libgomp (and Intel's OpenMP) read the variable once, when torch loads them, so
``prefer_passive_waits`` must run before ``import torch``; the command line calls it
first thing.  A value the user set is kept.  This module imports nothing heavy.
"""

from __future__ import annotations

import os
import sys


def prefer_passive_waits() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless it is set or torch is already loaded (then it
    would have no effect).  True when the policy is passive for the torch to come."""
    if "torch" in sys.modules:
        return False
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return os.environ["OMP_WAIT_POLICY"].upper() == "PASSIVE"
