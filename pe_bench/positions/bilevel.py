"""BiPE: bilevel positions read from the tokens, absolute within a segment (a learned table
added to the tokens), relative between segments (RoPE or ALiBi on the segment index)."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.config import Range
from pe_bench.errors import UserError
from pe_bench.positions.base import ModelDims, PositionScheme, register
from pe_bench.positions.bias import alibi_slopes
from pe_bench.positions.rotary import RoPE, rotate_half

NEWLINE = 10  # the byte tokenizer's id of "\n" (a token is a byte)


def bilevel_ids(idx: Tensor, separators: Tensor) -> tuple[Tensor, Tensor]:
    """(intra, segment) of every token ``[b, s]``: the segment is the number of separators
    before the token (a separator ends its segment), intra its index since its segment's first
    token. Both read earlier tokens only. BiPE's ``get_bilevel_ids`` without its clamp."""
    sep = torch.isin(idx, separators)
    segment = sep.cumsum(-1) - sep.long()
    index = torch.arange(idx.shape[-1], device=idx.device)
    after = torch.where(sep, index + 1, 0).cummax(-1).values  # one past the last separator <= t
    start = F.pad(after[..., :-1], (1, 0))  # ... < t: where token t's segment starts
    return index - start, segment


class Segments(nn.Module):
    """The token-dependent half of BiPE, shared by both schemes: the separators, the table of
    intra-segment positions and the levels of the current pass (``read``)."""

    def __init__(self, dims: ModelDims, separators: list[int], table_size: int | None) -> None:
        super().__init__()
        if not separators:
            raise UserError("bipe: separators must name at least one token id")
        self.register_buffer("separators", torch.tensor(separators), persistent=False)
        self.rows = table_size or dims.train_len
        # BiPE's nn.Embedding(train_scale, d, padding_idx=-1): its last row, where every intra
        # position past the table lands, stays 0 (HF's init zeroes it; it gets no gradient)
        self.table = nn.Embedding(self.rows, dims.d_model, padding_idx=self.rows - 1)
        nn.init.normal_(self.table.weight, std=0.02)
        with torch.no_grad():
            self.table.weight[-1].zero_()
        self.levels: tuple[Tensor, Tensor] | None = None

    def read(self, idx: Tensor | None) -> None:
        self.levels = None if idx is None else bilevel_ids(idx, self.separators)

    def at(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        """(intra, segment) at indices ``pos``: ``[b, s]``, or ``[1, s]`` with no tokens read
        (one segment: intra = the position)."""
        if self.levels is None:
            return pos.unsqueeze(0), torch.zeros_like(pos).unsqueeze(0)
        intra, segment = self.levels
        return intra[:, pos], segment[:, pos]

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        intra = self.at(pos)[0].clamp(max=self.rows - 1)
        return x + self.table(intra).to(x.dtype)


class BilevelOptions:
    """The options and hooks both BiPE schemes share (a mixin of ``PositionScheme``)."""

    segments: Segments
    option_ranges: ClassVar[dict[str, Range]] = {"table_size": Range(ge=1)}

    @property
    def caveat(self) -> str:
        return (
            "segments end at the given separator ids (default the byte tokenizer's newline; "
            "BiPE's code splits Llama ids at newline (13) and ' .' (869), not at '.' (29889): "
            "the paper's full stop); intra positions past the table share its last row, 0; "
            f"a window of L_train = {self.dims.train_len} tokens spans few segments (Python "
            "source in bytes: a newline every 36), so the segment-level encoding trains on few "
            "segment distances (the paper: 151M and 1.6B parameters, 1,024 Llama tokens of the "
            "Pile)"
        )

    def read_tokens(self, idx: Tensor | None) -> None:
        self.segments.read(idx)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return self.segments.embed(x, pos)


@register("bipe")
class BiPE(BilevelOptions, RoPE):
    """Bilevel positional encoding with RoPE between segments (He et al. 2024, "Two Stones Hit
    One Bird: Bilevel Positional Encoding for Better Length Extrapolation",
    https://arxiv.org/abs/2401.16421).

    A token's segment index is the number of separators before it (a separator closes its
    segment), its intra-segment position its index since the segment's first token. The
    intra-segment position picks a row of a learned table (``table_size`` rows, L_train by
    default, the last row 0) added to the token embedding; q and k are rotated by RoPE at the
    segment index, so q . k depends on the difference of segment indices. Both read only the
    tokens before each token (causal). Reference implementation: zhenyuhe00/BiPE
    ``my_modeling_llama_bipe_rope.py`` (``get_bilevel_ids``, ``get_ape_embeddings``, Llama's
    RoPE at ``position_ids``; ``train_scale`` = its training length 1024 rows, the padding row
    -1 zero).

    The positions depend on the tokens (``read_tokens``), so BiPE is not ``relative`` in the
    token index; it is in the segment index: the logits of two tokens do not change when
    whole segments are added before both.

    Args:
        base (float): RoPE's frequency base. Default: 10000.
        separators (list[int]): token ids that end a segment. Default: [10], the byte
            tokenizer's newline.
        table_size (int | None): rows of the intra-segment table; null: L_train. Default: None.
    """

    relative = False
    option_ranges: ClassVar[dict[str, Range]] = {
        **RoPE.option_ranges,
        **BilevelOptions.option_ranges,
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        separators: tuple[int, ...] = (NEWLINE,),
        table_size: int | None = None,
    ) -> None:
        super().__init__(dims, base=base)
        self.segments = Segments(dims, list(separators), table_size)

    def rotate(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> tuple[Tensor, Tensor]:
        """q and k rotated at their segment indices (per sequence of the batch)."""
        return self.at_segments(q, q_pos), self.at_segments(k, k_pos)

    def at_segments(self, x: Tensor, pos: Tensor) -> Tensor:
        segment = self.segments.at(pos)[1]  # [b|1, s]
        angles = segment.float().unsqueeze(-1) * self.theta32  # [b|1, s, h_d/2]
        cos, sin = (f(angles).repeat(1, 1, 2).unsqueeze(1) for f in (torch.cos, torch.sin))
        xf = x.float()
        return (xf * cos + rotate_half(xf) * sin).type_as(x)


@register("bipe_alibi")
class BiPEALiBi(BilevelOptions, PositionScheme):
    """BiPE with ALiBi between segments (He et al. 2024, as ``bipe``): the intra-segment table
    as ``bipe``, and the logit bias -m_h (c_i - c_j) on the segment indices c, with ALiBi's
    slopes times ``slope_scale``. Reference implementation: zhenyuhe00/BiPE
    ``my_modeling_llama_bipe_alibi.py`` (``_init_alibi_mul96``: the slopes times 96; the bias
    m_h c_j, which differs from -m_h (c_i - c_j) by a term of the query the softmax cancels,
    so the model attends with it as a ``key_bias``).

    Args:
        separators (list[int]): token ids that end a segment. Default: [10] (newline).
        table_size (int | None): rows of the intra-segment table; null: L_train. Default: None.
        slope_scale (float): the factor on ALiBi's slopes. Default: 96 (the code's).
    """

    content_bias = True  # the bias depends on the tokens of each sequence
    option_ranges: ClassVar[dict[str, Range]] = {
        **BilevelOptions.option_ranges,
        "slope_scale": Range(gt=0),
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        separators: tuple[int, ...] = (NEWLINE,),
        table_size: int | None = None,
        slope_scale: float = 96.0,
    ) -> None:
        super().__init__(dims)
        self.segments = Segments(dims, list(separators), table_size)
        slopes = torch.tensor(alibi_slopes(dims.num_heads)) * slope_scale
        self.register_buffer("slopes", slopes, persistent=False)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        c_q, c_k = self.segments.at(q_pos)[1].float(), self.segments.at(k_pos)[1].float()
        distance = c_q.unsqueeze(-1) - c_k.unsqueeze(-2)  # [b|1, s_q, s_k]
        return -self.slopes.view(1, -1, 1, 1) * distance.unsqueeze(1)  # [b|1, n_h, s_q, s_k]

    def key_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        """m_h c_j, ``[b|1, n_h, s_k]``: the code's form of the bias."""
        return self.slopes.view(1, -1, 1) * self.segments.at(k_pos)[1].float().unsqueeze(1)
