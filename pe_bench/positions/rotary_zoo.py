"""RoPE's relatives from the zoo (issue 17): trained schemes that change which frequencies rotate
(p-RoPE, HoPE, Resonance RoPE) or in which layers (the RoPE/NoPE hybrid, Llama 4's iRoPE), and
eval-time variants of a trained rope (NTK-by-parts, Llama 3, LongRoPE).

The trained schemes fix their frequencies at construction and edit RoPE's caches (``theta`` in
float64 and the ``theta32`` the forward pass rotates with), so a frequency of 0 leaves its pair
unrotated: a position-independent component. The variants compute theirs for each context
from the float64 caches, as ``ScaledRoPE`` does (``rotary.py``).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from pe_bench.config import Range
from pe_bench.errors import UserError
from pe_bench.positions.base import ModelDims, register
from pe_bench.positions.rotary import RoPE, ScaledRoPE, YaRN, apply_rotary, check_ntk_head_dim


def keep_pairs(rope: RoPE, kept: Tensor) -> None:
    """Set theta_k = 0 for the pairs not ``kept`` (``[h_d/2]`` bool): they stop rotating."""
    rope.theta[~kept] = 0.0
    rope.theta32[~kept] = 0.0


@register("p_rope")
class PRoPE(RoPE):
    """p-RoPE (Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional
    Encodings useful?", https://arxiv.org/abs/2410.06205): only the fraction p of highest
    frequencies rotates; the lowest 1 - p get theta_k = 0 (angle 0), so those pairs carry
    content without position.

    The number of rotated pairs is int(p * h_d // 2), as HF transformers' ``rope_type=
    "proportional"`` (``_compute_proportional_rope_parameters`` in ``modeling_rope_utils.py``,
    Gemma 4's ``partial_rotary_factor``), whose inv_freq the tests pin: theta_k = base^(-2k/h_d)
    for the rotated pairs (exponents over the full h_d), 0 for the others. p = 1 is RoPE and
    p = 0 is NoPE.

    Args:
        base (float): frequency base. Default: 10000.
        p (float): fraction of the frequencies that rotate, in [0, 1]. Default: 0.75 (the
            paper's 0.75-RoPE).
    """

    option_ranges: ClassVar[dict[str, Range]] = {**RoPE.option_ranges, "p": Range(ge=0, le=1)}

    def __init__(self, dims: ModelDims, *, base: float = 10000.0, p: float = 0.75) -> None:
        super().__init__(dims, base=base)
        if not 0 <= p <= 1:
            raise UserError(f"p_rope: p must be in [0, 1], got {p}")
        self.rotated = int(p * dims.head_dim // 2)  # HF's rounding: int(0.75 * 32 // 2) = 12
        keep_pairs(self, torch.arange(dims.head_dim // 2) < self.rotated)


@register("hope")
class HoPE(RoPE):
    """HoPE, High-frequency rotary Position Encoding (Chen et al. 2024, "HoPE: A Novel
    Positional Encoding Without Long-Term Decay for Enhanced Context Awareness and
    Extrapolation", https://arxiv.org/abs/2410.21216): the components that do not complete a
    full period within the training length are replaced by position-independent ones, so only
    the high-frequency signals rotate and the attention has no long-term decay.

    Implemented as theta'_k = theta_k where the wavelength 2 pi / theta_k <= L_train, and
    theta'_k = 0 (the pair is not rotated) where it is longer. The authors published no code;
    the rule is the paper's (section 4) and agrees with the third-party implementation in
    praxis (``praxis/encoding/hope.py``, which keeps theta_k > 2 pi / L_train: the two differ
    only for a wavelength of exactly L_train). At h_d = 32, base 10000, L_train = 64 (the quick
    suite), pairs 0..4 rotate (pair 4's wavelength is 62.8) and 5..15 do not; at L_train < 2 pi
    no pair rotates (NoPE). The frequencies are fixed by L_train: past it nothing changes.

    Args:
        base (float): frequency base. Default: 10000.
    """

    def __init__(self, dims: ModelDims, *, base: float = 10000.0) -> None:
        super().__init__(dims, base=base)
        keep_pairs(self, 2 * math.pi / self.theta <= dims.train_len)


@register("resonance_rope")
class ResonanceRoPE(RoPE):
    """Resonance RoPE (Wang et al. 2024, "Resonance RoPE: Improving Context Length
    Generalization of Large Language Models", https://arxiv.org/abs/2403.00071; reference
    implementation https://github.com/sheryc/resonance_rope, ``ResonanceRotaryEmbedding`` in
    ``src/models/components/positional_embedding/rotary_resonance.py``).

    Every wavelength is rounded to the nearest integer, lambda_k = round(2 pi / theta_k), and
    theta'_k = 2 pi / lambda_k: all h_d/2 pairs, as the reference's ``resonance_register``
    (its README: "rounds the wavelengths of all RoPE features"). Each pair then repeats its
    angles exactly every lambda_k positions, so positions past the training length revisit
    the angles of pairs whose wavelength fits in it. The angle is taken as (m mod lambda_k)
    theta'_k, as the reference's ``compute_freqs`` repeats one period: exact in float32 at any
    position. At h_d = 8, base 10000: lambda = 6, 63, 628, 6283.

    Args:
        base (float): frequency base. Default: 10000.
    """

    def __init__(self, dims: ModelDims, *, base: float = 10000.0) -> None:
        super().__init__(dims, base=base)
        wavelength = torch.round(2 * math.pi / self.theta)  # [h_d/2] float64, integers >= 6
        self.theta.copy_(2 * math.pi / wavelength)
        self.theta32.copy_(self.theta)
        self.register_buffer("wavelength", wavelength.long(), persistent=False)

    def angles(self, pos: Tensor) -> Tensor:
        """(m mod lambda_k) theta'_k: ``[s, h_d/2]``, float32, each in [0, 2 pi)."""
        return (pos.unsqueeze(-1) % self.wavelength).float() * self.theta32

    def rotate(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        return apply_rotary(q, self.angles(q_pos)), apply_rotary(k, self.angles(k_pos))


@register("rope_nope_hybrid")
class RoPENoPEHybrid(RoPE):
    """RoPE in most layers, NoPE in every ``nope_every``-th one, every layer attending to the
    whole window: the plain interleaving of RoPE and NoPE layers. It is the layer pattern of
    Llama 4's iRoPE and of Yang et al. 2025 ("Rope to Nope and Back Again: A New Hybrid
    Attention Strategy", https://arxiv.org/abs/2501.18795, Cohere Command A) without what
    both add to it: chunked or sliding-window attention in the RoPE layers, and in Llama 4 a
    temperature on the NoPE layers' queries (``irope`` is Llama 4's recipe). Its records say
    so in a caveat. The layer pattern is HF transformers ``modeling_llama4.py``'s
    (``use_rope = no_rope_layers[layer_idx]``, by default ``(layer_idx + 1) %
    no_rope_layer_interval != 0``), which the tests pin.

    Counting layers from 1, layers nope_every, 2 nope_every, ... (0-based indices
    nope_every - 1, 2 nope_every - 1, ...) are NoPE: q and k pass unrotated; the others are
    RoPE. Both kinds are relative, so the model is. A model of fewer than ``nope_every``
    layers has no NoPE layer (it is RoPE).

    Args:
        base (float): frequency base of the RoPE layers. Default: 10000.
        nope_every (int): period of the NoPE layers, >= 2. Default: 4 (Llama 4, Command A).
    """

    option_ranges: ClassVar[dict[str, Range]] = {**RoPE.option_ranges, "nope_every": Range(ge=2)}
    caveat = (
        "every layer attends to the whole window: not Llama 4's iRoPE (irope), whose RoPE "
        "layers attend within chunks and whose NoPE layers scale their queries, nor Command "
        "A's sliding-window RoPE layers"
    )

    def __init__(self, dims: ModelDims, *, base: float = 10000.0, nope_every: int = 4) -> None:
        super().__init__(dims, base=base)
        if nope_every < 2:
            raise UserError(
                f"{self.name}: nope_every must be >= 2 (1 would make every layer NoPE), "
                f"got {nope_every}"
            )
        self.nope_every = nope_every

    def is_nope(self, layer: int) -> bool:
        return (layer + 1) % self.nope_every == 0

    def rotate(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        if self.is_nope(layer):
            return q, k
        return super().rotate(q, k, q_pos, k_pos, layer)


ROPE_ATTENTION = ("chunked", "sliding")  # the values of irope's rope_attention


@register("irope")
class IRoPE(RoPENoPEHybrid):
    """Llama 4's iRoPE (Meta 2025, "The Llama 4 herd",
    https://ai.meta.com/blog/llama-4-multimodal-intelligence/; reference implementation HF
    transformers ``modeling_llama4.py``, ``Llama4TextAttention``, and the masks of
    ``masking_utils.py``): interleaved RoPE and NoPE layers (the layer pattern of
    ``rope_nope_hybrid``), where

    - each RoPE layer attends only within its chunk of ``window`` tokens: query i sees key
      j <= i where i // window == j // window (``attention_chunk_size``, the layer type
      ``chunked_attention``, HF's ``chunked_overlay``); or, with ``rope_attention:
      sliding``, the last ``window`` keys, i - j < window (``sliding_window_overlay``, as
      Command A's RoPE layers);
    - each NoPE layer attends to every earlier key, its queries multiplied by Llama 4's
      attention temperature log1p(floor((p + 1) / floor_scale)) * attn_scale + 1 at position p
      (``attn_temperature_tuning``): 1 while p + 1 < floor_scale, then growing with the log
      of the number of floor_scale-token spans (HF's code cites Scalable-Softmax, Nakanishi
      2025, https://arxiv.org/abs/2501.19399, for it).

    Llama 4's config sets attention_chunk_size = floor_scale = 8192 and attn_scale = 0.1;
    here the window defaults to L_train and floor_scale to the window, so that training sees
    whole windows (its RoPE layers are plain RoPE there and the temperature touches only its
    last position) and, past L_train, no RoPE layer meets a relative position it has not
    seen. Llama 4 Scout's L2 norm of q and k in the RoPE layers (``use_qk_norm``; Maverick
    has none) belongs to its trunk and is not part of this scheme.

    Not ``relative``: the chunks and the temperature read absolute positions.

    Args:
        base (float): frequency base of the RoPE layers. Default: 10000.
        nope_every (int): period of the NoPE layers, >= 2. Default: 4 (Llama 4).
        rope_attention (str): ``chunked`` (Llama 4) or ``sliding``. Default: chunked.
        window (int | None): the chunk (or sliding window) of the RoPE layers in tokens.
            Default: None, meaning L_train.
        temperature_tuning (bool): scale the NoPE layers' queries. Default: true.
        floor_scale (float | None): the temperature's span in tokens. Default: None, meaning
            the window.
        attn_scale (float): the temperature's strength. Default: 0.1.
    """

    relative = False
    option_ranges: ClassVar[dict[str, Range]] = {
        **RoPENoPEHybrid.option_ranges,
        "window": Range(ge=1),
        "floor_scale": Range(gt=0),
        "attn_scale": Range(ge=0),
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        nope_every: int = 4,
        rope_attention: str = "chunked",
        window: int | None = None,
        temperature_tuning: bool = True,
        floor_scale: float | None = None,
        attn_scale: float = 0.1,
    ) -> None:
        super().__init__(dims, base=base, nope_every=nope_every)
        if rope_attention not in ROPE_ATTENTION:
            raise UserError(
                f"irope: rope_attention={rope_attention!r} is not one of "
                f"{', '.join(ROPE_ATTENTION)}"
            )
        self.rope_attention = rope_attention
        self.window = dims.train_len if window is None else window
        self.temperature_tuning = temperature_tuning
        self.floor_scale = float(self.window if floor_scale is None else floor_scale)
        self.attn_scale = attn_scale

    @property
    def caveat(self) -> str:
        if self.window < self.dims.train_len:
            return ""
        return (
            f"window {self.window} >= L_train: no training window crosses a chunk boundary of"
            " the RoPE layers (Llama 4 trains across its 8192-token chunks)"
        )

    def attention_mask(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor | None:
        if self.is_nope(layer):
            return None  # the NoPE layers attend globally
        i, j = q_pos.unsqueeze(-1), k_pos  # [s_q, 1], [s_k]
        if self.rope_attention == "chunked":
            return torch.div(i, self.window, rounding_mode="floor") == torch.div(
                j, self.window, rounding_mode="floor"
            )
        return i - j < self.window

    def logit_scale(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor | None:
        if not (self.temperature_tuning and self.is_nope(layer)):
            return None
        spans = torch.floor((q_pos.float() + 1.0) / self.floor_scale)
        return torch.log1p(spans) * self.attn_scale + 1.0  # [s_q], HF's order of operations


@register("ntk_by_parts")
class NTKByParts(YaRN):
    """NTK-by-parts (bloc97 2023, https://github.com/jquesnelle/yarn; YaRN paper section 3.2,
    https://arxiv.org/abs/2309.00071): YaRN's per-frequency ramp between theta_k and
    theta_k / s, without YaRN's attention factor. HF transformers has no rope_type of its own
    for it: its inv_freq is HF ``rope_type="yarn"``'s (YaRN = NTK-by-parts + the attention
    factor 0.1 ln s + 1), which the tests pin.

    Args:
        base (float): frequency base of the trained rope. Default: 10000.
        factor (float | None): s; null: eval length / L_train. Default: None.
        beta_fast (float): rotations above which a pair is not interpolated. Default: 32.
        beta_slow (float): rotations below which a pair is fully interpolated. Default: 1.
    """

    def attention_factor(self, seq_len: int) -> float:
        """1: NTK-by-parts leaves the logits unscaled."""
        return 1.0


@register("llama3")
class Llama3(ScaledRoPE):
    """Llama 3.1's frequency scaling (Meta 2024, "The Llama 3 Herd of Models",
    https://arxiv.org/abs/2407.21783; reference implementation HF transformers
    ``rope_type="llama3"``, ``_compute_llama3_parameters`` in ``modeling_rope_utils.py``, with
    original_max_position_embeddings = L_train), whose inv_freq the tests pin.

    Wavelengths lambda_k = 2 pi / theta_k shorter than L_train / high_freq_factor keep theta_k,
    those longer than L_train / low_freq_factor become theta_k / s, and in between
    theta'_k = (1 - w_k) theta_k / s + w_k theta_k with w_k = (L_train / lambda_k -
    low_freq_factor) / (high_freq_factor - low_freq_factor): one formula with w_k clamped to
    [0, 1]. No attention factor.

    Args:
        base (float): frequency base of the trained rope. Default: 10000.
        factor (float | None): s; null: eval length / L_train. Default: None.
        low_freq_factor (float): L_train / this is the wavelength above which theta is
            divided by s. Default: 1.
        high_freq_factor (float): L_train / this is the wavelength below which theta is
            kept. Default: 4.
    """

    exact_caches = (*RoPE.exact_caches, "keep")

    option_ranges: ClassVar[dict[str, Range]] = {
        **ScaledRoPE.option_ranges,
        "low_freq_factor": Range(gt=0),
        "high_freq_factor": Range(gt=0),
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        factor: float | None = None,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
    ) -> None:
        super().__init__(dims, base=base, factor=factor)
        if not high_freq_factor > low_freq_factor > 0:
            raise UserError(
                f"llama3: need high_freq_factor > low_freq_factor > 0, got {high_freq_factor}, "
                f"{low_freq_factor}"
            )
        rotations = dims.train_len * self.theta / (2 * math.pi)  # L_train / lambda_k
        keep = (rotations - low_freq_factor) / (high_freq_factor - low_freq_factor)
        # [h_d/2]: 1 keeps theta_k, 0 divides it by s
        self.register_buffer("keep", keep.clamp(0, 1), persistent=False)

    def inv_freq(self, seq_len: int) -> Tensor:
        theta = super().inv_freq(seq_len)
        return self.keep * theta + (1 - self.keep) * theta / self.scale(seq_len)


@register("longrope")
class LongRoPE(ScaledRoPE):
    """LongRoPE (Ding et al. 2024, https://arxiv.org/abs/2402.13753; reference implementation
    https://github.com/microsoft/LongRoPE; HF transformers ``rope_type="longrope"``,
    ``_compute_longrope_parameters`` in ``modeling_rope_utils.py``, as Phi-3 uses it).

    theta'_k = theta_k / lambda_k with a static factor per pair: ``short_factor`` for a context
    of at most L_train keys, ``long_factor`` past it (HF switches on the largest position + 1:
    the same in windowed evaluation, where a window of L keys spans positions 0..L-1), and the
    logits multiplied by a^2 = 1 + ln s / ln L_train, where HF multiplies cos and sin by the
    attention factor a = sqrt(1 + ln s / ln L_train) (a = 1 for s <= 1).

    LongRoPE finds its factors by an evolutionary search on the extended model, which is not
    run here. Defaults: short factors 1 (the trained rope below L_train, as Phi-3's are close
    to 1); long factors NTK-aware's per pair, lambda_k = s^(2k/(h_d-2)) (1 for the fastest
    pair, s for the slowest, growing with k as LongRoPE's searched factors do), so this row is
    NTK's frequencies with LongRoPE's attention factor, and its records carry a caveat that
    says so. Give searched factors as HF configs carry them (``rope_scaling.long_factor`` and
    ``short_factor``, h_d/2 numbers each, for the target s): they are used as given, and the
    caveat goes.

    Args:
        base (float): frequency base of the trained rope. Default: 10000.
        factor (float | None): s; null: eval length / L_train. Default: None.
        short_factor (list[float] | None): lambda_k up to L_train; null: all 1. Default: None.
        long_factor (list[float] | None): lambda_k past L_train; null: s^(2k/(h_d-2)).
            Default: None.
    """

    exact_caches = (*RoPE.exact_caches, "short", "long")

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        factor: float | None = None,
        short_factor: list[float] | None = None,
        long_factor: list[float] | None = None,
    ) -> None:
        super().__init__(dims, base=base, factor=factor)
        if dims.train_len < 2:
            raise UserError(f"longrope needs a training length >= 2, got {dims.train_len}")
        check_ntk_head_dim("longrope", dims)
        pairs = dims.head_dim // 2
        for option, value in (("short_factor", short_factor), ("long_factor", long_factor)):
            if value is not None and (len(value) != pairs or not all(x > 0 for x in value)):
                raise UserError(
                    f"longrope: {option} needs {pairs} factors > 0 (one per pair of the head "
                    f"dim {dims.head_dim}), got {value}"
                )
        short = torch.ones(pairs, dtype=torch.float64) if short_factor is None else short_factor
        self.register_buffer("short", torch.as_tensor(short, dtype=torch.float64), persistent=False)
        # empty: the NTK-aware rule, computed for each s
        long = torch.as_tensor(long_factor or [], dtype=torch.float64)
        self.register_buffer("long", long, persistent=False)

    @property
    def caveat(self) -> str:
        if len(self.long):
            return ""
        return (
            "its long factors are NTK-aware's s^(2k/(h_d-2)), not ones found by LongRoPE's "
            "search (pass searched ones as long_factor)"
        )

    def factors(self, seq_len: int) -> Tensor:
        """lambda_k for a context of ``seq_len`` keys: ``[h_d/2]`` float64."""
        if seq_len <= self.dims.train_len:
            return self.short
        if len(self.long):
            return self.long
        d = self.dims.head_dim
        return self.scale(seq_len) ** (-self.exponent * d / (d - 2))  # s^(2k/(h_d-2))

    def inv_freq(self, seq_len: int) -> Tensor:
        return super().inv_freq(seq_len) / self.factors(seq_len)

    def attention_factor(self, seq_len: int) -> float:
        """a = sqrt(1 + ln s / ln L_train), the factor HF puts on cos and sin."""
        s = self.scale(seq_len)
        return math.sqrt(1 + math.log(s) / math.log(self.dims.train_len))

    def logit_scale(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor | None:
        a = self.attention_factor(self.context_len(k_pos))
        return None if a == 1.0 else torch.full(q_pos.shape, a * a, device=q_pos.device)
