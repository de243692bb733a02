"""The key of a position scheme's code: what decides whether a stored record is still fresh.

Records carry the key of the scheme that made them (``pe_source``; a variant's records also
``variant_source``) and checkpoints end their fingerprint in it, so that a job folder's records
and checkpoint are kept exactly as long as the code would compute the same numbers. git's SHA
cannot say that (it changes with every commit, and it does not cover a plugin's code), and a
hash of whole source files says it badly: moving a file or editing a docstring in ``base.py``
made every record stale, while a formula in a helper module the scheme imports escaped it.

The key is a hash of two parts:

- **source**: the normalised source of each class the scheme's class is made of (its MRO less
  ``PositionScheme`` and what that inherits; mixins included): the class statement's syntax
  tree with docstrings stripped, so comments, docstrings, formatting, the file and module it
  sits in do not count, and an edit of the class's own code does;
- **numbers**: what the scheme computes on a fixed probe. The scheme is built with its
  configured options for small fixed dimensions (``PROBE_DIMS``) under a fixed seed, every
  parameter is moved by fixed noise (so zero-initialised tables count), and the hooks the
  model calls are run on fixed inputs, in training and evaluation mode, below, at and past
  (3x) the training length, query chunks included: the positions, ``embed``, and for every
  layer the attention weights that ``transform_qk`` (``rotate``, ``logit_scale``),
  ``score_bias``/``logit_bias``, ``modify_logits``, ``attention_mask`` and
  ``attention_weights`` give, and for a scheme that attends itself (``attend``) its output on
  fixed layer inputs, queries, keys and values (a scheme that reads the tokens,
  ``read_tokens``, reads fixed ones first); a RoPE variant's ``frequencies`` and
  ``attention_factor`` too (what a pretrained model receives); the state dict's names and
  shapes and the declared flags. So an edit of a formula anywhere (a helper function or
  module, ``base.py``'s defaults) changes the key when it changes what the hooks compute,
  and a refactor that computes the same numbers does not.

The numbers are made the same on every machine: the probe runs on the CPU in float64 (a
scheme's own float32 casts are widened while the key is computed, ``Float64``), its inputs and
noise come from numpy's PCG64 bits (integer arithmetic, the same everywhere), and every value
is rounded to 20 significant bits, about 6 decimal digits (values below 1e-9 of their
tensor's largest are 0), before hashing: the last bits that vector units, thread counts and
BLAS kernels change never reach the key. (Without the widening, CoPE's float32 matmuls gave
another key under ``ATEN_CPU_CAPABILITY=default`` than under AVX512.) A change that only
rounds float32 differently keeps the key; a change of formula, which moves a record's numbers
by more than that, changes it.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import inspect
import json
import math
import textwrap
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from pe_bench.positions.base import ModelDims, PositionScheme

VERSION = 1  # bump when what the key covers changes: every stored record is then stale
PROBE_DIMS = ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=4, train_len=16)
PROBE_LENGTHS = (7, 16, 48)  # below, at and past (3x) the training length
# What the model does differently by a scheme's declarations (``relative`` only says what the
# conformance kit checks and which fast paths apply: the same numbers either way).
FLAGS = {"content_bias": False, "shared_bias": False, "scales_bias": False, "eval_draws": 1}
CHUNK = 17  # the longest length's last 17 queries are also scored alone (s_q < s_k)
BITS = 20  # significant bits of each value hashed (6 decimal digits)
FLUSH = 1e-9  # values below this fraction of their tensor's largest count as 0


def class_key(
    cls: type[PositionScheme],
    options: Mapping[str, Any] | None = None,
    dims: ModelDims | None = None,
) -> str:
    """The key of scheme class ``cls`` built with ``options``: 12 hex digits (computed once
    per process for each class, options and dims)."""
    options = dict(options or {})
    cached = (cls, json.dumps(options, sort_keys=True, default=repr), dims)
    if cached not in _KEYS:
        _KEYS[cached] = _sha({"version": VERSION, **key_parts(cls, options, dims)})[:12]
    return _KEYS[cached]


_KEYS: dict[tuple[type, str, ModelDims | None], str] = {}


def key_parts(
    cls: type[PositionScheme], options: Mapping[str, Any], dims: ModelDims | None = None
) -> dict[str, str]:
    """The two hashes the key is made of: ``source`` and ``numbers`` (see the module
    docstring); the migration of stored records compares them one by one."""
    return {"source": source_digest(cls), "numbers": numbers_digest(cls, options, dims)}


# ---- source ---------------------------------------------------------------------------------


def source_digest(cls: type) -> str:
    """A hash of the normalised source of each class ``cls`` is made of, besides
    ``PositionScheme`` and its own bases."""
    base = _position_scheme(cls)
    skip = set(base.__mro__) if base is not None else {object}
    return _sha([normalised_source(c) for c in cls.__mro__ if c not in skip])


def normalised_source(obj: Any) -> str:
    """A class's or function's syntax tree without docstrings, as JSON (``_tree``: no line
    numbers): the same wherever the code sits and however it is commented or formatted. Code
    without a source file (defined in a REPL) is named instead."""
    try:
        text = textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        return f"<no source: {getattr(obj, '__qualname__', repr(obj))}>"
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            first = node.body[0] if node.body else None
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return json.dumps(_tree(tree))


def _tree(node: Any) -> Any:
    """A syntax tree as nested lists: each node's type and its fields, leaving out the empty
    ones (None, []), so that a field a newer Python adds with an empty default (3.12's
    ``type_params``) does not change it, as ``ast.dump``'s text would."""
    if isinstance(node, ast.AST):
        fields = [(name, getattr(node, name, None)) for name in node._fields]
        return [type(node).__name__, [[k, _tree(v)] for k, v in fields if v not in (None, [])]]
    if isinstance(node, list):
        return [_tree(item) for item in node]
    return repr(node)


def _position_scheme(cls: type) -> type | None:
    """``PositionScheme`` as ``cls`` knows it (by name: an older pe-bench's, in a migration)."""
    for c in cls.__mro__:
        if c.__name__ == "PositionScheme" and c.__module__.endswith("positions.base"):
            return c
    return None


# ---- numbers --------------------------------------------------------------------------------


class Float64(TorchFunctionMode):
    """Torch calls with float32 (or half) widened to float64: ``x.float()``, ``dtype=`` and
    ``.to(torch.float32)``. A scheme casts to float32 where the model needs it; the probe
    computes in float64 so that its numbers do not depend on the CPU's vector unit."""

    NARROW = (torch.float32, torch.float16, torch.bfloat16)
    CASTS = (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.CASTS:
            return args[0].double()
        args = tuple(self._wide(a) for a in args)
        kwargs = {k: self._wide(v) for k, v in (kwargs or {}).items()}
        return func(*args, **kwargs)

    @classmethod
    def _wide(cls, value: Any) -> Any:
        return torch.float64 if isinstance(value, torch.dtype) and value in cls.NARROW else value


@contextlib.contextmanager
def float64() -> Iterator[None]:
    """``Float64`` with float64 as the default dtype, the global generator forked and seeded,
    and no gradients; everything restored after."""
    default = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]), torch.no_grad(), Float64():
        torch.set_default_dtype(torch.float64)
        torch.manual_seed(0)
        try:
            yield
        finally:
            torch.set_default_dtype(default)


def numbers_digest(
    cls: type[PositionScheme], options: Mapping[str, Any], dims: ModelDims | None = None
) -> str:
    """A hash of what the scheme computes on the probe (see the module docstring)."""
    digest = _Digest()
    with float64():
        scheme, probe = _build(cls, options, dims)
        _perturb(scheme)
        digest.add("state", [(k, list(v.shape)) for k, v in sorted(scheme.state_dict().items())])
        for flag, default in FLAGS.items():  # (a flag an older API lacks: its default)
            digest.add(flag, getattr(scheme, flag, default))
        digest.add("max_positions", getattr(scheme, "max_positions", None))
        for training in (True, False):
            scheme.train(training)
            draws = 1 if training else int(getattr(scheme, "eval_draws", 1))
            for s in PROBE_LENGTHS:
                for draw in range(draws):
                    _probe(scheme, probe, s, training, draw, digest)
        scheme.eval()
        for s in PROBE_LENGTHS:
            frequencies = _frequencies(scheme, torch.arange(s))
            if frequencies is not None:
                digest.add(f"frequencies {s}", frequencies)
            if callable(getattr(scheme, "attention_factor", None)):
                digest.add(f"attention_factor {s}", scheme.attention_factor(s))
    return digest.hexdigest()


def _frequencies(scheme: PositionScheme, k_pos: torch.Tensor) -> torch.Tensor | None:
    """A RoPE scheme's frequencies for a context of keys ``k_pos`` (what a pretrained model
    receives): ``frequencies``, or where an older API lacks it, ``inv_freq`` at
    ``context_len``, which it returned then; None for other schemes."""
    if callable(getattr(scheme, "frequencies", None)):
        return scheme.frequencies(k_pos)
    if callable(getattr(scheme, "inv_freq", None)) and callable(
        getattr(scheme, "context_len", None)
    ):
        return scheme.inv_freq(scheme.context_len(k_pos))
    return None


def _build(
    cls: type[PositionScheme], options: Mapping[str, Any], dims: ModelDims | None
) -> tuple[PositionScheme, ModelDims]:
    """The scheme built for the probe's dimensions, or for ``dims`` where its options need
    the model's own (then the probe takes at most ``PROBE_DIMS.num_layers`` layers)."""
    try:
        scheme = cls(PROBE_DIMS, **options)
        probe = PROBE_DIMS
    except Exception:
        if dims is None:
            raise
        torch.manual_seed(0)
        scheme = cls(dims, **options)
        probe = ModelDims(
            dims.d_model,
            dims.num_heads,
            dims.head_dim,
            min(dims.num_layers, PROBE_DIMS.num_layers),
            dims.train_len,
        )
    return scheme.double(), probe


def _perturb(scheme: PositionScheme) -> None:
    """Every parameter moved by fixed uniform noise in [-1, 1) (parameters in name order)."""
    bits = np.random.PCG64(12345)
    for _, param in sorted(scheme.named_parameters()):
        param.add_(torch.from_numpy(_uniform(bits, tuple(param.shape))).to(param.dtype))


def _inputs(shape: tuple[int, ...], *seed: int) -> torch.Tensor:
    """Fixed float64 values in [-1, 1) of ``shape``, from ``seed`` alone."""
    return torch.from_numpy(_uniform(np.random.PCG64(list(seed)), shape))


def _uniform(bits: np.random.PCG64, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform values in [-1, 1) from PCG64's raw 64-bit output (numpy keeps a bit generator's
    stream, though not its distributions', the same across versions): exact arithmetic."""
    raw = bits.random_raw(math.prod(shape))  # one value for a scalar's shape ()
    unit = (np.asarray(raw, dtype=np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return (2.0 * unit - 1.0).reshape(shape)


def _probe(
    scheme: PositionScheme, dims: ModelDims, s: int, training: bool, draw: int, out: _Digest
) -> None:
    """Positions, embeddings and every layer's attention weights of a sequence of ``s``."""
    label = f"{'train' if training else 'eval'} {s} {draw}"
    torch.manual_seed(1000 + s)  # training positions come from the global generator
    if not training and hasattr(scheme, "seed_eval_positions"):
        scheme.seed_eval_positions(draw)
    pos = scheme.positions(s, torch.device("cpu"))
    out.add(f"{label} positions", pos)
    reads_tokens = getattr(scheme, "reads_tokens", False)
    if reads_tokens:  # only such schemes: other keys stay
        scheme.read_tokens(_tokens(s))
    out.add(f"{label} embed", scheme.embed(_inputs((1, s, dims.d_model), s, 0), pos))
    for layer in range(dims.num_layers):
        shape = (1, dims.num_heads, s, dims.head_dim)
        q, k = _inputs(shape, s, layer, 1), _inputs(shape, s, layer, 2)
        for s_q in (s, CHUNK) if s > CHUNK else (s,):
            weights = _weights(scheme, q[:, :, s - s_q :], k, pos[s - s_q :], pos, layer)
            out.add(f"{label} layer {layer} queries {s_q}", weights)
        if getattr(scheme, "has_own_attention", False):  # only such schemes: other keys stay
            x, v = _inputs((1, s, dims.d_model), s, layer, 3), _inputs(shape, s, layer, 4)
            tq, tk = scheme.transform_qk(q, k, pos, pos, layer)
            out.add(f"{label} layer {layer} attend", scheme.attend(x, tq, tk, v, pos, layer))
    if reads_tokens:
        scheme.read_tokens(None)


def _tokens(s: int) -> torch.Tensor:
    """``[1, s]`` fixed token ids for a scheme that reads them: the bytes of a few lines of
    Python (newlines, full stops and spaces among them), repeated."""
    text = b"import os.path\nx = os.path.join(a, b)\n\nif x:\n    print(x.upper())\n"
    return torch.tensor(list(text * (s // len(text) + 1))[:s]).unsqueeze(0)


def _weights(
    scheme: PositionScheme,
    q: torch.Tensor,
    k: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    layer: int,
) -> torch.Tensor:
    """Attention weights as the model computes them (``model.attention.explicit_attention``),
    ``[b, n_h, s_q, s_k]``; a hook an older scheme API lacks is its default."""
    q, k = scheme.transform_qk(q, k, q_pos, k_pos, layer)
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if hasattr(scheme, "logit_bias"):
        bias = scheme.logit_bias(q, k, q_pos, k_pos, layer)
    else:
        bias = scheme.score_bias(q, k, q_pos, k_pos, layer)
    if hasattr(scheme, "modify_logits"):
        logits = scheme.modify_logits(logits, bias, q, k, q_pos, k_pos, layer)
    elif bias is not None:
        logits = logits + bias
    s_q, s_k = logits.shape[-2:]
    allowed = torch.arange(s_k) <= torch.arange(s_k - s_q, s_k).unsqueeze(-1)
    hides = getattr(scheme, "attention_mask", None)  # an older API lacks the hook
    keep = hides(q_pos, k_pos, layer) if hides is not None else None
    if keep is not None:  # keys a scheme hides (chunked attention); other schemes' keys as before
        allowed = allowed & keep
    if hasattr(scheme, "attention_weights"):
        return scheme.attention_weights(logits, allowed)
    return logits.masked_fill(~allowed, float("-inf")).softmax(dim=-1)


class _Digest:
    """sha256 of labelled values, floats rounded to ``BITS`` significant bits."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def add(self, label: str, value: Any) -> None:
        self._hash.update(f"{label}=".encode())
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            self._hash.update(f"{list(value.shape)}:".encode())
            self._hash.update(_rounded(value.detach().cpu().double().numpy()))
        elif isinstance(value, torch.Tensor):
            self._hash.update(f"{list(value.shape)}:{value.flatten().tolist()}".encode())
        elif isinstance(value, float):
            self._hash.update(_rounded(np.array([value])))
        else:
            self._hash.update(json.dumps(value, default=str).encode())
        self._hash.update(b";")

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _rounded(array: np.ndarray) -> bytes:
    """``array``'s values rounded to ``BITS`` significant bits, as bytes: each value's binary
    mantissa and exponent (``frexp``, exact), the mantissa rounded; values below ``FLUSH`` of
    the largest are 0, as are negative zeros; inf and nan kept. Exact arithmetic only, so the
    same values give the same bytes on every machine."""
    array = np.asarray(array, dtype=np.float64).ravel()
    finite = np.isfinite(array)
    largest = float(np.abs(array[finite]).max()) if finite.any() else 0.0
    array = np.where(finite & (np.abs(array) < FLUSH * largest), 0.0, array) + 0.0
    mantissa, exponent = np.frexp(np.where(finite, array, 0.0))
    mantissa = np.round(mantissa * 2.0**BITS)
    special = np.where(np.isnan(array), np.nan, np.where(finite, 0.0, array))  # inf, nan kept
    parts = (mantissa.astype("<i8"), exponent.astype("<i4"), special.astype("<f8"))
    return b"".join(part.tobytes() for part in parts)


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
