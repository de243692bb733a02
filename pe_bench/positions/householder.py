"""PaTH attention: position encoded by accumulating data-dependent Householder transforms.

Yang et al. 2025, "PaTH Attention: Position Encoding via Accumulating Householder
Transformations" (https://arxiv.org/abs/2505.16381). The logit of query i and key j <= i is

    q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(h_d),    H_t = I - beta_t w_t w_t^T,

with w_t a unit vector and beta_t in (0, 2) made from token t's layer input, so the "rotation"
between two tokens depends on the tokens between them; no other position encoding. The
reference is fla-org/flash-linear-attention: the layer ``fla/layers/path_attn.py``
(``PaTHAttention`` with its defaults: no forget gate, no QK norm, a low-rank w projection of
rank 32, a causal short convolution of width 3 with SiLU on w, w L2-normalised per head with
eps 1e-6 inside the root, beta = 2 sigmoid(W_beta x + b)) and the attention
``fla/ops/path_attn/naive.py`` (``naive_path_attn``: the blockwise UT-transform form that its
Triton kernels are tested against). Its model initialises every Linear and Conv1d weight from
N(0, 0.02) and every bias at 0 (``PaTHAttentionPreTrainedModel._init_weights``).

The attention here is the same blockwise form, written for the CPU (``path_attention``):
within a block of ``CHUNK`` tokens the Householder products are one triangular solve (the UT
transform) and the block's logits are explicit; across blocks the keys are carried in the
frame of the current block (each block's product is one ``[h_d, h_d]`` matrix), so that every
block of queries attends all earlier keys in one fused SDPA call, merged with its own block by
log-sum-exp. Time is O(s^2 h_d) as attention's, plus O(s^2 h_d^2 / CHUNK) for the frames.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.positions.base import ModelDims, PositionScheme, register

CHUNK = 64  # tokens per block (the reference's chunk_size): the numbers do not depend on it
L2_EPS = 1e-6  # fla.modules.l2norm: x / sqrt(sum x^2 + eps)


def unit_lower_solve(a: Tensor, rhs: Tensor) -> Tensor:
    """(I + strictly_lower(a))^-1 rhs, batched: solved as its transpose, X^T U = rhs^T with
    U = a^T unit upper triangular (``left=False``), where the row-major a and rhs are the
    column-major operands LAPACK wants, so that neither is copied into that layout first.
    Measured (1 thread, AMD EPYC under load, [128, 64, 64] a): 2.3 ms against 8.3 ms for
    ``solve_triangular(a, rhs, upper=False)`` with the 96 columns of a block's frames,
    forward and backward 9-10 ms against 19-23 ms with 64 (PaTH training at L = 64)."""
    upper = a.transpose(-1, -2)
    solved = torch.linalg.solve_triangular(
        upper, rhs.transpose(-1, -2), upper=True, left=False, unitriangular=True
    )
    return solved.transpose(-1, -2)


def ut_blocks(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, frames: bool) -> tuple[Tensor, ...]:
    """The UT transform of each block (``[..., n, C, h_d]`` and ``[..., n, C]``, float32).

    Returns the block's causal logits (of q as given, ``[..., n, C, C]``, the upper triangle
    meaningless) and, with ``frames``, its queries moved back to the block's start
    (q_i H_i ... H_first), its keys moved on to the block's end (H_last ... H_{j+1} k_j) and the
    block's whole product as a matrix acting on row vectors from the right,
    P = I - W^T T (beta W) (``[..., n, h_d, h_d]``), as ``naive_path_attn`` computes them, with
    T = (I + strictly_lower(beta W W^T))^-1 applied by unit-triangular solves."""
    size = w.shape[-2]
    strict = torch.ones(size, size, dtype=w.dtype, device=w.device).tril(-1)
    wb = w * beta.unsqueeze(-1)
    qk, qw = q @ k.transpose(-1, -2), q @ w.transpose(-1, -2)
    wbk, wbw = wb @ k.transpose(-1, -2), wb @ w.transpose(-1, -2)
    qw = qw * (strict + torch.eye(size, dtype=w.dtype, device=w.device))  # q_i . w_s, s <= i
    rhs = wbk * strict  # beta_t w_t . k_j for t > j
    if frames:
        rhs = torch.cat([rhs, wb], -1)
    solved = unit_lower_solve(wbw, rhs)  # T @ rhs
    twbk = solved[..., :size]  # [.., C_t, C_j]: the reflections after j, applied to k_j
    flat = qk.shape[:-2].numel()
    logits = torch.baddbmm(
        qk.reshape(flat, size, size),
        qw.reshape(flat, size, size),
        twbk.reshape(flat, size, size),
        alpha=-1,
    ).view(qk.shape)
    if not frames:
        return (logits,)
    twb = solved[..., size:]
    q_start = q - qw @ twb
    k_end = k - twbk.transpose(-1, -2) @ w
    product = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device) - w.transpose(-1, -2) @ twb
    return logits, q_start, k_end, product


def attention_with_lse(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """softmax(q k^T) v with no mask (q already scaled), and the log-sum-exp of each query's
    logits. On the CPU in float32 and without gradients by the fused SDPA kernel that returns
    it (the kernel ``scaled_dot_product_attention`` runs there; it wants v as wide as q and k,
    and its backward takes no gradient of the log-sum-exp, which the merge of blocks needs);
    otherwise written out (tests/positions/test_householder.py holds both to the paper's
    formula).

    The kernel is a private op (``aten::_scaled_dot_product_flash_attention_for_cpu``, looked
    up by name, so a torch without it takes the written-out path) because no public API
    returns fused attention's log-sum-exp on the CPU in torch 2.13:
    ``F.scaled_dot_product_attention`` returns the output alone;
    ``torch.nn.attention.varlen.varlen_attn`` has ``return_aux`` but runs on CUDA only (on
    the CPU it raises NotImplementedError for ``aten::_flash_attention_forward``); and
    FlexAttention's ``return_aux`` is fast only compiled by Inductor, which needs a C++
    compiler at run time (compiled FlexAttention ran slower than chunked masks on this CPU:
    ``pe_bench.model.attention.use_flex``)."""
    cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    fused = q.device.type == "cpu" and q.dtype == torch.float32 and v.shape[-1] == q.shape[-1]
    if cpu_sdpa is not None and fused and not grad:
        out, lse = cpu_sdpa(q, k, v, scale=1.0)
        return out, lse
    logits = q @ k.transpose(-1, -2)
    lse = logits.logsumexp(-1)
    return (logits - lse.unsqueeze(-1)).exp() @ v, lse


def path_attention(
    q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, chunk: int = CHUNK
) -> Tensor:
    """PaTH's causal attention, ``[b, n_h, s, h_d]`` in float32, from q, k, v and unit w
    ``[b, n_h, s, h_d]`` and beta ``[b, n_h, s]`` (float32), by blocks of ``chunk`` tokens
    (the module docstring): the logits are q_i^T H_i ... H_{j+1} k_j / sqrt(h_d)."""
    b, h, s, d = q.shape
    n = -(-s // chunk)
    size = min(chunk, s)
    pad = n * size - s  # padded tokens come last: w = 0 makes their H the identity

    def blocks(t: Tensor) -> Tensor:
        return F.pad(t, (0, 0, 0, pad)).view(b, h, n, size, t.shape[-1])

    q = q / math.sqrt(d)  # the logits' scale, once
    beta = F.pad(beta, (0, pad)).view(b, h, n, size)
    logits, *frames = ut_blocks(blocks(q), blocks(k), blocks(w), beta, frames=n > 1)
    future = torch.full((size, size), float("-inf"), device=q.device).triu(1)
    logits = logits + future
    if n == 1:  # one block: its own attention is all
        return (logits.softmax(-1) @ v.unsqueeze(2)).squeeze(2)
    q_start, k_end, product = frames
    local_lse = logits.logsumexp(-1)  # [b, h, n, C]
    out = (logits - local_lse.unsqueeze(-1)).exp() @ blocks(v)  # each block attending itself
    outputs, frame = [out[:, :, 0]], k_end[:, :, 0]  # keys before block c, in c's frame
    for c in range(1, n):
        far, far_lse = attention_with_lse(q_start[:, :, c], frame, v[:, :, : c * size])
        near_lse = local_lse[:, :, c]
        top = torch.maximum(far_lse, near_lse).unsqueeze(-1)
        far_w, near_w = (far_lse.unsqueeze(-1) - top).exp(), (near_lse.unsqueeze(-1) - top).exp()
        outputs.append((far_w * far + near_w * out[:, :, c]) / (far_w + near_w))
        if c + 1 < n:
            frame = torch.cat([frame @ product[:, :, c].transpose(-1, -2), k_end[:, :, c]], 2)
    return torch.cat(outputs, dim=2)[:, :, :s]


class _Reflections(nn.Module):
    """One layer's w_t and beta_t from its input x_t, as ``PaTHAttention.forward``:
    w = l2norm(SiLU(causal_conv(W_up W_down x))) per head, beta = 2 sigmoid(W_beta x + b)."""

    def __init__(self, dims: ModelDims, rank: int, conv_size: int) -> None:
        super().__init__()
        d = dims.d_model
        self.down = nn.Linear(d, rank, bias=False)
        self.up = nn.Linear(rank, d, bias=False)
        self.conv = nn.Conv1d(d, d, conv_size, groups=d, bias=False)  # depthwise, causal pad
        self.beta = nn.Linear(d, dims.num_heads)
        for module in (self.down, self.up, self.conv, self.beta):
            nn.init.normal_(module.weight, std=0.02)
        nn.init.zeros_(self.beta.bias)
        self.heads = dims.num_heads

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Unit w ``[b, n_h, s, h_d]`` and beta ``[b, n_h, s]`` in float32 from x ``[b, s, d]``."""
        x = x.float()
        w = F.linear(F.linear(x, self.down.weight.float()), self.up.weight.float())
        taps = self.conv.weight.float()[:, 0]  # [d, width]: tap i reads token t - width + 1 + i
        width = taps.shape[-1]
        padded = F.pad(w, (0, 0, width - 1, 0))
        w = sum(padded[:, i : i + w.shape[1]] * taps[:, i] for i in range(width))
        w = F.silu(w).unflatten(-1, (self.heads, -1)).transpose(1, 2)
        w = w * torch.rsqrt(w.square().sum(-1, keepdim=True) + L2_EPS)
        beta = 2 * torch.sigmoid(F.linear(x, self.beta.weight.float(), self.beta.bias.float()))
        return w, beta.transpose(1, 2)


@register("path")
class PaTH(PositionScheme):
    """PaTH attention (module docstring) with fla's ``PaTHAttention`` defaults: per layer, w
    from a rank-``w_rank`` projection of the layer's input through a causal depthwise
    convolution of width ``conv_size`` with SiLU, normalised per head, and beta per head. It
    reads no position, so it is not ``relative`` in the kit's sense (the logits depend on the
    tokens between query and key) and needs no ``max_positions``."""

    def __init__(self, dims: ModelDims, *, w_rank: int = 32, conv_size: int = 3) -> None:
        super().__init__(dims)
        self.reflections = nn.ModuleList(
            _Reflections(dims, w_rank, conv_size) for _ in range(dims.num_layers)
        )

    @property
    def caveat(self) -> str:
        return (
            "PaTH as fla's PaTHAttention (no forget gate, no QK norm) inside pe-bench's "
            "LayerNorm/GELU trunk, not fla's RMSNorm/SwiGLU one; no PaTH-FoX; the paper's "
            "state-tracking tasks are not in a language-model loss, and its language models "
            "are far larger than this one"
        )

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, layer: int) -> Tensor:
        w, beta = self.reflections[layer](x)
        return path_attention(q.float(), k.float(), v.float(), w, beta).to(v.dtype)
