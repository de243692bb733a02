"""FoPE: Fourier position embedding, each RoPE pair a Fourier series over the trained
frequencies, the frequencies under-trained at L_train zeroed."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.config import Range
from pe_bench.positions.base import ModelDims, register
from pe_bench.positions.rotary import RoPE, rotate_half


@register("fope")
class FoPE(RoPE):
    """Fourier position embedding (Hua et al. 2025, "Fourier Position Embedding: Enhancing
    Attention's Periodic Extension for Length Generalization", https://arxiv.org/abs/2412.17739).

    RoPE's frequencies theta_k below the floor 2 pi / L_train (a wave that does not complete
    one period in training) are zeroed and dropped; the D that remain make a basis. Pair d of
    head h (half-split, as RoPE) is then rotated by a Fourier series of them rather than by one:

        x' = x * C + rotate_half(x) * S,  C_d(p) = sum_D cos(theta_D p) A_hDd,
                                          S_d(p) = sum_D sin(theta_D p) B_hDd,

    for the first d_out = min(D, h_d/4) pairs; the other pairs get C = S = 1 (no position).
    A and B (``[n_h, D, d_out]`` per layer) start as the identity (or a strided identity when
    D > d_out) plus Xavier-normal noise of gain 0.3, and are not trained. C and S are no
    rotation, so q'_i . k'_j depends on i and j, not on i - j alone (not ``relative``).

    Reference implementation: yiju-zhao/Fourier-Position-Embedding ``olmo/model.py``
    (``FourierEmbedding`` on ``RotaryEmbedding``), with its configs' settings
    (``configs/*/ce-fourier/*.yaml``: ``rope_clamp_floor_freq`` and ``rope_clamp_floor_to_zero``
    at ratio 1, ``fourier_init: eye_xavier_norm``, ``fourier_separate_basis``,
    ``fourier_separate_head``, ``fourier_ignore_zero``, ``fourier_learnable`` left False); one
    embedding per block, so A and B per layer.

    Where the code departs from the paper, the code is kept: the pairs past d_out get
    C = S = 1 (``F.pad(..., value=1)`` on both), which is no position either but x + rotate_half(x),
    twice a zero frequency's weight in q . k (``zero_freq_sin: 0`` gives the paper's
    zero frequency, C = 1, S = 0).

    Args:
        base (float): RoPE's frequency base. Default: 10000.
        floor_ratio (float): frequencies below floor_ratio * 2 pi / L_train are zeroed. Default: 1.
        init_gain (float): Xavier-normal gain of A's and B's noise. Default: 0.3.
        learnable (bool): train A and B (the code's ``fourier_learnable``). Default: False.
        zero_freq_sin (float): S on the pairs past d_out. Default: 1 (the code).
    """

    relative = False
    exact_caches = (*RoPE.exact_caches, "basis")
    option_ranges: ClassVar[dict[str, Range]] = {
        **RoPE.option_ranges,
        "floor_ratio": Range(ge=0),
        "init_gain": Range(ge=0),
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        floor_ratio: float = 1.0,
        init_gain: float = 0.3,
        learnable: bool = False,
        zero_freq_sin: float = 1.0,
    ) -> None:
        super().__init__(dims, base=base)
        floor = floor_ratio * 2 * math.pi / dims.train_len
        basis = self.theta[self.theta >= floor]  # [D]: the frequencies training sees whole
        self.register_buffer("basis", basis.float(), persistent=False)
        self.zero_freq_sin = zero_freq_sin
        shape = (dims.num_heads, len(basis), min(len(basis), dims.head_dim // 4))
        self.cos_coef, self.sin_coef = (
            nn.Parameter(coefficients(dims.num_layers, shape, init_gain), requires_grad=learnable)
            for _ in range(2)
        )

    @property
    def caveat(self) -> str:
        kept, pairs = len(self.basis), self.dims.head_dim // 2
        scale = (
            f"at L_train {self.dims.train_len} only {kept} of {pairs} frequencies complete a "
            "period and make the series (the authors' OLMo models, 60M-1.2B parameters at "
            "L_train 512 and 1,024, keep about half); the paper's gains were not measured at "
            "this model's size"
        )
        if self.zero_freq_sin == 0:
            return scale
        return (
            "pairs past the series get cos = sin = 1 as in the authors' code (x + rotate_half(x): "
            "twice the weight of the paper's zero frequency; zero_freq_sin: 0 gives the paper's); "
            + scale
        )

    def series(self, x: Tensor, pos: Tensor, layer: int) -> Tensor:
        """x ``[b, n_h, s, h_d]`` at positions ``pos`` through layer ``layer``'s series."""
        angles = pos.float().unsqueeze(-1) * self.basis  # [s, D]
        pad = self.dims.head_dim // 2 - self.cos_coef.shape[-1]
        cos = F.pad(angles.cos() @ self.cos_coef[layer].float(), (0, pad), value=1.0)
        sin = F.pad(angles.sin() @ self.sin_coef[layer].float(), (0, pad), value=self.zero_freq_sin)
        xf = x.float()  # cos, sin: [n_h, s, h_d/2], repeated for both halves
        return (xf * cos.repeat(1, 1, 2) + rotate_half(xf) * sin.repeat(1, 1, 2)).type_as(x)

    def rotate(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        return self.series(q, q_pos, layer), self.series(k, k_pos, layer)


def coefficients(layers: int, shape: tuple[int, int, int], gain: float) -> Tensor:
    """A or B for every layer, ``[layers, n_h, D, d_out]``: Xavier-normal noise of ``gain`` on
    the ``[n_h, D, d_out]`` tensor (its fans as torch counts them), plus the identity, or for
    D > d_out the strided one with 1 at (i * ceil(D / d_out), i) (the reference's
    ``get_step_eye``)."""
    _, d_in, d_out = shape
    eye = torch.zeros(d_in, d_out)
    step = math.ceil(d_in / d_out) if d_out else 1
    rows = torch.arange(d_out) * step
    eye[rows[rows < d_in], torch.arange(d_out)[rows < d_in]] = 1.0
    out = torch.empty(layers, *shape)
    for layer in out:
        if layer.numel():
            nn.init.xavier_normal_(layer, gain=gain)
        layer += eye
    return out
