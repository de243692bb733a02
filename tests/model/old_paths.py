"""The code paths issue 28 moved, as they were before it (pe-bench at e174c7f), verbatim but
for names: the tests hold every moved path equal to its old self within float tolerance."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from pe_bench.model.attention import causal_allowed
from pe_bench.positions.absolute import sinusoid_table


def masked_bias(bias: Tensor | None, q: Tensor, s_k: int) -> Tensor:
    """``attention.masked_bias``: one ``masked_fill`` of the whole chunk."""
    s_q = q.shape[-2]
    allowed = causal_allowed(s_q, s_k, q.device)
    if bias is None:
        bias = torch.zeros(s_q, s_k, device=q.device, dtype=q.dtype)
    bias = bias.to(q.dtype).masked_fill(~allowed, float("-inf"))
    while bias.dim() < 4:
        bias = bias.unsqueeze(0)
    return bias


def stickbreaking_weights(self, logits: Tensor, allowed: Tensor) -> Tensor:
    """``StickBreaking.attention_weights``: logsigmoid, the stick between by a shifted sum."""
    s_q, s_k = allowed.shape
    keys = torch.arange(s_k, device=allowed.device)
    own = keys == torch.arange(s_k - s_q, s_k, device=allowed.device).unsqueeze(-1)
    before = allowed & ~own
    spent = F.softplus(logits).masked_fill(~before, 0.0)
    from_j = spent.flip(-1).cumsum(-1).flip(-1)
    between = F.pad(from_j[..., 1:], (0, 1))
    log_weights = F.logsigmoid(logits) - between
    remainder = torch.exp(-from_j[..., :1])
    return torch.where(before, log_weights.exp(), 0.0) + torch.where(own, remainder, 0.0)


def cope_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
    """``CoPE.score_bias``: gates in key order, a reversed cumulative sum, two gathers."""
    pos = self.gates(q, k).flip(-1).cumsum(-1).flip(-1)
    pos = pos.clamp(max=self.npos_max - 1)
    logits_int = q.float() @ self.pos_emb[layer].float()
    floor = pos.floor()
    w = pos - floor
    lower = floor.long()
    upper = (lower + 1).clamp_(max=self.npos_max - 1)
    at_lower, at_upper = logits_int.gather(-1, lower), logits_int.gather(-1, upper)
    return (at_lower + w * (at_upper - at_lower)) / math.sqrt(self.dims.head_dim)


DAPE_BUDGET = 2**25


def dape_logits(
    self,
    logits: Tensor,
    bias: Tensor,
    q: Tensor,
    k: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    layer: int,
) -> Tensor:
    """``DAPE.modify_logits``: A + B + f([A; B]) with f by einsum over permuted slices."""
    first, _, last = self.mlps[layer]
    heads = self.dims.num_heads
    w_a, w_b = first.weight.float()[:, :heads], first.weight.float()[:, heads:]
    b, _, s_q, s_k = logits.shape
    step = max(1, DAPE_BUDGET // (b * s_k * w_a.shape[0]))
    slices = []
    for start in range(0, s_q, step):
        rows = slice(start, start + step)
        hidden = torch.einsum("bhqk,oh->bqko", logits[:, :, rows], w_a)
        hidden = hidden + torch.einsum("...hqk,oh->...qko", bias[..., rows, :], w_b)
        hidden = F.leaky_relu(hidden + first.bias.float())
        out = F.linear(hidden, last.weight.float(), last.bias.float())
        slices.append(out.permute(0, 3, 1, 2))
    term = slices[0] if len(slices) == 1 else torch.cat(slices, dim=2)
    return logits + bias + term


def xl_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
    """``TransformerXL.score_bias``: the sinusoids projected again for every call."""
    from pe_bench.positions.relative import rel_shift

    s_k, scale = k.shape[-2], 1 / math.sqrt(self.dims.head_dim)
    n = torch.arange(s_k - 1, -1, -1, device=q.device)
    r = self.r_net[layer](sinusoid_table(n, self.dims.d_model).to(self.u.dtype))
    r = r.view(*n.shape, self.dims.num_heads, self.dims.head_dim)
    qv = (q + self.v.to(q.dtype).unsqueeze(1)) * scale
    position = qv @ r.to(q.dtype).permute(1, 2, 0)
    content = torch.einsum("hd,bhkd->bhk", self.u.to(k.dtype), k).unsqueeze(2)
    return rel_shift(position) + content * scale


def fire_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
    """``FIRE.score_bias``: the MLP at every pair."""
    mlp = self.mlp[layer]
    x = self.normalised_distance(q_pos, k_pos, layer).to(mlp[0].weight.dtype)
    return mlp(x.unsqueeze(-1)).permute(2, 0, 1)
