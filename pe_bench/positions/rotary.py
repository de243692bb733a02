"""Rotary position embedding (RoPE), xPos, and RoPE's eval-time extensions (PI, NTK-aware,
dynamic NTK, YaRN, log-n scaling).

Pairing layout: half-split, as HF ``rotate_half`` (dim k pairs with dim k + h_d/2), not
interleaved. Both give the same scores; half-split needs no strided views.

Frequencies are computed once, on CPU in float64 at construction, and kept as non-persistent
buffers (as torchtune's RoPE cache), so they move with the model and are not in its
state_dict. A forward pass rotates with float32 frequencies: plain RoPE's cached ones; a
variant whose frequencies depend on the context length computes them from the float64
caches on the model's device, without copying from the host or reading a value back.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from pe_bench.config import Range
from pe_bench.errors import UserError
from pe_bench.positions.base import ModelDims, PositionScheme, register


def rotate_half(x: Tensor) -> Tensor:
    """[x1, x2] -> [-x2, x1] on the last dim (HF transformers' layout)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate ``x: [b, n_h, s, h_d]`` by ``angles: [s, h_d/2]`` (float32 math, cast back)."""
    cos = angles.cos().repeat(1, 2)  # [s, h_d]
    sin = angles.sin().repeat(1, 2)
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).type_as(x)


@register("rope")
class RoPE(PositionScheme):
    """Rotary position embedding (Su et al. 2021, https://arxiv.org/abs/2104.09864).

    Frequencies theta_k = base^(-2k/h_d), k = 0..h_d/2-1; the pair k of q and k at position m
    is rotated by m * theta_k, so q_i . k_j depends on i - j only. Reference implementation:
    HF transformers ``modeling_llama.py`` (``rotate_half``, ``apply_rotary_pos_emb``).

    Args:
        base (float): frequency base. Default: 10000.
    """

    relative = True
    # Caches that keep their dtype when the model is cast (``to(torch.bfloat16)``, ``half()``):
    # angles are computed in float32 from float64 frequencies whatever the model's dtype.
    exact_caches: ClassVar[tuple[str, ...]] = ("exponent", "theta", "theta32")

    # theta_k = base^(-2k/h_d) falls with k only for base > 1
    option_ranges: ClassVar[dict[str, Range]] = {"base": Range(gt=1)}

    def __init__(self, dims: ModelDims, *, base: float = 10000.0) -> None:
        super().__init__(dims)
        if dims.head_dim % 2:
            raise UserError(f"{self.name or 'rope'} needs an even head_dim, got {dims.head_dim}")
        self.base = base
        d = dims.head_dim
        exponent = -torch.arange(0, d, 2, dtype=torch.float64) / d  # [h_d/2]: -2k/h_d
        self.register_buffer("exponent", exponent, persistent=False)
        self.register_buffer("theta", base**exponent, persistent=False)  # float64 theta_k
        self.register_buffer("theta32", self.theta.float(), persistent=False)

    def _apply(self, fn, recurse=True):
        """``Module._apply`` (behind ``to``, ``cuda``, ``half``, ...), except that the
        ``exact_caches`` only move: a dtype cast would round the frequencies."""
        exact = {name: self._buffers[name] for name in self.exact_caches}
        super()._apply(fn, recurse)
        for name, cache in exact.items():
            moved = self._buffers[name]
            if moved.dtype != cache.dtype:
                self._buffers[name] = cache.to(moved.device)
        return self

    def inv_freq(self, seq_len: int) -> Tensor:
        """theta_k for a context of ``seq_len`` keys, ``[h_d/2]`` in float64 for exact tests,
        on the scheme's device."""
        return self.theta

    def context_len(self, k_pos: Tensor) -> int:
        """The context length the frequencies are computed for: the number of keys."""
        return k_pos.shape[-1]

    def frequencies(self, k_pos: Tensor) -> Tensor:
        """theta_k in float32 for a context of keys ``k_pos``: ``[h_d/2]``. RoPE's do not
        depend on the context (the cached ``theta32``); a class that overrides ``inv_freq``
        gets its own, for ``context_len(k_pos)``."""
        if type(self).inv_freq is RoPE.inv_freq:
            return self.theta32
        return self.inv_freq(self.context_len(k_pos)).to(k_pos.device, torch.float32)

    def rotate(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        inv_freq = self.frequencies(k_pos)  # [h_d/2], float32
        q_angles = q_pos.float().unsqueeze(-1) * inv_freq  # [s_q, h_d/2]
        k_angles = k_pos.float().unsqueeze(-1) * inv_freq  # [s_k, h_d/2]
        return apply_rotary(q, q_angles), apply_rotary(k, k_angles)


@register("xpos")
class XPos(RoPE):
    """xPos (Sun et al. 2022, https://arxiv.org/abs/2212.10554): RoPE whose pair k of q is
    also scaled by zeta_k^(i/S) and of k by zeta_k^(-j/S), zeta_k = (2k/h_d + gamma)/(1 + gamma),
    so q_i . k_j gains the decay zeta_k^((i-j)/S). Reference implementation: torchscale
    ``component/xpos_relative_position.py`` (``XPOS``: gamma 0.4, scale_base 512).

    The exponents are taken relative to the middle of the key positions (torchscale centres
    them too), which keeps zeta^(+-m/S) in float32 range and cancels exactly in q . k: the
    logits depend on i - j only, so xPos is relative.

    Args:
        base (float): RoPE frequency base. Default: 10000.
        gamma (float): gamma in zeta_k. Default: 0.4.
        scale_base (float): S. Default: 512.
    """

    option_ranges: ClassVar[dict[str, Range]] = {
        **RoPE.option_ranges,
        "gamma": Range(gt=0),
        "scale_base": Range(gt=0),
    }

    caveat = (
        "evaluated with plain causal attention, without the blockwise causal attention xPos "
        "uses past its training length"
    )

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        gamma: float = 0.4,
        scale_base: float = 512.0,
    ) -> None:
        super().__init__(dims, base=base)
        if gamma <= 0 or scale_base <= 0:
            raise UserError(f"xpos: gamma ({gamma}) and scale_base ({scale_base}) must be > 0")
        self.scale_base = scale_base
        d = dims.head_dim
        zeta = (torch.arange(0, d, 2, dtype=torch.float64) / d + gamma) / (1 + gamma)
        self.register_buffer("zeta", zeta.float(), persistent=False)  # [h_d/2]

    def decay(self, pos: Tensor, centre: Tensor) -> Tensor:
        """zeta_k^((pos - centre)/S): ``[s, h_d]`` (each factor repeated for both halves)."""
        exponent = (pos.float() - centre).unsqueeze(-1) / self.scale_base  # [s, 1]
        return (self.zeta**exponent).repeat(1, 2)

    def rotate(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        q, k = super().rotate(q, k, q_pos, k_pos, layer)
        centre = (k_pos.min() + k_pos.max()).float() / 2
        q = (q.float() * self.decay(q_pos, centre)).type_as(q)
        k = (k.float() / self.decay(k_pos, centre)).type_as(k)
        return q, k


class ScaledRoPE(RoPE):
    """RoPE applied at evaluation with a scale s for contexts longer than training.

    s = ``factor`` when given, else s = max(1, s_k / L_train) for a context of s_k keys (the
    window length in evaluation), so at the training length the variant equals plain RoPE.
    """

    variant_of = "rope"

    # s < 1 would shrink the context the variant serves, not extend it
    option_ranges: ClassVar[dict[str, Range]] = {**RoPE.option_ranges, "factor": Range(ge=1)}

    def __init__(self, dims: ModelDims, *, base: float = 10000.0, factor: float | None = None):
        super().__init__(dims, base=base)
        if factor is not None and factor < 1:
            raise UserError(f"{self.name}: factor must be >= 1 or null, got {factor}")
        self.factor = factor

    def scale(self, seq_len: int) -> float:
        if self.factor is not None:
            return float(self.factor)
        return max(1.0, seq_len / self.dims.train_len)


@register("pi")
class PositionInterpolation(ScaledRoPE):
    """Position interpolation (Chen et al. 2023, https://arxiv.org/abs/2306.15595):
    positions m -> m / s, i.e. every theta_k / s. The paper fine-tunes afterwards; here it is
    applied to the trained checkpoint as is."""

    def inv_freq(self, seq_len: int) -> Tensor:
        return super().inv_freq(seq_len) / self.scale(seq_len)


def check_ntk_head_dim(name: str, dims: ModelDims) -> None:
    """NTK's exponent h_d/(h_d-2) needs h_d >= 4."""
    if dims.head_dim < 4:
        raise UserError(f"{name} needs a head_dim of at least 4, got {dims.head_dim}")


@register("ntk")
class NTKAware(ScaledRoPE):
    """NTK-aware scaling (bloc97 2023,
    https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/): base' = base * s^(h_d/(h_d-2)).

    The highest frequency (k = 0) is unchanged and the lowest is divided by exactly s.
    """

    def __init__(self, dims: ModelDims, *, base: float = 10000.0, factor: float | None = None):
        super().__init__(dims, base=base, factor=factor)
        check_ntk_head_dim("ntk", dims)

    def inv_freq(self, seq_len: int) -> Tensor:
        d = self.dims.head_dim
        base = self.base * self.scale(seq_len) ** (d / (d - 2))
        return base**self.exponent


@register("dynamic_ntk")
class DynamicNTK(RoPE):
    """Dynamic NTK scaling (bloc97 and emozilla 2023; HF transformers ``rope_type="dynamic"``,
    ``_compute_dynamic_ntk_parameters`` in ``modeling_rope_utils.py``).

    For a context of length l (the largest position + 1, as HF's ``dynamic_rope_update``)
    longer than L_train, base' = base * (f * l / L_train - (f - 1))^(h_d/(h_d-2)), recomputed
    for every l; plain RoPE up to L_train. With f = 1 it is NTK with s = l / L_train.

    What "dynamic" changes depends on how the model is run. In generation the context grows
    token by token and each step rescales for its own length. In pe-bench's windowed
    evaluation every window of length L spans positions 0..L-1, so each is scored at
    l = L: with the default f = 1 this row equals ``ntk`` at s = L / L_train (the scale the
    ``ntk`` row uses), and a larger f only scales more (s = f L / L_train - (f - 1): 3, 7, 15,
    31 at 2x-16x for HF's example f = 2), which is not comparable with ``ntk``'s row.

    Args:
        base (float): frequency base of the trained rope. Default: 10000.
        factor (float): f. HF has no default (its examples use 2.0); 1.0 scales as ``ntk``
            does at every eval length. Default: 1.0.
    """

    relative = False  # the frequencies depend on the largest position, not on i - j alone
    variant_of = "rope"

    option_ranges: ClassVar[dict[str, Range]] = {**RoPE.option_ranges, "factor": Range(ge=1)}

    def __init__(self, dims: ModelDims, *, base: float = 10000.0, factor: float = 1.0):
        super().__init__(dims, base=base)
        if factor < 1:
            raise UserError(f"dynamic_ntk: factor must be >= 1, got {factor}")
        check_ntk_head_dim("dynamic_ntk", dims)
        self.factor = factor

    def context_len(self, k_pos: Tensor) -> Tensor:
        """The largest position + 1, as a tensor: no value is read back to the host."""
        return k_pos.max() + 1

    def inv_freq(self, seq_len: int | Tensor) -> Tensor:
        d, train_len, f = self.dims.head_dim, self.dims.train_len, self.factor
        length = torch.as_tensor(seq_len, dtype=torch.float64, device=self.exponent.device)
        scaled = self.base * (f * length / train_len - (f - 1)) ** (d / (d - 2))
        base = torch.where(length > train_len, scaled, self.base)  # [] float64
        return base**self.exponent


def yarn_correction_dim(rotations: float, dim: int, base: float, train_len: int) -> float:
    """The (fractional) pair index whose wavelength fits ``rotations`` times in the training
    length: dim(r) = d ln(L_train / (2 pi r)) / (2 ln base) (YaRN, eq. 17; HF
    ``find_correction_dim``)."""
    return dim * math.log(train_len / (rotations * 2 * math.pi)) / (2 * math.log(base))


@register("yarn")
class YaRN(ScaledRoPE):
    """YaRN (Peng et al. 2023, https://arxiv.org/abs/2309.00071; HF transformers
    ``rope_type="yarn"``, ``_compute_yarn_parameters`` in ``modeling_rope_utils.py``).

    theta'_k = (1 - ramp_k) theta_k + ramp_k theta_k / s: pairs that rotate more than
    beta_fast times over L_train keep their frequency, pairs that rotate fewer than beta_slow
    times are interpolated, with a linear ramp between the correction dims
    low = floor(dim(beta_fast)) and high = ceil(dim(beta_slow)) (clamped to [0, h_d - 1]).
    HF multiplies cos and sin by the attention factor a = 0.1 ln(s) + 1 (1 for s <= 1), so the
    logits q . k scale by a^2: that is this scheme's ``logit_scale``.

    Args:
        base (float): frequency base of the trained rope. Default: 10000.
        factor (float | None): s; null: eval length / L_train. Default: None.
        beta_fast (float): rotations above which a pair is not interpolated. Default: 32.
        beta_slow (float): rotations below which a pair is fully interpolated. Default: 1.
    """

    exact_caches = (*RoPE.exact_caches, "ramp")

    option_ranges: ClassVar[dict[str, Range]] = {
        **ScaledRoPE.option_ranges,
        "beta_fast": Range(gt=0),
        "beta_slow": Range(gt=0),
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        factor: float | None = None,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
    ) -> None:
        super().__init__(dims, base=base, factor=factor)
        if not beta_fast > beta_slow > 0:
            raise UserError(f"yarn: need beta_fast > beta_slow > 0, got {beta_fast}, {beta_slow}")
        d, train_len = dims.head_dim, dims.train_len
        low = max(math.floor(yarn_correction_dim(beta_fast, d, base, train_len)), 0)
        high = min(math.ceil(yarn_correction_dim(beta_slow, d, base, train_len)), d - 1)
        if low == high:
            high += 0.001  # as HF: avoid a division by zero
        ramp = (torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)
        # [h_d/2]: 0 keeps theta_k, 1 interpolates it
        self.register_buffer("ramp", ramp.clamp(0, 1), persistent=False)

    def inv_freq(self, seq_len: int) -> Tensor:
        theta = super().inv_freq(seq_len)
        return (1 - self.ramp) * theta + self.ramp * theta / self.scale(seq_len)

    def attention_factor(self, seq_len: int) -> float:
        """a = 0.1 ln(s) + 1, the factor HF puts on cos and sin."""
        return 0.1 * math.log(self.scale(seq_len)) + 1.0

    def logit_scale(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor | None:
        a = self.attention_factor(self.context_len(k_pos))
        return None if a == 1.0 else torch.full(q_pos.shape, a * a, device=q_pos.device)


@register("logn")
class LogN(RoPE):
    """Log-n scaling on a trained RoPE model (Su 2021, "entropy-invariant attention",
    https://kexue.fm/archives/8823; as Qwen's ``logn_attn``): the logits of the query at 1-based
    position p are multiplied by max(1, ln p / ln L_train), so a query that sees more keys than
    in training gets a proportionally sharper softmax. Plain RoPE up to L_train.

    Args:
        base (float): frequency base of the trained rope. Default: 10000.
    """

    relative = False  # the scale depends on the absolute query position p
    variant_of = "rope"

    def __init__(self, dims: ModelDims, *, base: float = 10000.0) -> None:
        super().__init__(dims, base=base)
        if dims.train_len < 2:
            raise UserError(f"logn needs a training length >= 2, got {dims.train_len}")

    def logit_scale(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        p = q_pos.float() + 1  # 1-based: the number of keys the query sees
        return (p.log() / math.log(self.dims.train_len)).clamp(min=1.0)
