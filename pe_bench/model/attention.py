"""The one causal self-attention op every scheme goes through.

Fast path (``causal_attention``): ``scaled_dot_product_attention`` with ``is_causal=True``
when the scheme adds no logit term. Otherwise (``biased_attention``) the scheme's term and the
causal ``-inf`` go into one 4-D float mask (a 3-D mask sends CPU SDPA to its slow math path,
and ``attn_mask`` with ``is_causal`` raises on some backends), by query chunks for long
windows; or, where ``model.attention`` picks FlexAttention (``use_flex``), the term goes in
as a ``score_mod`` and no mask is built (``flex_attention``). Two terms need less: one of the
key alone (``key_bias``, FoX) rides on one more dimension of q and k into fused causal SDPA
(``key_biased_attention``), and a content-free relative one has its chunks' masks copied from
a table by distance (``distance_attention``). A scheme that rewrites the logits or their
normalisation (``modify_logits``, ``attention_weights``) attends through
``explicit_attention`` (a ``WindowedRoPE`` by blocks: ``windowed_attention``, no L x L
matrix). A scheme that hides keys the causal rule allows (``attention_mask``:
chunked or sliding-window attention) puts ``-inf`` on them in its float mask
(``masked_logit_bias``) or its explicit path (``allowed_keys``), never through a fused
kernel, a mask copied by distance or FlexAttention. ``reference_attention`` writes the math
out; tests hold the paths equal. On the CPU a chunk is sized to stay in cache
(``query_chunk``). ``attend`` picks the path (``attention_path``) for the benchmark's model and
for ``pe_bench.api`` alike.

One module: every path beside the dispatch that picks it (``attention_path``, ``_on_path``),
which the tests spy on here by each path's function name.

Shapes: q ``[b, n_h, s_q, h_d]``, k and v ``[b, n_h, s_k, h_d]``; the queries are the last s_q
of the s_k positions, so query i may see keys j <= s_k - s_q + i.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from pe_bench.errors import UserError
from pe_bench.positions.base import PositionScheme, ScoreMod
from pe_bench.positions.windowed import blockwise, planned_for, windowed_attention


def attention_path(pe: PositionScheme) -> str:
    """The path ``attend`` takes for ``pe``, decided by the scheme's hooks alone, the most
    fused first (FlexAttention, where ``model.attention`` turns it on, replaces the
    ``distance`` and ``mask`` paths of a scheme with a ``score_mod`` and no
    ``attention_mask``): ``scheme`` (the scheme's own ``attend``, from the layer's input),
    ``windowed``, ``explicit``, ``mask``, ``key_bias``, ``causal``, ``distance``."""
    if pe.has_own_attention:  # the scheme attends itself, reading the layer's input
        return "scheme"
    if blockwise(type(pe)):  # a WindowedRoPE's logits, computed by blocks and branches
        return "windowed"
    if pe.has_logits_hook:  # the scheme rewrites logits or weights: written out
        return "explicit"
    if pe.has_attention_mask:  # keys hidden by -inf in float masks, whatever else it has
        return "mask"
    if pe.has_key_bias:  # a term of the key alone: fused SDPA, no mask
        return "key_bias"
    if not pe.has_score_bias:  # fused causal SDPA
        return "causal"
    return "distance" if pe.tabulated_by_distance else "mask"


def causal_allowed(s_q: int, s_k: int, device: torch.device) -> Tensor:
    """``[s_q, s_k]`` bool, True where the query may attend the key."""
    q_idx = torch.arange(s_k - s_q, s_k, device=device).unsqueeze(-1)
    return torch.arange(s_k, device=device) <= q_idx


def masked_bias(bias: Tensor | None, q: Tensor, s_k: int) -> Tensor:
    """The scheme's logit term with ``-inf`` on future keys, as a 4-D mask in q's dtype.

    Future keys of the last s_q queries lie in the last s_q columns only, so the term is
    copied once and only that ``[s_q, s_q]`` corner is masked in place (a ``masked_fill``
    with the ``[s_q, s_k]`` mask broadcast over batch and heads ran 5x slower on CPU: 2.8 vs
    0.55 ns per element, ``[8, 4, 64, 1024]``, 1 thread). The values are ``masked_fill``'s.
    """
    s_q = q.shape[-2]
    if bias is None:
        bias = torch.zeros(s_q, s_k, device=q.device, dtype=q.dtype)
    while bias.dim() < 4:
        bias = bias.unsqueeze(0)  # [n_h, s_q, s_k] -> [1, n_h, s_q, s_k]
    mask = bias.to(q.dtype, copy=True, memory_format=torch.contiguous_format)
    corner = min(s_q, s_k)
    future = ~causal_allowed(s_q, s_k, q.device)[:, s_k - corner :]
    mask[..., s_k - corner :].masked_fill_(future, float("-inf"))
    return mask


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


def widened(v: Tensor, width: int) -> Tensor:
    """``v`` with zero columns up to ``width``, the width of q and k where a scheme widens them
    (PoPE's real and imaginary parts): CPU SDPA has fused kernels for one width only, and
    with v narrower it ran 9x slower (1 thread, b 8, 4 heads, 1024 tokens, q and k 64 wide:
    1.08 s against 0.18 s with v padded to 64, 0.12 s for rope's 32). The caller keeps the
    output's first ``v`` columns."""
    return v if v.shape[-1] == width else F.pad(v, (0, width - v.shape[-1]))


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(h_d) + causal mask) v, on the fastest SDPA path."""
    if q.shape[-2] == k.shape[-2]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=masked_bias(None, q, k.shape[-2]))


# Largest mask one query chunk may build, in elements (128 MiB in fp32): an 8192-token window
# then takes 8 chunks of 1024 queries instead of one 1 GiB mask per head group.
MASK_BUDGET = 2**25

# On the CPU a chunk's mask (or logits) is at most this many elements (8 MiB in fp32), so that
# the element-wise passes over it run from cache and its buffers are reused by the allocator
# rather than faulted in afresh: see ``query_chunk``.
CACHE_BUDGET = 2**21

# Largest set of chunk masks kept for reuse by later layers (512 MiB in fp32): above it every
# layer rebuilds its chunks, so that long windows stay within the per-chunk budget.
SHARED_MASK_BUDGET = 2**27


def query_chunk(b: int, h: int, s: int, device: torch.device) -> int:
    """Queries per chunk of a window of ``s`` keys: a ``[b, n_h, chunk, s]`` block within
    ``MASK_BUDGET`` elements, and on the CPU within ``CACHE_BUDGET``.

    Measured on 2 CPU cores (1 thread, b 8, 4 heads, 1024 tokens, per layer): stick-breaking's
    weights 3.4 s in one chunk of 1024 queries, 0.78 s in chunks of 64; CoPE's bias and
    attention 7.0 s against 1.06 s; copying a chunk's mask 112 ms against 11 ms. On a GPU,
    fewer and larger chunks keep kernel launches few.
    """
    budget = min(MASK_BUDGET, CACHE_BUDGET) if device.type == "cpu" else MASK_BUDGET
    return max(1, budget // (b * h * s))


BiasFn = Callable[[Tensor, Tensor, Tensor, Tensor], "Tensor | None"]

ATTENTION = ("auto", "sdpa", "flex")  # the values of model.attention


def use_flex(mode: str, num_heads: int, seq_len: int, grad: bool, device: str = "cpu") -> bool:
    """Whether a pass over ``seq_len`` tokens of a scheme with a logit term attends through
    FlexAttention, under ``model.attention=mode`` (one of ``ATTENTION``); ``grad``: whether
    gradients are on; ``device``: the device type.

    ``flex`` always, ``sdpa`` never; ``auto`` on a GPU for evaluation windows whose masks are
    too large to share across layers (n_h s^2 > ``SHARED_MASK_BUDGET``: from 5793 tokens at 4
    heads), never while training, and never on the CPU: there the masks of cache-sized query
    chunks (``distance_attention``) were measured faster than compiled FlexAttention (1 thread,
    d_model 128, 8192 tokens: ALiBi 5.2 to 6.2 s a pass against 12.8 s, T5 4.4 to 5.2 s against
    10.2 to 10.7 s).
    """
    if mode == "flex":
        return True
    if mode == "sdpa" or device == "cpu":
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
    expect). Chunks are sized by ``query_chunk``; training lengths fit in one chunk. With
    ``cache`` (a dict that lives for one forward pass), each chunk's masked bias is built once
    and reused by every layer: for schemes whose term depends on neither content nor layer
    (``shared_bias``), and only while all chunks together fit in ``SHARED_MASK_BUDGET``
    elements.
    """
    b, h, s, _ = q.shape
    chunk = query_chunk(b, h, s, q.device)
    if cache is not None and h * s * s > SHARED_MASK_BUDGET:
        cache = None
    dtype, outputs = q.dtype, []
    for start in reversed(range(0, s, chunk)):  # the longest prefix first (see TransformerXL)
        end = min(s, start + chunk)
        q_chunk, k_prefix, v_prefix = q[:, :, start:end], k[:, :, :end], v[:, :, :end]
        mask = None if cache is None else cache.get((start, end))
        if mask is None:
            bias = bias_fn(q_chunk, k_prefix, pos[start:end], pos[:end])
            mask = masked_bias(bias, q_chunk.float(), end)  # [(b|1), n_h, chunk, end], fp32
            if cache is not None:
                cache[(start, end)] = mask
        outputs.append(_fp32_attention(q_chunk, k_prefix, v_prefix, mask).to(dtype))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs[::-1], dim=2)


def distance_attention(q: Tensor, k: Tensor, v: Tensor, by_distance: Tensor) -> Tensor:
    """Causal attention with a relative bias given by distance (``bias_by_distance``,
    ``[n_h, s]``: entry n at i - j = n), by query chunks, with no term computed per pair: a
    chunk's mask is one strided copy of the table. Its rows are read in reverse (query
    end - 1 first), which makes both strides +1 on the flipped table, and the chunk's queries
    are reversed with them (SDPA does not care about their order). In float32 whatever
    autocast says, as ``_fp32_attention``.

    Measured on 2 CPU cores (1 thread, d_model 128, 4 layers, 8192 tokens, one window; the
    chunks of ``query_chunk``): ALiBi 7.9 s a pass with its bias computed per chunk, T5 10.2
    to 11.5 s (FlexAttention: 12.8 and 10.2 to 10.7 s).
    """
    b, h, s, _ = q.shape
    chunk = query_chunk(b, h, s, q.device)
    dtype, outputs = q.dtype, []
    with torch.autocast(q.device.type, enabled=False):
        # column y holds distance s - 1 - y; the chunk - 1 negative distances (future) hold 0
        table = F.pad(by_distance.float(), (chunk - 1, 0)).flip(-1)  # [n_h, s + chunk - 1]
        q, k, v = q.float(), k.float(), v.float()
        for start in range(0, s, chunk):
            end = min(s, start + chunk)
            c = end - start
            offset = table.storage_offset() + s - start - c
            block = table.as_strided((1, h, c, end), (0, table.stride(0), 1, 1), offset)
            mask = block.clone(memory_format=torch.contiguous_format)  # row r: query end-1-r
            future = ~causal_allowed(c, c, q.device).flip(0)
            mask[..., end - c :].masked_fill_(future, float("-inf"))
            y = F.scaled_dot_product_attention(
                q[:, :, start:end].flip(-2), k[:, :, :end], v[:, :, :end], attn_mask=mask
            )
            outputs.append(y.flip(-2))
    return (outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)).to(dtype)


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


def key_biased_attention(q: Tensor, k: Tensor, v: Tensor, key_bias: Tensor) -> Tensor:
    """Causal attention with a logit term of the key alone (``PositionScheme.key_bias``,
    ``[b|1, n_h|1, s_k]``), with no mask: the term rides on one more dimension of q and k,
    q' = [q / sqrt(h_d), 1] and k' = [k, w], so q' . k' = q . k / sqrt(h_d) + w_j, and fused
    causal SDPA does the rest (v gets a zero column: CPU SDPA ran 7x slower with v narrower
    than q and k). In float32 whatever autocast says, as ``_fp32_attention``: the term may be
    large (FoX's cumulative log gates) and a bf16 one would be off by whole units.

    Measured on 2 CPU cores (1 thread, b 8, 4 heads, 1024 tokens, h_d 32): 0.138 s a layer,
    against 0.126 s for plain causal SDPA and 0.75 s for the same term as a float mask.
    """
    b, h, s_q, d = q.shape
    dtype = q.dtype
    # a GPU's fused kernels want the head dimension a multiple of 8: zeros change no product
    pad = (-(d + 1)) % 8 if q.device.type == "cuda" else 0
    with torch.autocast(q.device.type, enabled=False):
        q = q.float() / math.sqrt(d)
        ones = torch.ones(b, h, s_q, 1, device=q.device, dtype=q.dtype)
        term = key_bias.float().expand(b, h, -1).unsqueeze(-1)  # [b, n_h, s_k, 1]
        q_ext = F.pad(torch.cat([q, ones], dim=-1), (0, pad))
        k_ext = F.pad(torch.cat([k.float(), term], dim=-1), (0, pad))
        v_ext = F.pad(v.float(), (0, 1 + pad))
        if s_q == k.shape[-2]:
            y = F.scaled_dot_product_attention(q_ext, k_ext, v_ext, is_causal=True, scale=1.0)
        else:
            mask = masked_bias(None, q, k.shape[-2])
            y = F.scaled_dot_product_attention(q_ext, k_ext, v_ext, attn_mask=mask, scale=1.0)
    return y[..., : v.shape[-1]].to(dtype)


def key_score_mod(key_bias: Tensor) -> ScoreMod:
    """A ``key_bias`` term (``[b|1, n_h|1, s_k]``) as a FlexAttention ``score_mod``."""
    term = key_bias.float()

    def add_key_term(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        batch = b if term.shape[0] > 1 else 0
        head = h if term.shape[1] > 1 else 0
        return score + term[batch, head, kv_idx]

    return add_key_term


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
    logits = (q.float() @ k.float().transpose(-2, -1)).div_(math.sqrt(q.shape[-1]))
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
    (``query_chunk``). q and k are already through ``transform_qk``."""
    b, h, s, _ = q.shape
    chunk = query_chunk(b, h, s, q.device)
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


# ---- the one dispatch: the model's layers and the public API (pe_bench.api) call it ---------


@dataclass(frozen=True)
class ForwardContext:
    """What every layer needs for one forward pass, built once (``forward_context``)."""

    pe: PositionScheme
    pos: Tensor  # [s]: the position of each index
    flex: bool  # the scheme's logit term goes into FlexAttention (see use_flex)
    bias_cache: dict | None  # masked biases built once and shared by all layers (shared_bias)
    windowed: bool = False  # a windowed RoPE at positions 0..s-1: by blocks (planned_for)


def forward_context(
    pe: PositionScheme, pos: Tensor, mode: str, num_heads: int, grad: bool, own: bool = True
) -> ForwardContext:
    """The context of a forward pass over positions ``pos`` under ``model.attention=mode``
    (``grad``: gradients on; ``own``: ``pos`` is ``pe.positions``'): FlexAttention only for a
    term it can take (no logit hook, no hidden keys; a ``key_bias`` term needs no mask at any
    length, so only when asked for), and one mask for all layers unless a per-layer scale
    multiplies it or a mask hides keys."""
    flex = (
        pe.has_score_bias
        and not (pe.has_logits_hook or pe.has_attention_mask)
        and use_flex(mode, num_heads, pos.shape[-1], grad, pos.device.type)
        and (not pe.has_key_bias or mode == "flex")
    )
    shared = pe.shared_bias and not (pe.scales_bias or pe.has_attention_mask)
    windowed = blockwise(type(pe)) and planned_for(pe, pos, own)
    return ForwardContext(pe, pos, flex, {} if shared else None, windowed)


def attend(
    q: Tensor, k: Tensor, v: Tensor, ctx: ForwardContext, layer: int, x: Tensor | None = None
) -> Tensor:
    """Causal attention of queries and keys already through the scheme's ``transform_qk``,
    ``[b, n_h, s, h_d]``, on the path ``attention_path`` names for ``ctx.pe``; ``x`` is the
    layer's normed input ``[b, s, d]``, which only a scheme's own ``attend`` reads. Where the
    scheme widened q and k (PoPE), v attends widened with zeros (``widened``) and the output
    keeps v's width."""
    width = v.shape[-1]
    return _on_path(q, k, widened(v, q.shape[-1]), ctx, layer, x)[..., :width]


def _on_path(
    q: Tensor, k: Tensor, v: Tensor, ctx: ForwardContext, layer: int, x: Tensor | None
) -> Tensor:
    """``attend`` with v as wide as q and k."""
    pe, pos = ctx.pe, ctx.pos
    path = attention_path(pe)
    if path == "scheme":
        return pe.attend(x, q, k, v, pos, layer)
    if path == "windowed" and ctx.windowed:  # (else positions its runs are not planned for)
        return windowed_attention(pe, q, k, v)
    if path in ("explicit", "windowed"):
        return explicit_attention(q, k, v, pos, pe, layer)
    if path == "key_bias":
        term = pe.key_bias(q, k, pos, pos, layer)
        if ctx.flex:  # model.attention=flex only
            return flex_attention(q, k, v, key_score_mod(term))
        return key_biased_attention(q, k, v, term)
    if path == "causal":
        return causal_attention(q, k, v)
    if pe.has_attention_mask:  # hidden keys' -inf in float masks: no fused kernel
        bias_fn = partial(masked_logit_bias, pe, layer=layer)
        return biased_attention(q, k, v, pos, bias_fn, ctx.bias_cache)
    score_mod = pe.score_mod(pos, pos, layer) if ctx.flex else None
    if score_mod is not None:  # the scheme's term inside FlexAttention
        return flex_attention(q, k, v, score_mod)
    if path == "distance":  # masks copied from the term's table by distance
        return distance_attention(q, k, v, pe.bias_by_distance(pos, layer))
    # the scheme's term in float masks, by query chunks
    bias_fn = partial(pe.logit_bias, layer=layer)
    return biased_attention(q, k, v, pos, bias_fn, ctx.bias_cache)
