"""Deliberately broken schemes, one per contract, that the conformance kit must fail.

Registered under ``broken_*`` names so that ``pe-bench-check broken_leaky --plugin
tests.plugins.broken_pe`` finds them too.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pe_bench.positions import PositionScheme, register
from pe_bench.positions.rotary import RoPE, apply_rotary


@register("broken_leaky")
class LeaksFuture(PositionScheme):
    """Adds the mean of the whole sequence to every token: token t sees the tokens after it."""

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + x.mean(dim=1, keepdim=True)


@register("broken_fake_relative")
class FakeRelative(PositionScheme):
    """Claims ``relative = True`` but divides the distance by the absolute query position."""

    relative = True

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        n = (q_pos.unsqueeze(-1) - k_pos).float()
        return -n / (1 + q_pos.float().unsqueeze(-1))


@register("broken_content")
class UndeclaredContent(PositionScheme):
    """Reads q in its bias but declares ``content_bias = False`` (a cache would be stale)."""

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        n = (q_pos.unsqueeze(-1) - k_pos).float()
        return -n * q.mean(-1, keepdim=True).sigmoid()  # [b, n_h, s_q, s_k]


@register("broken_shared")
class LayerBiasShared(PositionScheme):
    """A slope per layer, but declares ``shared_bias = True`` (layers would reuse layer 0's)."""

    shared_bias = True

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        return -(q_pos.unsqueeze(-1) - k_pos).float() / (layer + 1)


@register("broken_score_mod")
class WrongScoreMod(PositionScheme):
    """A FlexAttention form (slope 1/16) that disagrees with its bias (slope 1/8)."""

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        return -(q_pos.unsqueeze(-1) - k_pos).float() / 8

    def score_mod(self, q_pos: Tensor, k_pos: Tensor, layer: int):
        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score - (q_pos[q_idx] - k_pos[kv_idx]).float() / 16

        return mod


@register("broken_reference")
class WrongReference(PositionScheme):
    """A fast path (slope 1/8) that disagrees with its reference (slope 1/16)."""

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        return -(q_pos.unsqueeze(-1) - k_pos).float() / 8

    def score_bias_reference(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor:
        return -(q_pos.unsqueeze(-1) - k_pos).float() / 16


@register("broken_chunks")
class FirstQueries(PositionScheme):
    """Builds its bias from indices as if the queries were the *first* s_q keys."""

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        i = torch.arange(q.shape[-2]).unsqueeze(-1)
        return -(i - torch.arange(k.shape[-2])).float() / 8


@register("broken_table")
class UnguardedTable(PositionScheme):
    """A 20-row table that declares no limit: longer sequences crash with an IndexError."""

    def __init__(self, dims) -> None:
        super().__init__(dims)
        self.table = nn.Embedding(20, dims.d_model)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + self.table(pos).to(x.dtype)


@register("broken_bf16")
class LowPrecisionAngles(RoPE):
    """RoPE with its angles computed in the input dtype: bfloat16 rounds position 1047 to 1048."""

    def rotate(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        inv_freq = self.inv_freq(k_pos.shape[-1]).to(q.dtype)
        q_angles = q_pos.to(q.dtype).unsqueeze(-1) * inv_freq
        k_angles = k_pos.to(q.dtype).unsqueeze(-1) * inv_freq
        return apply_rotary(q, q_angles), apply_rotary(k, k_angles)


@register("broken_unused")
class UnusedParameter(PositionScheme):
    """A learned slope no hook ever uses."""

    def __init__(self, dims) -> None:
        super().__init__(dims)
        self.slope = nn.Parameter(torch.ones(dims.num_heads))


@register("broken_seed")
class UnseededInit(PositionScheme):
    """Initialises its table from a fresh generator: two builds under one seed differ."""

    def __init__(self, dims) -> None:
        super().__init__(dims)
        generator = torch.Generator()
        generator.seed()  # a non-deterministic seed, not torch's global generator
        self.table = nn.Parameter(torch.randn(4096, dims.d_model, generator=generator))

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + self.table[pos].to(x.dtype)


@register("broken_index_scale")
class IndexScaledRoPE(RoPE):
    """SSMax written on RoPE as the issue's plugin did: logits times ln n with n the number of
    keys a query sees, read from the query's index in the window. It inherits
    ``relative = True`` from RoPE, and shifting positions leaves it unchanged."""

    def logit_scale(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        n = torch.arange(k_pos.shape[-1] - q_pos.shape[-1], k_pos.shape[-1]) + 2.0
        return n.log()


@register("broken_scale_shape")
class WrongScaleShape(PositionScheme):
    """A scale per key instead of per query."""

    def logit_scale(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        return torch.ones(1, k_pos.shape[-1] + 1)


@register("broken_scales_nothing")
class ScalesNoBias(PositionScheme):
    """Declares ``scales_bias`` without a bias to scale."""

    scales_bias = True

    def logit_scale(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        return torch.full(q_pos.shape, 2.0)


@register("broken_weights")
class FutureWeights(PositionScheme):
    """Normalises over every key, future ones included."""

    def attention_weights(self, logits: Tensor, allowed: Tensor) -> Tensor:
        return logits.softmax(dim=-1)


@register("broken_self_hidden")
class HidesItself(PositionScheme):
    """Attends only to strictly earlier keys: the first query has nothing to attend."""

    def attention_mask(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        return q_pos.unsqueeze(-1) > k_pos


@register("broken_mask_rows")
class FirstRowsMask(PositionScheme):
    """A sliding window of 4 built from the query's index among those passed, not its
    position: query chunks (s_q < s_k) get the first rows' mask."""

    def attention_mask(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        i = torch.arange(len(q_pos), device=q_pos.device).unsqueeze(-1)
        return (i - k_pos < 4) & (i >= k_pos)


@register("broken_key_bias")
class WrongKeyBias(PositionScheme):
    """A bias c_i - c_j given to the fused path as +c_j: the wrong sign."""

    content_bias = True

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        c = k.float().sum(-1).cumsum(-1)  # [b, n_h, s_k]
        return c[..., -q.shape[-2] :].unsqueeze(-1) - c.unsqueeze(-2)

    def key_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        return k.float().sum(-1).cumsum(-1)


@register("broken_attend")
class LateLeak(PositionScheme):
    """Attends itself, causally, except that from token 64 on every query also sees the
    window's last token: a leak that the model's causality check at 48 tokens cannot see."""

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, layer: int) -> Tensor:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        late = torch.zeros_like(out)
        late[..., 64:, :] = v[..., -1:, :]
        return out + late


@register("broken_calibration")
class CalibratesItsParameter(PositionScheme):
    """A temperature fitted at evaluation by moving its own parameter: the checkpoint's value
    is lost (and every other length changes with it)."""

    def __init__(self, dims) -> None:
        super().__init__(dims)
        self.scale = nn.Parameter(torch.ones(()))

    def logit_scale(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        return self.scale.expand(q_pos.shape[-1])

    def calibrate(self, held_out, seq_len: int) -> str:
        with torch.no_grad():
            self.scale.fill_(1.5)
        return "scale 1.5"


@register("broken_nan")
class AllNaN(PositionScheme):
    """Claims ``relative = True``; its bias is NaN everywhere, so are the model's outputs."""

    relative = True

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        return torch.full((q_pos.shape[-1], k_pos.shape[-1]), float("nan"))
