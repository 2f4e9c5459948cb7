"""``check --recursive``: grouping a folder tree into checkpoints, checking each (serially and
with --jobs), the summary lines, the table, JSON and exit codes."""

from __future__ import annotations

import json
import os

import pytest

from builders import dense_layer, fp8_layer, int8_layer, w4a8_layer, write, zeros
from comfyquant import check
from comfyquant.checker.batch import check_tree, discover, group
from comfyquant.checkpoint import open_checkpoint
from comfyquant.cli import main

P = "blocks.0.attn.qkv"


def shards_with_index(folder, stem="model", broken=False):
    os.makedirs(folder, exist_ok=True)
    a = write(os.path.join(folder, f"{stem}-00001-of-00002.safetensors"), w4a8_layer("blocks.0.q"), dense_layer("norm"))
    corr = zeros("BF16", (32, 16)) if broken else None
    b = write(os.path.join(folder, f"{stem}-00002-of-00002.safetensors"), w4a8_layer("blocks.1.q", correction=corr))
    wm = {}
    for f in (a, b):
        with open_checkpoint(f) as ck:
            wm.update(dict.fromkeys(ck.tensors, os.path.basename(f)))
    with open(os.path.join(folder, f"{stem}.safetensors.index.json"), "w") as fh:
        json.dump({"weight_map": wm}, fh)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    write(root / "good.safetensors", int8_layer("a"), int8_layer("b"), dense_layer("norm"))
    write(root / "seed.safetensors", w4a8_layer(P, correction=zeros("BF16", (32, 16))))
    shards_with_index(str(root / "flux"), broken=True)
    stems = root / "wan"
    stems.mkdir()
    write(stems / "wan-00001-of-00003.safetensors", int8_layer("blocks.0.a"))
    write(stems / "wan-00002-of-00003.safetensors", int8_layer("blocks.1.a"))  # 00003 is missing
    write(stems / "vae-00001-of-00002.safetensors", dense_layer("enc"))
    write(stems / "vae-00002-of-00002.safetensors", dense_layer("dec"))
    deep = root / "nested" / "deeper"
    deep.mkdir(parents=True)
    write(deep / "c.safetensors", fp8_layer("x"))
    (root / ".cache").mkdir()
    write(root / ".cache" / "hidden.safetensors", fp8_layer("x"))
    (root / "notes.txt").write_text("not a checkpoint")
    return str(root)


LABELS = [
    "flux/model.safetensors.index.json",
    "good.safetensors",
    "nested/deeper/c.safetensors",
    "seed.safetensors",
    "wan/vae-NNNNN-of-00002.safetensors",
    "wan/wan-NNNNN-of-00003.safetensors",
]


def test_grouping(tree):
    files = discover(tree)
    assert not any(".cache" in f or f.endswith(".txt") for f in files)
    groups = group(files, tree)
    assert [g.label for g in groups] == LABELS
    by = {g.label: g for g in groups}
    assert by["flux/model.safetensors.index.json"].paths == [os.path.join(tree, "flux", "model.safetensors.index.json")]
    wan = by["wan/wan-NNNNN-of-00003.safetensors"]
    assert [os.path.basename(p) for p in wan.paths] == ["wan-00001-of-00003.safetensors", "wan-00002-of-00003.safetensors"]
    assert [os.path.basename(p) for p in wan.missing] == ["wan-00003-of-00003.safetensors"]
    assert by["wan/vae-NNNNN-of-00002.safetensors"].missing == []


def test_group_rules_on_names():
    files = [
        "r/a/x.safetensors.index.json",
        "r/a/x-00001-of-00002.safetensors",
        "r/a/x-00002-of-00002.safetensors",
        "r/a/odd-00007-of-00002.safetensors",
        "r/a/y-1-of-2.safetensors",
        "r/b/y-2-of-2.safetensors",
    ]
    # the index cannot be read (it does not exist): it is its own checkpoint, its shards group by stem
    labels = [(g.label, len(g.paths), len(g.missing)) for g in group(files, "r")]
    assert labels == [
        ("a/odd-00007-of-00002.safetensors", 1, 0),
        ("a/x-NNNNN-of-00002.safetensors", 2, 0),
        ("a/x.safetensors.index.json", 1, 0),
        ("a/y-N-of-2.safetensors", 1, 1),
        ("b/y-N-of-2.safetensors", 1, 1),
    ]


def test_each_checkpoint_checked_like_alone(tree):
    result = check_tree([tree])
    assert [i.label for i in result.items] == LABELS
    by = {i.label: i for i in result.items}
    for label, alone in [
        ("flux/model.safetensors.index.json", os.path.join(tree, "flux")),
        ("seed.safetensors", os.path.join(tree, "seed.safetensors")),
        ("good.safetensors", os.path.join(tree, "good.safetensors")),
    ]:
        r, a = by[label].report.to_dict(), check(alone).to_dict()
        assert [f["code"] for f in r["findings"]] == [f["code"] for f in a["findings"]]
        assert r["targets"] == a["targets"]
    assert by["good.safetensors"].status == "ok"
    assert by["seed.safetensors"].status == "failed"
    wan = by["wan/wan-NNNNN-of-00003.safetensors"].report
    assert [f.code for f in wan.findings if f.code == "C011"] == ["C011"]
    assert "wan-00003-of-00003.safetensors is missing" in next(f.message for f in wan.findings if f.code == "C011")
    assert result.exit_code == 1
    s = result.summary()
    assert s["checkpoints"] == 6 and s["failed"] == 3 and s["ok"] == 3 and s["unreadable"] == 0
    assert s["targets"]["sglang"]["fails"] >= 2


def test_jobs_give_the_same_result_in_the_same_order(tree):
    one = check_tree([tree], jobs=1).to_dict()
    four = check_tree([tree], jobs=4).to_dict()
    for d in (one, four):
        for c in d["checkpoints"]:
            c.pop("seconds")
    assert one == four


def test_unreadable_checkpoint_and_missing_root(tree, tmp_path):
    (tmp_path / "models" / "corrupt.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    result = check_tree([tree, str(tmp_path / "nope")])
    bad = [i for i in result.items if i.status == "unreadable"]
    assert [i.label for i in bad] == [str(tmp_path / "nope")]
    assert "no such file or folder" in bad[0].error
    # a file whose header is not JSON gets a report: C009, and every runtime FAILS opening it
    (corrupt,) = [i for i in result.items if i.label == "corrupt.safetensors"]
    assert corrupt.status == "failed" and corrupt.error is None
    (c009,) = [f for f in corrupt.report.findings if f.code == "C009"]
    assert "header is not valid JSON" in c009.message and c009.message.startswith(str(tmp_path))
    assert all(v.first.exception == "SafetensorError" for v in corrupt.report.verdicts.values())
    assert result.exit_code == 2
    assert len(result.items) == len(LABELS) + 2  # the rest is still checked


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_text_lines_and_table(tree, capsys):
    rc, out, err = cli(capsys, "check", tree, "--recursive", "--jobs", "3")
    assert rc == 1 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("FAILED  flux/model.safetensors.index.json: 2 files, 3 layers, ")
    assert "sglang fails (ValueError: Comfy W4A8 layer 'blocks.1.q' has an incompatible correction tensor)" in lines[0]
    assert lines[1].startswith("OK      good.safetensors: 1 file, 3 layers, 0 errors")
    assert any(line.startswith("FAILED  wan/wan-NNNNN-of-00003.safetensors: 2 files") for line in lines)
    table_head = next(line for line in lines if line.startswith("checkpoint"))
    assert table_head.split() == [
        "checkpoint",
        "files",
        "layers",
        "errors",
        "warnings",
        "sglang",
        "comfyui",
        "comfy-kitchen",
        "requests",
        "read",
    ]
    assert lines[-1].startswith("6 checkpoints: 3 OK, 3 FAILED; loads: sglang ")
    rc, out, _ = cli(capsys, "check", tree, "-r", "-v", "--target", "comfyui")
    assert "        read " in out and " requests, " in out


def test_cli_json_lists_one_report_per_checkpoint(tree, capsys):
    rc, out, _ = cli(capsys, "check", tree, "--recursive", "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["schema"] == 1 and doc["ok"] is False
    assert [c["checkpoint"] for c in doc["checkpoints"]] == LABELS
    for c in doc["checkpoints"]:
        assert c["status"] in ("ok", "failed") and {"findings", "targets", "io", "files"} <= set(c)
    assert doc["summary"]["checkpoints"] == 6 and doc["summary"]["requests"] > 0


def test_cli_exit_codes(tmp_path, capsys):
    clean = tmp_path / "clean"
    clean.mkdir()
    write(clean / "a.safetensors", int8_layer("a"))
    write(clean / "b.safetensors", fp8_layer("b"))
    assert cli(capsys, "check", clean, "-r")[0] == 0
    (clean / "z.safetensors").write_bytes(b"short")  # a report (C009): FAILED, not unreadable
    rc, out, err = cli(capsys, "check", clean, "-r")
    assert rc == 1 and "2 OK, 1 FAILED;" in out.splitlines()[-1] and err == ""
    (clean / "z.safetensors").unlink()
    (clean / "link.safetensors").symlink_to(clean / "gone.safetensors")  # what cannot be opened stays one line
    rc, out, err = cli(capsys, "check", clean, "-r")
    assert rc == 2 and "1 unreadable" in out.splitlines()[-1]
    assert err.strip().startswith("comfyquant: ") and err.count("\n") == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = cli(capsys, "check", empty, "-r")
    assert rc == 2 and "no .safetensors or .gguf files under this folder" in err
    rc, _, err = cli(capsys, "check", clean, "-r", "--jobs", "0")
    assert rc == 2 and "must be at least 1" in err


def test_remote_tree_through_fsspec(tree):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for folder, _dirs, files in os.walk(tree):
        for f in files:
            rel = os.path.relpath(os.path.join(folder, f), tree)
            with open(os.path.join(folder, f), "rb") as fh:
                fs.pipe(f"/cq-tree/{rel}", fh.read())
    try:
        remote = check_tree(["memory://cq-tree/"], jobs=4)
        local = check_tree([tree])
        assert [i.label for i in remote.items] == LABELS
        assert [i.status for i in remote.items] == [i.status for i in local.items]
        for r, lc in zip(remote.items, local.items):
            assert [f.code for f in r.report.findings] == [f.code for f in lc.report.findings]
    finally:
        fs.rm("/cq-tree", recursive=True)


def test_http_roots_cannot_be_listed_but_files_can(tmp_path):
    from test_remote import Server

    write(tmp_path / "a.safetensors", int8_layer("a"))
    write(tmp_path / "b.safetensors", w4a8_layer(P, correction=zeros("BF16", (32, 16))))
    server = Server(str(tmp_path))
    try:
        result = check_tree([server.url("a.safetensors"), server.url("b.safetensors"), server.url("dir/")], jobs=3)
        assert [i.status for i in result.items] == ["ok", "failed", "unreadable"]
        assert "cannot list a folder" in result.items[2].error
        assert result.items[0].report.io[server.url("a.safetensors")]["requests"] == 2
    finally:
        server.close()
