"""The packages' structure, read from source: no import circles in ``workbench/`` or ``kernels/`` (issue 28).

A circle is a set of modules each of which imports, directly or through the others, every other one: a
strongly connected component of the import graph. Every ``import x`` and ``from x import y`` of a module of
the two packages is an edge, of one of three kinds:

- ``module``: runs when the module is imported (at the top level, in a class body, under ``try`` or ``if``);
- ``function``: inside a function, run when it is called (the CLI's lazy imports that keep it torch-free);
- ``typing``: under ``if TYPE_CHECKING:``, read by the type checker only.

No circle at import time (``module`` edges) at all. Through lazy or typing imports a circle is still a circle:
the modules cannot be understood, moved or tested apart. ``PENDING`` lists the ones known, each with who
breaks it; an entry that no longer holds fails too, so the list only shrinks.

``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``; the parent
packages Python runs first are not edges (every module of a package whose ``__init__`` imports it would be
in a circle). ``importlib.import_module`` with a computed name is not seen.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("workbench", "kernels")

# Known circles, pending their fix: the modules of each, and who breaks it. Nothing else may join one.
PENDING: dict[frozenset[str], str] = {}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    kind: str  # "module" | "function" | "typing"
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.kind}, line {self.line})"


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted name -> file, for every module of ``packages`` under ``root`` (a package by its ``__init__``)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imported(node: ast.Import | ast.ImportFrom, name: str, is_package: bool, known: dict[str, Path]) -> set[str]:
    """The known modules an import statement of module ``name`` names."""
    if isinstance(node, ast.Import):
        out = set()
        for alias in node.names:
            dotted = alias.name
            while dotted and dotted not in known:  # import a.b.c of a package's attribute: its deepest module
                dotted = dotted.rpartition(".")[0]
            if dotted:
                out.add(dotted)
        return out
    if node.level:  # relative: from the module's own package up
        here = name.split(".") if is_package else name.split(".")[:-1]
        base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    out = set()
    for alias in node.names:
        if f"{base}.{alias.name}" in known:
            out.add(f"{base}.{alias.name}")
        elif base in known:
            out.add(base)
    return out


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement under ``node`` with its kind (``kind`` is that of ``node``'s place)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, kind
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _walk(child, "function")
        elif isinstance(child, ast.If) and _type_checking(child) and kind == "module":
            for statement in child.body:
                yield from _walk(ast.Module(body=[statement], type_ignores=[]), "typing")
            for statement in child.orelse:
                yield from _walk(ast.Module(body=[statement], type_ignores=[]), kind)
        else:
            yield from _walk(child, kind)


def import_edges(known: dict[str, Path]) -> list[Edge]:
    """Every import among the ``known`` modules, with its kind and line (a module importing itself left out)."""
    edges = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, kind in _walk(tree, "module"):
            for target in sorted(_imported(node, name, path.name == "__init__.py", known)):
                if target != name:
                    edges.append(Edge(name, target, kind, node.lineno))
    return edges


def circles(nodes: list[str], edges: list[Edge]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's, without recursion)."""
    graph: dict[str, list[str]] = {n: [] for n in nodes}
    for e in edges:
        graph[e.source].append(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def _described(found: list[frozenset[str]], edges: list[Edge]) -> str:
    lines = []
    for component in found:
        lines.append("circle: " + ", ".join(sorted(component)))
        lines += [f"    {e}" for e in edges if e.source in component and e.target in component]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def graph() -> tuple[list[str], list[Edge]]:
    known = module_files(ROOT, PACKAGES)
    return list(known), import_edges(known)


def test_no_import_circle_at_import_time(graph):
    nodes, edges = graph
    at_import = [e for e in edges if e.kind == "module"]
    found = circles(nodes, at_import)
    assert not found, "modules that import each other when imported:\n" + _described(found, at_import)


def test_no_import_circle_through_lazy_or_typing_imports_but_those_pending(graph):
    nodes, edges = graph
    found = circles(nodes, edges)
    new = [c for c in found if c not in PENDING]
    assert not new, "import circles (a function-level or TYPE_CHECKING import is still an import):\n" + _described(
        new, edges
    )
    gone = [", ".join(sorted(c)) for c in PENDING if c not in found]
    assert not gone, f"no longer a circle, drop it from PENDING: {gone}"


def test_the_zoo_result_is_below_its_export(graph):
    """``zoo.export`` writes a ``ZooResult`` out with the case registry's title and scenario; the result, below
    the cases that make it, never reaches up to it (it once did, for ``ZooResult.to_pytest``)."""
    _, edges = graph
    assert any(e.source == "workbench.zoo.export" and e.target == "workbench.zoo.result" for e in edges)
    assert not [str(e) for e in edges if e.source == "workbench.zoo.result" and e.target.startswith("workbench.zoo")]


# -- the graph itself, on a package written here --------------------------------------------------------------
def _package(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return module_files(root, ("pkg",))


def test_every_kind_of_import_is_an_edge(tmp_path):
    known = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": (
                "from typing import TYPE_CHECKING\n"
                "import pkg.sub.c as c\n"
                "from . import b\n"
                "from .sub import c as again, NAME\n"
                "if TYPE_CHECKING:\n    from pkg.sub.d import D\nelse:\n    D = None\n"
                "class A:\n    def f(self):\n        from pkg import b\n        import os\n"
            ),
            "pkg/b.py": "",
            "pkg/sub/__init__.py": "NAME = 1\nfrom ..b import *\n",
            "pkg/sub/c.py": "",
            "pkg/sub/d.py": "",
        },
    )
    edges = {(e.source, e.target, e.kind) for e in import_edges(known)}
    assert edges == {
        ("pkg", "pkg.a", "module"),
        ("pkg.a", "pkg.sub.c", "module"),
        ("pkg.a", "pkg.b", "module"),
        ("pkg.a", "pkg.sub", "module"),  # NAME is no module: the package is what is imported
        ("pkg.a", "pkg.sub.d", "typing"),
        ("pkg.a", "pkg.b", "function"),
        ("pkg.sub", "pkg.b", "module"),
    }


def test_a_circle_is_found_whatever_kind_of_import_closes_it(tmp_path):
    known = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low.py": "def f():\n    from pkg.high import g\n",  # a lazy import closes it
            "pkg/high.py": "from pkg.mid import h\n",
            "pkg/mid.py": "from pkg.low import f\n",
            "pkg/alone.py": "from pkg.low import f\n",
        },
    )
    edges = import_edges(known)
    assert circles(list(known), edges) == [frozenset({"pkg.low", "pkg.mid", "pkg.high"})]
    assert circles(list(known), [e for e in edges if e.kind == "module"]) == []
