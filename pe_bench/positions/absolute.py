"""Absolute schemes: nothing at all (NoPE), or a vector per position added to token embeddings."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from pe_bench.config import Range
from pe_bench.errors import UserError
from pe_bench.positions.base import ModelDims, PositionScheme, register


@register("nope")
class NoPE(PositionScheme):
    """No position information; order is only implicit in the causal mask.

    Haviv et al. 2022, https://arxiv.org/abs/2203.16634; Kazemnejad et al. 2023,
    https://arxiv.org/abs/2305.19466.
    """


def sinusoid_table(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Vaswani et al. 2017: PE[p, 2k] = sin(p / base^(2k/dim)), PE[p, 2k+1] = cos(same).

    ``positions: [...]`` -> ``[..., dim]`` in float32, sin and cos interleaved as in the paper.
    """
    inv_freq = base ** (-torch.arange(0, dim, 2, device=positions.device).float() / dim)
    angles = positions.float().unsqueeze(-1) * inv_freq  # [..., dim/2]
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # [..., dim]


@register("sinusoidal")
class Sinusoidal(PositionScheme):
    """Fixed sinusoidal embeddings added to the tokens (Vaswani et al. 2017,
    https://arxiv.org/abs/1706.03762). Defined for every position.

    The table has unit amplitude; added as is it would drown the token embeddings (init std
    0.02) and train worse than NoPE. It is scaled by d_model^-0.5, the initial scale of
    x-transformers' ``ScaledSinusoidalEmbedding`` and the ratio Vaswani et al. get by
    multiplying the token embeddings by sqrt(d_model) instead.

    Args:
        base (float): wavelength base. Default: 10000.
        scale (float | None): factor on the table. Default: None, meaning d_model^-0.5.
    """

    # theta_k = base^(-2k/d) falls with k only for base > 1
    option_ranges: ClassVar[dict[str, Range]] = {"base": Range(gt=1)}

    def __init__(self, dims: ModelDims, *, base: float = 10000.0, scale: float | None = None):
        super().__init__(dims)
        if dims.d_model % 2:
            raise UserError(f"sinusoidal needs an even d_model, got {dims.d_model}")
        self.base = base
        self.scale = dims.d_model**-0.5 if scale is None else scale

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + (self.scale * sinusoid_table(pos, self.dims.d_model, self.base)).to(x.dtype)


@register("learned")
class Learned(PositionScheme):
    """A learned vector per position (GPT-2 style), ``max_positions`` rows.

    Rows past the training length are never trained: evaluating there measures how the model
    reacts to untrained (randomly initialised) position vectors.

    Args:
        max_positions (int): rows in the table. Default: 16 x the training length.
        beyond (str): past the table, ``"error"`` refuses the length (before any training),
            ``"clamp"`` reuses the last row. Default: ``"error"``.
    """

    BEYOND = ("error", "clamp")

    option_ranges: ClassVar[dict[str, Range]] = {"max_positions": Range(ge=1)}

    @property
    def caveat(self) -> str:
        if self.beyond != "clamp":
            return ""
        return f"past its {self.rows} rows, every position reuses the last row (beyond=clamp)"

    def __init__(
        self, dims: ModelDims, *, max_positions: int | None = None, beyond: str = "error"
    ) -> None:
        super().__init__(dims)
        if beyond not in self.BEYOND:
            raise UserError(f"{self.name}: beyond={beyond!r} is not one of {list(self.BEYOND)}")
        self.rows = max_positions or 16 * dims.train_len
        if self.rows < dims.train_len:
            raise UserError(
                f"learned: max_positions={self.rows} is below the training length {dims.train_len}"
            )
        self.beyond = beyond
        self.table = nn.Embedding(self.rows, dims.d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    @property
    def max_positions(self) -> int | None:
        return self.rows if self.beyond == "error" else None

    def describe_limit(self) -> str:
        return "raise pe.max_positions or set pe.beyond=clamp"

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        # Lengths past the table are refused by check_length before any training ("error");
        # the clamp reuses the last row ("clamp") and needs no value read back to the host.
        return x + self.table(pos.clamp(max=self.rows - 1)).to(x.dtype)
