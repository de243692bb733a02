"""The position-scheme interface: the hooks the model calls, and what a scheme declares.

This is the public plugin API. A scheme is a subclass of ``PositionScheme`` registered by name
with ``@register("my_pe")``; it overrides only the hooks it needs (the defaults do nothing,
which is NoPE). See ``docs/add_your_encoding.md``.

Notation used for tensor shapes:
    b: batch, n_h: heads, s: sequence length (s_q queries, s_k keys), h_d: head dim, d: d_model.

Positions are 0-based integer tensors. Queries attend to keys at the same or earlier sequence
index; when s_q < s_k the queries are the *last* s_q keys (chunked or cached evaluation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.config import Range
from pe_bench.errors import UserError

# Attention weights at or below this are 0 (``attention_weights``): a query's weights sum to 1,
# so its output moves by at most s_k 1e-30 max|v|, far below float32's rounding. Weights that
# small are subnormal or near it, and on the CPU their product with v takes a slow path (1
# thread, Xeon AVX512, [4, 64, 8192] x [8192, 32]: 122 ms with weights of 3e-38, 11 ms with a
# softmax of ALiBi logits, 2.2 ms with none tiny; the floor costs one pass, 1.3 ms). Far keys'
# weights sit there at long windows: a softmax under a distance penalty, a spent stick.
WEIGHT_FLOOR = 1e-30

# Keys per block where a scheme sums along a row from the query back (stick-breaking's spent
# stick, CoPE's gates) and stops once the sum decides every earlier key (``key_blocks``).
KEY_BLOCK = 512


def key_blocks(s_q: int, s_k: int) -> list[tuple[int, int]]:
    """The (start, end) of each block of keys of the last s_q queries, the last block first:
    the first holds the queries' own s_q keys and up to ``KEY_BLOCK`` before them."""
    first = max(0, s_k - s_q - KEY_BLOCK)
    return [(first, s_k)] + [(max(0, e - KEY_BLOCK), e) for e in range(first, 0, -KEY_BLOCK)]


# FlexAttention's score_mod: (score, batch, head, q_idx, kv_idx) -> score, on index tensors.
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class ModelDims:
    """What a scheme may need to know about the model that hosts it."""

    d_model: int
    num_heads: int
    head_dim: int
    num_layers: int
    train_len: int  # the sequence length the model is trained at


class PositionScheme(nn.Module):
    """Base class of every position scheme.

    The model calls four hooks (their signatures are fixed):

    - ``positions(seq_len, device)``: the position of each index, ``[s]`` (randomized schemes
      resample them while ``self.training``);
    - ``read_tokens(idx)``: the token ids ``[b, s]`` of the pass, before ``embed``, and None
      after it: a scheme whose positions depend on the tokens (BiPE's segments) keeps what its
      other hooks need from them for that pass (without tokens, as in a direct call of a
      hook, it must act as on text without them);
    - ``embed(x, pos)``: add to the token embeddings (sinusoidal, learned);
    - ``transform_qk(q, k, q_pos, k_pos, layer)``: transform queries and keys. The default
      composes two finer hooks a scheme overrides instead:

      - ``rotate(q, k, q_pos, k_pos, layer)``: rotate or rescale q and k (RoPE, xPos);
      - ``logit_scale(q_pos, k_pos, layer)``: a factor per query, ``[s_q]``, or per head and
        query, ``[n_h, s_q]``, multiplied into q, so it scales q . k (and any
        content-dependent term built from q) (log-n scaling, YaRN's attention factor, SSMax's
        learned s ln n). It scales a content-free bias too only where the scheme declares
        ``scales_bias = True``;

    - ``score_bias(q, k, q_pos, k_pos, layer)``: a term added to the attention logits *after*
      the 1/sqrt(h_d) scaling of q . k (as SDPA's ``attn_mask``), before the causal mask.
      Content-free (``content_bias = False``: ALiBi, T5, KERPLE, FIRE; shape ``[n_h, s_q,
      s_k]``; a fast path may cache it or turn it into a FlexAttention ``score_mod``) or
      content-dependent (``content_bias = True``: Transformer-XL, Shaw, CoPE; shape
      ``[b, n_h, s_q, s_k]``). Entries for future keys are ignored (masked afterwards).

    Two more hooks replace the fused attention with an explicit one (float32, by query
    chunks), so only the schemes that override them pay for it:

    - ``modify_logits(logits, bias, q, k, q_pos, k_pos, layer)``: gets the scaled pre-mask
      logits q . k / sqrt(h_d) ``[b, n_h, s_q, s_k]`` (of q and k after ``transform_qk``), the
      scheme's own bias as the logits would receive it (or None) and q and k themselves, and
      returns the logits the causal mask and normalisation see (DAPE's MLP over heads; ReRoPE
      and Self-Extend, which mix logits of two rotations). The default adds the bias;
    - ``attention_weights(logits, allowed)``: turns those logits and the causal mask
      ``allowed`` ``[s_q, s_k]`` into attention weights (softmax by default; stick-breaking
      attention replaces it). Weights on masked keys must be 0.

    One more restricts which keys a query sees, besides the causal rule:

    - ``attention_mask(q_pos, k_pos, layer)``: ``[s_q, s_k]`` bool, True where the query may
      attend the key, or None (every earlier key): chunked or sliding-window attention (the
      RoPE layers of Llama 4's iRoPE). It must keep each query's own key (a row with no key
      has no softmax). Overriding it moves the scheme off the fused causal kernel and off
      FlexAttention, to the float-mask path (or the explicit one, with the hooks above).

    One more replaces the attention itself, for a scheme whose attention reads the layer's
    input and is no logit term (PaTH's Householder transforms of the keys):

    - ``attend(x, q, k, v, pos, layer)``: the attention output ``[b, n_h, s, h_d]`` from the
      layer's normed input ``x`` ``[b, s, d]`` and its queries, keys and values (q and k after
      ``transform_qk``). Overriding it sends the scheme down its own path (``has_own_attention``):
      the model calls none of the hooks above for the logits, and every other scheme keeps its
      fused path.

    And one step runs before evaluation rather than in the forward pass:

    - ``calibrate(held_out, seq_len)``: fit what the scheme sets at evaluation for windows of
      ``seq_len`` tokens (a per-head temperature searched on held-out text), from
      ``held_out()``, the model's mean next-token loss on ``calibration_tokens`` tokens of the
      validation split (never the test split) in windows of ``seq_len``. The evaluation calls
      it once per evaluation length before scoring, only for schemes that override it
      (``has_calibration``).

    A scheme whose ``score_bias`` is a fast path also defines ``score_bias_reference`` with
    the same signature: the formula written out, which the conformance kit
    (``pe_bench.conformance.kit``) holds equal to the fast path on every unmasked entry.

    Two optional forms of ``score_bias`` move it to a faster path (the kit holds each equal to
    ``score_bias``): ``key_bias`` (the bias as a term of the key alone, up to a term of the
    query: fused causal SDPA with no mask, FoX) and ``score_mod`` (FlexAttention); a
    content-free ``relative`` bias gets both a ``score_mod`` and masks copied from a table by
    distance (``bias_by_distance``) by default.

    The attention module picks its path from which hooks a scheme overrides
    (``has_score_bias``), so the model never branches on scheme names.

    Class attributes a scheme declares (capability flags, checked by the conformance kit):
        name: the registry name (set by ``@register``).
        relative: the logits depend on i - j only; checked by shifting every position.
        content_bias: ``score_bias`` reads q or k (see above).
        scales_bias: ``logit_scale`` multiplies the content-free ``score_bias`` as well as
            q . k (SSMax on ALiBi: the whole logit is scaled). Such a bias is then built per
            layer (a per-layer scale cannot share one mask across layers).
        variant_of: for eval-time variants (PI, NTK, YaRN, ...), the trained scheme whose
            checkpoint they are evaluated on.
        shared_bias: ``score_bias`` ignores q, k and layer (ALiBi, T5, KERPLE, ...): the model
            builds the masked bias once per forward pass and shares it across layers.
        calibration_tokens: held-out tokens ``calibrate``'s loss reads at each length.
        eval_draws: how many draws of its positions an evaluation averages, for a scheme
            whose evaluation positions are random (randomized positions); 1 for the others.
            Before each draw the evaluation calls ``seed_eval_positions(draw)``.

    And as a property:
        max_positions: the longest sequence the scheme can serve (None: unbounded); longer
            ones raise a ``UserError`` from ``check_length``, before any training.

    Parameters are created and initialised in ``__init__`` (the model builds the scheme under
    its own seed and never re-initialises it). What does not change is computed there too and
    kept as non-persistent buffers (``register_buffer(..., persistent=False)``): they move
    with the model and stay out of its state_dict.

    The hooks run inside the forward pass, on the model's device and possibly under
    ``torch.compile``: they never read a value back to the host (``int(t)``, ``t.item()``).
    Lengths are refused before any training, by ``check_length``, which the run calls for
    every length it will serve.
    """

    name: ClassVar[str] = ""
    relative: ClassVar[bool] = False
    content_bias: ClassVar[bool] = False
    variant_of: ClassVar[str | None] = None
    shared_bias: ClassVar[bool] = False
    scales_bias: ClassVar[bool] = False
    # The allowed values of options where the paper requires them, e.g. {"base": Range(gt=1)};
    # ``build_scheme`` checks them with the options' types before the constructor runs.
    option_ranges: ClassVar[dict[str, Range]] = {}
    eval_draws: int = 1
    calibration_tokens: int = 8192

    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        self.dims = dims

    @property
    def max_positions(self) -> int | None:
        """Longest sequence this scheme can serve; None means unbounded."""
        return None

    def check_length(self, seq_len: int) -> None:
        """Raise a ``UserError`` if this scheme cannot serve ``seq_len`` under its configuration."""
        limit = self.max_positions
        if limit is not None and seq_len > limit:
            raise UserError(
                f"scheme '{self.name}' cannot serve length {seq_len}: it has {limit} positions "
                f"({self.describe_limit()})"
            )

    def describe_limit(self) -> str:
        """How to serve longer sequences; shown in the error of ``check_length``."""
        return "no way to serve longer sequences"

    @property
    def caveat(self) -> str:
        """Where this scheme, as configured, departs from its paper's protocol, in one line
        ("" if nowhere): records carry it and reports print it under the numbers."""
        return ""

    def seed_eval_positions(self, draw: int) -> None:
        """Make the evaluation positions of draw ``draw`` reproducible (``eval_draws`` > 1)."""

    @property
    def has_score_bias(self) -> bool:
        """True when the scheme adds to the logits, which rules out the plain causal SDPA path."""
        return type(self).score_bias is not PositionScheme.score_bias

    @property
    def has_attention_mask(self) -> bool:
        """True when the scheme hides keys the causal rule allows (``attention_mask``), which
        rules out the fused causal path and FlexAttention's."""
        return type(self).attention_mask is not PositionScheme.attention_mask

    @property
    def reads_tokens(self) -> bool:
        """True when the scheme reads the token ids of each pass (``read_tokens``)."""
        return type(self).read_tokens is not PositionScheme.read_tokens

    @property
    def has_own_attention(self) -> bool:
        """True when the scheme computes the attention itself (``attend``), from the layer's
        input: the model then calls ``attend`` in place of every attention path."""
        return type(self).attend is not PositionScheme.attend

    @property
    def has_calibration(self) -> bool:
        """True when the scheme fits something on held-out text before evaluation
        (``calibrate``)."""
        return type(self).calibrate is not PositionScheme.calibrate

    @property
    def has_key_bias(self) -> bool:
        """True when the model attends through ``key_bias`` (fused SDPA, no mask)."""
        return (
            type(self).key_bias is not PositionScheme.key_bias
            and not self.has_logits_hook
            and not (self.scales_bias and not self.content_bias)
        )

    @property
    def has_logits_hook(self) -> bool:
        """True when the scheme rewrites the logits or their normalisation, which rules out
        every fused path: the model then attends through ``attention.explicit_attention``."""
        cls = type(self)
        return (
            cls.modify_logits is not PositionScheme.modify_logits
            or cls.attention_weights is not PositionScheme.attention_weights
        )

    def logit_bias(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor | None:
        """``score_bias`` as the logits receive it: times ``logit_scale`` where the scheme
        declares ``scales_bias`` (a content-dependent bias built from the scaled q already
        carries the scale)."""
        bias = self.score_bias(q, k, q_pos, k_pos, layer)
        if bias is None or not self.scales_bias or self.content_bias:
            return bias
        scale = self.logit_scale(q_pos, k_pos, layer)
        return bias if scale is None else bias * scale.to(bias.dtype).unsqueeze(-1)

    # ---- hooks the model calls -----------------------------------------------------------

    def positions(self, seq_len: int, device: torch.device) -> Tensor:
        """Positions of a sequence of ``seq_len`` tokens: ``[s]``."""
        return torch.arange(seq_len, device=device)

    def read_tokens(self, idx: Tensor | None) -> None:
        """The token ids ``[b, s]`` of the forward pass about to run (None once it has run):
        keep on the scheme what ``embed`` and the attention hooks of this pass need from them
        (computed on their device, never read back to the host). The hooks see the same batch
        and window, the queries as the last keys; called directly, without tokens, they act
        as on text without any. Default: the tokens are not read."""

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        """Token embeddings ``x: [b, s, d]`` -> ``[b, s, d]``."""
        return x

    def transform_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        """Queries ``[b, n_h, s_q, h_d]`` and keys ``[b, n_h, s_k, h_d]``, transformed:
        ``rotate``, then the queries multiplied by ``logit_scale``."""
        q, k = self.rotate(q, k, q_pos, k_pos, layer)
        scale = self.logit_scale(q_pos, k_pos, layer)
        if scale is not None:
            q = q * scale.to(q.dtype).unsqueeze(-1)  # [(n_h,) s_q, 1]: row i of q . k times scale_i
        return q, k

    def score_bias(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor | None:
        """Additive logit term broadcastable to ``[b, n_h, s_q, s_k]`` (after 1/sqrt(h_d))."""
        return None

    def key_bias(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor | None:
        """``score_bias`` as a term of the key alone, ``[b|1, n_h|1, s_k]``, where the bias is
        one up to a term of the query, which the softmax cancels (FoX's D_ij = c_i - c_j gives
        -c_j); None: no such form. With it the model attends by fused causal SDPA, the term as
        one more dimension of q and k (``attention.key_biased_attention``), and builds no mask;
        schemes that rewrite the logits or weights (``has_logits_hook``) or scale the bias
        (``scales_bias``) keep their own paths. The conformance kit holds ``logit_bias`` minus
        this term constant along every query's row."""
        return None

    @property
    def tabulated_by_distance(self) -> bool:
        """True when the logit term is a content-free function of the distance i - j alone,
        so that ``bias_by_distance`` tabulates it (not content-dependent, not scaled,
        ``relative``)."""
        return (
            self.has_score_bias and self.relative and not self.content_bias and not self.scales_bias
        )

    def bias_by_distance(self, k_pos: Tensor, layer: int) -> Tensor | None:
        """A content-free relative bias tabulated by distance, ``[n_h, s_k]`` in float32
        (entry n: the term at i - j = n, n = 0 .. s_k - 1), from one row of ``score_bias``;
        None where the bias is not a function of the distance alone (content-dependent,
        scaled, not ``relative``, or no bias). The positions are taken to be consecutive (as
        ``positions`` gives them), so the table is sized from shapes, without reading a position
        back to the host. The model builds each query chunk's mask from it with one strided
        copy (``attention.distance_attention``), and ``score_mod`` reads it."""
        if not self.tabulated_by_distance:
            return None
        keys = torch.arange(k_pos.shape[-1], device=k_pos.device)  # distances s_k - 1 .. 0
        row = self.score_bias(None, None, keys[-1:], keys, layer)  # [n_h, 1, s_k]
        row = row[0] if row.dim() == 4 else row  # [1, n_h, 1, s] -> [n_h, 1, s]
        row = row.expand(self.dims.num_heads, 1, -1)  # also [1, s] or [1, 1, s]: one for all
        return row[:, 0].flip(-1).float()  # [n_h, s_k]: entry n at distance n

    def score_mod(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> ScoreMod | None:
        """``score_bias`` as a FlexAttention ``score_mod``, ``(score, b, h, q_idx, kv_idx) ->
        score + bias``, so that no ``[s_q, s_k]`` mask is ever built; None: no such form.

        The default covers every content-free relative bias (ALiBi, T5, KERPLE, Sandwich): the
        term is a function of the distance i - j alone, tabulated by ``bias_by_distance``.
        Other content-free schemes may override it (the conformance kit holds it equal to
        ``score_bias``).
        """
        by_distance = self.bias_by_distance(k_pos, layer)
        if by_distance is None:
            return None
        longest = by_distance.shape[-1] - 1

        def add_bias(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            # future keys (negative distances) are masked anyway
            distance = (q_pos[q_idx] - k_pos[kv_idx]).clamp(0, longest)
            return score + by_distance[h, distance]

        return add_bias

    def modify_logits(
        self,
        logits: Tensor,
        bias: Tensor | None,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        layer: int,
    ) -> Tensor:
        """The logits before the causal mask ``[b, n_h, s_q, s_k]``, from the scaled q . k
        ``logits`` and the scheme's ``bias`` (None: no bias). Overriding it (or
        ``attention_weights``) moves the scheme to the explicit attention path."""
        return logits if bias is None else logits + bias

    def attention_weights(self, logits: Tensor, allowed: Tensor) -> Tensor:
        """Attention weights ``[b, n_h, s_q, s_k]`` from the logits and the causal mask
        ``allowed`` ``[s_q, s_k]`` (True where the query may attend): the softmax over the
        allowed keys, those at most ``WEIGHT_FLOOR`` set to 0 (see there)."""
        weights = logits.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        return F.threshold(weights, WEIGHT_FLOOR, 0.0, inplace=not weights.requires_grad)

    def attention_mask(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor | None:
        """Which keys each query may attend besides the causal rule: ``[s_q, s_k]`` bool
        (True: may attend; each query's own key must stay), or None for every earlier key."""
        return None

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, layer: int) -> Tensor:
        """The attention output ``[b, n_h, s, h_d]`` of one layer, computed by the scheme from
        the layer's normed input ``x`` ``[b, s, d]`` (what q, k and v were projected from) and
        q, k (after ``transform_qk``), v ``[b, n_h, s, h_d]`` at positions ``pos`` ``[s]``.
        Query i may attend keys j <= i only. Override it only where the attention is no logit
        term of q and k (PaTH reads x to transform the keys between every pair of tokens):
        the model then calls it in place of every fused path (``has_own_attention``)."""
        raise NotImplementedError(f"scheme {self.name!r} does not compute its own attention")

    def calibrate(self, held_out: Callable[[], Tensor], seq_len: int) -> str:
        """Fit what the scheme sets at evaluation for windows of ``seq_len`` tokens, before
        any is scored, and keep it for them: ``held_out()`` is the model's mean next-token
        loss (nats, a scalar with gradients to the scheme's tensors) on ``calibration_tokens``
        tokens of held-out text, the validation split (never the test split), in windows of
        ``seq_len``, through the scheme as it stands. Fit tensors of the scheme's own, out of
        its state dict: no parameter of the model changes. Returns one line for the records
        (what was fitted). Called in eval mode, once per evaluation length, only for schemes
        that override it (``has_calibration``)."""
        raise NotImplementedError(f"scheme {self.name!r} has nothing to calibrate")

    # ---- finer hooks composed by transform_qk --------------------------------------------

    def rotate(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        """Rotate or rescale queries ``[b, n_h, s_q, h_d]`` and keys ``[b, n_h, s_k, h_d]``.
        Both may come back widened to one other width (PoPE: ``[.., 2 h_d]``): the model pads
        v with zeros to it and keeps the output's first h_d columns; q . k is then divided by
        the square root of that width."""
        return q, k

    def logit_scale(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor | None:
        """A factor on the logits q . k of each query, ``[s_q]``, or of each head and query,
        ``[n_h, s_q]`` (a temperature), or None."""
        return None


_REGISTRY: dict[str, type[PositionScheme]] = {}


def register(name: str):
    """Class decorator: make a scheme buildable from config as ``pe.name: <name>``."""

    def decorate(cls: type[PositionScheme]) -> type[PositionScheme]:
        if not (isinstance(cls, type) and issubclass(cls, PositionScheme)):
            raise TypeError(f"@register({name!r}) needs a PositionScheme subclass, got {cls!r}")
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"scheme name '{name}' is already registered by {_REGISTRY[name]}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def registered() -> dict[str, type[PositionScheme]]:
    """All registered schemes by name."""
    return dict(_REGISTRY)
