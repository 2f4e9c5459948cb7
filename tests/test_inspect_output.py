"""``inspect`` output a person can read: a table that fits the terminal (least useful columns
dropped first, and said so), formats coloured on a terminal only, ``__metadata__`` and the
per-tensor list on request, and JSON whose values are data, not display strings."""

from __future__ import annotations

import io
import json
import os

from builders import dense_layer, fp8_layer, header_markers, int8_layer, w4a8_layer, write
from comfyquant.cli import main
from comfyquant.inspection import inspect
from comfyquant.render import render_inventory

LONG = "model.diffusion_model.double_blocks.18.img_attn.proj"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def sample(tmp_path) -> str:
    layers = [
        w4a8_layer(LONG),
        int8_layer("model.diffusion_model.single_blocks.37.linear2"),
        fp8_layer("a.fp8"),
        dense_layer("final_layer.linear"),
    ]
    return write(tmp_path / "m.safetensors", *layers, metadata={"modelspec.title": "x" * 500, **header_markers({})})


def test_table_fits_80_columns_and_says_what_it_left_out(tmp_path):
    inv = inspect(sample(tmp_path))
    full = render_inventory(inv)
    assert max(len(line) for line in full.splitlines()) > 80  # the full table does not fit
    text = render_inventory(inv, width=80)
    table = text.split("\n\n")[0].splitlines()
    assert all(len(line) <= 80 for line in table), max(table, key=len)
    assert "dtypes" not in table[1] and "layer" in table[1] and "bits/w" in table[1]
    assert "--wide shows every column" in text
    assert LONG not in text and "model.diffus...locks.18.img_attn.proj" in text  # the long name lost its middle
    assert "double_blocks.18.img_attn.proj"[-15:] in text


def test_formats_are_coloured_on_a_terminal_only(tmp_path, monkeypatch):
    inv = inspect(sample(tmp_path))
    monkeypatch.delenv("NO_COLOR", raising=False)
    coloured = render_inventory(inv, stream=Tty())
    assert "\033[36masym_w4a8_int8" in coloured and "\033[2mdense" in coloured
    assert "\033[" not in render_inventory(inv, stream=io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\033[" not in render_inventory(inv, stream=Tty())


def test_metadata_and_tensors_on_request(tmp_path, capsys):
    path = sample(tmp_path)
    assert main(["inspect", path, "--metadata", "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "metadata of" in out and "modelspec.title = xxx" in out and "(500 chars)" not in out  # not a tty: whole
    assert f"{LONG}.weight_codebook" in out and "F32" in out
    assert main(["inspect", path, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "metadata" not in plain and "tensors" not in plain
    assert main(["inspect", path, "--json", "--metadata", "--tensors"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["metadata"][path]["modelspec.title"] == "x" * 500
    names = {t["name"]: t for t in doc["tensors"]}
    assert names[f"{LONG}.weight"]["layer"] == LONG and names[f"{LONG}.weight"]["dtype"] == "I8"


def test_json_layers_carry_the_marker_and_tensors_as_data(tmp_path, capsys):
    path = sample(tmp_path)
    assert main(["inspect", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == 2
    rows = {r["layer"]: r for r in doc["layers"]}
    row = rows[LONG]
    assert row["marker"]["format"] == "asym_w4a8_int8" and isinstance(row["marker"], dict)
    dtypes = {d["tensor"]: d for d in row["dtypes"]}
    assert dtypes["weight_s_rel"] == {"tensor": "weight_s_rel", "dtype": "F8_E4M3", "shape": [32, 256 // 16]}
    assert row["params"] == {k: v for k, v in row["marker"].items() if k != "format"} and row["params"]["convrot"]
    assert isinstance(row["params_text"], str) and "G=16" in row["params_text"]
    assert rows["final_layer.linear"]["marker"] is None and rows["final_layer.linear"]["params"] == {}


def test_long_metadata_values_are_cut_to_the_width(tmp_path):
    inv = inspect(sample(tmp_path))
    text = render_inventory(inv, width=80, metadata=True)
    line = next(x for x in text.splitlines() if "modelspec.title" in x)
    assert len(line) <= 80 and "(500 chars)" in line
    assert os.path.basename(inv.files[0]) in text
