"""The conformance checks of what a scheme's logit hooks declare: logits that depend on
distances alone (``relative``), each hook's fast path equal to its definition (logit scale and
hooks, attention mask, content, shared and key biases, ``score_mod``, ``score_bias_reference``).
A check returns a one-line summary, raises ``Failed`` or ``Skipped`` (as ``checks.py``'s)."""

from __future__ import annotations

import torch
from torch import Tensor

from pe_bench.conformance.harness import (
    Failed,
    Setup,
    Skipped,
    allowed_entries,
    max_diff,
    qk,
    scheme_under_test,
    tolerance,
)
from pe_bench.model.attention import attention_logits, causal_allowed
from pe_bench.positions import PositionScheme

SHIFTS = (1, 37, 1000)  # position shifts of the relative check


def declared_by(cls: type, attribute: str) -> type:
    """The class in ``cls``'s MRO whose body sets ``attribute``."""
    return next(c for c in cls.__mro__ if attribute in vars(c))


def check_relative(setup: Setup) -> str:
    scheme, s, pos = scheme_under_test(setup)
    if not scheme.relative:
        raise Skipped("not declared relative")
    owner = declared_by(type(scheme), "relative")
    declared = (
        "declares relative = True"
        if owner is type(scheme)
        else f"inherits relative = True from {owner.__qualname__}"
    )
    q, k = qk(setup, s, s)
    limit = scheme.max_positions
    shifts = [n for n in SHIFTS if limit is None or s + n <= limit]
    moves = [n for n in (1, s // 3) if 0 < n < s]
    for layer in range(setup.dims.num_layers):
        base = allowed_entries(attention_logits(scheme, q, k, pos, pos, layer), s, s)
        for shift in shifts:
            moved = attention_logits(scheme, q, k, pos + shift, pos + shift, layer)
            moved = allowed_entries(moved, s, s)
            if max_diff(base, moved) > tolerance(base, 2e-4):
                raise Failed(
                    f"{declared}, but its logits change by {max_diff(base, moved):.3g} when "
                    f"every position shifts by {shift} (layer {layer}): they depend on absolute "
                    "positions; set relative = False"
                )
        for move in moves:
            first, later = moved_logits(scheme, setup, q, k, move, layer)
            first, later = (allowed_entries(x, s - move, s - move) for x in (first, later))
            if max_diff(first, later) > tolerance(first, 2e-4):
                raise Failed(
                    f"{declared}, but the logits of the same tokens change by "
                    f"{max_diff(first, later):.3g} when they sit {move} places later in a window "
                    f"of {s} (layer {layer}): they depend on a token's index in the window (e.g. "
                    "SSMax's ln n); set relative = False"
                )
    return (
        f"logits unchanged when every position shifts by {', '.join(map(str, shifts))} and when "
        f"the tokens move {' or '.join(map(str, moves))} places later in the window"
    )


def moved_logits(
    scheme: PositionScheme, setup: Setup, q: Tensor, k: Tensor, move: int, layer: int
) -> tuple[Tensor, Tensor]:
    """Logits of the first ``s - move`` of ``q`` and ``k`` (the first ``s - move`` rows and
    columns), and of the same queries and keys moved ``move`` places later in a window of the
    same length, at consecutive positions from 0."""
    s = q.shape[-2]
    front_q, front_k = qk(setup, move, move, seed=1)
    later_q = torch.cat([front_q, q[..., : s - move, :]], -2)
    later_k = torch.cat([front_k, k[..., : s - move, :]], -2)
    pos = torch.arange(s)
    first = attention_logits(scheme, q, k, pos, pos, layer)[..., : s - move, : s - move]
    later = attention_logits(scheme, later_q, later_k, pos, pos, layer)[..., move:, move:]
    return first, later


def check_logit_hooks(setup: Setup) -> str:
    scheme, s, pos = scheme_under_test(setup)
    cls, d = type(scheme), setup.dims
    scaled = cls.logit_scale is not PositionScheme.logit_scale
    if not (scaled or scheme.has_logits_hook or scheme.scales_bias):
        raise Skipped("no logit_scale, modify_logits or attention_weights")
    done = []
    if scaled:
        for layer in range(d.num_layers):
            scale = scheme.logit_scale(pos, pos, layer)
            if scale is not None and scale.shape not in ((s,), (d.num_heads, s)):
                raise Failed(
                    f"logit_scale gave shape {tuple(scale.shape)} (layer {layer}), expected "
                    f"[s_q] = ({s},) or [n_h, s_q] = ({d.num_heads}, {s})"
                )
            if scale is not None and not torch.isfinite(scale).all():
                raise Failed(f"logit_scale is not finite (layer {layer})")
        done.append("logit_scale has shape [s_q] or [n_h, s_q]")
    if scheme.scales_bias:
        if not (scaled and scheme.has_score_bias and not scheme.content_bias):
            raise Failed(
                "declares scales_bias = True, which needs a logit_scale and a content-free "
                "score_bias to scale"
            )
        done.append("scales_bias has a bias and a scale")
    if cls.attention_weights is not PositionScheme.attention_weights:
        allowed = causal_allowed(s, s, torch.device("cpu"))
        weights = scheme.attention_weights(
            attention_logits(scheme, *qk(setup, s, s), pos, pos), allowed
        )
        if weights.shape != (2, d.num_heads, s, s) or not torch.isfinite(weights).all():
            raise Failed(f"attention_weights gave {tuple(weights.shape)}, or non-finite weights")
        if (weights < 0).any() or (weights.sum(-1) > 1 + 1e-5).any():
            raise Failed("attention_weights gives negative weights or rows summing past 1")
        if weights[..., ~allowed].abs().max() > 0:
            raise Failed("attention_weights puts weight on future keys: it must be 0 there")
        done.append("attention_weights is causal, non-negative and sums to at most 1")
    if cls.modify_logits is not PositionScheme.modify_logits:
        done.append("modify_logits is checked by query_chunks, relative and causality")
    return "; ".join(done)


def check_attention_mask(setup: Setup) -> str:
    scheme, s, pos = scheme_under_test(setup)
    if not scheme.has_attention_mask:
        raise Skipped("no attention_mask")
    s_q, masked = max(1, s // 3), []
    for layer in range(setup.dims.num_layers):
        full = scheme.attention_mask(pos, pos, layer)
        if full is None:
            continue
        if full.shape != (s, s) or full.dtype != torch.bool:
            raise Failed(
                f"attention_mask gave {full.dtype} {tuple(full.shape)} (layer {layer}), expected "
                f"bool [s_q, s_k] = ({s}, {s})"
            )
        if not full.diagonal().all():
            query = int((~full.diagonal()).nonzero()[0])
            raise Failed(
                f"attention_mask hides query {query} from its own key (layer {layer}): every "
                "query must keep itself, or its row has no key to attend"
            )
        chunk = scheme.attention_mask(pos[-s_q:], pos, layer)
        if chunk is None or not torch.equal(chunk, full[-s_q:]):
            raise Failed(
                f"the last {s_q} of {s} queries passed alone get another attention_mask than "
                f"the same rows of the full one (layer {layer}): with s_q < s_k the queries "
                "are the last s_q keys"
            )
        if scheme.relative and not torch.equal(
            scheme.attention_mask(pos + 37, pos + 37, layer), full
        ):
            raise Failed(
                f"declares relative = True, but its attention_mask changes when every "
                f"position shifts by 37 (layer {layer}); set relative = False"
            )
        masked.append(layer)
    if not masked:
        return f"no layer of {setup.dims.num_layers} hides keys at length {s}"
    return (
        f"bool [s_q, s_k] in layers {', '.join(map(str, masked))}, every query keeps its own key, "
        "the same rows for query chunks"
    )


def check_content_bias(setup: Setup) -> str:
    scheme, s, pos = scheme_under_test(setup)
    if not scheme.has_score_bias:
        raise Skipped("no score_bias")
    if scheme.content_bias:
        return "declared content-dependent (content_bias = True): never cached"
    biases = []
    for seed in (0, 1):
        q, k = scheme.transform_qk(*qk(setup, s, s, seed=seed), pos, pos, 0)
        biases.append(scheme.score_bias(q, k, pos, pos, 0))
    a, b = (allowed_entries(x, s, s) for x in biases)
    if max_diff(a, b) > 0:
        raise Failed(
            f"declares content_bias = False but score_bias changes by {max_diff(a, b):.3g} with "
            "the contents of q and k: set content_bias = True"
        )
    if biases[0].dim() == 4 and biases[0].shape[0] != 1:
        raise Failed(
            f"declares content_bias = False but score_bias has a batch dimension "
            f"{tuple(biases[0].shape)}: return [n_h, s_q, s_k], or set content_bias = True"
        )
    return "content-free bias (the same for any q and k): a fast path may cache it"


def check_shared_bias(setup: Setup) -> str:
    scheme, s, pos = scheme_under_test(setup)
    if not scheme.shared_bias:
        raise Skipped("shared_bias = False: a bias per layer")
    if scheme.content_bias or not scheme.has_score_bias:
        raise Failed("declares shared_bias = True, which needs a content-free score_bias")
    q, k = scheme.transform_qk(*qk(setup, s, s), pos, pos, 0)
    first = allowed_entries(scheme.score_bias(q, k, pos, pos, 0), s, s)
    for layer in range(1, setup.dims.num_layers):
        other = allowed_entries(scheme.score_bias(q, k, pos, pos, layer), s, s)
        if max_diff(first, other) > 0:
            raise Failed(
                f"declares shared_bias = True but score_bias differs by "
                f"{max_diff(first, other):.3g} between layers 0 and {layer}: the model would "
                "reuse layer 0's bias in every layer; set shared_bias = False"
            )
    return "the same score_bias in every layer: the model builds it once per forward pass"


def check_score_mod(setup: Setup) -> str:
    scheme, s, pos = scheme_under_test(setup)
    if scheme.score_mod(pos, pos, 0) is None:
        raise Skipped("no score_mod (model.attention=flex uses the bias path)")
    h = torch.arange(setup.dims.num_heads).view(-1, 1, 1)
    q_idx, kv_idx = torch.arange(s).view(1, -1, 1), torch.arange(s).view(1, 1, -1)
    for offset in (0, 37):
        shifted = pos + offset
        q, k = scheme.transform_qk(*qk(setup, s, s), shifted, shifted, 0)
        for layer in range(setup.dims.num_layers):
            mod = scheme.score_mod(shifted, shifted, layer)
            as_mod = mod(torch.zeros(()), torch.zeros((), dtype=torch.long), h, q_idx, kv_idx)
            bias = scheme.logit_bias(q, k, shifted, shifted, layer)
            as_mod, bias = (allowed_entries(x, s, s) for x in (as_mod, bias))
            if max_diff(as_mod, bias) > tolerance(bias, 1e-5):
                default = type(scheme).score_mod is PositionScheme.score_mod
                why = (
                    "; the default score_mod tabulates the bias by distance, right only for a "
                    "truly relative bias (see the relative check)"
                    if default
                    else ""
                )
                raise Failed(
                    f"score_mod and score_bias differ by {max_diff(as_mod, bias):.3g} (layer "
                    f"{layer}, positions from {offset}): model.attention=flex would compute "
                    f"other logits{why}"
                )
    return "score_mod adds score_bias on every unmasked entry (model.attention=flex)"


def check_key_bias(setup: Setup) -> str:
    scheme, s, pos = scheme_under_test(setup)
    if type(scheme).key_bias is PositionScheme.key_bias:
        raise Skipped("no key_bias (the bias goes into a float mask)")
    if not scheme.has_key_bias:
        raise Failed(
            "defines key_bias, which the model ignores for a scheme that rewrites the logits "
            "or weights or declares scales_bias: remove it or those"
        )
    for s_q in (s, max(1, s // 3)):
        q, k = scheme.transform_qk(*qk(setup, s_q, s), pos[-s_q:], pos, 0)
        for layer in range(setup.dims.num_layers):
            bias = scheme.logit_bias(q, k, pos[-s_q:], pos, layer)
            term = scheme.key_bias(q, k, pos[-s_q:], pos, layer)
            if term.dim() != 3 or term.shape[-1] != s:
                raise Failed(f"key_bias gave shape {tuple(term.shape)}, expected [b, n_h, {s}]")
            rest = bias - term.unsqueeze(-2)  # the query's own term, if key_bias is right
            rest = rest - rest[..., :1]  # key 0: every query sees it
            spread = allowed_entries(rest, s_q, s).abs().max().item()
            if spread > tolerance(bias, 1e-5):
                raise Failed(
                    f"score_bias minus key_bias varies by {spread:.3g} along a query's row "
                    f"(layer {layer}, s_q={s_q}): it must be a term of the query alone, which "
                    "the softmax cancels"
                )
    return "logit_bias is key_bias plus a term of the query (the fused path is exact)"


def check_reference(setup: Setup) -> str:
    scheme, s, pos = scheme_under_test(setup)
    if getattr(scheme, "score_bias_reference", None) is None:
        raise Skipped("no score_bias_reference")
    for s_q, offset in ((s, 0), (s, 37), (max(1, s // 3), 0)):
        q, k = qk(setup, s_q, s)
        k_pos = pos + offset
        q_pos = k_pos[-s_q:]
        q, k = scheme.transform_qk(q, k, q_pos, k_pos, 0)
        for layer in range(setup.dims.num_layers):
            fast = scheme.score_bias(q, k, q_pos, k_pos, layer)
            reference = scheme.score_bias_reference(q, k, q_pos, k_pos, layer)
            fast, reference = (allowed_entries(x, s_q, s) for x in (fast, reference))
            if max_diff(fast, reference) > tolerance(reference, 1e-4):
                raise Failed(
                    f"score_bias and score_bias_reference differ by "
                    f"{max_diff(fast, reference):.3g} (layer {layer}, s_q={s_q}, s_k={s}, "
                    f"positions from {offset})"
                )
    return "score_bias equals score_bias_reference (s_q = s_k, s_q < s_k, shifted positions)"
