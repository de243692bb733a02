"""Relative schemes whose logit terms depend on query/key content: Transformer-XL, Shaw et al."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from pe_bench.config import Range
from pe_bench.errors import UserError
from pe_bench.positions.absolute import sinusoid_table
from pe_bench.positions.base import ModelDims, PositionScheme, register
from pe_bench.positions.bias import distances


def rel_shift(x: Tensor) -> Tensor:
    """Transformer-XL's relative shift (Dai et al. 2019, ``_rel_shift`` in
    kimiyoung/transformer-xl), as a strided view instead of the original pad-and-reshape copy.

    ``x: [b, n_h, s_q, s_k]`` (contiguous) with column m holding distance s_k - 1 - m, for
    queries that are the last s_q of the s_k keys. Returns ``y`` with ``y[..., i, j]`` = the
    entry for distance (s_k - s_q + i) - j, i.e. ``x[..., i, j + s_q - 1 - i]``: flat offset
    (s_q - 1) + i (s_k - 1) + j inside each [s_q, s_k] matrix. Entries with j past the query
    read a neighbouring row (garbage) and must be masked.
    """
    b, h, s_q, s_k = x.shape
    x = x.contiguous()
    base = x.storage_offset()
    return x.as_strided((b, h, s_q, s_k), (h * s_q * s_k, s_q * s_k, s_k - 1, 1), base + s_q - 1)


@register("xl")
class TransformerXL(PositionScheme):
    """Transformer-XL relative attention (Dai et al. 2019, https://arxiv.org/abs/1901.02860).

    logits_ij = (q_i + u) . k_j + (q_i + v) . W_R r_{i-j}, all over sqrt(h_d); r_n is the
    sinusoidal encoding of distance n (width d_model), W_R is per layer, u and v are per head
    and shared by all layers (the paper's default). The q_i . k_j part is the model's own; this
    scheme adds the other three terms. No absolute embedding, no segment memory.

    ``score_bias`` is the fast path: the position term for the s_k distances once per layer,
    aligned by ``rel_shift``; it takes positions to be consecutive (always true in this suite).
    ``score_bias_reference`` is the O(s^2 d) formula written out (the conformance kit holds
    the two equal).
    """

    relative = True
    content_bias = True

    def __init__(self, dims: ModelDims) -> None:
        super().__init__(dims)
        inner = dims.num_heads * dims.head_dim
        self.r_net = nn.ModuleList(
            nn.Linear(dims.d_model, inner, bias=False) for _ in range(dims.num_layers)
        )
        for lin in self.r_net:
            nn.init.normal_(lin.weight, std=0.02)
        self.u = nn.Parameter(torch.zeros(dims.num_heads, dims.head_dim))
        self.v = nn.Parameter(torch.zeros(dims.num_heads, dims.head_dim))
        self._tables: dict[int, tuple[tuple, Tensor]] = {}  # see _encoded_distances

    def _content_term(self, k: Tensor) -> Tensor:
        """u . k_j: ``[b, n_h, 1, s_k]``."""
        return torch.einsum("hd,bhkd->bhk", self.u.to(k.dtype), k).unsqueeze(2)

    def _encode(self, n: Tensor, layer: int) -> Tensor:
        """W_R r_n for distances ``n: [...]`` -> ``[..., n_h, h_d]``."""
        r = self.r_net[layer](sinusoid_table(n, self.dims.d_model).to(self.u.dtype))
        return r.view(*n.shape, self.dims.num_heads, self.dims.head_dim)

    def _encoded_distances(self, s_k: int, layer: int, device: torch.device) -> Tensor:
        """W_R r_n for n = s_k - 1 .. 0: ``[s_k, n_h, h_d]``. Without gradients the table is
        kept per layer (while W_R is unchanged: same tensor, same in-place version) and the
        last s_k rows of a longer one are reused, so that the query chunks of a long window
        (the longest first, ``attention.biased_attention``) project the sinusoids once."""
        weight = self.r_net[layer].weight
        if torch.is_grad_enabled():
            return self._encode(torch.arange(s_k - 1, -1, -1, device=device), layer)
        stamp = (weight.data_ptr(), weight._version, device, weight.dtype)
        kept = self._tables.get(layer)
        if kept is None or kept[0] != stamp or kept[1].shape[0] < s_k:
            table = self._encode(torch.arange(s_k - 1, -1, -1, device=device), layer)
            kept = self._tables[layer] = (stamp, table)
        return kept[1][kept[1].shape[0] - s_k :]

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        s_k, scale = k.shape[-2], 1 / math.sqrt(self.dims.head_dim)
        r = self._encoded_distances(s_k, layer, q.device)  # [s_k, n_h, h_d]
        qv = (q + self.v.to(q.dtype).unsqueeze(1)) * scale  # [b, n_h, s_q, h_d]
        position = qv @ r.to(q.dtype).permute(1, 2, 0)  # [b, n_h, s_q, s_k], contiguous
        return rel_shift(position) + self._content_term(k) * scale

    def score_bias_reference(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor:
        """Reference: W_R r_{i-j} for every pair, dotted with q_i + v."""
        r = self._encode(distances(q_pos, k_pos).clamp(min=0), layer)  # [s_q, s_k, n_h, h_d]
        qv = q + self.v.to(q.dtype).unsqueeze(1)
        position = torch.einsum("bhqd,qkhd->bhqk", qv, r.to(q.dtype))
        return (self._content_term(k) + position) / math.sqrt(self.dims.head_dim)


@register("shaw")
class Shaw(PositionScheme):
    """Relative position representations (Shaw et al. 2018, https://arxiv.org/abs/1803.02155):
    e_ij = q_i . (k_j + a_{clip(j - i, -k, k)}) / sqrt(h_d), with a learned vector a per
    clipped relative distance, per layer and shared by the heads (as tensor2tensor's
    ``dot_product_attention_relative``). The q_i . k_j part is the model's own; this scheme
    adds q_i . a / sqrt(h_d). Causal attention only sees j - i in [-k, 0], so the table has the
    k + 1 rows a_0 .. a_k for distances n = i - j (the paper's 2k + 1 rows minus the k future
    ones no query ever uses).

    The paper's value term a^V has no hook here; its ablation (Table 4) finds the key term
    alone as good as both. ``score_bias`` gathers q . a for the k + 1 distances;
    ``score_bias_reference`` writes out a_{clip} for every pair.

    Args:
        max_distance (int): the clipping distance k. Default: 16 (the paper's experiments).
    """

    relative = True
    content_bias = True

    option_ranges: ClassVar[dict[str, Range]] = {"max_distance": Range(ge=1)}

    caveat = "key term a^K only: the paper's value term a^V has no hook in pe-bench"

    def __init__(self, dims: ModelDims, *, max_distance: int = 16) -> None:
        super().__init__(dims)
        if max_distance < 1:
            raise UserError(f"shaw: max_distance must be >= 1, got {max_distance}")
        self.max_distance = max_distance
        table = torch.empty(dims.num_layers, max_distance + 1, dims.head_dim)
        self.rel_keys = nn.Parameter(nn.init.normal_(table, std=0.02))  # [layers, k + 1, h_d]

    def _clipped(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """min(i - j, k) for every pair, ``[s_q, s_k]`` (future pairs, masked later, give 0)."""
        return distances(q_pos, k_pos).clamp(0, self.max_distance)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        table = self.rel_keys[layer].to(q.dtype)
        qa = q @ table.T  # [b, n_h, s_q, k + 1]: q_i . a_n for every clipped distance n
        index = self._clipped(q_pos, k_pos).expand(*q.shape[:2], -1, -1)  # [b, n_h, s_q, s_k]
        return qa.gather(-1, index) / math.sqrt(self.dims.head_dim)

    def score_bias_reference(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor:
        """q_i . a_{clip(j - i)} / sqrt(h_d) with a materialised for every pair."""
        a = self.rel_keys[layer][self._clipped(q_pos, k_pos)]  # [s_q, s_k, h_d]
        return torch.einsum("bhqd,qkd->bhqk", q, a.to(q.dtype)) / math.sqrt(self.dims.head_dim)
