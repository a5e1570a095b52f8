"""The shape of the package (docs/architecture/index.md), checked: no module
over 600 lines, no private name imported from another module, no import
cycle between modules or between sub-packages (imports under
``TYPE_CHECKING`` aside). The layers themselves are `lint-imports`' contract
(``pyproject.toml``), run by ``make lint``."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import grimp

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "eddyflow"
MAX_LINES = 600


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def test_no_module_is_over_600_lines() -> None:
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these along a real seam: {long}"


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_private_name_is_imported_from_another_module() -> None:
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if not node.module.startswith("eddyflow"):
                    continue
                if any(private(part) for part in node.module.split(".")):
                    found.append(f"{name}: from {node.module}")
                found += [f"{name}: {a.name} from {node.module}"
                          for a in node.names if private(a.name)]
            elif isinstance(node, ast.Import):
                found += [f"{name}: import {a.name}" for a in node.names
                          if a.name.startswith("eddyflow")
                          and any(private(p) for p in a.name.split("."))]
    assert not found, found


def graph() -> grimp.ImportGraph:
    return grimp.build_graph("eddyflow", exclude_type_checking_imports=True)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_modules() -> None:
    g = graph()
    # A package's __init__ re-exporting its modules is not a cycle of design.
    edges = {m: {i for i in g.find_modules_directly_imported_by(m) if not m.startswith(i + ".")}
             for m in g.modules}
    assert not cycles(edges)


def package_of(module: str, packages: set[str]) -> str:
    """The sub-package a module is in (itself for a top-level module)."""
    return module if module in packages or module.count(".") < 2 else module.rsplit(".", 1)[0]


def test_no_import_cycle_between_sub_packages() -> None:
    g = graph()
    packages = {m for m, p in modules().items() if p.name == "__init__.py"}
    edges: dict[str, set[str]] = defaultdict(set)
    for m in g.modules:
        for i in g.find_modules_directly_imported_by(m):
            a, b = package_of(m, packages), package_of(i, packages)
            if a != b and not a.startswith(b + ".") and not b.startswith(a + "."):
                edges[a].add(b)
    assert not cycles(edges)
