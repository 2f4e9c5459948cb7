"""Severity follows the verdicts on the whole generated defect space: for each runtime
selected alone, the report has an error finding exactly when that runtime's verdict says the
file FAILS (raises or computes garbage).  With the agreement tests, which hold each verdict
to what the real runtime does on the same files, a finding is an error exactly when the
selected runtime raises or computes garbage as measured."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the generated cases need torch")

import comfyquant  # noqa: E402
from comfyquant.errors import InputError  # noqa: E402
from comfyquant.targets.select import TARGETS  # noqa: E402
from runtimes.agreement import write_space  # noqa: E402


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_space(tmp_path_factory.mktemp("severity-cases"))


@pytest.mark.parametrize("target", TARGETS)
def test_an_error_exactly_when_the_selected_runtime_fails(written, target):
    judged, wrong = 0, []
    for case in written:
        try:
            report = comfyquant.check(str(case.path), target=target, deep=case.deep)
        except InputError:
            continue  # refused in one line: no report, no severities
        judged += 1
        errors = [f.code for f in report.findings if f.severity == "error"]
        if bool(errors) == report.verdicts[target].loads:
            wrong.append(f"{case.id}: errors {errors}, loads {report.verdicts[target].loads}")
    assert judged > 3000
    assert wrong == [], "\n".join(wrong[:20])
