"""ReRoPE, leaky ReRoPE and Self-Extend on a pretrained HF model: the attention of a
``positions.rerope.WindowedRoPE`` scheme.

Such a scheme mixes two rotations of q and k by distance: RoPE at the tokens' own positions
for keys closer than its window w, and at the positions its ``far_positions`` gives for the
others (ReRoPE: relative position w; leaky ReRoPE: w + (i - j - w) / k; Self-Extend: the
grouped positions). The formulas are the scheme's own (``window``, ``far_positions``,
``frequencies``, ``logit_scale``), as pe-bench's trained models use them; what is here is
how an HF attention layer computes them: the rotary embedding hands q and k over unrotated
(``pretrained.rope.pe_bench_rope``), and ``windowed_attention`` rotates them both ways and
attends over one softmax of the merged logits.

It does so a block of ``BLOCK`` queries at a time, in pieces that each take one rotation: the
keys at least w before every query of the block (far, no mask), then the band of the last
w + ``BLOCK`` keys twice, near where 0 <= i - j < w and far where i - j >= w (masked). Each
piece is a fused attention that returns its log-sum-exp (on the CPU, the kernel behind SDPA;
elsewhere, explicit), and the pieces are merged by their log-sum-exps, which is the softmax
over all of them. No L x L matrix is ever held (explicit attention over 16k x 16k x 9 heads in
float32 would be 9 GB), and about as many q . k products are computed as by plain causal
attention (the band's, w + ``BLOCK`` per query, are the extra).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pe_bench.positions.rerope import WindowedRoPE
from pe_bench.positions.rotary import apply_rotary

BLOCK = 256  # queries per block
FUSED = ("cpu",)  # devices where a piece is the fused kernel (with its log-sum-exp)


def rotate(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """``x: [b, h, s, d]`` rotated at (real-valued) ``positions: [s]``, as HF's rotary
    embedding does (float32 angles, ``rotate_half`` pairs); a partial rotary model rotates its
    first ``2 * len(inv_freq)`` dims and passes the rest through."""
    rot = 2 * inv_freq.numel()
    angles = positions.float().unsqueeze(-1) * inv_freq.float()
    if rot == x.shape[-1]:
        return apply_rotary(x, angles)
    return torch.cat([apply_rotary(x[..., :rot], angles), x[..., rot:]], dim=-1)


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
    [b, h_kv, s_k, d]`` with ``scheme``'s two rotations: near (i - j < w) at the positions,
    far at ``scheme.far_positions``; queries first times ``scheme.logit_scale`` where it has
    one (ReRoPE's log-n). Positions are consecutive from 0, the queries the last ``s_q`` of
    the ``s_k`` keys (pe-bench's windows, prompts and cached decoding); ``mask`` (HF's, bool
    or additive) on top of causality. Returns ``[b, s_q, h, d]`` as HF's attention
    functions do."""
    h, s_q, s_k = query.shape[1], query.shape[-2], key.shape[-2]
    key = key.repeat_interleave(h // key.shape[1], dim=1)
    value = value.repeat_interleave(h // value.shape[1], dim=1)
    positions = torch.arange(s_k, device=query.device)
    q_pos = positions[s_k - s_q :]
    inv_freq = scheme.frequencies(positions).to(query.device)
    scale = scheme.logit_scale(q_pos, positions, module.layer_idx)
    if scale is not None:
        query = query * scale.to(query.dtype).unsqueeze(-1)
    far_q_pos, far_k_pos = scheme.far_positions(q_pos, positions)
    keys = {"near": rotate(key, positions, inv_freq), "far": rotate(key, far_k_pos, inv_freq)}
    w, out = scheme.window, torch.empty_like(query)
    for start in range(0, s_q, BLOCK):
        rows = slice(start, min(start + BLOCK, s_q))
        queries = {
            "near": rotate(query[:, :, rows], q_pos[rows], inv_freq),
            "far": rotate(query[:, :, rows], far_q_pos[rows], inv_freq),
        }
        pieces = []
        for which, cols, allowed in _pieces(q_pos[rows], w):
            if mask is not None:
                part = mask[..., rows, cols]
                part = part if part.dtype == torch.bool else part > torch.finfo(part.dtype).min / 2
                allowed = part if allowed is None else allowed & part
            k, v = keys[which][:, :, cols], value[:, :, cols]
            pieces.append(attend(queries[which], k, v, allowed, scaling))
        out[:, :, rows] = merge(pieces)
    return out.transpose(1, 2).contiguous()


def _pieces(q_pos: Tensor, window: int) -> list[tuple[str, slice, Tensor | None]]:
    """(rotation, keys, which of them each query attends to; None: all) of a block of queries
    at positions ``q_pos`` (consecutive): far for the keys at least ``window`` before every
    query, then near and far over the band of keys after them, masked by distance."""
    first, last = int(q_pos[0]), int(q_pos[-1])
    far_end = max(first - window + 1, 0)  # keys < far_end: far for every query of the block
    band = torch.arange(far_end, last + 1, device=q_pos.device)
    dist = q_pos.unsqueeze(-1) - band  # [block, keys]
    found = [("near", slice(far_end, last + 1), (dist >= 0) & (dist < window))]
    if far_end > 0:
        found.insert(0, ("far", slice(0, far_end), None))
    far_stop = last - window + 1  # keys < far_stop are far for some query of the block
    if far_stop > far_end:
        found.append(("far", slice(far_end, far_stop), dist[:, : far_stop - far_end] >= window))
    return found


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
