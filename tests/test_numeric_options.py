"""Numeric options take only the numbers that mean something: a count, a size or a number
of seconds that is ``nan``, infinite, zero or negative is a one-line usage error (exit 2)
before any work, on the command line and in the Python API."""

import pytest

import builders as b
import comfyquant
from comfyquant.cli import main
from comfyquant.errors import InputError
from comfyquant.io.remote import RemoteOptions

URL = "http://127.0.0.1:9/never-contacted.safetensors"
"""Refused at argument parsing, so nothing listens there and nothing is asked."""


def _usage_error(capsys, args) -> str:
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert "Traceback" not in err and "internal error" not in err
    return err


@pytest.mark.parametrize("command", ["check", "inspect"])
@pytest.mark.parametrize("value", ["inf", "nan", "1e308", "1e999", "0", "-1", "-0.0", "abc"])
def test_timeout_takes_a_positive_finite_number_of_seconds(capsys, command, value):
    err = _usage_error(capsys, [command, f"--timeout={value}", URL])
    assert err.startswith(f"comfyquant {command}: error: argument --timeout: ")


def test_timeout_accepts_what_a_user_means(tmp_path, capsys):
    src = b.write(tmp_path / "m.safetensors", b.fp8_layer("blk.0"))
    for value in ("0.5", "30", "3600", "604800"):
        assert main(["check", f"--timeout={value}", src]) == 0
        capsys.readouterr()


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e308, 0, -5, "30", True])
def test_remote_options_refuse_a_meaningless_timeout(value):
    with pytest.raises(ValueError, match="timeout"):
        RemoteOptions(timeout=value)


def test_a_timeout_set_after_construction_is_refused_before_any_read():
    opts = RemoteOptions()
    opts.timeout = float("inf")
    with pytest.raises(ValueError, match="timeout must be a finite number"):
        comfyquant.open_checkpoint(URL, remote=opts)


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--gap", "-1"],
        ["check", "--gap", "1e99"],
        ["check", "--gap", "nan"],
        ["check", "-r", "--jobs", "0"],
        ["check", "-r", "--jobs", "nan"],
        ["check", "-r", "--jobs", "inf"],
        ["inspect", "--gap", "-5"],
    ],
    ids=" ".join,
)
def test_counts_and_sizes_are_whole_and_in_range(tmp_path, capsys, args):
    src = b.write(tmp_path / "m.safetensors", b.fp8_layer("blk.0"))
    err = _usage_error(capsys, [*args, src])
    assert "error: argument" in err


@pytest.mark.parametrize("value", ["-5", "0", "nan", "16.5"])
def test_fix_convrot_groupsize_is_a_positive_whole_number(tmp_path, capsys, value):
    src = b.write(tmp_path / "m.safetensors", b.w4a8_layer("blk.0", marker=False))
    _usage_error(capsys, ["fix", "--dry-run", "--convrot-groupsize", value, src])


@pytest.mark.parametrize("value", [-5, 0, 16.0, True])
def test_fix_api_refuses_a_meaningless_convrot_groupsize_in_its_keyword(tmp_path, value):
    src = b.write(tmp_path / "m.safetensors", b.w4a8_layer("blk.0", marker=False))
    with pytest.raises(InputError, match="^convrot_groupsize must be a positive whole number"):
        comfyquant.fix(src, dry_run=True, convrot_groupsize=value)
