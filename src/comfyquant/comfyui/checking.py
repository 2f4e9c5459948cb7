"""The Check node's report: the very text ``comfyquant check PATH --target T`` prints."""

from __future__ import annotations


def report_text(path: str, targets: str) -> str:
    from ..checker.run import check_checkpoint, parse_targets
    from ..dialects.containers import open_any
    from ..errors import InputError
    from ..render import render_report

    try:
        parse_targets(targets)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    with open_any(path) as ckpt:
        report = check_checkpoint(ckpt, target=targets)
    return render_report(report)
