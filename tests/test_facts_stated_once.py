"""Each fact about markers, runtimes' choices and formats has one home in ``src/``: source scans
keep a restatement from coming back.

``markers.py`` owns the header map's key, its document (``format_version`` and ``layers``),
the metadata a writer of other tensors drops and the dtypes SGLang wants a marker for; the
ComfyUI nodes read their choices from the tables that hold them; the checker asks the formats'
packages for what it knows of one format and names none.  Every scan is shown to see what it
looks for, on a probe file."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest

from comfyquant import markers
from comfyquant.comfyui import loading, nodes
from comfyquant.formats.registry import FORMATS
from comfyquant.targets.select import TARGETS
from test_params import format_name_literals
from test_validation_data import _code_strings

SRC = Path(__file__).resolve().parent.parent / "src" / "comfyquant"
MARKERS = SRC / "markers.py"
OWNED_NAMES = ("MARKER_MAP", "QUANT_FORMAT", "DROP_METADATA", "MARKER_SUFFIX", "FORMAT_VERSION", "FILE_LEVEL_DTYPES")
"""Names markers.py defines: defined nowhere else."""


def _sources() -> list[Path]:
    found = sorted(SRC.rglob("*.py"))
    assert len(found) > 150
    return found


def marker_restatements(path: Path, base: Path = SRC) -> list[str]:
    """Where ``path`` restates what markers.py owns: the map's key or ``format_version`` as a
    string of its own (a key read or written: prose that mentions them is not), a tuple of
    exactly SGLang's marker dtypes, or a definition of a name markers.py defines."""
    tree = ast.parse(path.read_text(), str(path))
    dtypes = set(markers.FILE_LEVEL_DTYPES)
    name = path.relative_to(base)
    hits = [f"{name}:{line}: {text!r}" for line, text in _code_strings(tree) if text in (markers.MARKER_MAP, "format_version")]
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
            values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if len(values) == len(node.elts) and set(values) == dtypes:
                hits.append(f"{where}: {tuple(values)!r}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            hits.extend(f"{where}: {t.id} =" for t in targets if isinstance(t, ast.Name) and t.id in OWNED_NAMES)
    return hits


def test_markers_module_alone_states_the_marker_facts():
    hits = [hit for p in _sources() if p != MARKERS for hit in marker_restatements(p)]
    assert hits == []


def test_the_marker_scan_sees_restatements(tmp_path):
    """The scan is not vacuous: it finds the key, a built document, the dtype tuple and a
    second definition, and passes over prose and other tuples."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        textwrap.dedent('''
            """Reads _quantization_metadata."""
            MARKER_MAP = "x"
            DTYPES = ("U8", "I8", "F8_E4M3")
            OTHER = ("F8_E4M3", "I8")
            def f(meta, layers):
                meta["_quantization_metadata"] = dump({"format_version": "1.0", "layers": layers})
                raise ValueError("_quantization_metadata is not JSON")
        ''')
    )
    hits = [h.split(": ", 1)[1] for h in marker_restatements(probe, tmp_path)]
    assert sorted(hits) == sorted(["MARKER_MAP =", "('U8', 'I8', 'F8_E4M3')", "'_quantization_metadata'", "'format_version'"])


def test_markers_module_states_them():
    """What the scan keeps out of the other modules is stated here, and the writer and reader
    agree with each other."""
    layers = {"blocks.0.attn": {"format": "float8_e4m3fn"}}
    text = markers.marker_map_text(layers)
    assert json.loads(text) == {"format_version": markers.FORMAT_VERSION, "layers": layers}
    assert markers.read_marker_map(text)["layers"] == layers
    assert json.loads(markers.marker_map_text(layers, version="1.1"))["format_version"] == "1.1"
    assert markers.read_marker_map('{"format_version": "1.0"}') is None
    assert markers.read_marker_map("not json") is None
    meta = markers.set_marker_map({"other": "kept"}, layers)
    assert meta == {"other": "kept", markers.MARKER_MAP: text}
    assert markers.set_marker_map(meta, {}) == {"other": "kept"}
    name, (dtype, shape, raw) = markers.marker_tensor("blocks.0.attn", layers["blocks.0.attn"])
    assert (name, dtype, shape, json.loads(raw)) == ("blocks.0.attn.comfy_quant", "U8", (len(raw),), layers["blocks.0.attn"])
    assert markers.DROP_METADATA == (markers.MARKER_MAP, markers.QUANT_FORMAT)


def test_node_choices_come_from_their_tables():
    """The Check node offers every runtime check judges by (ComfyUI's first), the Loader every
    weight dtype the loading table turns into model options, and nodes.py lists neither."""
    assert nodes.target_choices() == ["all", "comfyui", *(t for t in TARGETS if t != "comfyui")]
    assert nodes.weight_dtypes() == list(loading.WEIGHT_DTYPES)
    for table in (TARGETS, loading.WEIGHT_DTYPES):
        assert choice_lists(SRC / "comfyui" / "nodes.py", set(table)) == []
    assert len(choice_lists(SRC / "comfyui" / "loading.py", set(loading.WEIGHT_DTYPES))) == 1  # the table itself


def choice_lists(path: Path, names: set[str]) -> list[int]:
    """Lines of the list, tuple, set or dict literals in ``path`` that hold two or more of ``names``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        items = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else []
        if sum(isinstance(e, ast.Constant) and e.value in names for e in items) >= 2:
            out.append(node.lineno)
    return out


def test_the_choice_scan_sees_a_list(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('CHOICES = ["all", "comfyui", "sglang"]\nFIRST = sorted(x, key=lambda n: n != "comfyui")\n')
    assert choice_lists(probe, set(TARGETS)) == [1]


CHECKER = sorted((SRC / "checker").glob("*.py"))


def _single_format_suffixes() -> dict[str, str]:
    """Tensor suffixes that one format alone has (``weight_correction``): naming one is
    knowing that format."""
    owners: dict[str, set[str]] = {}
    for fmt in FORMATS.values():
        for slot in fmt.slots:
            owners.setdefault(slot.suffix, set()).add(fmt.name)
    return {s: next(iter(o)) for s, o in owners.items() if len(o) == 1}


@pytest.mark.parametrize("path", CHECKER, ids=lambda p: p.name)
def test_checker_names_no_format(path):
    """What the checker knows of one format, it asks the format's package (``Slot`` data,
    ``Format.dropped``): no format name, short name or tensor suffix of one format alone in
    its code."""
    assert format_name_literals(path) == []
    own = _single_format_suffixes()
    hits = [f"{line}: {text!r} ({own[text]})" for line, text in _code_strings(ast.parse(path.read_text())) if text in own]
    assert hits == []


def test_the_checker_scan_sees_single_format_suffixes():
    own = _single_format_suffixes()
    assert len(CHECKER) >= 6
    assert "weight_correction" in own and "weight_zeros" in own
    assert "weight" not in own and "weight_scale" not in own
