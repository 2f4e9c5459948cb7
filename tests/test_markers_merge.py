"""One marker merge (markers.MarkerMerge) with the three precedences its callers need:
ComfyUI's (the header wins: the effective marker and the M020/M021 findings), SGLang's (a
record that conflicts adds nothing: it raises there) and fix's (the first side read wins)."""

from __future__ import annotations

import json

from builders import fp8_layer, write
from comfyquant import check, open_checkpoint
from comfyquant.markers import HEADER, TENSOR, MarkerMerge, MarkerRecord
from comfyquant.repair.run import fix

P = "blocks.0.attn.qkv"


def rec(kind: str, obj: dict, file: str = "a.safetensors") -> MarkerRecord:
    return MarkerRecord(kind, file, P, P, obj)


def test_identical_records_share_the_first_object():
    a, b = {"format": "nvfp4"}, {"format": "nvfp4"}
    m = MarkerMerge(wins=HEADER)
    assert not m.add(rec(HEADER, a)) and not m.add(rec(TENSOR, b))
    assert m.merged[P] is a and len(m.sources[P]) == 2


def test_header_wins_and_union_keeps_first_key_order():
    tensor, header = {"format": "x", "a": 1}, {"b": 2, "a": 3}
    m = MarkerMerge(wins=HEADER)
    m.add(rec(TENSOR, tensor))
    conflicts = m.add(rec(HEADER, header))
    assert [(k, old, r.kind) for k, old, r in conflicts] == [("a", 1, TENSOR)]
    assert list(m.merged[P].items()) == [("format", "x"), ("a", 3), ("b", 2)]
    assert tensor == {"format": "x", "a": 1}  # the parsed object is never mutated


def test_first_read_wins_without_a_precedence():
    m = MarkerMerge()
    m.add(rec(TENSOR, {"a": 1}))
    assert [k for k, _, _ in m.add(rec(HEADER, {"a": 3, "b": 2}))] == ["a"]
    assert m.merged[P] == {"a": 1, "b": 2}


def test_a_conflicting_record_adds_nothing_when_skipped():
    """A={a:1}, B={a:2, b:1}, C={b:2}: SGLang refuses B (one conflict) and then reads C
    against {a:1}, which it fits; the union of every record conflicts on a and on b."""
    records = [rec(HEADER, {"a": 1}), rec(TENSOR, {"a": 2, "b": 1}), rec(TENSOR, {"b": 2})]
    skipping, union = MarkerMerge(skip_conflicting=True), MarkerMerge()
    assert [len(skipping.add(r)) for r in records] == [0, 1, 0]
    assert skipping.merged[P] == {"a": 1, "b": 2}
    assert [len(union.add(r)) for r in records] == [0, 1, 1]


def test_numbers_and_booleans_compare_as_python_compares_them():
    """1 == True: no conflict for either runtime (both compare with !=), so none is reported."""
    for m in (MarkerMerge(wins=HEADER), MarkerMerge(skip_conflicting=True)):
        m.add(rec(TENSOR, {"convrot": True}))
        assert not m.add(rec(HEADER, {"convrot": 1}))


def test_checker_sglang_and_fix_read_one_merge(tmp_path):
    """A header/tensor conflict: the effective marker is the header's value (M020), SGLang
    raises P1 on it, fix --prefer tensor writes the tensor's value."""
    layer = fp8_layer(P, marker={"format": "float8_e4m3fn", "full_precision_matrix_mult": False})
    header = {"format_version": "1.0", "layers": {P: {"format": "float8_e4m3fn", "full_precision_matrix_mult": True}}}
    src = write(tmp_path / "in.safetensors", layer, metadata={"_quantization_metadata": json.dumps(header)})
    with open_checkpoint(src) as ck:
        assert ck.markers.effective[P]["full_precision_matrix_mult"] is True
        assert [f.code for f in ck.markers.findings] == ["M020"]
    report = check(src)
    assert report.verdicts["sglang"].first.rule == "sglang.P1"
    for prefer, value in (("tensor", False), ("header", True)):
        result = fix(src, dry_run=True, prefer=prefer)
        assert result.plan.markers[P]["full_precision_matrix_mult"] is value
