"""What one checkpoint is: folders of separate checkpoints, shard series, indexes, symbolic links.

The same rule for every command (io/shards.py): an index is one checkpoint; files named
``<stem>-<i>-of-<n>.safetensors`` with one stem and n are one; every other file stands alone;
files named on the command line are one unless they repeat tensor names.  check and inspect
report each checkpoint of a folder; the commands that write one output refuse with one line.
Broken links are one-line errors or missing shards, never a crash; an index may not name files
outside its folder.
"""

from __future__ import annotations

import json
import os

import pytest

from builders import dense_layer, fp8_layer, int8_layer, w4a8_layer, write, zeros
from comfyquant import check
from comfyquant.checker.batch import check_tree
from comfyquant.cli import main
from comfyquant.errors import InputError
from comfyquant.io.header import read_header
from comfyquant.io.shards import SeparateCheckpoints, read_index
from comfyquant.io.source import LocalFile

WRITERS = [
    ("fix",),
    ("fix", "--dry-run"),
    ("dequantize", "{out}"),
    ("quantize", "{out}", "-f", "fp8"),
    ("convert", "{out}", "--to", "int8"),
]


def run(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def codes(report):
    return [f.code for f in report.findings]


def flux(path, seed_broken=False):
    """A small "full model": the same tensor names in every variant, as flux1-dev and -schnell.
    Too few of Flux's own keys for a whole Flux (which ComfyUI would detect, build at its true
    size and find most of its parameters missing): its layers are judged one by one."""
    corr = zeros("BF16", (32, 16)) if seed_broken else None
    return write(
        path,
        w4a8_layer("double_blocks.0.img_attn.qkv"),
        w4a8_layer("double_blocks.0.txt_mlp.0", correction=corr),
        dense_layer("vector_in.in_layer"),
        dense_layer("guidance_in.out_layer"),
    )


@pytest.fixture
def diffusion_models(tmp_path):
    """ComfyUI's models/diffusion_models: several full models side by side, no index."""
    d = tmp_path / "diffusion_models"
    d.mkdir()
    flux(d / "flux1-dev-fp8.safetensors")
    flux(d / "flux1-schnell-fp8.safetensors")
    write(d / "qwen_image_fp8.safetensors", fp8_layer("transformer_blocks.0.attn.to_q"), dense_layer("img_in"))
    (d / "put_diffusion_model_files_here").write_text("")
    return d


def index_for(folder, files, name="model.safetensors.index.json", extra=None):
    from comfyquant.checkpoint import open_checkpoint

    wm = {}
    for f in files:
        with open_checkpoint(str(f)) as ck:
            wm.update(dict.fromkeys(ck.tensors, os.path.basename(f)))
    wm.update(extra or {})
    path = os.path.join(folder, name)
    with open(path, "w") as fh:
        json.dump({"metadata": {}, "weight_map": wm}, fh)
    return path


def shard_pair(folder, stem="model"):
    os.makedirs(folder, exist_ok=True)
    a = write(os.path.join(folder, f"{stem}-00001-of-00002.safetensors"), int8_layer("blocks.0.a"), dense_layer("norm"))
    b = write(os.path.join(folder, f"{stem}-00002-of-00002.safetensors"), int8_layer("blocks.1.a"))
    return a, b


# -- folders of separate checkpoints -----------------------------------------------------------


def test_comfyui_folder_is_separate_checkpoints_each_with_its_verdict(diffusion_models, capsys):
    """Was: one "checkpoint" of three models, a C010 error per repeated tensor, exit 1."""
    rc, out, err = run(capsys, "check", diffusion_models)
    assert rc == 0 and err == ""
    assert "C010" not in out
    assert out.splitlines()[0].startswith(f"{diffusion_models}: 3 separate checkpoints, not the shards of one model")
    for name in ("flux1-dev-fp8.safetensors", "flux1-schnell-fp8.safetensors", "qwen_image_fp8.safetensors"):
        assert f"== {name} ==" in out
    assert out.count("targets:") == 3 and out.count(": OK") == 3
    rc, out, _ = run(capsys, "check", diffusion_models, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["summary"]["checkpoints"] == 3 and doc["ok"]
    assert [c["checkpoint"] for c in doc["checkpoints"]] == [
        "flux1-dev-fp8.safetensors",
        "flux1-schnell-fp8.safetensors",
        "qwen_image_fp8.safetensors",
    ]
    assert all(c["findings"] == [] and len(c["files"]) == 1 for c in doc["checkpoints"])
    assert "separate checkpoints" in doc["note"]


def test_exit_code_is_the_worst_of_the_checkpoints(diffusion_models, capsys):
    flux(diffusion_models / "flux1-dev-fp8.safetensors", seed_broken=True)
    rc, out, _ = run(capsys, "check", diffusion_models, "--target", "sglang")
    assert rc == 1
    assert out.count(": OK") == 2 and out.count(": FAILED") == 1
    os.symlink(diffusion_models / "gone.safetensors", diffusion_models / "wan2.1.safetensors")
    rc, out, err = run(capsys, "check", diffusion_models, "--target", "sglang")
    assert rc == 2
    assert err.count("\n") == 1 and "wan2.1.safetensors: is a dangling symbolic link (to " in err
    assert out.count("targets:") == 3  # the three readable models are still checked


def test_writing_commands_refuse_a_folder_of_separate_checkpoints_naming_them(diffusion_models, tmp_path, capsys):
    """A command that writes one output cannot make one file of three models: one line, exit 2,
    nothing written (was: quantize merged the three models into one output)."""
    out = tmp_path / "out.safetensors"
    for args in WRITERS:
        argv = [args[0], diffusion_models] + [a.format(out=out) for a in args[1:]]
        rc, stdout, err = run(capsys, *argv)
        assert rc == 2, (argv, stdout, err)
        assert err.count("\n") == 1 and "3 separate checkpoints, not the shards of one model" in err, err
        assert "flux1-dev-fp8.safetensors, flux1-schnell-fp8.safetensors, qwen_image_fp8.safetensors" in err
        assert not out.exists()
    assert sorted(os.listdir(diffusion_models)) == [
        "flux1-dev-fp8.safetensors",
        "flux1-schnell-fp8.safetensors",
        "put_diffusion_model_files_here",
        "qwen_image_fp8.safetensors",
    ]
    with pytest.raises(SeparateCheckpoints):
        check(str(diffusion_models))


def test_inspect_gives_one_table_per_checkpoint(diffusion_models, capsys):
    rc, out, err = run(capsys, "inspect", diffusion_models)
    assert rc == 0 and err == ""
    assert out.count("== ") == 3 and out.count("\nfiles: 1,") == 3
    rc, out, _ = run(capsys, "inspect", diffusion_models, "--json")
    doc = json.loads(out)
    assert [len(c["layers"]) for c in doc["checkpoints"]] == [4, 4, 2]
    assert all(c["error"] is None and c["io"] for c in doc["checkpoints"])


def test_index_plus_unrelated_file_and_two_index_variants(tmp_path, capsys):
    """diffusers keeps ``*.safetensors.index.json`` and ``*.fp16.safetensors.index.json`` side
    by side: two checkpoints (was: their weight maps merged, every tensor a C010/C012)."""
    d = tmp_path / "transformer"
    a, b = shard_pair(d, "diffusion_pytorch_model")
    index_for(d, [a, b], "diffusion_pytorch_model.safetensors.index.json")
    a16, b16 = shard_pair(d, "diffusion_pytorch_model.fp16")
    index_for(d, [a16, b16], "diffusion_pytorch_model.fp16.safetensors.index.json")
    rc, out, _ = run(capsys, "check", d, "--json")
    doc = json.loads(out)
    assert rc == 0, out
    assert [(c["checkpoint"], len(c["files"]), c["findings"]) for c in doc["checkpoints"]] == [
        ("diffusion_pytorch_model.fp16.safetensors.index.json", 2, []),
        ("diffusion_pytorch_model.safetensors.index.json", 2, []),
    ]
    # an index plus a file it does not name: two checkpoints, the file is not silently ignored
    os.remove(d / "diffusion_pytorch_model.fp16.safetensors.index.json")
    for f in (a16, b16):
        os.remove(f)
    write(d / "consolidated.safetensors", fp8_layer("blocks.0.a"))
    rc, out, _ = run(capsys, "check", d, "--json")
    labels = [c["checkpoint"] for c in json.loads(out)["checkpoints"]]
    assert rc == 0 and labels == ["consolidated.safetensors", "diffusion_pytorch_model.safetensors.index.json"]


def test_shard_series_without_index_is_one_checkpoint_and_a_gap_is_missing(tmp_path):
    d = tmp_path / "wan"
    d.mkdir()
    write(d / "wan-00001-of-00003.safetensors", int8_layer("blocks.0.a"))
    write(d / "wan-00003-of-00003.safetensors", int8_layer("blocks.2.a"))
    r = check(str(d))
    assert len(r.files) == 2
    c011 = [f for f in r.findings if f.code == "C011"]
    assert len(c011) == 1 and "wan-00002-of-00003.safetensors is missing (the shard names count 3 files)" in c011[0].message
    # plus an unrelated file: two checkpoints
    write(d / "vae.safetensors", dense_layer("decoder.conv"))
    with pytest.raises(SeparateCheckpoints) as exc:
        check(str(d))
    assert [g.label for g in exc.value.groups] == ["vae.safetensors", "wan-NNNNN-of-00003.safetensors"]


def test_files_named_on_the_command_line(tmp_path, capsys):
    """Files the user lists are one checkpoint (split shards with any names), unless they
    repeat tensor names: then the folder rule groups them.  A repeated shard series stays one
    checkpoint whose repeats are C010 (a mixed export)."""
    a = write(tmp_path / "part_a.safetensors", int8_layer("blocks.0.a"))
    b = write(tmp_path / "part_b.safetensors", int8_layer("blocks.1.a"))
    assert check([a, b]).files == [a, b]
    dev = flux(tmp_path / "flux1-dev.safetensors")
    schnell = flux(tmp_path / "flux1-schnell.safetensors")
    with pytest.raises(SeparateCheckpoints, match="the files repeat tensor names, e.g. 'double_blocks"):
        check([dev, schnell])
    rc, out, err = run(capsys, "check", dev, schnell)
    assert rc == 0 and "C010" not in out and out.count("targets:") == 2, out + err
    m1 = flux(tmp_path / "m-00001-of-00002.safetensors")
    m2 = flux(tmp_path / "m-00002-of-00002.safetensors")
    r = check([m1, m2])
    assert set(codes(r)) == {"C010"} and len(r.findings) == len(read_header(LocalFile(m1)).tensors)


def test_repeated_tensor_findings_are_one_group_and_json_keeps_each(tmp_path, capsys):
    """Was: one C010 block per tensor (79 for a ComfyUI folder)."""
    d = tmp_path / "mixed"
    d.mkdir()
    for i in (1, 2):
        write(d / f"m-0000{i}-of-00002.safetensors", *[int8_layer(f"blocks.{j}.a") for j in range(12)])
    rc, out, _ = run(capsys, "check", d)
    assert rc == 0  # no runtime refuses a tensor repeated across shards: a warning (severity follows verdicts)
    assert out.count("WARNING C010") == 1 and out.count("C010") == 1
    assert "<tensor>" not in out and out.count("' is in both") == 1  # the first one's words, real names
    assert "tensors  36: blocks.0.a.comfy_quant, " in out and " and 28 more" in out
    rc, out, _ = run(capsys, "check", d, "--json")
    findings = json.loads(out)["findings"]
    assert len(findings) == 36 and len({f["tensor"] for f in findings}) == 36


# -- symbolic links -----------------------------------------------------------------------------


def member_kinds(folder, kind):
    """One broken folder member of ``kind`` next to a good model."""
    path = os.path.join(folder, "broken.safetensors")
    if kind == "dangling":
        os.symlink(os.path.join(folder, "nowhere.safetensors"), path)
        return "is a dangling symbolic link (to "
    if kind == "loop":
        os.symlink("loop2.safetensors", path)
        os.symlink("broken.safetensors", os.path.join(folder, "loop2.safetensors"))
        return "is a symbolic link loop"
    if kind == "directory":
        os.mkdir(os.path.join(folder, "sub"))
        os.symlink("sub", path)
        return "is a directory"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["dangling", "loop", "directory"])
def test_broken_member_is_one_line_for_every_command(tmp_path, capsys, kind):
    """Was: FileNotFoundError / OSError(ELOOP) tracebacks (exit 3) from every command."""
    d = tmp_path / "models"
    d.mkdir()
    good = flux(d / "flux.safetensors")
    needle = member_kinds(str(d), kind)
    rc, out, err = run(capsys, "check", d)
    assert rc == 2 and "internal error" not in err
    assert f"broken.safetensors: {needle}" in err
    assert "== flux.safetensors ==" in out and ": OK" in out
    rc, out, err = run(capsys, "inspect", d)
    assert rc == 2 and f"broken.safetensors: {needle}" in err and "\nfiles: 1," in out
    for args in WRITERS:
        rc, _, err = run(capsys, args[0], d, *[a.format(out=tmp_path / "o.safetensors") for a in args[1:]])
        assert rc == 2 and err.count("\n") == 1 and "broken.safetensors (unreadable: " in err, err
    # the member given by name (a link to a folder is that folder)
    rc, _, err = run(capsys, "check", os.path.join(d, "broken.safetensors"))
    assert rc == 2 and err.count("\n") == 1
    assert (needle if kind != "directory" else "folder holds no .safetensors files") in err
    assert check(good).ok


def test_broken_member_beside_an_index_is_skipped_with_a_note(tmp_path, capsys):
    d = tmp_path / "sharded"
    a, b = shard_pair(d)
    index_for(d, [a, b])
    os.symlink(d / "gone.safetensors", d / "stale.safetensors")
    r = check(str(d))
    assert r.ok and r.files == [a, b]
    notes = [f for f in r.findings if f.code == "C015"]
    assert len(notes) == 1 and notes[0].severity == "info"
    assert "stale.safetensors is a dangling symbolic link" in notes[0].message and "skipped" in notes[0].message
    rc, out, err = run(capsys, "check", d, "-v")
    assert rc == 0 and err == "" and "C015" in out


def test_shard_link_problems_are_missing_shards_with_the_reason(tmp_path):
    """A shard the index (or the series) names that is a broken link, or a link to another
    shard, is a missing shard that says so (was: 'no such file', or silently read as the other
    shard with its tensors reported one by one as C014)."""
    d = tmp_path / "hf"
    a, b = shard_pair(d)
    index_for(d, [a, b])
    os.remove(b)
    os.symlink("../blobs/0123abcd", b)
    r = check(str(d))
    c011 = [f for f in r.findings if f.code == "C011"]
    assert len(c011) == 1 and "is a dangling symbolic link (to ../blobs/0123abcd" in c011[0].actual
    os.remove(b)
    os.symlink(os.path.basename(a), b)
    r = check(str(d))
    assert codes(r).count("C011") == 1 and "C014" not in codes(r)
    assert "is the same file as model-00001-of-00002.safetensors" in next(f.actual for f in r.findings if f.code == "C011")
    # without the index: the series says 00002 is a shard, and it is the same file as 00001
    os.remove(d / "model.safetensors.index.json")
    r = check(str(d))
    assert r.files == [a] and codes(r).count("C011") == 1
    assert "is the same file as model-00001-of-00002.safetensors" in next(f.message for f in r.findings if f.code == "C011")


def test_a_link_to_another_member_is_read_once_with_a_note(tmp_path):
    d = tmp_path / "models"
    d.mkdir()
    real = flux(d / "flux1-dev.safetensors")
    os.symlink("flux1-dev.safetensors", d / "current.safetensors")
    r = check(str(d))
    assert r.files == [real]
    note = next(f for f in r.findings if f.code == "C015")
    assert (
        note.message == "current.safetensors is the same file as flux1-dev.safetensors: read once, as part of "
        "flux1-dev.safetensors"
    )
    # a link to a shard of a series is that shard, read once
    a, b = shard_pair(d / "sharded")
    os.symlink(os.path.basename(a), d / "sharded" / "first.safetensors")
    r = check(str(d / "sharded"))
    assert r.files == [a, b] and [f.code for f in r.findings] == ["C015"]


def test_hugging_face_cache_layout_is_read(tmp_path):
    """Snapshot folders are links into ../../blobs: links in the folder may point anywhere."""
    blobs = tmp_path / "models--org--name" / "blobs"
    snap = tmp_path / "models--org--name" / "snapshots" / "abc123"
    a, b = shard_pair(blobs / "x")
    snap.mkdir(parents=True)
    for i, src in enumerate((a, b), start=1):
        os.symlink(os.path.relpath(src, snap), snap / f"model-0000{i}-of-00002.safetensors")
    index_for(snap, [snap / "model-00001-of-00002.safetensors", snap / "model-00002-of-00002.safetensors"])
    r = check(str(snap))
    assert r.ok and len(r.files) == 2 and r.layers == 3


def test_check_recursive_uses_the_same_rules(tmp_path):
    root = tmp_path / "models"
    d = root / "diffusion_models"
    d.mkdir(parents=True)
    flux(d / "flux.safetensors")
    os.symlink("flux.safetensors", d / "flux-link.safetensors")
    os.symlink(d / "gone.safetensors", d / "dangling.safetensors")
    a, b = shard_pair(root / "big")
    index_for(root / "big", [a, b])
    os.symlink(root / "gone.safetensors", root / "big" / "stale.safetensors")
    result = check_tree([str(root)])
    by = {i.label: i for i in result.items}
    assert sorted(by) == [
        "big/model.safetensors.index.json",
        "diffusion_models/dangling.safetensors",
        "diffusion_models/flux.safetensors",
    ]
    assert "dangling symbolic link" in by["diffusion_models/dangling.safetensors"].error
    assert [f.code for f in by["diffusion_models/flux.safetensors"].report.findings] == ["C015"]
    assert [f.code for f in by["big/model.safetensors.index.json"].report.findings] == ["C015"]
    assert result.exit_code == 2


# -- index entries ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry, why",
    [
        ("../outside.safetensors", "a '..' step out of the index's folder"),
        ("sub/../../outside.safetensors", "a '..' step out of the index's folder"),
        ("..\\outside.safetensors", "a '..' step out of the index's folder"),
        ("{abs}", "an absolute path"),
        ("C:\\models\\x.safetensors", "an absolute path"),
        ("model\u0000.safetensors", "a NUL character"),
        ("", "an empty file name"),
    ],
)
def test_index_naming_files_outside_its_folder_is_refused(tmp_path, capsys, entry, why):
    """Was: followed (``../`` and absolute paths read files anywhere; a NUL made a missing shard)."""
    outside = write(tmp_path / "outside.safetensors", int8_layer("secret"))
    d = tmp_path / "ck"
    d.mkdir()
    inside = write(d / "model-00001-of-00001.safetensors", int8_layer("a"))
    entry = entry.replace("{abs}", outside)
    index = index_for(d, [inside], extra={"secret.weight": entry})
    for argv in (
        ("check", index),
        ("check", d),
        ("inspect", index),
        ("dequantize", index, tmp_path / "o.safetensors"),
        ("fix", index, "--dry-run"),
    ):
        rc, out, err = run(capsys, *argv)
        assert rc == 2 and err.count("\n") == 1, (argv, out, err)
        assert f"{index}: index maps 'secret.weight' to {entry!r}, {why}" in err, err
    assert not (tmp_path / "o.safetensors").exists()
    with pytest.raises(InputError, match="a '..' step"):
        read_index(
            "https://host/org/model/model.safetensors.index.json",
            json.dumps({"weight_map": {"a.weight": "../../other/model.safetensors"}}),
        )


def test_index_entries_in_subfolders_and_dot_paths_are_fine(tmp_path):
    d = tmp_path / "ck"
    (d / "part").mkdir(parents=True)
    a = write(d / "part" / "a.safetensors", int8_layer("a"))
    b = write(d / "b.safetensors", int8_layer("b"))
    with open(d / "model.safetensors.index.json", "w") as fh:
        json.dump(
            {
                "weight_map": {
                    "a.weight": "part/a.safetensors",
                    "a.weight_scale": "part/a.safetensors",
                    "a.comfy_quant": "./part/a.safetensors",
                    "b.weight": "b.safetensors",
                    "b.weight_scale": "b.safetensors",
                    "b.comfy_quant": "b.safetensors",
                }
            },
            fh,
        )
    r = check(str(d))
    assert r.ok and r.files == [a, b]


# -- random folders -------------------------------------------------------------------------


def random_folder(folder, seed):
    """1-6 members drawn from the kinds a real folder has: full models (some with the same
    tensor names), shard series with gaps, indexes good and bad, and every kind of broken link."""
    import random

    rng = random.Random(seed)
    os.makedirs(folder)
    made: list[str] = []
    for i in range(rng.randint(1, 6)):
        kind = rng.choice(
            ["model", "model", "series", "index", "dangling", "loop", "dirlink", "samelink", "fifo", "badindex", "outside"]
        )
        if kind == "model":
            made.append(flux(os.path.join(folder, f"m{i}.safetensors")))
        elif kind == "series":
            n = rng.randint(1, 3)
            for j in rng.sample(range(1, n + 1), rng.randint(1, n)):
                made.append(write(os.path.join(folder, f"s{i}-{j:05d}-of-{n:05d}.safetensors"), int8_layer(f"b{j}.x")))
        elif kind == "index":
            a, b = shard_pair(folder, f"ix{i}")
            index_for(folder, [a, b], f"ix{i}.safetensors.index.json")
            if rng.random() < 0.5:
                os.remove(b)
        elif kind == "dangling":
            os.symlink(os.path.join(folder, "nothing"), os.path.join(folder, f"d{i}.safetensors"))
        elif kind == "loop":
            os.symlink(f"l{i}b.safetensors", os.path.join(folder, f"l{i}a.safetensors"))
            os.symlink(f"l{i}a.safetensors", os.path.join(folder, f"l{i}b.safetensors"))
        elif kind == "dirlink":
            os.makedirs(os.path.join(folder, f"dir{i}"))
            os.symlink(f"dir{i}", os.path.join(folder, f"dir{i}.safetensors"))
        elif kind == "samelink" and made:
            os.symlink(os.path.basename(rng.choice(made)), os.path.join(folder, f"z{i}.safetensors"))
        elif kind == "fifo" and hasattr(os, "mkfifo"):
            os.mkfifo(os.path.join(folder, f"p{i}.safetensors"))
        elif kind == "badindex":
            with open(os.path.join(folder, f"bad{i}.safetensors.index.json"), "w") as fh:
                fh.write(rng.choice(["{not json", "[]", '{"weight_map": {"a": 1}}', ""]))
        elif kind == "outside":
            with open(os.path.join(folder, f"out{i}.safetensors.index.json"), "w") as fh:
                json.dump({"weight_map": {"a.weight": rng.choice(["../x.safetensors", "/etc/passwd", "a\u0000b"])}}, fh)


@pytest.mark.parametrize("seed", range(40))
def test_random_folders_never_crash(tmp_path, capsys, seed):
    """Whatever a folder holds, every command answers with a report or one-line errors
    (exit 0, 1 or 2), never an internal error; check --json is always one JSON document."""
    d = str(tmp_path / "f")
    random_folder(d, seed)
    before = sorted(os.listdir(d))
    for argv in (
        ("check", d),
        ("check", d, "--json"),
        ("inspect", d),
        ("check", "-r", d),
        ("fix", d, "--dry-run"),
        ("dequantize", d, str(tmp_path / "o.safetensors")),
    ):
        rc, out, err = run(capsys, *argv)
        assert rc in (0, 1, 2), (argv, out, err)
        assert "internal error" not in err and "Traceback" not in err, (argv, err)
        assert all(line.startswith("comfyquant") for line in err.splitlines()), (argv, err)
        if argv[0] in ("fix", "dequantize") and rc == 2:
            assert err.count("\n") == 1, (argv, err)
        if "--json" in argv and (rc != 2 or out):  # a single unreadable input is only its error line
            json.loads(out)
    assert sorted(os.listdir(d)) == before


def test_remote_folder_follows_the_same_rule(diffusion_models, tmp_path, capsys):
    """An fsspec folder URL of separate models: each checked, writers refuse (was: merged)."""
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for name in os.listdir(diffusion_models):
        fs.pipe(f"/cq-folders/{name}", (diffusion_models / name).read_bytes())
    try:
        url = "memory://cq-folders/"
        rc, out, err = run(capsys, "check", url, "--json")
        doc = json.loads(out)
        assert rc == 0 and err == ""
        assert [(c["checkpoint"], c["findings"]) for c in doc["checkpoints"]] == [
            ("flux1-dev-fp8.safetensors", []),
            ("flux1-schnell-fp8.safetensors", []),
            ("qwen_image_fp8.safetensors", []),
        ]
        rc, _, err = run(capsys, "dequantize", url, tmp_path / "o.safetensors")
        assert rc == 2 and err.count("\n") == 1 and "3 separate checkpoints, not the shards of one model" in err
        # one model and its index: one checkpoint, as locally
        for name in os.listdir(diffusion_models):
            fs.rm(f"/cq-folders/{name}")
        a, b = shard_pair(tmp_path / "sharded")
        index_for(tmp_path / "sharded", [a, b])
        for name in os.listdir(tmp_path / "sharded"):
            fs.pipe(f"/cq-folders/{name}", (tmp_path / "sharded" / name).read_bytes())
        r = check(url)
        assert r.ok and len(r.files) == 2
    finally:
        fs.rm("/cq-folders", recursive=True)


def test_an_implausible_shard_count_is_not_a_series(tmp_path):
    """``-of-1000000`` is not read as a series with 999,999 missing shards (was: a million C011
    findings; ``-of-999999999`` never finished): the file stands alone."""
    from comfyquant.checker.batch import group

    groups = group(["r/x-00001-of-1000000.safetensors", "r/y-00001-of-00002.safetensors"], "r")
    assert [(g.label, g.missing) for g in groups] == [
        ("x-00001-of-1000000.safetensors", []),
        ("y-NNNNN-of-00002.safetensors", ["r/y-00002-of-00002.safetensors"]),
    ]
    d = tmp_path / "m"
    d.mkdir()
    write(d / "x-00001-of-999999999.safetensors", int8_layer("a"))
    r = check(str(d))
    assert r.ok and r.findings == []


def test_grouped_tensor_findings_keep_the_rest_of_the_message(tmp_path, capsys):
    """Tensor names are replaced only where quoted: a tensor named 'model' leaves the shard name
    'model-00002-of-00002.safetensors' alone, so both C012 findings are one group."""
    d = tmp_path / "ck"
    d.mkdir()
    a = write(
        d / "model-00001-of-00002.safetensors",
        int8_layer("blocks.0.a"),
        {"model": zeros("BF16", (4,))},
        {"x": zeros("BF16", (4,))},
    )
    b = write(d / "model-00002-of-00002.safetensors", int8_layer("blocks.1.a"))
    index_for(d, [a, b], extra={"model": "model-00002-of-00002.safetensors", "x": "model-00002-of-00002.safetensors"})
    rc, out, _ = run(capsys, "check", d)
    assert rc == 0  # runtimes read the tensor from whichever shard holds it: a warning (severity follows verdicts)
    assert out.count("WARNING C012") == 1 and out.count("C012") == 1
    assert "  expected model-00002-of-00002.safetensors\n" in out
    assert "  tensors  2: model, x\n" in out


def test_a_model_root_without_files_points_to_recursive(tmp_path, capsys):
    """A diffusers root holds its checkpoints in sub-folders (transformer/, vae/)."""
    root = tmp_path / "FLUX.1-dev"
    shard_pair(root / "transformer")
    (root / "model_index.json").write_text("{}")
    rc, _, err = run(capsys, "check", root)
    assert rc == 2 and err.count("\n") == 1
    assert err.endswith("folder holds no .safetensors files; check --recursive also looks in its sub-folders\n")
    rc, out, _ = run(capsys, "check", root, "--recursive")
    assert rc == 0 and "transformer/model-NNNNN-of-00002.safetensors" in out


def test_the_same_checkpoint_given_twice_is_one(tmp_path):
    d = tmp_path / "ck"
    a, b = shard_pair(d)
    index = index_for(d, [a, b])
    single = write(tmp_path / "single.safetensors", int8_layer("x"))
    assert check([str(d), str(d)]).files == [a, b]
    assert check([str(d), index]).files == [a, b]
    assert check([index, os.path.join(str(d), ".", "model.safetensors.index.json")]).files == [a, b]
    assert check([single, str(tmp_path / "." / "single.safetensors")]).files == [single]


def test_hidden_files_are_not_checkpoints_of_a_folder(tmp_path, capsys):
    """macOS leaves ``._name`` companions (a few KB of resource fork, not safetensors) beside
    every copied file: a folder check reads the real checkpoint only, local and --recursive."""
    write(tmp_path / "flux.safetensors", fp8_layer("x"))
    (tmp_path / "._flux.safetensors").write_bytes(b"\x00\x05\x16\x07" + bytes(4092))
    assert main(["check", str(tmp_path)]) == 0
    assert main(["check", str(tmp_path), "--recursive"]) == 0
    assert main(["inspect", str(tmp_path)]) == 0
    capsys.readouterr()
    (tmp_path / "flux.safetensors").unlink()
    assert main(["check", str(tmp_path)]) == 2
    assert "holds no .safetensors files" in capsys.readouterr().err
