"""Contextual position encoding (CoPE): positions counted by gates that depend on content."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.config import Range
from pe_bench.errors import UserError
from pe_bench.positions.base import ModelDims, PositionScheme, register


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
        """The gates against the keys in reverse order, so that p_ij = sum_{t=j..i} g_it is
        one plain cumulative sum (future keys: logit -inf, gate 0), then one ``gather`` of
        (q . e[n], q . e[n + 1] - q . e[n]) pairs at n = floor(p) interpolates the logits."""
        s_q = q.shape[-2]
        q = q.float() / math.sqrt(self.dims.head_dim)
        logits = q @ k.float().flip(-2).transpose(-2, -1)  # [b, n_h, s_q, s_k]: key s_k-1-m at m
        # the future keys of the last s_q queries: the first s_q columns of the reversed keys
        allowed = torch.ones(s_q, s_q, dtype=torch.bool, device=q.device).tril().flip(-1)
        logits[..., :s_q].masked_fill_(~allowed, float("-inf"))
        pos = torch.sigmoid(logits).cumsum(-1).clamp(max=self.npos_max - 1).flip(-1)
        at_int = q @ self.pos_emb[layer].float()  # [b, n_h, s_q, npos_max]: q_i . e[n]
        step = F.pad(at_int[..., 1:] - at_int[..., :-1], (0, 1))  # q_i . (e[n + 1] - e[n])
        pairs = torch.view_as_complex(torch.stack([at_int, step], dim=-1))
        lower = pos.long()  # floor: p >= 0
        at_lower, slope = torch.view_as_real(pairs.gather(-1, lower)).unbind(-1)
        return at_lower + pos.frac() * slope

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
