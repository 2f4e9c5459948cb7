"""What a runtime did with one file, and how that compares with comfyquant's verdict.

Every driver returns an ``Outcome``; ``expected(verdict)`` reads comfyquant's verdict (the
dict of ``Verdict.to_dict()``) as the outcome it predicts, and ``disagreement`` says in one
short line where the two differ (None when they agree).  Agreement is on three classes:

* ``raises``: the runtime raises; comfyquant says FAILS with the same exception type and
  message (compared exactly);
* ``garbage``: the runtime runs without an error but its output is non-finite or its relative
  error against the dense source is at least ``GARBAGE``; comfyquant says FAILS silently (no
  exception);
* ``undefined``: the runtime runs with a parameter the file did not fill (ComfyUI logs
  ``unet missing: [...]`` and computes with uninitialised memory): judged as ``garbage``;
* ``ok`` / ``degraded``: the runtime computes (``degraded``: clearly worse than the format's
  usual error, still useful); comfyquant says it loads.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

STATUSES = ("raises", "garbage", "undefined", "degraded", "ok")
STAGES = ("read", "convert", "detect", "load", "forward")

GARBAGE = 0.9
"""Relative output error (``|y - y_ref| / |y_ref|``, Frobenius) from which an output is garbage."""


@dataclass(frozen=True)
class Outcome:
    status: str
    """One of ``STATUSES``."""
    stage: str | None = None
    """Where it raised (one of ``STAGES``), None when it did not."""
    exception: str | None = None
    """The raised exception's type name (``type(exc).__name__``)."""
    message: str = ""
    """The raised exception's message (``str(exc)``), or what made the output garbage."""
    layer: str | None = None
    """The layer that raised or computed garbage (None for file-level failures)."""
    error: float | None = None
    """The measured relative output error of the worst layer, when the file computed."""
    model_error: float | None = None
    """The whole model's relative output error against the dense model's (whole-model drivers)."""
    architecture: str | None = None
    """What the runtime detected the file as (whole-model drivers), None when it did not."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Outcome.status must be one of {STATUSES}, got {self.status!r}")
        if self.stage is not None and self.stage not in STAGES:
            raise ValueError(f"Outcome.stage must be one of {STAGES} or None, got {self.stage!r}")

    @property
    def kind(self) -> str:
        """The class agreement is judged on: ``raises``, ``garbage`` (``undefined`` too) or ``loads``."""
        if self.status in ("ok", "degraded"):
            return "loads"
        return "garbage" if self.status == "undefined" else self.status

    def to_dict(self) -> dict:
        return asdict(self)

    def short(self) -> str:
        if self.status == "raises":
            return f"raises {self.exception}: {self.message}"
        if self.status in ("garbage", "undefined"):
            return f"{self.status} ({self.message})" if self.message else self.status
        return self.status if self.error is None else f"{self.status} (err {self.error:.3g})"


@dataclass(frozen=True)
class Expected:
    """comfyquant's verdict for one runtime, as an outcome class."""

    kind: str
    """``raises`` (FAILS with an exception), ``garbage`` (FAILS silently) or ``loads``."""
    exception: str | None = None
    message: str | None = None
    layer: str | None = None

    def short(self) -> str:
        if self.kind == "raises":
            return f"raises {self.exception}: {self.message}"
        return "garbage" if self.kind == "garbage" else "loads"


UNREADABLE = Expected("unreadable")
"""comfyquant gave no verdict (the check refused the input)."""


def expected(verdict: dict | None) -> Expected:
    """comfyquant's prediction from ``Verdict.to_dict()`` (None: no report)."""
    if verdict is None:
        return UNREADABLE
    if verdict["loads"]:
        return Expected("loads")
    if verdict.get("exception"):
        return Expected("raises", verdict["exception"], verdict["error"], verdict.get("layer"))
    return Expected("garbage", None, verdict.get("error"), verdict.get("layer"))


def with_newer_kitchen(verdict: dict | None) -> dict | None:
    """A ComfyUI verdict (``to_dict()``) as ComfyUI 0.33.0 gives it with comfy-kitchen 0.2.40,
    the pairing the ComfyUI drivers run: ``check``'s default is the comfy-kitchen 0.33.0 pins,
    and its ``newer_kitchen`` holds the 0.2.40 verdict where that one differs."""
    newer = (verdict or {}).get("newer_kitchen")
    return verdict if newer is None else {**verdict, **newer}


STATE_DICT = "Error(s) in loading state_dict for "


def _sorted_sets(message: str) -> str:
    """``{b, a}`` -> ``{a, b}``: comfy-kitchen prints the dtypes an op accepts as a Python set
    of ``torch.dtype``, whose order changes from one process to the next."""
    return re.sub(r"\{([^{}]*)\}", lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", message)


_MATMUL_ROWS = re.compile(r"(mat1 and mat2 shapes cannot be multiplied \(|Target sizes: \[)(?:\d+|M)(x|, )")
"""The rows of a matmul's or a bias expansion's input: the tokens the model was given, not
anything in the file."""


def comparable(message: str | None) -> str | None:
    """The part of a message a file can predict, in a canonical form: torch's
    ``load_state_dict`` error opens with the model's class name (``Error(s) in loading
    state_dict for Flux:``), which depends on the model, not the file (the lines after it name
    the tensors); a matmul's or a bias expansion's message names its input's rows, which the input decides (a
    verdict writes them ``M``); sets are compared whatever their printing order."""
    if message is None:
        return None
    if message.startswith(STATE_DICT) and ":\n\t" in message:
        message = message.split(":\n\t", 1)[1]
    message = _MATMUL_ROWS.sub(r"\1M\2", message)
    return _sorted_sets(message)


def disagreement(outcome: Outcome, predicted: Expected) -> str | None:
    """None when comfyquant's verdict matches what the runtime did, else why not (short)."""
    if outcome.kind != predicted.kind:
        return f"{predicted.kind} vs {outcome.kind}"
    if outcome.kind == "raises":
        if predicted.exception != outcome.exception:
            return f"exception {predicted.exception} vs {outcome.exception}"
        if comparable(predicted.message) != comparable(outcome.message):
            return "message differs"
    return None
