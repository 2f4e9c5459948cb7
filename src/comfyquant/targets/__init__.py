"""Runtime target profiles: what SGLang, ComfyUI and comfy-kitchen do with a checkpoint.

Each profile walks the checkpoint in the runtime's own order and lists every violation it
would hit; the first one that stops loading is the error the runtime raises.
"""

from .base import Verdict, Violation
from .select import TARGETS, run_target

__all__ = ["TARGETS", "Verdict", "Violation", "run_target"]
