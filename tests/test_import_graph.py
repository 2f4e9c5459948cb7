"""The package's import graph has no cycles.

Every import counts, including the ones inside functions (which grimp reports like any
other): a lazy import that closes a cycle still ties two modules together, and moving the
shared piece a level down is what keeps each module's place in the layers clear.  Two views
are checked: module to module (a package's ``__init__`` is a module of its own), and within
each package, its direct children with everything below them.
"""

from __future__ import annotations

import pytest

grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the dev extra)")


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(graph, component: list[str]) -> str:
    lines = []
    members = set(component)
    for importer in component:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"  {importer}:{detail['line_number']} {detail['line_contents']}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("comfyquant")


def test_cycle_finder_sees_a_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back(graph):
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = _cycles(edges)
    assert not cycles, "import cycles:\n" + "\n".join(_describe(graph, c) for c in cycles)


def test_no_cycle_among_the_children_of_a_package(graph):
    problems = []
    for package in sorted(m for m in graph.modules if graph.find_children(m)):
        children = sorted(graph.find_children(package))
        edges: dict[str, set[str]] = {c: set() for c in children}
        for child in children:
            for module in (child, *graph.find_descendants(child)):
                for imported in graph.find_modules_directly_imported_by(module):
                    owner = next((c for c in children if imported == c or imported.startswith(c + ".")), None)
                    if owner is not None and owner != child:
                        edges[child].add(owner)
        problems.extend(f"{package}: {' <-> '.join(c)}" for c in _cycles(edges))
    assert not problems, "import cycles between sibling packages:\n" + "\n".join(problems)


def _contracts() -> dict[str, dict]:
    import sys
    from pathlib import Path

    if sys.version_info >= (3, 11):
        import tomllib
    else:
        tomllib = pytest.importorskip("tomli")
    root = Path(__file__).resolve().parent.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())
    return {c["name"]: c for c in config["tool"]["importlinter"]["contracts"]}


@pytest.mark.parametrize(
    "contract, key, family",
    [
        ("Format packages: independent of each other", "modules", "formats"),
        ("Format descriptions: torch is never imported", "source_modules", "formats"),
        ("Dialect packages: independent of each other", "modules", "dialects"),
    ],
)
def test_contracts_name_every_package_of_their_family(contract, key, family):
    """The independence and no-torch contracts list packages by name: a package added to
    ``formats/`` or ``dialects/`` must be added there too, or the contract says nothing about it."""
    from pathlib import Path

    import comfyquant

    folder = Path(comfyquant.__file__).parent / family
    packages = {f"comfyquant.{family}.{p.name}" for p in folder.iterdir() if (p / "__init__.py").is_file()}
    assert len(packages) > 5
    assert set(_contracts()[contract][key]) == packages
