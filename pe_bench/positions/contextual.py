"""Contextual position encoding (CoPE): positions counted by gates that depend on content."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.config import Range
from pe_bench.errors import UserError
from pe_bench.positions.base import ModelDims, PositionScheme, key_blocks, register


@register("cope")
class CoPE(PositionScheme):
    """Contextual position encoding (Golovneva et al. 2024, https://arxiv.org/abs/2405.18719).

    Gates g_it = sigmoid(q_i . k_t / sqrt(h_d)) (0 for future keys); the position of key j
    seen from query i is p_ij = sum_{t=j..i} g_it, clamped to ``npos_max`` - 1; a learned
    embedding e[p] per integer position is interpolated, e[p] = (1 - w) e[floor p] + w e[ceil p]
    with w = p - floor p, and e_ij = (q_i . k_j + q_i . e[p_ij]) / sqrt(h_d). Reference
    implementation: facebookresearch/RAM ``projects/cope/src/cope/context_position.py``
    (defaults: gates from the model's own keys, the position term divided by sqrt(h_d) with
    the content term, e zero-initialised, one table per layer shared by the heads, and
    ``npos_max`` = block size + 1).

    p_ij depends on content, not on i - j, so CoPE is not ``relative``. ``score_bias`` gathers
    q . e for the integer positions and interpolates the logits (the reference's trick);
    ``score_bias_reference`` sums the gates with a matrix product and interpolates e itself.

    Args:
        npos_max (int | None): positions in the table. Default: None, meaning L_train + 1.
    """

    content_bias = True

    option_ranges: ClassVar[dict[str, Range]] = {"npos_max": Range(ge=2)}

    def __init__(self, dims: ModelDims, *, npos_max: int | None = None) -> None:
        super().__init__(dims)
        self.npos_max = dims.train_len + 1 if npos_max is None else npos_max
        if self.npos_max < 2:
            raise UserError(f"cope: npos_max must be >= 2, got {npos_max}")
        self.pos_emb = nn.Parameter(torch.zeros(dims.num_layers, dims.head_dim, self.npos_max))

    def gates(self, q: Tensor, k: Tensor) -> Tensor:
        """g_ij = sigmoid(q_i . k_j / sqrt(h_d)), 0 on future keys: ``[b, n_h, s_q, s_k]``."""
        logits = q.float() @ k.float().transpose(-2, -1) / math.sqrt(self.dims.head_dim)
        s_q, s_k = logits.shape[-2:]
        # queries are the last s_q of the keys: query i sees keys j <= i + s_k - s_q
        allowed = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril(s_k - s_q)
        return torch.sigmoid(logits) * allowed

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        """The gates summed from the query back by blocks of keys (``key_blocks``): in each,
        one reversed cumulative sum (future keys: logit -inf, gate 0) carried on from the
        block after it, then one ``gather`` of (q . e[n], q . e[n + 1] - q . e[n]) pairs at
        n = floor(p) interpolates the logits. Once every query's sum reaches npos_max - 1 at
        a block's first key, every earlier key's p is clamped there and its term is
        q . e[npos_max - 1]: filled in, with no gate computed (the gates of the zoo's model
        sum to 64 within about 130 keys, so at 8,192 tokens a chunk of queries sums one
        block or two, not 8,192 keys)."""
        s_q, s_k = q.shape[-2], k.shape[-2]
        top = self.npos_max - 1
        q, k = q.float() / math.sqrt(self.dims.head_dim), k.float()
        at_int = q @ self.pos_emb[layer].float()  # [b, n_h, s_q, npos_max]: q_i . e[n]
        step = F.pad(at_int[..., 1:] - at_int[..., :-1], (0, 1))  # q_i . (e[n + 1] - e[n])
        pairs = torch.view_as_complex(torch.stack([at_int, step], dim=-1))
        # the future keys of the last s_q queries: the last s_q columns of the first block
        allowed = torch.ones(s_q, s_q, dtype=torch.bool, device=q.device).tril()
        blocks, bias, carry = key_blocks(s_q, s_k), None, None
        for start, end in blocks:
            logits = q @ k[..., start:end, :].transpose(-2, -1)  # [b, n_h, s_q, block]
            if end == s_k:
                logits[..., end - start - s_q :].masked_fill_(~allowed, float("-inf"))
            pos = torch.sigmoid(logits).flip(-1).cumsum_(-1).flip(-1)  # sum_{t=j..end-1} g_it
            if carry is not None:
                pos = pos.add_(carry)
            carry, pos = pos[..., :1], pos.clamp(max=top)
            lower = pos.long()  # floor: p >= 0
            at_lower, slope = torch.view_as_real(pairs.gather(-1, lower)).unbind(-1)
            block = at_lower + pos.frac() * slope
            if len(blocks) == 1:
                return block
            if bias is None:
                bias = at_int.new_empty(*at_int.shape[:-1], s_k)  # each block written into it
            bias[..., start:end] = block
            if start > 0 and bool((carry >= top).all()):  # every earlier p is clamped at top
                bias[..., :start] = at_int[..., top : top + 1]
                break
        return bias

    def score_bias_reference(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor:
        """p = g M with M[t, j] = [t >= j]; e[p] interpolated per pair, then dotted with q."""
        s_k = k.shape[-2]
        at_or_after = torch.ones(s_k, s_k, device=q.device).tril()  # [t, j] = 1 where t >= j
        pos = (self.gates(q, k) @ at_or_after).clamp(max=self.npos_max - 1)
        table = self.pos_emb[layer].float().T  # [npos_max, h_d]
        floor = pos.floor()
        w = (pos - floor).unsqueeze(-1)
        e = table[floor.long()] * (1 - w) + table[pos.ceil().long()] * w  # [b, n_h, s_q, s_k, h_d]
        return torch.einsum("bhqd,bhqkd->bhqk", q.float(), e) / math.sqrt(self.dims.head_dim)
