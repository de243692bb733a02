"""PoPE: polar coordinate position embeddings (magnitudes from content, phases from position)."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.config import Range
from pe_bench.positions.base import ModelDims, PositionScheme, register


@register("pope")
class PoPE(PositionScheme):
    """Polar coordinate position embeddings (Gopalakrishnan et al. 2025, "Decoupling the
    'What' and 'Where' With Polar Coordinate Positional Embeddings",
    https://arxiv.org/abs/2509.10534).

    Each of the h_d dimensions c of a query or key is one complex number: magnitude
    softplus(q_c) (content, never negative) and phase i theta_c (position), with h_d
    frequencies theta_c = base^(-c/h_d) (RoPE has h_d/2); a key's phase also carries a learned
    bias delta_{h,c} per head, clamped to [-2 pi, 0] and 0 at init. So

        logit_ij = sum_c softplus(q_c) softplus(k_c) cos((i - j) theta_c - delta_c) / sqrt(h_d),

    a function of i - j and the content alone (``relative``). Reference implementation:
    lucidrains/PoPE-pytorch ``PoPE_pytorch/pope.py`` (``PoPE``, ``apply_pope_to_qk`` with
    ``F.softplus``; ``flash_attn_with_pope`` scales by the unwidened h_d ** -0.5), the same
    as x-transformers' ``PolarEmbedding`` and ``apply_polar_pos_emb``.

    The hook returns q and k widened to 2 h_d (real and imaginary parts, ``[x cos, x sin]``),
    as the reference does; the model pads v to that width with zeros for the fused kernel.
    SDPA divides by sqrt of the widened width, so the queries carry a factor sqrt 2 that
    restores the reference's 1 / sqrt(h_d). Each layer has its own bias (PoPE-pytorch builds
    one module per attention layer; x-transformers shares one across layers).

    Args:
        base (float): frequency base. Default: 10000.
        bias_uniform_init (bool): draw delta from U(-2 pi, 0) instead of 0 (the reference's
            ``bias_uniform_init``). Default: False.
    """

    relative = True
    option_ranges: ClassVar[dict[str, Range]] = {"base": Range(gt=1)}
    caveat = (
        "phase bias per layer and head, 0 at init, as PoPE-pytorch builds it (x-transformers "
        "shares one across layers); the paper's gains were measured at 124M-774M parameters "
        "and L_train 1024, not at this model's size"
    )

    def __init__(
        self, dims: ModelDims, *, base: float = 10000.0, bias_uniform_init: bool = False
    ) -> None:
        super().__init__(dims)
        d = dims.head_dim
        theta = base ** -(torch.arange(d, dtype=torch.float64) / d)  # [h_d]
        self.register_buffer("theta", theta.float(), persistent=False)
        bias = torch.zeros(dims.num_layers, dims.num_heads, d)
        if bias_uniform_init:
            bias.uniform_(-2 * math.pi, 0)
        self.phase_bias = nn.Parameter(bias)

    def _apply(self, fn, recurse=True):
        """``Module._apply`` (behind ``to``, ``half``, ...), except that ``theta`` only moves:
        a bfloat16 cast would round the frequencies (as RoPE's ``exact_caches``)."""
        theta = self.theta
        super()._apply(fn, recurse)
        self._buffers["theta"] = theta.to(self._buffers["theta"].device)
        return self

    def rotate(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        """q and k ``[b, n_h, s, h_d]`` -> ``[b, n_h, s, 2 h_d]``: [m cos phi, m sin phi] with
        m = softplus(x) and phi the position's phases (a key's plus its head's bias)."""
        delta = self.phase_bias[layer].float().clamp(-2 * math.pi, 0).unsqueeze(-2)  # [n_h,1,h_d]
        q_phase = q_pos.float().unsqueeze(-1) * self.theta  # [s_q, h_d]
        k_phase = k_pos.float().unsqueeze(-1) * self.theta + delta  # [n_h, s_k, h_d]
        return polar(q, q_phase, math.sqrt(2)), polar(k, k_phase, 1.0)


def polar(x: Tensor, phase: Tensor, scale: float) -> Tensor:
    """``[m cos phase, m sin phase] * scale`` with m = softplus(x), in float32, cast back."""
    magnitude = F.softplus(x.float()) * scale
    return torch.cat((magnitude * phase.cos(), magnitude * phase.sin()), dim=-1).type_as(x)
