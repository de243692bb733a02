"""The worker of ``experiments/migrate_keys.py``: what one tree's ``pe_bench`` computes for the
records' code (module docstring there, steps 2 and 3), run in a fresh interpreter whose path
holds that tree (today's, or an old commit's ``git archive``), so that the old code computes
its own numbers. Reads the items as JSON on stdin, prints the results as one JSON line.

Its own script, not a function of migrate_keys.py: it runs under another tree's ``pe_bench``,
and it imports only the standard library, torch and that tree (today's fingerprint and key
modules are loaded by path where the old tree lacks them).

    python experiments/migrate_worker.py < items.json   # run by migrate_keys.run_worker
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # today's tree


def _fingerprint_module() -> Any:
    """``pe_bench.positions.fingerprint``: the tree's own, or today's loaded into an old tree
    (its imports, ``pe_bench.positions.base``, are then the old tree's)."""
    try:
        return importlib.import_module("pe_bench.positions.fingerprint")
    except ImportError:
        name = "pe_bench.positions.fingerprint"
        spec = importlib.util.spec_from_file_location(
            name, ROOT / "pe_bench" / "positions" / "fingerprint.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module


def _key_module() -> Any:
    """``pe_bench.pretrained.key`` from today's tree (it imports only the fingerprint)."""
    _fingerprint_module()
    spec = importlib.util.spec_from_file_location(
        "pe_bench_key", ROOT / "pe_bench" / "pretrained" / "key.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What this tree computes for each item: a scheme's key parts (with each class's
    normalised source, and the old file hash where the tree has one), or the pretrained
    code's key (with each function's)."""
    import torch

    torch.set_num_threads(1)
    fingerprint = _fingerprint_module()
    positions = importlib.import_module("pe_bench.positions")
    out: list[dict[str, Any]] = [{"tree": str(Path(positions.__file__).parents[2])}]
    for item in items:
        try:
            if item["kind"] == "hf_code":
                out.append(_hf_code())
                continue
            if item.get("plugin"):
                importlib.import_module(item["plugin"])
            cls = positions.scheme_class(item["name"])
            dims = positions.ModelDims(**item["dims"]) if item.get("dims") else None
            parts = fingerprint.key_parts(cls, item["options"], dims)
            base = fingerprint._position_scheme(cls)
            classes = [c for c in cls.__mro__ if c not in set(base.__mro__)]
            parts["classes"] = {
                c.__qualname__: fingerprint._sha(fingerprint.normalised_source(c)) for c in classes
            }
            source_hash = getattr(positions, "source_hash", None)
            parts["source_hash"] = source_hash(cls) if source_hash else None
            out.append(parts)
        except Exception as err:  # an old tree that cannot build it: the numbers are unknown
            out.append({"error": f"{type(err).__name__}: {err}"})
    return out


def _hf_code() -> dict[str, Any]:
    """The pretrained code's definitions in this tree's ``pe_bench/pretrained`` (today's
    ``key.definitions``): the key, each ``module.name``'s digest after the equivalences a
    proof may use (``_proof_source``), the modules, and the names whose definition is inert
    (``_inert``)."""
    key = _key_module()
    package = Path(importlib.import_module("pe_bench").__file__).parent / "pretrained"
    paths = sorted(package.rglob("*.py")) if package.is_dir() else []
    paths = [p for p in paths if p.relative_to(package).as_posix() not in key.PIPELINE]
    found: dict[str, list[str]] = {}
    inert = []
    for path in paths:
        module = ".".join(path.relative_to(package).with_suffix("").parts)
        source = path.read_text(encoding="utf-8")
        for name, tree in key.module_definitions(_proof_source(source, key)):
            found.setdefault(f"{module}.{name}", []).append(tree)
        for node in ast.parse(source).body:
            names = key.defined_names(node) if _inert(node) else []
            inert += [f"{module}.{name}" for name in names]
    found = {name: sorted(trees) for name, trees in found.items()}
    return {
        "key": key.pretrained_key(package) if package.is_dir() else None,
        "each": {name: key.code_key({name: trees}) for name, trees in found.items()},
        "inert": sorted(set(inert)),
        "modules": sorted({name.split(".")[0] for name in found}),
    }


PURE_DECORATORS = ("dataclass", "cache", "lru_cache", "staticmethod", "classmethod", "property")


def _inert(node: ast.stmt) -> bool:
    """A definition that does nothing on import: a function or class decorated by nothing
    but ``PURE_DECORATORS`` (``dataclass(frozen=True)`` too), or an assignment that calls
    nothing."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return all(_decorator_name(d) in PURE_DECORATORS for d in node.decorator_list)
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        return not any(isinstance(n, ast.Call) for n in ast.walk(node))
    return False


def _decorator_name(node: ast.expr) -> str:
    """``dataclass`` of ``@dataclass``, ``@dataclasses.dataclass(frozen=True)``, ..."""
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _proof_source(source: str, key: Any) -> str:
    """``source`` without log lines anywhere, and with a loop counter that only they read
    dropped: ``for i, x in enumerate(xs)`` is ``for x in xs`` (the same items in the same
    order; 1199a25 numbered the passkey trials for a log line)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                kept = [stmt for stmt in body if not key.unkeyed_statement(stmt)]
                setattr(node, field, kept or ([ast.Pass()] if field == "body" else []))
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and _unread_counter(node):
            node.target, node.iter = node.target.elts[1], node.iter.args[0]
    return ast.unparse(tree)


def _unread_counter(loop: ast.For) -> bool:
    """Whether ``loop`` is ``for i, x in enumerate(xs[, start])`` with ``i`` read nowhere."""
    call, target = loop.iter, loop.target
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == "enumerate"
        and 1 <= len(call.args) <= 2
        and not call.keywords
        and isinstance(target, ast.Tuple)
        and len(target.elts) == 2
        and isinstance(target.elts[0], ast.Name)
    ):
        return False
    counter = target.elts[0].id
    body = [*loop.body, *loop.orelse]
    return not any(isinstance(n, ast.Name) and n.id == counter for s in body for n in ast.walk(s))


if __name__ == "__main__":
    print(json.dumps(worker(json.loads(sys.stdin.read()))))
