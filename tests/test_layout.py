"""The package's shape, held by tests: imports only go down (no circle, none hidden in a
function or behind ``TYPE_CHECKING``), no module a newcomer cannot read whole, and ``cli.py`` the
thin wrapper its docstring says it is (docs/layout.md draws the packages)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "pe_bench"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
MAX_CLI_LINES = 150


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(name: str) -> set[str]:
    """Every pe_bench module ``name`` imports, wherever the import statement is."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in MODULES}
        elif isinstance(node, ast.ImportFrom) and node.module in MODULES:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in MODULES else node.module)
    return found - {name}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (the modules in order, the first repeated), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_find_cycle_finds_a_cycle_and_only_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle():
    graph = {name: imported_modules(name) for name in MODULES}
    assert find_cycle(graph) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_and_functions_are_short(name):
    text = MODULES[name].read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{name} is over {MAX_MODULE_LINES} lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{name}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


def test_cli_is_thin():
    assert len((PACKAGE / "cli.py").read_text().splitlines()) < MAX_CLI_LINES
