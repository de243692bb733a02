"""The one causal self-attention op every scheme goes through.

Fast path (``causal_attention``): ``scaled_dot_product_attention`` with ``is_causal=True``
when the scheme adds no logit term. Otherwise (``biased_attention``) the scheme's term and the
causal ``-inf`` go into one 4-D float mask (a 3-D mask sends CPU SDPA to its slow math path,
and ``attn_mask`` with ``is_causal`` raises on some backends), by query chunks for long
windows; or, where ``model.attention`` picks FlexAttention (``use_flex``), the term goes in
as a ``score_mod`` and no mask is built (``flex_attention``). A scheme that rewrites the
logits or their normalisation (``modify_logits``, ``attention_weights``) attends through
``explicit_attention``. A scheme that hides keys the causal rule allows (``attention_mask``:
chunked or sliding-window attention) puts ``-inf`` on them in its float mask
(``masked_logit_bias``) or its explicit path (``allowed_keys``), never through the fused
causal kernel or FlexAttention. ``reference_attention`` writes the math out; tests hold the
paths equal.

Shapes: q ``[b, n_h, s_q, h_d]``, k and v ``[b, n_h, s_k, h_d]``; the queries are the last s_q
of the s_k positions, so query i may see keys j <= s_k - s_q + i.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from pe_bench.errors import UserError
from pe_bench.positions.base import PositionScheme, ScoreMod


def causal_allowed(s_q: int, s_k: int, device: torch.device) -> Tensor:
    """``[s_q, s_k]`` bool, True where the query may attend the key."""
    q_idx = torch.arange(s_k - s_q, s_k, device=device).unsqueeze(-1)
    return torch.arange(s_k, device=device) <= q_idx


def masked_bias(bias: Tensor | None, q: Tensor, s_k: int) -> Tensor:
    """The scheme's logit term with ``-inf`` on future keys, as a 4-D mask in q's dtype."""
    s_q = q.shape[-2]
    allowed = causal_allowed(s_q, s_k, q.device)
    if bias is None:
        bias = torch.zeros(s_q, s_k, device=q.device, dtype=q.dtype)
    bias = bias.to(q.dtype).masked_fill(~allowed, float("-inf"))
    while bias.dim() < 4:
        bias = bias.unsqueeze(0)  # [n_h, s_q, s_k] -> [1, n_h, s_q, s_k]
    return bias


def allowed_keys(pe: PositionScheme, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
    """``[s_q, s_k]`` bool, True where the query may attend the key: the causal rule and the
    scheme's ``attention_mask``, if it has one for this layer."""
    allowed = causal_allowed(q_pos.shape[-1], k_pos.shape[-1], q_pos.device)
    keep = pe.attention_mask(q_pos, k_pos, layer)
    return allowed if keep is None else allowed & keep


def masked_logit_bias(
    pe: PositionScheme, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
) -> Tensor | None:
    """The scheme's ``logit_bias`` as the float-mask path adds it: -inf on the keys its
    ``attention_mask`` hides (None: neither a bias nor a mask in this layer)."""
    bias = pe.logit_bias(q, k, q_pos, k_pos, layer=layer)
    keep = pe.attention_mask(q_pos, k_pos, layer)
    if keep is None:
        return bias
    if bias is None:
        bias = torch.zeros(keep.shape, device=q.device, dtype=torch.float32)
    return bias.masked_fill(~keep, float("-inf"))


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(h_d) + causal mask) v, on the fastest SDPA path."""
    if q.shape[-2] == k.shape[-2]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=masked_bias(None, q, k.shape[-2]))


# Largest mask one query chunk may build, in elements (128 MiB in fp32): an 8192-token window
# then takes 8 chunks of 1024 queries instead of one 1 GiB mask per head group.
MASK_BUDGET = 2**25

# Largest set of chunk masks kept for reuse by later layers (512 MiB in fp32): above it every
# layer rebuilds its chunks, so that long windows stay within the per-chunk budget.
SHARED_MASK_BUDGET = 2**27

BiasFn = Callable[[Tensor, Tensor, Tensor, Tensor], "Tensor | None"]

ATTENTION = ("auto", "sdpa", "flex")  # the values of model.attention


def use_flex(mode: str, num_heads: int, seq_len: int, grad: bool) -> bool:
    """Whether a pass over ``seq_len`` tokens of a scheme with a logit term attends through
    FlexAttention, under ``model.attention=mode`` (one of ``ATTENTION``); ``grad``: whether
    gradients are on.

    ``flex`` always, ``sdpa`` never; ``auto`` for evaluation windows whose masks are too large
    to share across layers (n_h s^2 > ``SHARED_MASK_BUDGET``: from 5793 tokens at 4 heads),
    where it was measured faster on CPU (eval tokens/s at 8192, d_model 128: ALiBi 2318 vs
    1519, T5 2471 vs 805), and not below (at 4096: 4354 vs 7739, 3830 vs 7169), nor while
    training.
    """
    if mode == "flex":
        return True
    if mode == "sdpa":
        return False
    return not grad and num_heads * seq_len**2 > SHARED_MASK_BUDGET


def biased_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pos: Tensor,
    bias_fn: BiasFn,
    cache: dict[tuple[int, int], Tensor] | None = None,
) -> Tensor:
    """Causal attention with a scheme's logit term, computed by query chunks.

    ``bias_fn(q_chunk, k_prefix, q_pos, k_pos)`` returns the term for one chunk of queries
    against the keys up to the chunk's end (the queries are the last keys, as the scheme hooks
    expect). Chunks are sized so that a ``[b, n_h, chunk, s_k]`` mask stays within
    ``MASK_BUDGET`` elements; training lengths fit in one chunk. With ``cache`` (a dict that
    lives for one forward pass), each chunk's masked bias is built once and reused by every
    layer: for schemes whose term depends on neither content nor layer (``shared_bias``), and
    only while all chunks together fit in ``SHARED_MASK_BUDGET`` elements.
    """
    b, h, s, _ = q.shape
    chunk = max(1, MASK_BUDGET // (b * h * s))
    if cache is not None and h * s * s > SHARED_MASK_BUDGET:
        cache = None
    dtype, outputs = q.dtype, []
    for start in range(0, s, chunk):
        end = min(s, start + chunk)
        q_chunk, k_prefix, v_prefix = q[:, :, start:end], k[:, :, :end], v[:, :, :end]
        mask = None if cache is None else cache.get((start, end))
        if mask is None:
            bias = bias_fn(q_chunk, k_prefix, pos[start:end], pos[:end])
            mask = masked_bias(bias, q_chunk.float(), end)  # [(b|1), n_h, chunk, end], fp32
            if cache is not None:
                cache[(start, end)] = mask
        outputs.append(_fp32_attention(q_chunk, k_prefix, v_prefix, mask).to(dtype))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


def _fp32_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """SDPA with a float32 mask, in float32 whatever autocast says.

    A position term must not lose precision to the compute dtype: SDPA takes its mask in q's
    dtype (and autocast casts both to bf16), and a bf16 ALiBi term -m (i - j) is off by up to
    1 at 1024 tokens. So under bf16 autocast this path attends in float32 (a no-op in fp32
    training and evaluation); the fused causal path of schemes without a term stays in bf16.
    """
    with torch.autocast(q.device.type, enabled=False):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)


@functools.cache
def _flex() -> tuple[Callable, Callable]:
    """(flex_attention, create_block_mask), imported on first use (torch >= 2.5)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as err:
        raise UserError(
            f"model.attention=flex needs FlexAttention (torch >= 2.5); this is torch "
            f"{torch.__version__}: use model.attention=sdpa"
        ) from err
    return flex_attention, create_block_mask


@functools.cache
def _compiled_flex() -> Callable:
    """FlexAttention compiled once per process (eager FlexAttention is a slow reference)."""
    return torch.compile(_flex()[0], dynamic=False)


@functools.lru_cache(maxsize=16)
def causal_block_mask(s_q: int, s_k: int, device: torch.device):
    """FlexAttention's block-sparse causal mask (queries = the last s_q keys), per shape."""
    offset = s_k - s_q

    def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx <= q_idx + offset

    return _flex()[1](causal, None, None, s_q, s_k, device=device)


def flex_attention(
    q: Tensor, k: Tensor, v: Tensor, score_mod: ScoreMod, compiled: bool = True
) -> Tensor:
    """Causal attention with a scheme's ``score_mod`` through FlexAttention: the term is
    computed inside the kernel, block by block, so memory stays linear in the length.
    ``compiled=False`` runs it eagerly (slow; tests compare it on small shapes)."""
    run = _compiled_flex() if compiled else _flex()[0]
    mask = causal_block_mask(q.shape[-2], k.shape[-2], q.device)
    return run(q, k, v, score_mod=score_mod, block_mask=mask)


def reference_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """The same computation written out in float32, for tests."""
    logits = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    logits = logits + masked_bias(None if bias is None else bias.float(), q.float(), k.shape[-2])
    return (logits.softmax(dim=-1) @ v.float()).type_as(q)


def scheme_logits(
    pe: PositionScheme, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
) -> Tensor:
    """The logits before the causal mask, ``[b, n_h, s_q, s_k]`` in float32, of queries and
    keys already through ``transform_qk``: scaled q . k, the scheme's bias, ``modify_logits``."""
    logits = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    bias = pe.logit_bias(q, k, q_pos, k_pos, layer)
    return pe.modify_logits(
        logits, None if bias is None else bias.float(), q, k, q_pos, k_pos, layer
    )


def attention_logits(
    pe: PositionScheme, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int = 0
) -> Tensor:
    """The logits a scheme produces from raw q and k before the causal mask:
    ``[b, n_h, s_q, s_k]``.

    What the invariance tests compare: for a relative scheme they must not change when every
    position shifts by the same constant, nor when the window grows in front.
    """
    q, k = pe.transform_qk(q, k, q_pos, k_pos, layer)
    return scheme_logits(pe, q, k, q_pos, k_pos, layer)


def explicit_attention(
    q: Tensor, k: Tensor, v: Tensor, pos: Tensor, pe: PositionScheme, layer: int
) -> Tensor:
    """Attention written out, for schemes with ``modify_logits`` or ``attention_weights``:
    their logits, their weights, times v, in float32 (as ``_fp32_attention``), by query chunks
    of at most ``MASK_BUDGET`` logits. q and k are already through ``transform_qk``."""
    b, h, s, _ = q.shape
    chunk = max(1, MASK_BUDGET // (b * h * s))
    outputs = []
    with torch.autocast(q.device.type, enabled=False):
        for start in range(0, s, chunk):
            end = min(s, start + chunk)
            logits = scheme_logits(
                pe, q[:, :, start:end], k[:, :, :end], pos[start:end], pos[:end], layer
            )
            allowed = allowed_keys(pe, pos[start:end], pos[:end], layer)
            weights = pe.attention_weights(logits, allowed)
            outputs.append((weights @ v[:, :, :end].float()).to(q.dtype))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
