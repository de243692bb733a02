"""Schemes that add a per-head bias to the attention logits, a function of the distance i - j."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.config import Range
from pe_bench.errors import UserError
from pe_bench.positions.base import ModelDims, PositionScheme, register


def distances(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """n = i - j for every query/key pair: ``[s_q, s_k]`` (negative entries are masked later)."""
    return q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)


def alibi_slopes(num_heads: int) -> list[float]:
    """Head slopes m_h of ALiBi, as the authors' ``get_slopes``
    (https://github.com/ofirpress/attention_with_linear_biases, fairseq ``models/transformer.py``).

    For H a power of two, m_h = 2^(-8h/H), h = 1..H. Otherwise the slopes of the closest power
    of two below H, then every other slope of twice that power until there are H slopes.
    """
    if num_heads < 1:
        raise UserError(f"alibi needs at least one head, got {num_heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (h + 1) for h in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


@register("alibi")
class ALiBi(PositionScheme):
    """Attention with linear biases (Press et al. 2022, https://arxiv.org/abs/2108.12409):
    bias = -m_h * (i - j), no position embedding. Parameter-free and defined at every length."""

    relative = True
    shared_bias = True  # parameter-free, the same for every layer

    def __init__(self, dims: ModelDims) -> None:
        super().__init__(dims)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(dims.num_heads)), persistent=False)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        n = distances(q_pos, k_pos).float()  # [s_q, s_k]
        return -self.slopes.view(-1, 1, 1) * n  # [n_h, s_q, s_k]


def t5_bucket(n: Tensor, num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """Causal T5 bucket of each distance n = i - j >= 0 (Raffel et al. 2020; HF transformers
    ``T5Attention._relative_position_bucket`` with ``bidirectional=False``).

    Distances below num_buckets/2 get their own bucket; larger ones share log-spaced buckets up
    to max_distance; everything beyond falls in the last bucket. Negative n map to bucket 0.
    """
    n = n.clamp(min=0)
    max_exact = num_buckets // 2
    log_ratio = torch.log(n.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return torch.where(n < max_exact, n, large)


@register("t5")
class T5Bias(PositionScheme):
    """T5 relative position buckets (Raffel et al. 2020, https://arxiv.org/abs/1910.10683):
    a learned scalar per (bucket, head), shared by all layers, added to the logits.

    ``max_distance`` defaults to the paper's 128, lowered to the training length when that is
    shorter, so that every bucket is trained: a bucket no training distance reaches keeps its
    initial 0 while trained ones go negative, which pulls attention to far tokens (measured at
    L_train = 64, 400 steps: 4.28 bits/byte at 16x with 128, 3.80 with 64).

    The table is zero-initialised (the model starts as NoPE) and multiplied by ``scale``,
    sqrt(h_d) by default as x-transformers' ``RelativePositionBias(scale=dim_head ** 0.5)``.
    Without it Adam moves each bias by about lr per step, far too slowly to learn the
    locality ALiBi gets for free (measured: 3.13 vs 2.65 bits/byte after 400 quick-suite steps).

    Args:
        num_buckets (int): buckets (half exact, half log-spaced). Default: 32.
        max_distance (int | None): distance where the last bucket starts. Default: None,
            meaning min(128, max(L_train, num_buckets)).
        scale (float | None): factor on the table. Default: None, meaning sqrt(h_d).
    """

    relative = True
    shared_bias = True  # one table for all layers

    option_ranges: ClassVar[dict[str, Range]] = {
        "num_buckets": Range(ge=2),
        "max_distance": Range(ge=1),
    }

    @property
    def caveat(self) -> str:
        if self.max_distance == 128:
            return ""
        return (
            f"max_distance {self.max_distance}, lowered from T5's 128 so that every bucket "
            "trains at this training length"
        )

    def __init__(
        self,
        dims: ModelDims,
        *,
        num_buckets: int = 32,
        max_distance: int | None = None,
        scale: float | None = None,
    ) -> None:
        super().__init__(dims)
        if num_buckets < 2 or num_buckets % 2:
            raise UserError(f"t5: num_buckets must be even and >= 2, got {num_buckets}")
        if max_distance is None:
            max_distance = min(128, max(dims.train_len, num_buckets))
        if max_distance <= num_buckets // 2:
            raise UserError(
                f"t5: max_distance ({max_distance}) must exceed num_buckets/2 ({num_buckets // 2})"
            )
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.scale = math.sqrt(dims.head_dim) if scale is None else scale
        self.bias = nn.Embedding(num_buckets, dims.num_heads)
        nn.init.zeros_(self.bias.weight)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        buckets = t5_bucket(distances(q_pos, k_pos), self.num_buckets, self.max_distance)
        bias = self.scale * self.bias(buckets)  # [s_q, s_k, n_h]
        return bias.permute(2, 0, 1)  # [n_h, s_q, s_k]


def inverse_softplus(y: Tensor) -> Tensor:
    """x with softplus(x) = y (y > 0): log(exp(y) - 1)."""
    return y.expm1().log()


def kerple_init(num_heads: int, high: float, eps: float = 1e-2) -> Tensor:
    """The KERPLE reference's initial values: U(0, high) per head, clamped at eps = 0.01 (the
    reference clamps every parameter at eps before use)."""
    return (torch.rand(num_heads) * high).clamp(min=eps)


@register("kerple_log")
class KerpleLog(PositionScheme):
    """KERPLE, logarithmic variant (Chi et al. 2022, https://arxiv.org/abs/2205.09921):
    bias = -r1 * ln(1 + r2 * (i - j)) with r1, r2 > 0 learned per head, shared by all layers.
    Reference implementation: chijames/KERPLE, ``ParallelKerpleLog`` in ``megatron/mpu/layers.py``
    (r1 ~ U(0, 2), r2 ~ U(0, 1) at initialisation, kept positive there by clamping at 0.01).

    Here r = softplus(w) keeps them positive with a smooth gradient instead of the clamp.
    """

    relative = True
    shared_bias = True  # one bias for all layers

    def __init__(self, dims: ModelDims) -> None:
        super().__init__(dims)
        self.raw_r1 = nn.Parameter(inverse_softplus(kerple_init(dims.num_heads, 2.0)))
        self.raw_r2 = nn.Parameter(inverse_softplus(kerple_init(dims.num_heads, 1.0)))

    def coefficients(self) -> tuple[Tensor, Tensor]:
        """(r1, r2), each ``[n_h]``."""
        return F.softplus(self.raw_r1), F.softplus(self.raw_r2)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        n = distances(q_pos, k_pos).clamp(min=0).float()  # [s_q, s_k]
        r1, r2 = (r.view(-1, 1, 1) for r in self.coefficients())
        return -r1 * torch.log1p(r2 * n)  # [n_h, s_q, s_k]


@register("kerple_power")
class KerplePower(PositionScheme):
    """KERPLE, power variant (Chi et al. 2022, https://arxiv.org/abs/2205.09921):
    bias = -r1 * (i - j)^r2 with r1 > 0 and 0 < r2 <= 2 learned per head, shared by all layers.
    Reference implementation: chijames/KERPLE, ``ParallelKerplePower`` (r1 ~ U(0, 1),
    r2 ~ U(0, 2) at initialisation, clamped to [0.01, 2] there).

    Here r1 = softplus(w1) and r2 = 2 sigmoid(w2) keep them in range with smooth gradients.
    """

    relative = True
    shared_bias = True  # one bias for all layers

    def __init__(self, dims: ModelDims) -> None:
        super().__init__(dims)
        r1 = kerple_init(dims.num_heads, 1.0)
        r2 = kerple_init(dims.num_heads, 2.0).clamp(max=1.99)  # 2 sigmoid(w) never reaches 2
        self.raw_r1 = nn.Parameter(inverse_softplus(r1))
        self.raw_r2 = nn.Parameter(torch.logit(r2 / 2))

    def coefficients(self) -> tuple[Tensor, Tensor]:
        """(r1, r2), each ``[n_h]``."""
        return F.softplus(self.raw_r1), 2 * torch.sigmoid(self.raw_r2)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        n = distances(q_pos, k_pos).clamp(min=0).float()  # [s_q, s_k]
        r1, r2 = (r.view(-1, 1, 1) for r in self.coefficients())
        # n^r2 as exp(r2 ln n) where n > 0: the gradient of 0^r2 with respect to r2 is 0 . ln 0
        power = torch.where(n > 0, torch.exp(r2 * n.clamp(min=1).log()), 0.0)
        return -r1 * power  # [n_h, s_q, s_k]


@register("sandwich")
class Sandwich(PositionScheme):
    """Sandwich (Chi et al. 2023, https://arxiv.org/abs/2212.10356): the inner product of the
    sinusoidal embeddings of i and j, p_i . p_j = sum_{k=1}^{d'/2} cos((i - j) / 10000^(2k/d')),
    minus d'/2 so that it is 0 at distance 0, divided by 8h/H for head h = 1..H (ALiBi-like
    per-head compression). Parameter-free. Reference implementation: NVIDIA NeMo
    ``SandwichRelativePositionEmbedding`` (``sandwich_relative_position_embedding.py``), with
    d' the head dimension.

    Args:
        dim (int | None): d', the width of the sinusoidal embeddings. Default: None (h_d).
    """

    relative = True
    shared_bias = True  # one bias for all layers

    option_ranges: ClassVar[dict[str, Range]] = {"dim": Range(ge=2)}

    def __init__(self, dims: ModelDims, *, dim: int | None = None) -> None:
        super().__init__(dims)
        dim = dims.head_dim if dim is None else dim
        if dim < 2 or dim % 2:
            raise UserError(f"sandwich: dim must be even and >= 2, got {dim}")
        self.dim = dim
        k = torch.arange(1, dim // 2 + 1, dtype=torch.float64)
        self.register_buffer("inv_freq", (10000.0 ** (-2 * k / dim)).float(), persistent=False)
        heads = torch.arange(1, dims.num_heads + 1, dtype=torch.float32)
        self.register_buffer("compression", 8 * heads / dims.num_heads, persistent=False)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        n = distances(q_pos, k_pos).float()  # [s_q, s_k]
        inner = torch.cos(n.unsqueeze(-1) * self.inv_freq).sum(-1)  # [s_q, s_k]
        return (inner - self.dim / 2) / self.compression.view(-1, 1, 1)  # [n_h, s_q, s_k]
