"""The attention of a ``rerope.WindowedRoPE`` (ReRoPE, leaky ReRoPE, Self-Extend; DCA,
StreamingLLM, LM-Infinite, STRING) without an L x L matrix, for the trained model's layers
(``model.attention``, the ``windowed`` path).

Such a scheme scores each (query, key) pair with one of a few rotations of q and k (its
branches: ReRoPE's near and far by distance, DCA's intra-, successive- and inter-chunk), each
at positions of its own, and hides the pairs no branch scores (StreamingLLM's and
LM-Infinite's middle). Its ``modify_logits`` writes the merged logits out, ``[s, s]`` per
head; ``branch_attention`` computes the same softmax from the scheme's own formulas
(``branch_positions``, ``branch_scores``, ``frequencies``) a block of ``BLOCK`` queries at a
time. For each block and branch, the keys split into runs: keys the branch scores for every
query of the block (one fused attention, no mask), keys it scores for some of them (a masked
one), keys it scores for none (skipped). Each piece returns its log-sum-exp (on the CPU
without gradients, the kernel behind SDPA; else written out, which autograd differentiates),
and the pieces are merged by their log-sum-exps, which is the softmax over all of them. About
as many q . k products are computed as by plain causal attention (the partial runs, about a
block wide at each edge of a branch, are the extra). The runs depend on the lengths alone, so
a forward pass plans them once for all its layers (``plan``).

Positions are consecutive from 0 (the model's windows; ``planned_for``), the queries the last
``s_q`` of the ``s_k`` keys. The keys a query sees are those its branches score: a windowed
scheme's ``attention_mask``, where it has one, is their union (``SinkWindowRoPE``'s).
``pretrained.windowed`` computes the same on an HF model (its own copy of this algorithm).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import torch
from torch import Tensor

from pe_bench.positions.base import PositionScheme
from pe_bench.positions.rerope import WindowedRoPE
from pe_bench.positions.rotary import apply_rotary

BLOCK = 256  # queries per block
FUSED = ("cpu",)  # devices where a piece is the fused kernel (with its log-sum-exp)


class Piece(NamedTuple):
    """One fused attention of a block of queries: a branch's rotation over a run of keys."""

    branch: int  # index into the scheme's branches
    keys: slice
    allowed: Tensor | None  # [block, keys] bool; None: every key for every query


def blockwise(cls: type[PositionScheme]) -> bool:
    """Whether ``branch_attention`` computes the attention of schemes of class ``cls``: a
    ``WindowedRoPE`` whose logits are its branches' as ``WindowedRoPE.modify_logits`` merges
    them, and whose weights are their softmax (no ``attention_weights`` of its own)."""
    return (
        issubclass(cls, WindowedRoPE)
        and cls.modify_logits is WindowedRoPE.modify_logits
        and cls.attention_weights is PositionScheme.attention_weights
    )


def planned_for(scheme: PositionScheme, pos: Tensor, own: bool) -> bool:
    """Whether ``pos`` is 0, 1, ..., s - 1, the positions ``plan`` assumes: known without
    reading it where it is the scheme's own (``own``) and its ``positions`` the default
    (the model's passes: no wait on a GPU), else read on the host (positions from outside)."""
    if own and type(scheme).positions is PositionScheme.positions:
        return True
    return torch.equal(pos, torch.arange(pos.shape[-1], device=pos.device))


def windowed_attention(scheme: WindowedRoPE, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal attention of the model's q, k (through ``transform_qk``: times ``rotary_factor``
    and ``logit_scale``, unrotated) and v, ``[b, n_h, s, h_d]``, at positions 0 .. s - 1: what
    ``attention.explicit_attention`` computes from ``modify_logits``, in float32 whatever
    autocast says, as it does."""
    with torch.autocast(q.device.type, enabled=False):
        scaling = 1 / math.sqrt(q.shape[-1])
        out = branch_attention(scheme, q.float(), k.float(), v.float(), scaling)
    return out.to(q.dtype)


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


def branch_attention(
    scheme: WindowedRoPE,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    scaling: float,
    factor: float = 1.0,
    mask: Tensor | None = None,
) -> Tensor:
    """Attention ``[b, h, s_q, d]`` of unrotated ``query: [b, h, s_q, d]`` over unrotated
    ``key``, ``value: [b, h_kv, s_k, d]`` (grouped heads repeated) with ``scheme``'s
    branches, each pair scored by the rotation of the branch that scores it (none: hidden),
    logits times ``scaling``, cos and sin times ``factor``; ``mask`` (bool, or additive with
    its minimum for hidden keys) on top of causality."""
    h, s_q, s_k = query.shape[1], query.shape[-2], key.shape[-2]
    positions = torch.arange(s_k, device=query.device)
    inv_freq = scheme.frequencies(positions).to(query.device)
    branches = scheme.branch_positions(positions[s_k - s_q :], positions)
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
    return out


@functools.lru_cache(maxsize=16)  # a plan of 8192 queries: ~1 s to make, a few MB of masks
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
    none): on the CPU with gradients off the fused kernel behind SDPA (its log-sum-exp has
    none), else written out."""
    if query.device.type in FUSED and not torch.is_grad_enabled():
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
    finite = lse.masked_fill(lse == -math.inf, 0.0)  # a row without keys: weights 0, not nan
    probs = (logits - finite.unsqueeze(-1)).exp().to(value.dtype)
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
