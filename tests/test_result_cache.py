"""The per-layer result cache: class ids by marker content and tensor signature."""

from __future__ import annotations

import gc
import weakref

from comfyquant import memo
from comfyquant.checkpoint import Layer
from comfyquant.io.header import TensorEntry


class Marker(dict):
    """A dict that can be weakly referenced (plain dicts cannot)."""


def _layer() -> Layer:
    layer = Layer("blocks.0.fc")
    layer.tensors["weight"] = TensorEntry("blocks.0.fc.weight", "F8_E4M3", (32, 256), 0, 8192, "f")
    return layer


def test_class_ids_follow_content_and_survive_several_marker_objects():
    memo.clear()
    m = memo.Memo()
    layer = _layer()
    a, b, a_copy = Marker(format="float8_e4m3fn"), Marker(format="nvfp4"), Marker(format="float8_e4m3fn")
    ca, cb, cc = m.class_id(a, layer), m.class_id(b, layer), m.class_id(a_copy, layer)
    assert ca != cb and ca == cc  # equal content, equal class; another object is another cache entry
    assert m.class_id(a, layer) == ca and m.class_id(b, layer) == cb  # both still cached on the layer
    calls = []
    assert m.get("kind", b, layer, lambda: calls.append(1) or "B") == "B"
    assert m.get("kind", Marker(format="nvfp4"), layer, lambda: calls.append(1) or "other") == "B"
    assert calls == [1]


def test_the_class_cache_is_a_declared_field_of_the_layer():
    """The memo keeps a layer's classes in ``Layer.class_ids``, a documented slot of the layer
    (no attribute another module invents): per marker object, the marker and its class id."""
    memo.clear()
    m = memo.Memo()
    layer = _layer()
    assert "class_ids" in Layer.__slots__ and layer.class_ids is None
    a = Marker(format="float8_e4m3fn")
    cid = m.class_id(a, layer)
    assert layer.class_ids == {id(a): (a, cid)}


def test_the_cache_keeps_its_markers_alive_so_ids_are_not_reused():
    """A marker a runtime profile derives and drops must not hand its id (and class) to a new
    marker with other content: the cache holds every marker it answered for."""
    memo.clear()
    m = memo.Memo()
    layer = _layer()
    derived = Marker(format="float8_e4m3fn")
    ref = weakref.ref(derived)
    cid = m.class_id(derived, layer)
    del derived
    gc.collect()
    assert ref() is not None
    fresh = [Marker(format="nvfp4") for _ in range(100)]  # would often reuse a freed address
    assert all(m.class_id(x, layer) != cid for x in fresh)


def test_comfyui_shares_the_merged_marker_only_when_it_is_the_same_marker(tmp_path):
    """Header and tensor markers written identical (as fix and quantize write them): ComfyUI's
    marker is the checkpoint's merged object, so its per-layer results come from the same
    cache entry.  Values equal only loosely (``1 == True``) are not the same marker."""
    from builders import W4A8_MARKER, header_markers, w4a8_layer, write
    from comfyquant import open_checkpoint
    from comfyquant.markers import same_marker as _same_marker
    from comfyquant.targets.comfyui import comfyui_markers

    layer = w4a8_layer("blocks.0.fc")
    path = write(tmp_path / "m.safetensors", layer, metadata=header_markers({"blocks.0.fc": dict(W4A8_MARKER)}))
    with open_checkpoint(path) as ck:
        shared = comfyui_markers(ck, [])["blocks.0.fc"]
        assert shared is ck.markers.effective["blocks.0.fc"]
    assert _same_marker({"convrot": True, "g": [16]}, {"convrot": True, "g": [16]})
    assert not _same_marker({"convrot": True}, {"convrot": 1})
    assert not _same_marker({"s": [1, 2]}, {"s": [True, 2]})
    assert not _same_marker({"a": 1}, {"a": 1, "b": 2})


def test_identical_header_and_tensor_markers_merge_to_the_shared_object(tmp_path):
    """No copy when the second source adds nothing (the usual file): the merged marker is one of
    the parsed markers itself; a differing header still merges into a copy, header winning."""
    from builders import W4A8_MARKER, header_markers, w4a8_layer, write
    from comfyquant import open_checkpoint

    layer = w4a8_layer("blocks.0.fc")
    same = write(tmp_path / "same.safetensors", layer, metadata=header_markers({"blocks.0.fc": dict(W4A8_MARKER)}))
    with open_checkpoint(same) as ck:
        parsed = [r.obj for r in ck.markers.records if r.prefix == "blocks.0.fc"]
        assert len(parsed) == 2 and not ck.markers.findings
        assert any(ck.markers.effective["blocks.0.fc"] is obj for obj in parsed)  # one of them, not a copy
    other = dict(W4A8_MARKER, group_size=32)
    diff = write(tmp_path / "diff.safetensors", layer, metadata=header_markers({"blocks.0.fc": other}))
    with open_checkpoint(diff) as ck:
        parsed = {r.kind: r.obj for r in ck.markers.records if r.prefix == "blocks.0.fc"}
        merged = ck.markers.effective["blocks.0.fc"]
        assert all(merged is not obj for obj in parsed.values())
        assert merged["group_size"] == 32 and parsed["tensor"]["group_size"] == 16
        assert "M020" in {f.code for f in ck.markers.findings}
