"""The windowed RoPE variants on a pretrained HF model (ReRoPE, leaky ReRoPE, Self-Extend; DCA,
StreamingLLM, LM-Infinite, STRING): the attention of a ``positions.rerope.WindowedRoPE``.

Such a scheme scores each (query, key) pair with one of a few rotations of q and k (its
branches: ReRoPE's near and far by distance, DCA's intra-, successive- and inter-chunk), each
at positions of its own, and hides the pairs no branch scores (StreamingLLM's and
LM-Infinite's middle). The formulas are the scheme's own (``branch_positions``,
``branch_scores``, ``frequencies``, ``rotary_factor``, ``logit_scale``), as pe-bench's trained
models use them; what is here is how an HF attention layer computes them: the rotary embedding
hands q and k over unrotated (``pretrained.rope.pe_bench_rope``), and ``windowed_attention``
rotates them each branch's way and attends over one softmax of the merged logits.

It does so a block of ``BLOCK`` queries at a time. For each block and branch, the keys split
into runs: keys the branch scores for every query of the block (one fused attention, no
mask), keys it scores for some of them (a masked one), keys it scores for none (skipped). Each
piece returns its log-sum-exp (on the CPU, the kernel behind SDPA; elsewhere, explicit), and
the pieces are merged by their log-sum-exps, which is the softmax over all of them. No L x L
matrix is ever held (explicit attention over 16k x 16k x 9 heads in float32 would be 9 GB),
and about as many q . k products are computed as by plain causal attention (the partial runs,
about a block wide at each edge of a branch, are the extra). The runs depend on the lengths
alone, so a forward pass plans them once for all its layers (``plan``).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from pe_bench.positions.rerope import WindowedRoPE
from pe_bench.positions.rotary import apply_rotary

BLOCK = 256  # queries per block
FUSED = ("cpu",)  # devices where a piece is the fused kernel (with its log-sum-exp)


class Piece(NamedTuple):
    """One fused attention of a block of queries: a branch's rotation over a run of keys."""

    branch: int  # index into the scheme's branches
    keys: slice
    allowed: Tensor | None  # [block, keys] bool; None: every key for every query


def rotate(x: Tensor, positions: Tensor, inv_freq: Tensor, factor: float = 1.0) -> Tensor:
    """``x: [b, h, s, d]`` rotated at (real-valued) ``positions: [s]``, as HF's rotary
    embedding does (float32 angles, ``rotate_half`` pairs, cos and sin times ``factor``); a
    partial rotary model rotates its first ``2 * len(inv_freq)`` dims and passes the rest
    through."""
    rot = 2 * inv_freq.numel()
    angles = positions.float().unsqueeze(-1) * inv_freq.float()
    turned = apply_rotary(x[..., :rot], angles)
    turned = turned if factor == 1 else turned * factor
    return turned if rot == x.shape[-1] else torch.cat([turned, x[..., rot:]], dim=-1)


def windowed_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    scheme: WindowedRoPE,
    scaling: float,
) -> Tensor:
    """Attention of unrotated ``query: [b, h, s_q, d]`` over unrotated ``key``, ``value:
    [b, h_kv, s_k, d]`` with ``scheme``'s branches, each pair scored by the rotation of the
    branch that scores it (none: hidden); queries first times ``scheme.logit_scale`` where it
    has one (ReRoPE's log-n), cos and sin times its ``rotary_factor``. Positions are
    consecutive from 0 (pe-bench's windows, prompts and cached decoding), the queries the last
    ``s_q`` of the ``s_k`` keys; ``mask`` (HF's, bool or additive) on top of causality.
    Returns ``[b, s_q, h, d]`` as HF's attention functions do."""
    h, s_q, s_k = query.shape[1], query.shape[-2], key.shape[-2]
    positions = torch.arange(s_k, device=query.device)
    q_pos = positions[s_k - s_q :]
    inv_freq = scheme.frequencies(positions).to(query.device)
    factor = scheme.rotary_factor(s_k)
    scale = scheme.logit_scale(q_pos, positions, module.layer_idx)
    if scale is not None:
        query = query * scale.to(query.dtype).unsqueeze(-1)
    branches = scheme.branch_positions(q_pos, positions)
    keys: dict[int, Tensor] = {}  # rotated keys by id of their positions: shared where equal
    for _, k_at in branches:
        if id(k_at) not in keys:
            rotated = rotate(key, k_at, inv_freq, factor)
            keys[id(k_at)] = rotated.repeat_interleave(h // key.shape[1], dim=1)
    value = value.repeat_interleave(h // value.shape[1], dim=1)
    out = torch.empty_like(query)
    for start, pieces in plan(scheme, s_q, s_k, BLOCK, str(query.device)):
        rows = slice(start, min(start + BLOCK, s_q))
        queries: dict[int, Tensor] = {}
        found = []
        for branch, cols, allowed in pieces:
            if mask is not None:
                part = mask[..., rows, cols]
                part = part if part.dtype == torch.bool else part > torch.finfo(part.dtype).min / 2
                allowed = part if allowed is None else allowed & part
            q_at, k_at = branches[branch]
            if branch not in queries:
                queries[branch] = rotate(query[:, :, rows], q_at[rows], inv_freq, factor)
            k, v = keys[id(k_at)][:, :, cols], value[:, :, cols]
            found.append(attend(queries[branch], k, v, allowed, scaling))
        out[:, :, rows] = merge(found)
    return out.transpose(1, 2).contiguous()


@functools.lru_cache(maxsize=8)
def plan(
    scheme: WindowedRoPE, s_q: int, s_k: int, block: int, device: str
) -> list[tuple[int, list[Piece]]]:
    """(first query, pieces) of each block of ``block`` queries of ``s_q`` over ``s_k`` keys:
    for each branch, the runs of keys it scores for every query of the block (no mask) or for
    some of them (masked), keys after the block's last query left out (causal). The same for
    every layer of a forward pass: kept for the next call."""
    positions = torch.arange(s_k, device=device)
    found = []
    for start in range(s_k - s_q, s_k, block):
        q_pos = positions[start : min(start + block, s_k)]
        k_pos = positions[: int(q_pos[-1]) + 1]  # later keys are future keys for every query
        causal = q_pos.unsqueeze(-1) >= k_pos
        pieces = []
        for branch, scores in enumerate(scheme.branch_scores(q_pos, k_pos)):
            pieces += _runs(branch, scores & causal)
        found.append((start - (s_k - s_q), pieces))
    return found


def _runs(branch: int, allowed: Tensor) -> list[Piece]:
    """The pieces of one branch over a block: maximal runs of keys allowed for every query (no
    mask) or for some (masked); keys allowed for none are left out."""
    kind = allowed.any(dim=0).int() + allowed.all(dim=0).int()  # 0 none, 1 some, 2 every
    edges = (torch.nonzero(kind[1:] != kind[:-1]).flatten() + 1).tolist()
    bounds = [0, *edges, kind.numel()]
    pieces = []
    for lo, hi in itertools.pairwise(bounds):
        which = int(kind[lo])
        if which:
            part = None if which == 2 else allowed[:, lo:hi].clone()  # not a view of the block's
            pieces.append(Piece(branch, slice(lo, hi), part))
    return pieces


def attend(
    query: Tensor, key: Tensor, value: Tensor, allowed: Tensor | None, scaling: float
) -> tuple[Tensor, Tensor]:
    """Softmax attention of ``query`` over the ``allowed`` keys (bool ``[s_q, s_k]`` or with
    leading dims; None: all) and the log-sum-exp of each row's logits (-inf where a row has
    none): on the CPU the fused kernel behind SDPA, elsewhere explicit."""
    if query.device.type in FUSED:
        bias = None
        if allowed is not None:
            bias = torch.zeros(allowed.shape, dtype=query.dtype).masked_fill(~allowed, -math.inf)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, False, attn_mask=bias, scale=scaling
        )
        if allowed is not None:  # the kernel gives a row without keys lse 0, not -inf
            lse = lse.masked_fill(~allowed.any(dim=-1), -math.inf)
        return out, lse
    logits = (query @ key.transpose(-2, -1)).float() * scaling
    if allowed is not None:
        logits = logits.masked_fill(~allowed, -math.inf)
    lse = logits.logsumexp(dim=-1)
    probs = (logits - lse.unsqueeze(-1)).exp().to(value.dtype)
    return probs @ value, lse


def merge(pieces: list[tuple[Tensor, Tensor]]) -> Tensor:
    """The attention over the union of the pieces' keys, from each piece's output and
    log-sum-exp: the pieces weighted by exp(lse_piece - lse_all) (a piece whose row has no key
    weighs 0)."""
    total = torch.stack([lse for _, lse in pieces]).logsumexp(dim=0)
    out = 0
    for part, lse in pieces:
        weight = (lse - total).exp().nan_to_num(0.0).unsqueeze(-1).to(part.dtype)
        out = out + weight * part.nan_to_num(0.0)
    return out
