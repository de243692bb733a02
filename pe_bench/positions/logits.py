"""Schemes that act on the attention logits themselves: DAPE's MLP over heads (through
``modify_logits``) and SSMax's learned temperature s ln n (through ``logit_scale``), each on
top of a base scheme it subclasses."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.config import Range
from pe_bench.errors import UserError
from pe_bench.positions.base import ModelDims, PositionScheme, register
from pe_bench.positions.bias import ALiBi, KerpleLog
from pe_bench.positions.rotary import RoPE

# Largest hidden activation of DAPE's MLP built at once, in elements (1 MiB in fp32, the
# size of a CPU core's L2 cache here): longer windows go through it by slices. Measured on
# 2 CPU cores (1 thread, b 8, 4 heads, 1024 x 1024 logits, one layer): 7.4 s with slices of
# 2^25 activations, 2.1 s with 2^20, 1.2 s with 2^18 in the layout of ``sliced_logits``.
DAPE_BUDGET = 2**18

# Pairs of one query row (its keys times the batch) from which DAPE's MLP goes row by row
# (``rows_logits``); shorter rows go by slices of several rows (``sliced_logits``), where a
# row's few pairs would not pay for the calls of one.
ROW_PAIRS = 4096


class DAPE(PositionScheme):
    """DAPE (Zheng et al. 2024, "DAPE: Data-Adaptive Positional Encoding for Length
    Extrapolation", https://arxiv.org/abs/2405.14722): the logits A + B + f([A; B]), with A the
    scaled q . k / sqrt(h_d) and B the base scheme's bias, both ``[n_h]`` at every (i, j), and
    f an MLP from 2 n_h to n_h features applied at each (i, j). Reference implementation:
    chuanyang-Zheng/DAPE, ``DAPE.py`` (``AliBi_DAPE``, ``ParallelKerpleLog_DAPE``: ``mlp2`` =
    Linear(2 n_h, ``mlp_width``), LeakyReLU, Linear(``mlp_width``, n_h), PyTorch's default
    initialisation, ``mlp_width`` 32 in its configs, one module per attention layer).

    As there, f has its own weights in every layer and LeakyReLU keeps PyTorch's slope 0.01;
    f reads A and B at one (i, j) only, so a relative base stays relative. The base bias B is
    the base scheme's as pe-bench trains it (KERPLE's coefficients are shared by the layers
    here; the reference builds both per layer), so that a DAPE row differs from its base row
    by f alone.

    A mixin: subclass it with a scheme that has a content-free ``score_bias`` (``DapeKerple``,
    ``DapeALiBi``); ``modify_logits`` gets that bias as B.

    Args:
        mlp_width (int): hidden width of f. Default: 32.
    """

    option_ranges: ClassVar[dict[str, Range]] = {"mlp_width": Range(ge=1)}

    def __init__(self, dims: ModelDims, *, mlp_width: int = 32) -> None:
        super().__init__(dims)  # the base scheme's parameters first
        if mlp_width < 1:
            raise UserError(f"{self.name}: mlp_width must be >= 1, got {mlp_width}")
        heads = dims.num_heads
        self.mlps = nn.ModuleList(
            nn.Sequential(
                nn.Linear(2 * heads, mlp_width), nn.LeakyReLU(), nn.Linear(mlp_width, heads)
            )
            for _ in range(dims.num_layers)
        )

    def adaptive_logits(self, logits: Tensor, bias: Tensor, layer: int) -> Tensor:
        """A + B + f([A; B]), ``[b, n_h, s_q, s_k]`` in float32: row by row where a row has
        at least ``ROW_PAIRS`` pairs (``rows_logits``), else by slices (``sliced_logits``).
        Measured on the whole model (d_model 128, 4 layers, 1 thread, AMD EPYC under load,
        rope's time in the same runs): dape_alibi at 8192 tokens 5.7x rope against 6.5x by
        slices alone; training at L = 64 (b 32) 1.5x, where rows alone made it 1.9x."""
        if logits.shape[0] * logits.shape[-1] >= ROW_PAIRS:
            return self.rows_logits(logits, bias, layer)
        return self.sliced_logits(logits, bias, layer)

    def rows_logits(self, logits: Tensor, bias: Tensor, layer: int) -> Tensor:
        """``adaptive_logits`` one query row at a time (by blocks of keys of at most
        ``DAPE_BUDGET`` hidden activations).

        The base is relative, so B is a function of i - j: its part of f's first layer,
        W_B B + b_1, is one table by distance (built from the last row of B and the first
        row's future keys), and a query row reads it as one contiguous slice, the keys in
        order. Each row is then one batched product of its A with W_A onto that slice, laid
        out pairs-major ([pairs, width], the layout CPU GEMM wrote fastest here), LeakyReLU in
        place, and one ``baddbmm`` of W_2 onto A + B + b_2. Measured on the MLP of one query
        chunk of 64 x 8192 pairs (b 1, 4 heads, 1 thread, AMD EPYC under load): 32-37 ms
        against 47-69 ms by ``sliced_logits``."""
        first, _, last = self.mlps[layer]
        heads = self.dims.num_heads
        b, _, s_q, s_k = logits.shape
        bias = bias.float().reshape(-1, s_q, s_k).expand(heads, -1, -1)  # [n_h, s_q, s_k]
        # entry y: B at distance s_k - 1 - y (y < s_k: the last row), then future keys
        by_distance = torch.cat([bias[:, -1], bias[:, 0, s_k - s_q + 1 :]], dim=-1)
        w_a, w_b = first.weight.float()[:, :heads], first.weight.float()[:, heads:]
        table = torch.addmm(first.bias.float(), by_distance.T, w_b.T)  # [s_k + s_q - 1, W]
        w_a, w_2 = w_a.T.expand(b, -1, -1), last.weight.float().expand(b, -1, -1)
        residual = (logits + bias).add_(last.bias.float().view(-1, 1, 1))  # A + B + b_2
        step = max(1, DAPE_BUDGET // (b * table.shape[-1]))
        rows = []
        for r in range(s_q):
            blocks = []
            for j in range(0, s_k, step):
                y = s_q - 1 - r + j  # key j of row r is at distance s_k - s_q + r - j
                a = logits[:, :, r, j : j + step]  # [b, n_h, keys]
                hidden = torch.baddbmm(table[y : y + a.shape[-1]], a.transpose(1, 2), w_a)
                F.leaky_relu_(hidden)  # [b, keys, W]
                part = residual[:, :, r, j : j + step]
                blocks.append(torch.baddbmm(part, w_2, hidden.transpose(1, 2)))
            rows.append(blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-1))
        return torch.stack(rows, dim=2)

    def sliced_logits(self, logits: Tensor, bias: Tensor, layer: int) -> Tensor:
        """``adaptive_logits`` by slices of the pairs of at most ``DAPE_BUDGET`` hidden
        activations (of inputs, 2 n_h + 1 per pair). Heads lead and the pairs are one flat
        dimension, read where they lie: the first layer of f is one batched matrix product of
        its weights and bias with [A; B; 1] (one pass over the hidden units, where two products
        of n_h inputs and the bias made three), the second adds A + B and its bias
        (``baddbmm``). Measured on one layer's attention at 8192 tokens (b 1, 4 heads,
        1 thread, Xeon AVX512): 6.4 s with slices of query rows (one row each, each B slice
        copied twice), 2.1 s here."""
        first, _, last = self.mlps[layer]
        w_1 = torch.cat([first.weight.float(), first.bias.float().unsqueeze(-1)], dim=-1)
        b2 = last.bias.float().unsqueeze(-1)
        b, heads, s_q, s_k = logits.shape
        bias = bias.float()
        bias = bias if bias.dim() == 4 else bias.unsqueeze(0)  # [b|1, n_h, s_q, s_k]
        a_all = logits.reshape(b, heads, -1)  # [b, n_h, pairs]
        b_all = bias.expand(-1, heads, s_q, s_k).reshape(bias.shape[0], heads, -1)
        w_1, w_2 = w_1.expand(b, -1, -1), last.weight.float().expand(b, -1, -1)
        step = max(1, DAPE_BUDGET // (b * w_1.shape[1]))
        ones = a_all.new_ones(b, 1, min(step, a_all.shape[-1]))
        slices = []
        for start in range(0, a_all.shape[-1], step):
            a, b_term = a_all[..., start : start + step], b_all[..., start : start + step]
            inputs = torch.cat([a, b_term.expand(b, -1, -1), ones[..., : a.shape[-1]]], dim=1)
            hidden = F.leaky_relu_(torch.bmm(w_1, inputs))  # [b, width, pairs]
            slices.append(torch.baddbmm(a + b_term + b2, w_2, hidden))  # [b, n_h, pairs]
        out = slices[0] if len(slices) == 1 else torch.cat(slices, dim=-1)
        return out.view(b, heads, s_q, s_k)

    def modify_logits(
        self,
        logits: Tensor,
        bias: Tensor,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        layer: int,
    ) -> Tensor:
        return self.adaptive_logits(logits, bias, layer)


@register("dape_kerple")
class DapeKerple(DAPE, KerpleLog):
    """DAPE on KERPLE log (the reference's ``ParallelKerpleLog_DAPE``): logits A + B + f([A;
    B]) with B = -r1 ln(1 + r2 (i - j)). Relative, as KERPLE: f reads A and B at one (i, j)."""


@register("dape_alibi")
class DapeALiBi(DAPE, ALiBi):
    """DAPE on ALiBi (the reference's ``AliBi_DAPE``): logits A + B + f([A; B]) with
    B = -m_h (i - j). Relative, as ALiBi."""


def ssmax_scales(dims: ModelDims, init_s: float | None) -> nn.Parameter:
    """s per layer and head, ``[num_layers, n_h]``, all at ``init_s`` (None: 1 / ln L_train)."""
    if init_s is None:
        if dims.train_len < 2:
            raise UserError(f"ssmax needs a training length >= 2, got {dims.train_len}")
        init_s = 1.0 / math.log(dims.train_len)
    return nn.Parameter(torch.full((dims.num_layers, dims.num_heads), float(init_s)))


@register("ssmax_nope")
class SSMax(PositionScheme):
    """Scalable-Softmax (Nakanishi 2025, "Scalable-Softmax Is Superior for Attention",
    https://arxiv.org/abs/2501.19399): the logits of a query that attends to n keys are
    multiplied by s ln n before the softmax, s learned per layer and head, so that attention
    does not fade as n grows. Causal: n = q_pos + 1, the query's 1-based position (a position,
    not an index, so a chunk of queries or a window that starts later scales as a whole
    window would). ``logit_scale`` returns s ln n per head, ``[n_h, s_q]``.

    Initial s: the paper's text available here does not state it (its Figure 1 uses s = 0.43;
    the unofficial gdevos010/Scalable-Softmax defaults to 0.43, TabICL's ``ssmax.py`` to 1).
    The default 1 / ln L_train makes s ln n = 1 at n = L_train: at initialisation the last
    training query sees its base scheme's logits unscaled, earlier ones damped (s ln n < 1),
    and queries past L_train sharpened.

    This class is SSMax on NoPE; ``ssmax_rope`` and ``ssmax_alibi`` add it to those schemes.
    ln n depends on the query's absolute position, so none of them is ``relative``.

    Args:
        init_s (float | None): initial s. Default: None, meaning 1 / ln L_train.
    """

    relative = False  # ln n reads the query's absolute position

    def __init__(self, dims: ModelDims, *, init_s: float | None = None) -> None:
        super().__init__(dims)
        self.s = ssmax_scales(dims, init_s)

    def logit_scale(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        n = q_pos.float() + 1  # the keys a causal query attends to
        return self.s[layer].float().unsqueeze(-1) * n.log()  # [n_h, s_q]


@register("ssmax_rope")
class SSMaxRoPE(SSMax, RoPE):
    """SSMax on RoPE: q and k rotated as RoPE, the logits times s ln n. Not relative (ln n)."""

    def __init__(
        self, dims: ModelDims, *, base: float = 10000.0, init_s: float | None = None
    ) -> None:
        RoPE.__init__(self, dims, base=base)  # RoPE's caches for its base, then SSMax's s
        self.s = ssmax_scales(dims, init_s)


@register("ssmax_alibi")
class SSMaxALiBi(SSMax, ALiBi):
    """SSMax on ALiBi: the whole logit (q . k / sqrt(h_d) - m_h (i - j)) times s ln n, as the
    paper puts the scale on softmax's input (``scales_bias``); the bias is then built per
    layer. Not relative (ln n)."""

    scales_bias = True
