"""FIRE: a learned function of the log distance, normalised by the log query position."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.config import Range
from pe_bench.errors import UserError
from pe_bench.positions.base import ModelDims, PositionScheme, register
from pe_bench.positions.bias import distances


@register("fire")
class FIRE(PositionScheme):
    """Functional interpolation for relative positions (Li et al. 2023,
    https://arxiv.org/abs/2310.04418).

    bias_h(i, j) = f_h(psi(i - j) / psi(max(tau, i))), psi(x) = ln(|c| x + 1), with f an MLP
    1 -> ``mlp_width`` (ReLU) -> n_h, and c and tau = |tau_multiplier * init_tau| learned. Each
    layer has its own MLP, c and tau. Dividing by psi(i) maps every distance a query can see
    into [0, 1] ("progressive interpolation"); the threshold tau keeps early queries from
    dividing by a tiny psi(i). The normaliser depends on the absolute query position i, so
    FIRE is not shift-invariant (not ``relative``).

    Reference implementation: the PyTorch code in the paper's appendix (``FIRE(num_heads,
    mlp_width=32, init_c=0.1, init_L=512., eps=1e-6)``; c and the multiplier of L learned,
    ``nn.Linear`` default initialisation).

    ``init_tau`` defaults to L_train / 4, the paper's ratio (its code's 512 for its training
    length of 2048), so that training sees both regimes of the normaliser: queries before tau
    (psi(tau) fixed) and after it (psi(i) growing with i). At L_train = 64 the reference's 512,
    or any tau >= L_train, would keep psi(i) a constant in training and let progressive
    interpolation appear only at evaluation.

    Args:
        mlp_width (int): hidden units of f. Default: 32.
        init_c (float): initial c. Default: 0.1.
        init_tau (float | None): initial tau. Default: None, meaning L_train / 4.
        eps (float): added to the normaliser. Default: 1e-6.
    """

    option_ranges: ClassVar[dict[str, Range]] = {
        "mlp_width": Range(ge=1),
        "init_c": Range(gt=0),  # psi(x) = ln(cx + 1) needs c > 0
        "init_tau": Range(gt=0),
        "eps": Range(gt=0),
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_tau: float | None = None,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(dims)
        if mlp_width < 1:
            raise UserError(f"fire: mlp_width must be >= 1, got {mlp_width}")
        self.init_tau = float(dims.train_len / 4 if init_tau is None else init_tau)
        if self.init_tau <= 0:
            raise UserError(f"fire: init_tau must be > 0, got {init_tau}")
        self.eps = eps
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, dims.num_heads))
            for _ in range(dims.num_layers)
        )
        self.c = nn.Parameter(torch.full((dims.num_layers,), init_c))
        self.tau_multiplier = nn.Parameter(torch.ones(dims.num_layers))

    def psi(self, n: Tensor, layer: int) -> Tensor:
        """psi(n) = ln(|c| n + 1) of distances ``n``, clamped at 0 first (float32)."""
        return torch.log1p(self.c[layer].abs() * n.clamp(min=0).float())

    def normaliser(self, q_pos: Tensor, layer: int) -> Tensor:
        """psi(max(tau, i)) + eps of each query: ``[s_q]``."""
        tau = (self.tau_multiplier[layer] * self.init_tau).abs()
        return torch.log1p(self.c[layer].abs() * torch.maximum(q_pos.float(), tau)) + self.eps

    def normalised_distance(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        """psi(i - j) / psi(max(tau, i)): ``[s_q, s_k]``, in [0, 1] where j <= i."""
        psi_n = self.psi(distances(q_pos, k_pos), layer)
        return psi_n / self.normaliser(q_pos, layer).unsqueeze(-1)

    def pieces(self, layer: int) -> tuple[Tensor, Tensor]:
        """f of ``layer`` as the piecewise-linear function it is: f(x) = sum_o W2_o
        ReLU(w_o x + b_o) + b2 has a kink at each -b_o / w_o. Returns the kinks in increasing
        order (``[mlp_width]``, +inf for a unit with w_o = 0) and, for the segment after the
        first k kinks (k = 0 .. mlp_width), the slope and intercept of every head
        (``[mlp_width + 1, 2 n_h]``), in float32: unit o is on there if w_o > 0 and its kink
        is among the first k, or w_o < 0 and it is not, or w_o = 0 and b_o > 0."""
        first, _, last = self.mlp[layer]
        w, b = first.weight[:, 0].float(), first.bias.float()
        kinks = torch.where(w != 0, -b / w, torch.inf).detach()
        order = kinks.argsort()
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order), device=order.device)
        k = torch.arange(len(order) + 1, device=order.device).unsqueeze(-1)  # [width + 1, 1]
        on = torch.where(w > 0, rank < k, torch.where(w < 0, rank >= k, b > 0))
        on = on.to(w.dtype)  # [width + 1, width]
        w2 = last.weight.float().T  # [width, n_h]
        slope, intercept = (on * w) @ w2, (on * b) @ w2 + last.bias.float()
        return kinks[order], torch.cat([slope, intercept], dim=-1)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        """f_h(x) at every pair, exactly as its line on x's segment (``pieces``), heads
        leading, with no search per pair. The positions are taken to be consecutive and the
        queries the last keys (as ``positions`` gives them and the model's windows and chunks
        are), so x comes from one table of psi by distance, read with the keys reversed, where
        x rises along each row: a row is one run of pairs per segment, the runs' ends one
        ``searchsorted`` of the kinks per row, and each pair's line one ``index_select``.
        One query chunk of 64 x 8192 pairs (4 heads, 1 thread, Xeon AVX512): 11 ms against 28
        with a ``bucketize`` per pair."""
        s_q, s_k = q_pos.shape[-1], k_pos.shape[-1]
        # key s_k - 1 - m of query r is at distance r + m - (s_q - 1): a strided table read
        psi = self.psi(torch.arange(1 - s_q, s_k, device=q_pos.device), layer)
        rising = psi.unfold(0, s_k, 1).clone(memory_format=torch.contiguous_format)
        rising = rising.div_(self.normaliser(q_pos, layer).unsqueeze(-1))  # x, keys reversed
        kinks, lines = self.pieces(layer)
        edges = F.pad(torch.searchsorted(rising, kinks.expand(s_q, -1).contiguous()), (1, 1))
        edges[:, -1] = s_k  # run w of a reversed row: pairs edges[w] .. edges[w + 1] - 1
        runs = edges.diff(dim=-1).flip(-1)  # in key order: the last segment first
        run_of_pair = torch.repeat_interleave(runs.flatten(), output_size=s_q * s_k)
        line_of_run = lines.flip(0).T.repeat(1, s_q)  # [2 n_h, s_q (W + 1)]
        line = line_of_run.index_select(1, run_of_pair).view(-1, s_q, s_k)  # [2 n_h, s_q, s_k]
        heads = self.dims.num_heads
        bias = torch.addcmul(line[heads:], line[:heads], rising.flip(-1))
        return bias.to(self.mlp[layer][0].weight.dtype)  # [n_h, s_q, s_k]

    def score_bias_reference(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int
    ) -> Tensor:
        """f_h through the MLP itself, unit by unit."""
        mlp = self.mlp[layer]
        x = self.normalised_distance(q_pos, k_pos, layer).to(mlp[0].weight.dtype)
        return mlp(x.unsqueeze(-1)).permute(2, 0, 1)  # [n_h, s_q, s_k]
