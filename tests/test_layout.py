"""The package's shape, held by tests: imports only go down the floors docs/layout.md draws
(no circle, none hidden in a function or behind ``TYPE_CHECKING``), no module a newcomer cannot
read whole (the scripts of experiments/ and examples/ too, with no import circle among them),
the entry points in ``cli/`` with ``pe-bench`` the thin wrapper its docstring says it is,
Hydra's internals and the config resolvers each in one module, and ``tests/`` laid out as the
package is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import tomllib

from tests.helpers import ROOT

PACKAGE = ROOT / "pe_bench"
TESTS = ROOT / "tests"
MAX_MODULE_LINES = 500
MAX_TEST_LINES = 500
MAX_FUNCTION_LINES = 60
# A module this close to the cap is split on its seams, or says in its docstring why it is one
# piece (a line starting "One module:"), so that it is not kept under the cap by trimming.
NEAR_CAP = MAX_MODULE_LINES - 30
MAX_CLI_LINES = 150
# docs/layout.md's floors: a package (or top-level module) imports only from lower floors.
FLOORS = {
    "cli": 8,
    "pretrained": 7,
    "run": 6,
    "conformance": 6,
    "report": 5,
    "api": 5,  # a scheme in your own model: over model/ and positions/
    "model": 4,
    "data": 3,
    "positions": 3,
    "records": 2,
    "config": 2,
    "resolvers": 2,
    "stats": 2,
    "provenance": 2,
    "files": 1,
    "errors": 0,
}
# Test folders that mirror no package: the experiments' tests and the plugins tests import.
NOT_MIRRORED = {"experiments", "plugins"}
# Tests at the top of tests/ that check the repository as a whole, not one module.
WHOLE_REPO = {"test_layout", "test_docs", "test_committed_keys", "test_reference_results"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
# The scripts beside the package (experiments/, examples/): short like its modules, and no
# import circle among them (a script imports a sibling by its bare name, from its folder).
SCRIPTS = {
    p.relative_to(ROOT).as_posix(): p
    for folder in ("experiments", "examples")
    for p in sorted((ROOT / folder).rglob("*.py"))
}


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


def sibling_imports(path: Path) -> set[str]:
    """The scripts of ``path``'s folder that the script ``path`` imports (by bare name)."""
    siblings = {p.stem for p in path.parent.glob("*.py")} - {path.stem}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in siblings}
        elif isinstance(node, ast.ImportFrom) and node.module in siblings and not node.level:
            found.add(node.module)
    return {(path.parent / f"{name}.py").relative_to(ROOT).as_posix() for name in found}


def test_no_import_circle_among_the_scripts():
    """experiments/kill_anywhere.py imports kill_together.py, which must not import it back."""
    graph = {name: sibling_imports(path) for name, path in SCRIPTS.items()}
    assert "experiments/kill_together.py" in graph["experiments/kill_anywhere.py"]
    assert find_cycle(graph) == []


@pytest.mark.parametrize("name", [*sorted(MODULES), *sorted(SCRIPTS)])
def test_modules_and_functions_are_short(name):
    text = {**MODULES, **SCRIPTS}[name].read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{name} is over {MAX_MODULE_LINES} lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{name}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


@pytest.mark.parametrize("name", [*sorted(MODULES), *sorted(SCRIPTS)])
def test_a_module_near_the_cap_says_why(name):
    text = {**MODULES, **SCRIPTS}[name].read_text()
    if len(text.splitlines()) > NEAR_CAP:
        doc = ast.get_docstring(ast.parse(text)) or ""
        assert re.search(r"(?m)^One module:", doc), (
            f"{name} is within 30 lines of the {MAX_MODULE_LINES}-line cap: split it on a seam "
            "or say why it is one piece in its docstring (a line starting 'One module:')"
        )


def floor_of(name: str) -> str:
    """The floor ``name`` is on: its package below pe_bench, or its top-level module."""
    return name.split(".")[1]


def test_every_package_has_a_floor():
    assert {floor_of(name) for name in MODULES if "." in name} == set(FLOORS)


def test_imports_only_go_down_the_floors():
    up = [
        f"{name} imports {dep}"
        for name in MODULES
        if "." in name
        for dep in imported_modules(name)
        if floor_of(dep) != floor_of(name) and FLOORS[floor_of(dep)] >= FLOORS[floor_of(name)]
    ]
    assert not up, "imports that do not go down (tests/test_layout.py FLOORS): " + "; ".join(up)


def test_cli_is_thin():
    assert len((PACKAGE / "cli" / "bench.py").read_text().splitlines()) < MAX_CLI_LINES


def test_every_console_script_is_a_module_of_cli():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    modules = {target.split(":")[0] for target in scripts.values()}
    assert {m.rsplit(".", 1)[0] for m in modules} == {"pe_bench.cli"}, scripts
    assert all(m in MODULES for m in modules)


def modules_matching(pattern: str) -> set[str]:
    return {name for name, path in MODULES.items() if re.search(pattern, path.read_text())}


def test_hydras_internals_are_imported_in_one_module():
    imports = r"(?m)^\s*(from|import) hydra\._internal"
    assert modules_matching(imports) == {"pe_bench.cli.hydra_private"}


def test_resolvers_are_registered_in_one_place():
    assert modules_matching(r"register_new_resolver") == {"pe_bench.resolvers"}
    assert modules_matching(r"register_resolvers\(\)") == {"pe_bench", "pe_bench.resolvers"}


TEST_FILES = sorted(TESTS.rglob("*.py"))


def test_tests_mirror_the_package():
    """Each folder of tests/ is a package of pe_bench/ (but ``NOT_MIRRORED``); each test file
    at the top tests a top-level module (test_records.py: records.py) or the whole repo."""
    folders = {p.parent.relative_to(TESTS) for p in TEST_FILES} - {Path(".")}
    stray = [
        str(f) for f in folders if f.parts[0] not in NOT_MIRRORED and not (PACKAGE / f).is_dir()
    ]
    assert not stray, f"tests/ folders that mirror no package of pe_bench/: {stray}"
    top = {p.stem for p in TESTS.glob("test_*.py")} - WHOLE_REPO
    assert not [t for t in top if not (PACKAGE / f"{t.removeprefix('test_')}.py").exists()]


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: str(p.relative_to(TESTS)))
def test_test_files_are_short(path):
    assert len(path.read_text().splitlines()) <= MAX_TEST_LINES, f"{path} is over the cap"
