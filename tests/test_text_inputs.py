"""Text files a command reads beside checkpoints (rules files, shard indexes) that are not
UTF-8 text, a checkpoint given by mistake, NUL bytes, nesting too deep to parse: one line
naming the file, exit 2, nothing written."""

import os

import pytest

import builders as b
import comfyquant
from comfyquant.cli import main
from comfyquant.errors import InputError


@pytest.fixture
def dense(tmp_path):
    return b.write(tmp_path / "dense.safetensors", b.dense_layer("blk.0.a"), b.dense_layer("blk.0.b"))


def _bad_rules(tmp_path, dense):
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('[default]\nformat = "fp8"\n# caf\u00e9\n'.encode("latin-1"))
    utf16 = tmp_path / "utf16.toml"
    utf16.write_bytes('[default]\nformat = "fp8"\n'.encode("utf-16"))
    nul = tmp_path / "nul.toml"
    nul.write_bytes(b'[default]\nformat = "fp8\x00"\n')
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 50000 + "]" * 50000)
    return {
        str(latin1): "not UTF-8 text",
        str(utf16): "not UTF-8 text",
        dense: "it looks like a safetensors checkpoint",
        str(nul): "NUL bytes",
        str(deep): "nests too deeply",
    }


@pytest.mark.parametrize("command", ["quantize", "convert"])
def test_a_rules_file_that_is_not_text_is_one_line(tmp_path, capsys, dense, command):
    out = tmp_path / "out.safetensors"
    for rules, words in _bad_rules(tmp_path, dense).items():
        code = main([command, dense, str(out), "--rules", rules, "--dry-run"])
        err = capsys.readouterr().err
        assert code == 2, (rules, err)
        assert err.startswith(f"comfyquant: {rules}: ") and err.count("\n") == 1, err
        assert words in err and "internal error" not in err
        assert not os.path.exists(out)


def test_the_api_refuses_the_same_rules_files(tmp_path, dense):
    for rules, words in _bad_rules(tmp_path, dense).items():
        with pytest.raises(InputError, match=words):
            comfyquant.quantize(dense, str(tmp_path / "o.safetensors"), rules=rules, dry_run=True)


def test_a_rules_file_with_a_byte_order_mark_is_read(tmp_path, capsys, dense):
    rules = tmp_path / "bom.toml"
    rules.write_bytes('\ufeff[default]\nformat = "float8_e4m3fn"\n'.encode())
    assert main(["quantize", dense, str(tmp_path / "o.safetensors"), "--rules", str(rules), "--dry-run"]) == 0
    capsys.readouterr()


def test_a_shard_index_that_is_not_text_is_one_line(tmp_path, capsys):
    for name, data, words in (
        ("latin1", '{"weight_map": {"caf\u00e9": "a.safetensors"}}'.encode("latin-1"), "not UTF-8 text"),
        ("nul", b'{"weight_map": {}}\x00', "NUL bytes"),
    ):
        index = tmp_path / f"{name}.safetensors.index.json"
        index.write_bytes(data)
        for command in ("check", "inspect", "fix"):
            assert main([command, str(index)]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"comfyquant: {index}: ") and err.count("\n") == 1 and words in err, err
