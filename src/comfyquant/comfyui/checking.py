"""The Check node's report: the very text ``comfyquant check PATH --target T`` prints, built by
the same ``build_report``, so a file whose header cannot be read is reported, not refused."""

from __future__ import annotations


def report_text(path: str, targets: str) -> str:
    from ..checker.run import CheckOptions, build_report, parse_targets
    from ..errors import InputError
    from ..render import render_report

    try:
        parse_targets(targets)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return render_report(build_report(path, CheckOptions(targets)))
