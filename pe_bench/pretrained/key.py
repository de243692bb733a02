"""The key of the code that computes a pretrained model's numbers (``model=hf``).

A pretrained model's records carry it as ``pe_source``, as a trained model's carry the key of
its scheme's code (``positions.scheme_key``), and ``RunStore`` recomputes the records of
another key. It covers what pe-bench adds to the model: the functions that apply an eval-time
variant to an HF model (``pretrained.rope``: the model's rotary spec, the patched frequencies
and attention, HF's ``rope_parameters`` of each method, which labels compute the same numbers
at a length; ``pretrained.windowed``: the attention of ReRoPE, Self-Extend, DCA and the other
windowed variants) and the passkey test's prompts and greedy decoding
(``pretrained.passkey``), each as its normalised syntax tree
(``fingerprint.normalised_source``: docstrings, comments and where the function sits do not
count). A variant's records carry the key of the variant's own code as ``variant_source``
(``variant_key``), so editing one variant recomputes its records only.

The model's weights are keyed apart, as ``weights_sha`` (``weights_key``): a GGUF file by its
sha256 (also part of its run id), a local folder (or file) by a hash of its files' bytes, so
weights changed in place (``make_tiny_hf.py`` rerun into its folder) are evaluated again; a
hub model by the commit its ``model.revision`` (or ``main``) resolves to, so a revision moved
on is too. HF's own code is named by the records' provenance, not here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pe_bench.positions import ModelDims
from pe_bench.positions.fingerprint import class_key, normalised_source
from pe_bench.pretrained import passkey, rope, windowed
from pe_bench.pretrained.rope import Variant

if TYPE_CHECKING:
    from pe_bench.run.config import PretrainedConfig

# What applies a variant to an HF model (pe_bench.pretrained.rope) ...
APPLY = (
    "LONG_LAYERS",
    "rope_spec",
    "rotary_modules",
    "attention_layers",
    "scaled_attention",
    "register_attention",
    "scheme_defaults",
    "frequencies_only",
    "build_variants",
    "uses_hf",
    "rope_variant",
    "hf_rope",
    "pe_bench_rope",
    "HF_ROPE_TYPES",
    "_linear",
    "_dynamic",
    "_yarn",
    "_llama3",
    "_longrope",
    "windowed",
    "Effect",
    "effect",
    "same_as",
)
# ... with the attention of the windowed variants (pe_bench.pretrained.windowed) ...
WINDOWED = ("Piece", "rotate", "windowed_attention", "plan", "_runs", "attend", "merge")
# ... and the passkey test's prompts and decoding (pe_bench.pretrained.passkey).
PASSKEY = (
    "TASK",
    "FILLER",
    "QUESTION",
    "KEYS",
    "key_sentence",
    "prompt_text",
    "fit_prompt",
    "draws",
    "first_integer",
    "answered",
    "greedy",
    "cache_keyword",
)


def pretrained_key() -> str:
    """The key of the code above as it is now: 12 hex digits."""
    return code_key({**named(rope, APPLY), **named(windowed, WINDOWED), **named(passkey, PASSKEY)})


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


def named(module: ModuleType, names: Iterable[str]) -> dict[str, Any]:
    """``{name: module.name}`` for each of ``names`` (a missing one is ``None``)."""
    return {name: getattr(module, name, None) for name in names}


def code_key(objects: Mapping[str, Any]) -> str:
    """A hash of named functions and constants: functions as normalised syntax trees, a dict
    of functions by their names, other values by ``repr``."""
    return hashlib.sha256(
        json.dumps({name: _normalised(obj) for name, obj in sorted(objects.items())}).encode()
    ).hexdigest()[:12]


def _normalised(obj: Any) -> Any:
    if callable(obj):
        return normalised_source(obj)
    if isinstance(obj, Mapping):
        return {str(k): _normalised(v) if not callable(v) else v.__name__ for k, v in obj.items()}
    return repr(obj)
