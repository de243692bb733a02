"""An example pe-bench plugin, outside the package: ALiBi with a learned slope per head.

bias_h(i, j) = -softplus(w_h) * (i - j), with the slopes starting at ALiBi's 2^(-8h/H)
(Press et al. 2022, https://arxiv.org/abs/2108.12409). See docs/add_your_encoding.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.positions import ModelDims, PositionScheme, register


@register("my_pe")
class LearnedSlopes(PositionScheme):
    """ALiBi whose head slopes are learned (kept positive by a softplus).

    Args:
        init_scale (float): the slopes start at 2^(-init_scale * h / H), h = 1..H. Default: 8.
    """

    relative = True  # the bias depends on i - j only (pe-bench-check verifies it)

    def __init__(self, dims: ModelDims, *, init_scale: float = 8.0) -> None:
        super().__init__(dims)
        heads = torch.arange(1, dims.num_heads + 1, dtype=torch.float32)
        slopes = 2.0 ** (-init_scale * heads / dims.num_heads)
        self.raw_slopes = nn.Parameter(slopes.expm1().log())  # softplus(raw) = slopes

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        distance = (q_pos.unsqueeze(-1) - k_pos).float()  # [s_q, s_k]
        return -F.softplus(self.raw_slopes).view(-1, 1, 1) * distance  # [n_h, s_q, s_k]
