"""The eval-time methods long-context papers compare a trained RoPE against, each a
``WindowedRoPE`` (every (query, key) pair scored by one of a few rotations): dual chunk
attention (DCA), StreamingLLM's attention sinks, LM-Infinite's Lambda-shaped attention and
STRING's shifted positions. None trains anything; each reads the trained rope at positions it
was trained on.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from pe_bench.config import Range
from pe_bench.errors import UserError
from pe_bench.positions.base import ModelDims, register
from pe_bench.positions.rerope import WindowedRoPE
from pe_bench.positions.rotary import RoPE


def chunkllama_mscale(scale: float) -> float:
    """ChunkLlama's ``get_mscale``: 0.05 ln(s) + 1 for a context s > 1 times the pretraining
    length, else 1 (YaRN's rule with half its slope)."""
    return 1.0 if scale <= 1 else 0.05 * math.log(scale) + 1.0


@register("dca")
class DualChunkAttention(WindowedRoPE):
    """Dual chunk attention (An et al. 2024, "Training-Free Long-Context Scaling of Large
    Language Models", https://arxiv.org/abs/2402.17463; ChunkLlama), an eval-time variant of a
    trained rope: the sequence is cut into chunks of c = S - w tokens (S: chunk size, w: local
    window) and the keys sit at j mod c; a query sits at i mod c for the keys of its own chunk
    (intra: relative position i - j), at min(i mod c + c, S) for those of the chunk before
    (successive), and at min(2c - 1, S) for every earlier chunk (inter). No relative position
    exceeds S. Reference implementation: HKUNLP/ChunkLlama ``chunkllama_attn_replace.py``
    (``ChunkLlamaRotaryEmbedding``: ``q_t``, ``qc_t``, ``k_t``; ``forward``: one flash attention
    per chunk pair, merged by log-sum-exp; it rounds the merge's weights to bfloat16, here they
    stay float32).

    The code multiplies cos and sin by ``get_mscale(L / L_train)`` = 0.05 ln(L / L_train) + 1
    past the pretraining length (added a month after the paper, whose results "did not use
    yarn", the code's comment says): ``mscale: true`` as the code, ``false`` the paper's form.

    Defaults: ``replace_with_chunkllama(pretraining_length)``: S = 3 L_train / 4, w =
    L_train / 8 (so c = 5 L_train / 8).

    Args:
        base (float): frequency base of the trained rope. Default: 10000.
        chunk_size (int | None): S. Default: None, meaning 3 L_train // 4.
        local_window (int | None): w. Default: None, meaning L_train // 8.
        mscale (bool): scale cos and sin past L_train as the code does. Default: true.
    """

    option_ranges: ClassVar[dict[str, Range]] = {
        **RoPE.option_ranges,
        "chunk_size": Range(ge=2),
        "local_window": Range(ge=0),
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        chunk_size: int | None = None,
        local_window: int | None = None,
        mscale: bool = True,
    ) -> None:
        super().__init__(dims, base=base)
        self.chunk_size = dims.train_len * 3 // 4 if chunk_size is None else chunk_size
        self.local_window = dims.train_len // 8 if local_window is None else local_window
        self.chunk_len = self.chunk_size - self.local_window
        if self.chunk_len < 1:
            raise UserError(
                f"dca: chunk_size ({self.chunk_size}) must exceed local_window "
                f"({self.local_window}): chunks are chunk_size - local_window tokens"
            )
        self.mscale = mscale

    @property
    def plain_up_to(self) -> int:
        return self.chunk_len  # one chunk: every pair intra, at i - j

    @property
    def caveat(self) -> str:
        if not self.mscale:
            return ""
        return (
            "dca scales cos and sin by 0.05 ln(L/L_train) + 1 past L_train as ChunkLlama's code "
            "does; the paper's results did not (mscale: false)"
        )

    def rotary_factor(self, seq_len: int) -> float:
        return chunkllama_mscale(seq_len / self.dims.train_len) if self.mscale else 1.0

    def branch_positions(self, q_pos: Tensor, k_pos: Tensor) -> list[tuple[Tensor, Tensor]]:
        c, size = self.chunk_len, self.chunk_size
        keys, inner = k_pos % c, q_pos % c
        inter = torch.full_like(q_pos, min(2 * c - 1, size))  # qc_t at position_ids[c - 1]
        return [(inner, keys), ((inner + c).clamp(max=size), keys), (inter, keys)]

    def branch_scores(self, q_pos: Tensor, k_pos: Tensor) -> list[Tensor]:
        q_chunk = (q_pos // self.chunk_len).unsqueeze(-1)
        k_chunk = k_pos // self.chunk_len
        return [q_chunk == k_chunk, q_chunk == k_chunk + 1, q_chunk >= k_chunk + 2]


class SinkWindowRoPE(WindowedRoPE):
    """A window of the w most recent keys at their own positions and the first ``sinks``
    keys beyond it at ``far_positions``; every other key is hidden (``attention_mask``), as
    StreamingLLM's cache and LM-Infinite's Lambda-shaped mask keep them."""

    sinks: int

    def branch_scores(self, q_pos: Tensor, k_pos: Tensor) -> list[Tensor]:
        within, beyond = super().branch_scores(q_pos, k_pos)
        return [within, beyond & (k_pos < self.sinks)]

    def attention_mask(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        within, sinks = self.branch_scores(q_pos, k_pos)
        return within | sinks


@register("streaming_llm")
class StreamingLLM(SinkWindowRoPE):
    """StreamingLLM (Xiao et al. 2024, "Efficient Streaming Language Models with Attention
    Sinks", https://arxiv.org/abs/2309.17453), an eval-time variant of a trained rope: each
    token attends to the first ``start_size`` tokens (the attention sinks) and the
    ``recent_size`` tokens before it, at their positions within that cache. Reference
    implementation: mit-han-lab/streaming-llm, ``kv_cache.py`` (``StartRecentKVCache``: the
    cache keeps the sinks and the last ``recent_size`` tokens after each step) and
    ``pos_shift/modify_llama.py`` (the keys rotated at their index in the cache, the query at
    the cache's length), decoding one token at a time (``examples/eval_long_ppl.py``). Here
    every token of a window is scored in one pass, as that decoding scores it: the recent keys
    at their own distance, sink j at min(i, start_size + recent_size) - j.

    Defaults: 4 sinks (the paper's), and ``recent_size`` = L_train - 5, so that a query sees
    L_train keys at positions 0 .. L_train - 1, those it was trained on (the README: the cache
    stays within the pretraining window).

    Args:
        base (float): frequency base of the trained rope. Default: 10000.
        start_size (int): the attention sinks. Default: 4.
        recent_size (int | None): recent tokens kept besides the query's own. Default: None,
            meaning L_train - start_size - 1.
    """

    option_ranges: ClassVar[dict[str, Range]] = {
        **RoPE.option_ranges,
        "start_size": Range(ge=0),
        "recent_size": Range(ge=0),
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        start_size: int = 4,
        recent_size: int | None = None,
    ) -> None:
        super().__init__(dims, base=base)
        recent = dims.train_len - start_size - 1 if recent_size is None else recent_size
        if recent < 0:
            raise UserError(
                f"streaming_llm: start_size {start_size} leaves no recent tokens within "
                f"L_train = {dims.train_len}; give recent_size (>= 0) or fewer sinks"
            )
        self.sinks, self.recent_size = start_size, recent
        self.window = recent + 1  # the recent keys and the query's own

    @property
    def plain_up_to(self) -> int:
        return self.sinks + self.window  # the whole cache: nothing evicted yet

    def far_positions(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return q_pos.clamp(max=self.sinks + self.recent_size), k_pos


@register("lm_infinite")
class LMInfinite(SinkWindowRoPE):
    """LM-Infinite (Han et al. 2024, "LM-Infinite: Zero-Shot Extreme Length Generalization for
    Large Language Models", https://arxiv.org/abs/2308.16137), an eval-time variant of a trained
    rope: a Lambda-shaped mask, each query attending to the ``local_branch`` most recent keys
    at their own distance and to the first ``global_branch`` keys beyond them at distance
    ``local_branch`` (the distance cap: q rotated to the limit, the keys unrotated). Reference
    implementation: Glaciohound/LM-Infinite, ``models/lambda_attention.py``
    (``Lambda_Attention_Matrix``) with ``models/llama.py`` (``attn_forward_factory`` as
    ``convert_llama_model(model, local_branch, global_branch)`` sets it: ``limit_distance`` =
    ``local_branch``; its optional top-k attention is off).

    Defaults: the README's ``convert_llama_model(model, 4096, 10)`` for Llama 2: the local
    branch is L_train, 10 global tokens.

    Args:
        base (float): frequency base of the trained rope. Default: 10000.
        local_branch (int | None): the window of recent keys, also the distance cap. Default:
            None, meaning L_train.
        global_branch (int): the first keys every query sees. Default: 10.
    """

    option_ranges: ClassVar[dict[str, Range]] = {
        **RoPE.option_ranges,
        "local_branch": Range(ge=1),
        "global_branch": Range(ge=0),
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        local_branch: int | None = None,
        global_branch: int = 10,
    ) -> None:
        super().__init__(dims, base=base)
        self.window = dims.train_len if local_branch is None else local_branch
        self.sinks = global_branch

    def far_positions(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return torch.full_like(q_pos, self.window), torch.zeros_like(k_pos)


@register("string")
class STRING(WindowedRoPE):
    """STRING (An et al. 2025, "Why Does the Effective Context Length of LLMs Fall Short?",
    https://arxiv.org/abs/2410.18745), an eval-time variant of a trained rope: the largest
    relative positions, the least trained, are dropped and the ones below shifted in: keys
    closer than the offset S at their own distance, the others at distance i - j - S + W (W:
    the local value), so no relative position exceeds L - 1 - S + W. Reference implementation:
    HKUNLP/STRING ``string_for_llama.py`` (``forward``: the query rotated at its position and
    at position - S + W, keys at theirs; ``string_flash_forward``: a sliding-window and a
    shifted attention merged by log-sum-exp; cos and sin times ``attention_factor`` =
    0.1 ln 2 + 1, always). Its decoding scores keys at distance < S in the window branch and
    the rest shifted, as the paper's position matrix; its prefill's flash window of S + 1 keys
    also scores the key at distance S there, so that key counts twice: here once, as decoding.

    Defaults: the README's ``shifted_offset = int(0.33 * L)`` of the pretraining length (its
    RULER scripts take 0.33 of each test length instead) and ``small_local_value = 128``, at
    most S / 4 for short contexts (pe-bench's rule: the zoo's L_train = 64 has S = 21).

    Args:
        base (float): frequency base of the trained rope. Default: 10000.
        shifted_offset (int | None): S. Default: None, meaning int(0.33 L_train).
        local_value (int | None): W, 0 <= W <= S. Default: None, meaning min(128, S // 4).
        attention_factor (float | None): the factor on cos and sin. Default: None, meaning
            0.1 ln 2 + 1 as the code.
    """

    relative = True  # the branch and its position depend on i - j alone
    option_ranges: ClassVar[dict[str, Range]] = {
        **RoPE.option_ranges,
        "shifted_offset": Range(ge=1),
        "local_value": Range(ge=0),
        "attention_factor": Range(gt=0),
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        shifted_offset: int | None = None,
        local_value: int | None = None,
        attention_factor: float | None = None,
    ) -> None:
        super().__init__(dims, base=base)
        offset = max(1, int(0.33 * dims.train_len)) if shifted_offset is None else shifted_offset
        local = min(128, max(1, offset // 4)) if local_value is None else local_value
        if local > offset:
            raise UserError(
                f"string: local_value ({local}) must be at most shifted_offset ({offset}): the "
                "shifted positions start at local_value"
            )
        self.window, self.local_value = offset, local
        # not ``attention_factor``: pe-bench's RoPE variants name a method so (YaRN's)
        self.cos_sin_factor = (
            0.1 * math.log(2) + 1 if attention_factor is None else attention_factor
        )

    @property
    def plain_up_to(self) -> int:
        return self.window if self.cos_sin_factor == 1 else 0

    def rotary_factor(self, seq_len: int) -> float:
        return self.cos_sin_factor

    def far_positions(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return q_pos - self.window + self.local_value, k_pos
