"""The attention weights a layer attends with, recomputed from its own input with the scheme's
hooks, since the fused kernels do not return them: the ``attention`` probe's distance and
entropy (``run.probes``) read them through ``observed_attention``, a forward hook that changes
nothing the model computes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from pe_bench.model.attention import MASK_BUDGET, allowed_keys, scheme_logits
from pe_bench.model.gpt import GPT, CausalSelfAttention, ForwardContext


def layer_qkv(attn: CausalSelfAttention, x: Tensor, ctx: ForwardContext) -> tuple[Tensor, ...]:
    """Queries and keys as layer ``attn`` attends with (after the scheme's ``transform_qk``),
    and its values, ``[b, n_h, s, h_d]``, from the layer's input ``x`` ``[b, s, d]``."""
    b, s, d = x.shape
    q, k, v = attn.qkv(x).split(d, dim=2)
    q, k, v = (t.view(b, s, attn.num_heads, -1).transpose(1, 2) for t in (q, k, v))
    q, k = ctx.pe.transform_qk(q, k, ctx.pos, ctx.pos, attn.layer)
    return q, k, v


def attention_weights(
    attn: CausalSelfAttention,
    q: Tensor,
    k: Tensor,
    ctx: ForwardContext,
    start: int = 0,
    end: int | None = None,
) -> Tensor:
    """Attention weights of queries ``start .. end - 1`` over keys ``0 .. end - 1``, ``[b, n_h,
    end - start, end]``, in float32, as the model attends for that query chunk: the scheme's
    logits (``scheme_logits``: q.k / sqrt(h_d), its bias, ``modify_logits``), then its
    ``attention_weights`` (the masked softmax, or a scheme's own, e.g. stick-breaking)."""
    end = q.shape[-2] if end is None else end
    q_chunk, k_prefix = q[:, :, start:end], k[:, :, :end]
    pos = ctx.pos
    logits = scheme_logits(ctx.pe, q_chunk, k_prefix, pos[start:end], pos[:end], attn.layer)
    return ctx.pe.attention_weights(
        logits, allowed_keys(ctx.pe, pos[start:end], pos[:end], attn.layer)
    )


def own_attention_weights(
    attn: CausalSelfAttention, x: Tensor, q: Tensor, k: Tensor, ctx: ForwardContext
) -> Tensor:
    """The weights ``[b, n_h, s, s]`` of a scheme that attends itself (``attend``, e.g.
    CABLE, PaTH), in float32: its output for the values e_1 .. e_s (the identity), which is
    the weights wherever the output is a weighted sum of the values, as attention's is."""
    b, h, s, _ = q.shape
    eye = torch.eye(s, device=q.device, dtype=q.dtype).expand(b, h, s, s)
    return ctx.pe.attend(x, q, k, eye, ctx.pos, attn.layer).float()


@dataclass
class AttentionSums:
    """Per layer: summed mean distance and entropy over every (batch, head, query) seen."""

    distance: list[float]
    entropy: list[float]
    queries: list[int]

    def add(self, layer: int, weights: Tensor, start: int) -> None:
        """Add the queries ``start ..`` of ``weights`` ``[b, n_h, chunk, s_k]``."""
        i = torch.arange(start, start + weights.shape[-2], device=weights.device).float()
        j = torch.arange(weights.shape[-1], device=weights.device).float()
        distance = i.unsqueeze(-1) - weights @ j.unsqueeze(-1)  # sum_j a_ij (i - j): sum a = 1
        self.distance[layer] += float(distance.double().sum())
        self.entropy[layer] += float(torch.special.entr(weights).sum(-1).double().sum())
        self.queries[layer] += weights[..., 0].numel()


@contextlib.contextmanager
def observed_attention(model: GPT) -> Iterator[AttentionSums]:
    """Within the block, every attention layer's forward also adds its weights' distance and
    entropy to the sums yielded (a forward hook replays the layer's q and k by query chunks
    of at most ``MASK_BUDGET`` weights; nothing changes in what the model computes)."""
    layers = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    n = len(layers)
    sums = AttentionSums([0.0] * n, [0.0] * n, [0] * n)

    def observe(attn: CausalSelfAttention, args: tuple, output: Tensor) -> None:
        x, ctx = args
        q, k, _ = layer_qkv(attn, x, ctx)
        if ctx.pe.has_own_attention:  # weights only the scheme's own attention can give
            sums.add(attn.layer, own_attention_weights(attn, x, q, k, ctx), 0)
            return
        b, h, s, _ = q.shape
        chunk = max(1, MASK_BUDGET // (b * h * s))
        for start in range(0, s, chunk):
            end = min(s, start + chunk)
            sums.add(attn.layer, attention_weights(attn, q, k, ctx, start, end), start)

    handles = [layer.register_forward_hook(observe) for layer in layers]
    try:
        yield sums
    finally:
        for handle in handles:
            handle.remove()
