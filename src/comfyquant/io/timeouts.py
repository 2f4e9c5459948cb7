"""What a remote read's ``timeout`` may be: a positive, finite number of seconds, at most a week.

Shared by ``--timeout`` (argparse refuses the rest in one line) and ``RemoteOptions``
(the Python API refuses it with ``ValueError``): ``inf`` or ``1e308`` overflow the clocks the
waits are computed on, ``nan`` compares false with every clock and ends each wait at once, and
zero or a negative number can never be met.  A torch-free base module: ``check`` imports it.
"""

from __future__ import annotations

import math

MIN_TIMEOUT = 0.001
"""The shortest timeout, in seconds: anything shorter cannot see one answer."""
MAX_TIMEOUT = 7 * 24 * 3600.0
"""The longest timeout, in seconds (a week): finite on every clock and wait call."""


def timeout_problem(value) -> str | None:
    """Why ``value`` cannot be a timeout (a phrase), or None when it can."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number of seconds, got {value!r}"
    if not math.isfinite(value):
        return f"must be a finite number of seconds, got {value!r}"
    if value < MIN_TIMEOUT:
        return f"must be at least {MIN_TIMEOUT:g} s, got {value!r}"
    if value > MAX_TIMEOUT:
        return f"must be at most {MAX_TIMEOUT:g} s (a week), got {value!r}"
    return None
