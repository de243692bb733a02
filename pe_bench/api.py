"""A pe-bench position scheme in your own model: build one by name, attend with it.

The benchmark's model is one of many a scheme can live in. This module gives another model the
same two pieces it uses (see ``docs/your_model.md`` for a nanoGPT-style example)::

    from pe_bench.api import attention, position_scheme

    pe = position_scheme("alibi", num_heads=12, head_dim=64, num_layers=12, train_len=1024)
    pos = pe.positions(seq_len, device)     # once per forward pass, shared by the layers
    pe.read_tokens(idx)                     # token ids [b, s]: BiPE reads them (a no-op else)
    x = pe.embed(token_embeddings, pos)     # absolute schemes add here; the others return x
    y = attention(q, k, v, pe, pos=pos, layer=i)   # in layer i: q, k, v [b, n_h, s, h_d]
    pe.read_tokens(None)                    # after the pass

``position_scheme`` builds any registered scheme (the built-ins, a module named by
``plugin``, an installed entry point) with its options checked as a ``pe`` config's are.
``attention`` applies the scheme's ``transform_qk`` and attends causally on the path the
benchmark's model takes for it (``model.attention.attend``: fused SDPA, a key term, masks by
distance, float masks, FlexAttention, or written out), so its output is the benchmark's
(``tests/test_api.py`` holds them equal for every registered scheme). The scheme is an
``nn.Module``: keep it as a submodule of your model so that its parameters train and move
with it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pe_bench.errors import UserError
from pe_bench.model.attention import ATTENTION, attend, forward_context
from pe_bench.positions import ModelDims, PositionScheme, build_scheme

__all__ = ["attention", "position_scheme"]


def position_scheme(
    name: str,
    *,
    num_heads: int,
    head_dim: int,
    train_len: int,
    num_layers: int = 1,
    plugin: str | None = None,
    **options: Any,
) -> PositionScheme:
    """The scheme registered as ``name`` with its keyword ``options`` (``base=500000.0`` for
    ``rope``, ``factor=4.0`` for ``yarn``; unknown or out-of-range options are refused in one
    line), for a model of ``num_layers`` layers of ``num_heads`` heads of ``head_dim`` trained
    at ``train_len`` tokens (learned positions size their table from it; eval-time variants
    read it as the length they extend). ``plugin``: a module to import first, whose
    ``@register`` adds the scheme (as ``pe.plugin`` in a config)."""
    sizes = {"num_heads": num_heads, "head_dim": head_dim, "train_len": train_len}
    for key, value in {**sizes, "num_layers": num_layers}.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(f"{key}={value!r} must be a positive integer")
    dims = ModelDims(
        d_model=num_heads * head_dim,
        num_heads=num_heads,
        head_dim=head_dim,
        num_layers=num_layers,
        train_len=train_len,
    )
    cfg = {"name": name, **options, **({"plugin": plugin} if plugin else {})}
    return build_scheme(cfg, dims, prefix="")


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pe: PositionScheme,
    *,
    x: Tensor | None = None,
    pos: Tensor | None = None,
    layer: int = 0,
    mode: str = "auto",
) -> Tensor:
    """Causal self-attention of the queries, keys and values of one layer, ``[b, n_h, s, h_d]``
    each, as they come out of the layer's projection (the scheme rotates or scales them
    here), under scheme ``pe``: ``[b, n_h, s, h_d]``, what the benchmark's model computes.

    ``x``: the layer's normed input ``[b, s, d]`` that q, k and v were projected from, needed
    only by a scheme that computes its attention from it (``pe.has_own_attention``: PaTH).

    ``pos``: the positions, ``[s]``; by default ``pe.positions(s)``. Pass the same tensor to
    every layer of a forward pass: a randomized scheme draws new positions on each call while
    training, and the benchmark draws once per pass. ``layer``: the layer's index, for schemes
    with per-layer terms (FIRE, iRoPE). ``mode``: how a logit term attends, as
    ``model.attention`` (``auto``, ``sdpa``, ``flex``); the numbers are the same.

    The benchmark's model builds a content-free bias once per pass for all its layers; here
    each call builds its own (the same numbers, more work for a bias on the float-mask path).
    """
    _check(q, k, v, pe, layer, mode)
    _check_input(x, q, pe)
    s = q.shape[-2]
    pe.check_length(s)
    own = pos is None
    if own:
        pos = pe.positions(s, q.device)
    elif tuple(pos.shape) != (s,):
        raise UserError(f"pos has shape {tuple(pos.shape)}; it must be [s] = [{s}]")
    ctx = forward_context(pe, pos, mode, q.shape[1], torch.is_grad_enabled(), own)
    q, k = pe.transform_qk(q, k, pos, pos, layer)
    return attend(q, k, v, ctx, layer, x)


def _check(q: Tensor, k: Tensor, v: Tensor, pe: PositionScheme, layer: int, mode: str) -> None:
    """One line for each input ``attention`` cannot take, naming the value and what is
    allowed."""
    if not isinstance(pe, PositionScheme):
        raise UserError(f"pe={pe!r} must be a PositionScheme (build one with position_scheme)")
    if mode not in ATTENTION:
        raise UserError(f"mode={mode!r} is not one of {', '.join(ATTENTION)}")
    shapes = {name: tuple(t.shape) for name, t in (("q", q), ("k", k), ("v", v))}
    if len(shapes["q"]) != 4 or len(set(shapes.values())) != 1:
        got = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise UserError(f"q, k and v must share one shape [b, n_h, s, h_d]; got {got}")
    heads, head_dim = shapes["q"][1], shapes["q"][3]
    dims = pe.dims
    if (heads, head_dim) != (dims.num_heads, dims.head_dim):
        raise UserError(
            f"q has {heads} heads of {head_dim}; scheme {pe.name!r} was built for "
            f"{dims.num_heads} heads of {dims.head_dim}"
        )
    if not isinstance(layer, int) or not 0 <= layer < dims.num_layers:
        raise UserError(
            f"layer={layer!r} must be 0 .. {dims.num_layers - 1}: scheme {pe.name!r} was built "
            f"for {dims.num_layers} layers"
        )


def _check_input(x: Tensor | None, q: Tensor, pe: PositionScheme) -> None:
    """The layer's input where the scheme reads it: ``[b, s, d]``, d = heads x head_dim."""
    if x is None:
        if pe.has_own_attention:
            raise UserError(
                f"scheme {pe.name!r} computes its attention from the layer's input: pass x, "
                f"the normed input [b, s, d] that q, k and v were projected from"
            )
        return
    b, _, s, _ = q.shape
    if tuple(x.shape) != (b, s, pe.dims.d_model):
        raise UserError(
            f"x has shape {tuple(x.shape)}; it must be [b, s, d] = [{b}, {s}, {pe.dims.d_model}]"
        )
