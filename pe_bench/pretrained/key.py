"""The key of the code that computes a pretrained model's numbers (``model=hf``).

A pretrained model's records carry it as ``pe_source``, as a trained model's carry the key of
its scheme's code (``positions.scheme_key``), and ``RunStore`` recomputes the records of
another key. It is derived from the code, not listed: every module-level definition (function,
class, constant) of every module of ``pe_bench.pretrained`` that computes numbers, by module
and name, as its normalised syntax tree (docstrings, comments and log lines do not count). A
module computes numbers unless it is one of ``PIPELINE``, the steps around the methods, which
are keyed as a trained model's pipeline is (by the settings in each record's identity and
hashes, the weights and the tokenizer): so the variant patches (``rope``, ``windowed``), the
passkey test (``passkey``), the perplexity protocols (``tail``, ``truncate``), RULER's
generators and scoring, and any function or module added beside them (a DCA patch) are in
the key the moment they exist. A variant's records carry the key of the variant's own code as
``variant_source`` (``variant_key``), so editing one variant recomputes its records only.

The model's weights are keyed apart, as ``weights_sha`` (``weights_key``): a GGUF file by its
sha256 (also part of its run id), a local folder (or file) by a hash of its files' bytes, so
weights changed in place (``make_tiny_hf.py`` rerun into its folder) are evaluated again; a
hub model by the commit its ``model.revision`` (or ``main``) resolves to, so a revision moved
on is too. HF's own code is named by the records' provenance, not here.
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pe_bench.positions import ModelDims
from pe_bench.positions.fingerprint import _tree, class_key

if TYPE_CHECKING:
    from pe_bench.pretrained.rope import Variant
    from pe_bench.run.config import PretrainedConfig

PACKAGE = Path(__file__).parent  # pe_bench/pretrained
# The modules around the methods, not keyed: this key; the plan (which records a run owes:
# their identities and settings hashes); the steps that run the methods and write records
# (as run/trained.py for a trained model); loading the weights and tokenizer (``weights_sha``,
# ``tokenizer_sha``).
PIPELINE = ("key.py", "plan.py", "evaluate.py", "load.py")
LOGGERS = ("log", "logger", "logging")  # a call on one of these is a log line: not keyed
STATEMENTS = "<statements>"  # a module's top-level statements that define no name


def pretrained_key(package: Path = PACKAGE) -> str:
    """The key of the code in ``package`` (``pe_bench/pretrained``) as it is now: 12 hex
    digits."""
    return code_key(definitions(package))


def definitions(package: Path = PACKAGE) -> dict[str, list[str]]:
    """Every module-level definition of the modules under ``package`` that compute numbers
    (all but ``PIPELINE``), as ``module.name``: the normalised syntax tree of each statement
    that defines it. Imports, docstrings and log lines are left out; top-level statements
    that define nothing are keyed as ``module.<statements>``."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.as_posix() in PIPELINE:
            continue
        module = ".".join(rel.with_suffix("").parts)
        for name, tree in module_definitions(path.read_text(encoding="utf-8")):
            found.setdefault(f"{module}.{name}", []).append(tree)
    return {name: sorted(trees) for name, trees in found.items()}


def module_definitions(source: str) -> list[tuple[str, str]]:
    """(name, normalised syntax tree) of each top-level statement of a module's ``source``
    that is not an import, a docstring or a log line (``_normalised``)."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or unkeyed_statement(node):
            continue
        tree = _normalised(node)
        names = defined_names(node) or [STATEMENTS]
        found += [(name, tree) for name in names]
    return found


def defined_names(node: ast.stmt) -> list[str]:
    """The names a top-level statement defines (none for an expression, an ``if``, ...)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else []
    if isinstance(node, ast.AnnAssign):
        targets = [node.target]
    return [name for target in targets for name in _names(target)]


def _names(target: ast.expr) -> list[str]:
    """The names an assignment target binds (``a``, ``a, *b``; none for ``x.y`` or ``x[0]``)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return _names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _names(element)]
    return []


def unkeyed_statement(node: ast.AST) -> bool:
    """A docstring, or a log line (``log.info(...)``): neither computes a number."""
    if not isinstance(node, ast.Expr):
        return False
    value = node.value
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return True
    func = value.func if isinstance(value, ast.Call) else None
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in LOGGERS
    )


def _normalised(node: ast.AST) -> str:
    """``node``'s syntax tree without docstrings and log lines in any body, as JSON without
    line numbers (``fingerprint._tree``, as a scheme's classes are keyed)."""
    for inner in ast.walk(node):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(inner, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                kept = [stmt for stmt in body if not unkeyed_statement(stmt)]
                setattr(inner, field, kept or ([ast.Pass()] if field == "body" else []))
    return json.dumps(_tree(node))


def code_key(objects: Mapping[str, Any]) -> str:
    """A hash of named normalised definitions (``definitions``), 12 hex digits."""
    return hashlib.sha256(json.dumps(dict(sorted(objects.items()))).encode()).hexdigest()[:12]


def variant_key(variant: Variant, dims: ModelDims) -> str:
    """The key of a pretrained model's variant's code (``fingerprint.class_key``), with the
    options it is built with (``base`` = the model's ``rope_theta``); ``dims``, the model's
    rotary dims, where the options need them."""
    return class_key(type(variant.scheme), variant.options, dims)


def weights_key(model: PretrainedConfig) -> str:
    """What the model's weights are: ``gguf:<sha256>`` of a GGUF file, ``files:<sha256>`` of a
    local folder's files (names and
    bytes; hidden files, such as a download's ``.cache``, left out) or of a local file, else
    ``commit:<sha>`` of the hub commit that ``model.revision`` names now (``revision:<name>``
    where the hub, offline, names none)."""
    # imported here: experiments/migrate_keys.py loads this module into old trees, which
    # have neither module
    from pe_bench.pretrained.load import load_config
    from pe_bench.run.weights import resolve, sha256

    gguf = resolve(model.name, model.gguf_file).path
    if gguf is not None:
        return f"gguf:{sha256(gguf)[:16]}"
    path = Path(model.name).expanduser()
    if path.exists():
        return f"files:{files_hash(path)}"
    commit = getattr(load_config(model), "_commit_hash", None)
    return f"commit:{commit}" if commit else f"revision:{model.revision or 'main'}"


def files_hash(path: Path) -> str:
    """sha256 of the files under ``path`` (or of the file ``path``): each one's path relative
    to it, size and bytes, in sorted order; 16 hex digits."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for file in files:
        rel = file.relative_to(path).as_posix() if file != path else file.name
        if any(part.startswith(".") for part in Path(rel).parts):
            continue
        digest.update(f"{rel}\0{file.stat().st_size}\0".encode())
        with open(file, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:16]
