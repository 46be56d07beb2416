"""hmt's import graph, read from the source: no circle among its modules, and the on-device
half (hmt.serve, hmt.runtime) never imports torch or an offline stage.

Every ``import`` counts, at module level, inside functions and under ``TYPE_CHECKING``: a
lazy import only defers a circle to the first call that takes it. A module's edges go to the
most specific hmt module each import names (``from hmt.a import b`` reaches ``hmt.a.b`` when
that is a module, and ``hmt.a``'s ``__init__`` too, since Python runs it first)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hmt

ON_DEVICE = ("hmt.serve", "hmt.runtime")
OFFLINE = ("torch", "hmt.supernet", "hmt.profile", "hmt.pareto", "hmt.convert", "hmt.fuse", "hmt.deploy",
           "hmt.data")


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at ``root``."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported_names(name: str, path: Path) -> set[str]:
    """Every dotted name a module's imports name, anywhere in the file (relative ones resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (the nearest enclosing module of each name)."""
    modules = module_names(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for target in imported_names(name, path):
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            target = next(edges, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
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


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


HMT = Path(hmt.__file__).parent


def test_no_import_circle_among_hmt_modules() -> None:
    found = circles(import_graph(HMT))
    assert not found, "import circles (lazy imports count):\n" + "\n".join("  " + " -> ".join(c) for c in found)


def test_serve_and_runtime_import_no_torch_and_no_offline_stage() -> None:
    modules = module_names(HMT)
    bad = [f"{name} imports {target}" for name, path in modules.items() if under(name, ON_DEVICE)
           for target in sorted(imported_names(name, path)) if under(target, OFFLINE)]
    assert not bad, "the on-device half imports torch or an offline stage:\n" + "\n".join(bad)


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


def test_the_checker_finds_a_circle_through_a_lazy_and_a_relative_import(tmp_path: Path) -> None:
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a/__init__.py": "from pkg.a.one import f\n",
        "pkg/a/one.py": "def f():\n    from ..b import two\n    return two\n",
        "pkg/b/__init__.py": "",
        "pkg/b/two.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import one\n",
        "pkg/c.py": "import pkg.b.two\n",
    })
    assert circles(import_graph(pkg)) == [["pkg.a", "pkg.a.one", "pkg.b.two"]]


@pytest.mark.parametrize("text", ["import pkg.b.two\n", "from pkg.b import two\n"])
def test_the_checker_finds_no_circle_in_a_chain(tmp_path: Path, text: str) -> None:
    pkg = _write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": text, "pkg/b/__init__.py": "",
                            "pkg/b/two.py": "import os\n"})
    assert circles(import_graph(pkg)) == []
    assert import_graph(pkg)["pkg.a"] == {"pkg.b.two"} | ({"pkg.b"} if text.startswith("from") else set())
