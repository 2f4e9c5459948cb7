"""Names from a file reach the terminal escaped: an ESC in a tensor name must not set the
window title or clear the screen, on stdout (every text renderer) or stderr (warnings and
error lines).  ``--json`` escapes them through JSON and keeps the names intact."""

import json

import pytest

import builders as b
from comfyquant.cli import main

TITLE = "\x1b]0;PWNED\x07"
CLEAR = "\x1b[2J"
HOSTILE = TITLE + CLEAR + "\x9b1m\u202e"
"""Set the window title, clear the screen, a C1 control sequence introducer, a
right-to-left override."""


def _raw_controls(text: str) -> list[str]:
    return [ch for ch in text if (ord(ch) < 32 and ch not in "\n") or 0x7F <= ord(ch) <= 0x9F or ch == "\u202e"]


@pytest.fixture
def hostile(tmp_path):
    broken = b.write(
        tmp_path / "broken.safetensors",
        b.int8_layer("blk" + HOSTILE + ".a", scale_shape=(1, 32)),
        b.w4a8_layer("w" + HOSTILE + ".x", marker=False),
        b.dense_layer("dense" + HOSTILE),
        metadata={"note" + HOSTILE: "value" + HOSTILE},
    )
    healthy = b.write(tmp_path / "healthy.safetensors", b.fp8_layer("blk" + HOSTILE + ".b"), b.dense_layer("d" + HOSTILE))
    return broken, healthy


def _run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_printable_escapes_controls_and_keeps_the_rest():
    from comfyquant.naming import printable

    assert printable("blk" + TITLE + ".a") == "blk\\x1b]0;PWNED\\x07.a"
    assert printable("a\u202eb\x9bc\x7f") == "a\\u202eb\\x9bc\\x7f"
    assert printable("layer.weight ünïcode 层") == "layer.weight ünïcode 层"
    assert printable("a\nb\tc", keep="\n") == "a\nb\\x09c"


@pytest.mark.parametrize(
    "args",
    [
        ["check"],
        ["check", "-v"],
        ["inspect"],
        ["inspect", "--tensors", "--metadata", "--wide"],
        ["fix", "--dry-run"],
        ["recipe"],
        ["migrate", "--dry-run"],
    ],
    ids=lambda a: " ".join(a),
)
def test_header_only_commands_print_names_escaped(hostile, capsys, args):
    broken, _healthy = hostile
    code, out, err = _run(capsys, *args, broken)
    assert code in (0, 1, 2)
    assert _raw_controls(out) == [], out
    assert _raw_controls(err) == [], err
    assert "\\x1b]0;PWNED\\x07" in out + err  # the name is still there, readable


def test_the_inventory_table_stays_aligned(hostile, capsys):
    broken, _healthy = hostile
    _code, out, _err = _run(capsys, "inspect", "--wide", broken)
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("layer "))
    rule = lines[head + 1]
    rows = lines[head + 2 : head + 5]
    start = rule.index("  -") + 2  # the second column starts at the same place on every row
    assert all(row[start - 2 : start] == "  " and row[start] != " " for row in rows), rows


def test_error_lines_on_stderr_are_escaped(tmp_path, capsys):
    missing = tmp_path / ("gone" + HOSTILE + ".safetensors")
    code, out, err = _run(capsys, "check", missing)
    assert code == 2
    assert _raw_controls(err) == [], err
    assert len(err.splitlines()) == 1 and "gone\\x1b]0;PWNED" in err


def test_json_keeps_the_names_intact(hostile, capsys):
    broken, _healthy = hostile
    _code, out, _err = _run(capsys, "inspect", "--json", broken)
    assert _raw_controls(out) == []
    names = [row["layer"] for row in json.loads(out)["layers"]]
    assert "blk" + HOSTILE + ".a" in names


@pytest.mark.needs_torch
def test_decoding_commands_print_names_escaped(hostile, tmp_path, capsys):
    _broken, healthy = hostile
    dense = tmp_path / "dense.safetensors"
    for args in (
        ["dequantize", healthy, dense],
        ["compare", healthy, dense],
        ["quantize", dense, tmp_path / "q.safetensors", "--format", "float8_e4m3fn"],
        ["quantize", dense, tmp_path / "q2.safetensors", "--format", "float8_e4m3fn", "--dry-run"],
    ):
        code, out, err = _run(capsys, *args)
        assert code in (0, 1), (args, err)
        assert _raw_controls(out) == [], (args, out)
        assert _raw_controls(err) == [], (args, err)


@pytest.mark.parametrize("args", [["check"], ["check", "-v"], ["inspect", "--tensors"], ["fix", "--dry-run"]], ids=" ".join)
def test_a_line_break_in_a_name_cannot_forge_a_line(tmp_path, capsys, args):
    forged = "blk\nERROR C999 forged\r"
    path = b.write(tmp_path / "m.safetensors", b.int8_layer(forged, scale_shape=(1, 32)), b.dense_layer("d\n\tx"))
    _code, out, err = _run(capsys, *args, path)
    assert not any(line.startswith("ERROR C999") for line in (out + err).splitlines()), out
    assert "blk\\x0aERROR C999 forged\\x0d" in out


@pytest.mark.needs_torch
def test_decoding_commands_cannot_be_forged_a_line_either(tmp_path, capsys):
    src = b.write(tmp_path / "m.safetensors", b.fp8_layer("blk\nERROR C999 forged"), b.dense_layer("d\nFAKE LINE"))
    dense = tmp_path / "dense.safetensors"
    for args in (
        ["dequantize", src, dense],
        ["compare", src, dense],
        ["quantize", dense, tmp_path / "q.safetensors", "--format", "float8_e4m3fn", "-v"],
        ["quantize", dense, tmp_path / "q2.safetensors", "--format", "float8_e4m3fn", "--dry-run"],
    ):
        code, out, err = _run(capsys, *args)
        assert code in (0, 1), (args, err)
        lines = (out + err).splitlines()
        assert not any(line.startswith(("ERROR C999", "FAKE LINE")) for line in lines), (args, out)
