"""Eval-time variants of a trained RoPE that cap the relative positions a query sees by mixing
the logits of two rotations by distance: ReRoPE, leaky ReRoPE and Self-Extend; and their base,
``WindowedRoPE``, which scores each (query, key) pair with one of a few rotations.

Each leaves q and k unrotated in ``rotate`` and rotates them in ``modify_logits`` (which gets q
and k after ``transform_qk``): once at their own positions, for the keys within the window, and
once at the positions that give the capped relative position, for the others.
"""

from __future__ import annotations

import math
from typing import ClassVar

from torch import Tensor

from pe_bench.config import Range
from pe_bench.errors import UserError
from pe_bench.positions.base import ModelDims, register
from pe_bench.positions.rotary import LogN, RoPE, apply_rotary


def default_window(name: str, dims: ModelDims, window: int | None) -> int:
    """The window w: ``window``, or L_train / 4 (at least 1) when None."""
    window = max(1, dims.train_len // 4) if window is None else window
    if window < 1:
        raise UserError(f"{name}: window must be >= 1, got {window}")
    return window


def rotated_logits(q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, inv_freq: Tensor) -> Tensor:
    """q at (real-valued) positions ``q_pos`` dotted with k at ``k_pos``, over sqrt(h_d):
    RoPE's logits for the relative positions q_pos - k_pos, ``[b, n_h, s_q, s_k]`` in float32."""
    q_rot = apply_rotary(q.float(), q_pos.float().unsqueeze(-1) * inv_freq)
    k_rot = apply_rotary(k.float(), k_pos.float().unsqueeze(-1) * inv_freq)
    return q_rot @ k_rot.transpose(-2, -1) / math.sqrt(q.shape[-1])


class WindowedRoPE(RoPE):
    """A trained rope read at other positions: each (query, key) pair is scored by one of a few
    rotations (branches), each rotating q and k to positions of its own; pairs no branch
    scores are hidden. The base for ReRoPE and Self-Extend (near: RoPE for keys closer than
    the window w; far: ``far_positions`` for the rest) and for the long-context methods of
    ``positions.long_context`` (DCA, StreamingLLM, LM-Infinite, STRING). q and k are rotated in
    ``modify_logits``, not in ``rotate``, which only scales them by ``rotary_factor`` (a
    factor on cos and sin, as HF's ``attention_scaling``). ``positions.windowed`` computes the
    same attention without an L x L matrix (the model's ``windowed`` path), as
    ``pretrained.windowed`` does on an HF model."""

    variant_of = "rope"
    relative = False
    window: int

    def rotate(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        # both rotations happen in modify_logits; a factor on cos and sin scales q and k
        factor = self.rotary_factor(self.context_len(k_pos))
        return (q, k) if factor == 1 else (q * factor, k * factor)

    def rotary_factor(self, seq_len: int) -> float:
        """The factor on cos and sin (of q and k alike) at a context of ``seq_len`` keys."""
        return 1.0

    @property
    def plain_up_to(self) -> int:
        """A length up to which the scheme computes RoPE's own logits (every pair in the near
        branch, factor 1; log-n aside): the window."""
        return self.window

    def far_positions(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """The (real-valued) positions q and k are rotated to for keys at distance >= w."""
        raise NotImplementedError

    def branch_positions(self, q_pos: Tensor, k_pos: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each branch's (q_at ``[s_q]``, k_at ``[s_k]``): the positions it rotates q and k to
        (a branch that rotates the keys as another does returns the same tensor). Near: the
        tokens' own; far: ``far_positions``."""
        return [(q_pos, k_pos), self.far_positions(q_pos, k_pos)]

    def branch_scores(self, q_pos: Tensor, k_pos: Tensor) -> list[Tensor]:
        """Which (query, key) pairs each branch scores, ``[s_q, s_k]`` bool, disjoint (future
        keys are masked afterwards): near where i - j < w, far elsewhere."""
        within = (q_pos.unsqueeze(-1) - k_pos) < self.window
        return [within, ~within]

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
        inv_freq = self.frequencies(k_pos)
        merged, scored = None, None
        positions = self.branch_positions(q_pos, k_pos)
        for (q_at, k_at), scores in zip(positions, self.branch_scores(q_pos, k_pos), strict=True):
            branch = rotated_logits(q, k, q_at, k_at, inv_freq)
            merged = branch if merged is None else branch.where(scores, merged)
            scored = scores if scored is None else scored | scores
        return merged.masked_fill(~scored, -math.inf)  # no bias: RoPE has none


@register("rerope")
class ReRoPE(WindowedRoPE, LogN):
    """ReRoPE (Su 2023, "Rectified Rotary Position Embeddings", https://kexue.fm/archives/9708),
    an eval-time variant of a trained rope: relative positions up to the window w as RoPE's,
    every larger one read as w. Reference implementation: bojone/rerope, ``rerope_patch.py``:
    logits of q and k rotated at their positions where i - j < w, else of q rotated at w and k
    unrotated (relative position exactly w); and, before the rotations, the queries times
    max(1, ln(p + 1) / ln L_train) (log-n scaling, as ``logn``; ``logn: false`` drops it).

    Window: the patch ships w = 512 for Llama 2's 4096 tokens and its README reports w = 1024;
    the default here is L_train / 4, the README's fraction.

    Not ``relative``: log-n scaling reads the query's position (without it the logits depend
    on i - j only, which the tests check).

    Args:
        base (float): frequency base of the trained rope. Default: 10000.
        window (int | None): w. Default: None, meaning L_train / 4 (at least 1).
        logn (bool): scale the queries by max(1, ln(p + 1) / ln L_train). Default: true.
    """

    option_ranges: ClassVar[dict[str, Range]] = {**RoPE.option_ranges, "window": Range(ge=1)}

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        window: int | None = None,
        logn: bool = True,
    ) -> None:
        super().__init__(dims, base=base)
        self.window = default_window(self.name, dims, window)
        self.logn = logn

    def slope(self) -> float:
        """How fast the relative position grows past w: 0, it stays at w."""
        return 0.0

    def far_positions(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        # q at r i + w (1 - r), k at r j: relative position w + r (i - j - w)
        r, w = self.slope(), self.window
        return q_pos.float() * r + w * (1 - r), k_pos.float() * r

    def logit_scale(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor | None:
        return super().logit_scale(q_pos, k_pos, layer) if self.logn else None


@register("leaky_rerope")
class LeakyReRoPE(ReRoPE):
    """Leaky ReRoPE (Su 2023, https://kexue.fm/archives/9708), an eval-time variant of a
    trained rope: relative positions up to w as RoPE's, then w + (i - j - w) / k. Reference
    implementation: bojone/rerope, ``leaky_rerope_patch.py``: past the window q is rotated at
    (i + w (k - 1)) / k and k at j / k (``LlamaLinearScalingRotaryEmbedding`` with factor k,
    positions shifted by w (k - 1)), with log-n scaling of the queries as in ``rerope``.

    The point of the slope is to keep every relative position within those the model was
    trained on, 0 .. L_train - 1, as ReRoPE does: at a window of n tokens the largest is
    w + (n - 1 - w) / k, so a k serves lengths up to w + (L_train - 1 - w) k + 1
    (``max_positions``; longer ones are refused before any training). The patch fixes one k
    (16, with w = 512 of Llama 2's 4096 tokens, which keeps 16k tokens at 1504) for every
    length it evaluates; ``k: null`` picks that k for ``max_len``, the longest length the run
    evaluates (the config sets it, ``${longest_eval_len:}``): the smallest k that keeps it in
    range, k = max(1, (max_len - 1 - w) / (L_train - 1 - w)), used at every length. At the
    zoo's L_train = 64, w = 16, up to 1024 tokens: k = 1007 / 47 = 21.43 (k = 16 reaches
    16 + 1007 / 16 = 78.9 at 1024 and serves up to 769 tokens).

    Defaults: k = 16 as the patch (the config's ``k: null`` picks it as above); w = L_train / 4
    as ``rerope`` (the patch: w = 512 of 4096).

    Args:
        base (float): frequency base of the trained rope. Default: 10000.
        window (int | None): w. Default: None, meaning L_train / 4 (at least 1).
        k (float | None): the slope 1/k past the window (k = 1 is plain RoPE); None: the
            smallest k that keeps ``max_len`` within the trained positions. Default: 16.
        max_len (int | None): the longest length to serve, which ``k: null`` picks k for
            (unused with a given k). Default: None.
        logn (bool): scale the queries by max(1, ln(p + 1) / ln L_train). Default: true.
    """

    option_ranges: ClassVar[dict[str, Range]] = {
        **ReRoPE.option_ranges,
        "k": Range(ge=1),
        "max_len": Range(ge=1),
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        window: int | None = None,
        k: float | None = 16.0,
        max_len: int | None = None,
        logn: bool = True,
    ) -> None:
        super().__init__(dims, base=base, window=window, logn=logn)
        k = self.fitting_k(max_len) if k is None else k
        if k < 1:
            raise UserError(f"leaky_rerope: k must be >= 1, got {k}")
        self.k = k

    def fitting_k(self, max_len: int | None) -> float:
        """The smallest k >= 1 whose largest relative position at ``max_len`` tokens,
        w + (max_len - 1 - w) / k, is at most L_train - 1."""
        trained, w = self.dims.train_len - 1, self.window
        if max_len is None:
            raise UserError(
                "leaky_rerope: k: null picks k for max_len, the longest length to serve; give "
                "max_len (the config sets it to the run's longest eval length) or k"
            )
        if w >= trained:
            raise UserError(
                f"leaky_rerope: k: null needs a window below L_train - 1 = {trained} (past it "
                f"no k keeps the relative positions within training), got window {w}"
            )
        return max(1.0, (max_len - 1 - w) / (trained - w))

    def slope(self) -> float:
        return 1.0 / self.k

    @property
    def max_positions(self) -> int:
        """The longest window whose relative positions all stay within 0 .. L_train - 1."""
        trained, w = self.dims.train_len - 1, self.window
        if w >= trained:  # past w every relative position is beyond training
            return self.dims.train_len
        return math.floor(w + (trained - w) * self.k + 1 + 1e-9)

    def check_length(self, seq_len: int) -> None:
        limit = self.max_positions
        if seq_len > limit:
            trained, w = self.dims.train_len - 1, self.window
            reach = w + (seq_len - 1 - w) / self.k
            need = (
                f", or k >= {(seq_len - 1 - w) / (trained - w):.4g} for it (k: null picks "
                "k for the longest eval length)"
                if w < trained
                else ""
            )
            raise UserError(
                f"leaky_rerope cannot serve length {seq_len}: with window {w} and k = "
                f"{self.k:g} its relative positions reach {reach:.1f}, past the 0..{trained} "
                f"the model was trained on; allowed: lengths up to {limit}{need}"
            )


@register("self_extend")
class SelfExtend(WindowedRoPE):
    """Self-Extend (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without
    Tuning", https://arxiv.org/abs/2401.01325), an eval-time variant of a trained rope:
    neighbour attention (RoPE at the tokens' own positions) for i - j < w, and grouped
    attention beyond, with q at floor(i / G) + w - w / G and k at floor(j / G), so the grouped
    relative positions continue from w. Reference implementation: datamllab/LongLM,
    ``self_extend_patch/Llama.py`` (``self_extend_forward``: ``group_size_1`` = G,
    ``group_size_2`` = w, the shift w - w / G in floating point, its neighbour mask
    i - j < w; its optional log-n ``scale_base`` is off by default, and so here).

    Defaults: the README's rule is that a window of L tokens needs (L_train - w) G + w >= L;
    w = L_train / 4 (the README's Llama example, w = 1024 of 4096) and G = 32 serve up to
    24 L_train, past the suite's 16x (the smallest power of two that does).

    Not ``relative``: floor(i / G) - floor(j / G) depends on the positions, not on i - j only.

    Args:
        base (float): frequency base of the trained rope. Default: 10000.
        group_size (int): G. Default: 32.
        window (int | None): w, the neighbour window. Default: None, meaning L_train / 4.
    """

    option_ranges: ClassVar[dict[str, Range]] = {
        **RoPE.option_ranges,
        "group_size": Range(ge=1),
        "window": Range(ge=1),
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        group_size: int = 32,
        window: int | None = None,
    ) -> None:
        super().__init__(dims, base=base)
        if group_size < 1:
            raise UserError(f"self_extend: group_size must be >= 1, got {group_size}")
        self.group_size = group_size
        self.window = default_window(self.name, dims, window)

    def far_positions(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        g, w = self.group_size, self.window
        return (q_pos // g).float() + (w - w / g), (k_pos // g).float()
