"""PaTH attention: pinned to fla's reference (``naive_path_attn``), equal to the paper's product
of Householder reflections, causal, reading no position, and its blockwise form exact across
blocks far past the training length."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pe_bench.conformance import assert_conforms
from pe_bench.model.attention import attention_path
from pe_bench.positions import build_scheme
from pe_bench.positions.householder import attention_with_lse, path_attention

from ..helpers import tiny_model

# fla-org/flash-linear-attention at bc3b101d (fla/ops/path_attn/naive.py, naive_path_attn),
# run on this machine's CPU (torch 2.13, float32, einops 0.8.2) on the inputs of
# ``closed_form_inputs`` with g = 0 (no forget gate), scale = D^-0.5 and chunk_size=4:
# [T, D] per head of its output [B=1, T=10, H=2, D=4].
FLA_NAIVE = [
    [
        [0.479426, -0.099833, -0.644218, -0.963558],
        [0.664859, 0.235743, -0.275725, -0.690874],
        [0.626898, 0.346153, -0.055514, -0.437788],
        [0.456701, 0.364356, 0.144731, -0.125453],
        [0.087883, 0.175407, 0.201656, 0.157460],
        [-0.177754, -0.099136, 0.014114, 0.122433],
        [-0.163008, -0.171355, -0.119843, -0.026467],
        [0.003974, -0.026317, -0.047415, -0.051950],
        [0.154768, 0.151826, 0.095847, 0.006386],
        [0.099007, 0.180135, 0.198337, 0.147254],
    ],
    [
        [0.783327, 0.295520, -0.295520, -0.783327],
        [0.847635, 0.647730, 0.221554, -0.282017],
        [0.516465, 0.630562, 0.524386, 0.235027],
        [-0.119975, 0.172521, 0.404751, 0.495590],
        [-0.475352, -0.379190, -0.150566, 0.130655],
        [-0.190815, -0.350319, -0.387447, -0.289228],
        [0.208876, 0.058397, -0.112482, -0.244068],
        [0.377088, 0.342121, 0.187642, -0.032387],
        [0.400875, 0.389306, 0.241741, 0.009729],
        [0.284609, 0.295933, 0.203878, 0.040603],
    ],
]


def closed_form_inputs() -> tuple[torch.Tensor, ...]:
    """q, k, v, unit w ``[1, H=2, T=10, D=4]`` and beta in [0, 2] ``[1, 2, 10]`` from sines
    and cosines of t, h, d (what the pinned reference was run on, in fla's [B, T, H, D])."""
    t = torch.arange(10.0).view(1, 10, 1, 1)
    h = torch.arange(2.0).view(1, 1, 2, 1)
    d = torch.arange(4.0).view(1, 1, 1, 4)
    q = torch.sin(0.7 * t + 1.3 * h + 0.3 * d + 0.1)
    k = torch.cos(0.5 * t - 0.9 * h + 0.8 * d)
    v = torch.sin(1.1 * t + 0.4 * h - 0.6 * d + 0.5)
    w = F.normalize(torch.cos(0.3 * t + 2.1 * h + 1.7 * d + 0.2), dim=-1)
    beta = (1 + torch.sin(0.9 * t + 0.5 * h)).squeeze(-1)
    return (*(x.transpose(1, 2) for x in (q, k, v, w)), beta.transpose(1, 2))


def product_logits(q, k, w, beta) -> torch.Tensor:
    """The paper's logits written out, token by token in float64: q_i^T H_i ... H_{j+1} k_j
    (query i's row vector carried back one reflection per key), -inf above the diagonal."""
    q, k, w, beta = (x.double() for x in (q, k, w, beta))
    s = q.shape[-2]
    logits = torch.full((*q.shape[:-2], s, s), float("-inf"), dtype=torch.float64)
    for i in range(s):
        row = q[..., i, :]
        for j in range(i, -1, -1):
            logits[..., i, j] = (row * k[..., j, :]).sum(-1)
            reach = (row * w[..., j, :]).sum(-1, keepdim=True)
            row = row - beta[..., j, None] * reach * w[..., j, :]  # row H_j
    return logits / math.sqrt(q.shape[-1])


def random_inputs(b: int, h: int, s: int, d: int, seed: int = 0, grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, s, d, generator=g) for _ in range(3))
    w = F.normalize(torch.randn(b, h, s, d, generator=g), dim=-1)
    beta = 2 * torch.rand(b, h, s, generator=g)
    return [x.requires_grad_(grad) for x in (q, k, v, w, beta)]


@pytest.mark.parametrize("chunk", [4, 3, 64])
def test_path_attention_equals_fla_naive_reference(chunk):
    q, k, v, w, beta = closed_form_inputs()
    out = path_attention(q, k, v, w, beta, chunk=chunk)
    assert torch.allclose(out[0], torch.tensor(FLA_NAIVE), atol=2e-6)


@pytest.mark.parametrize(("s", "chunk"), [(37, 8), (37, 64), (16, 4), (5, 2)])
def test_path_attention_is_the_papers_product_of_reflections(s, chunk):
    q, k, v, w, beta = random_inputs(2, 3, s, 8)
    expected = product_logits(q, k, w, beta).softmax(-1) @ v.double()
    assert torch.allclose(
        path_attention(q, k, v, w, beta, chunk=chunk).double(), expected, atol=1e-5
    )


def test_gradients_across_blocks_equal_the_papers_formula():
    """Backward through the blockwise form (the fused SDPA with its log-sum-exp, the frames)
    gives the written-out formula's gradients for every input."""
    inputs = random_inputs(1, 2, 21, 4, seed=3, grad=True)
    q, k, v, w, beta = inputs
    cotangent = torch.randn(1, 2, 21, 4, generator=torch.Generator().manual_seed(4))
    ours = torch.autograd.grad(
        (path_attention(q, k, v, w, beta, chunk=8) * cotangent).sum(), inputs
    )
    ref = product_logits(q, k, w, beta).softmax(-1) @ v.double()
    theirs = torch.autograd.grad((ref * cotangent.double()).sum(), inputs)
    for name, a, b in zip(["q", "k", "v", "w", "beta"], ours, theirs, strict=True):
        assert torch.allclose(a, b, atol=1e-5), name


def test_no_reflection_is_causal_softmax_attention():
    """beta = 0: every H_t is the identity, and PaTH is NoPE."""
    q, k, v, w, beta = random_inputs(2, 2, 70, 8)
    out = path_attention(q, k, v, w, torch.zeros_like(beta), chunk=16)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5)


def test_logits_depend_on_the_tokens_between_alone():
    """With v the identity the output rows are the attention weights: the log-ratio of two
    keys' weights (a logit difference) is the same whatever tokens come before them, and
    changes when a reflection between them changes."""
    s, m = 12, 5
    q, k, _, w, beta = random_inputs(1, 1, s, s, seed=5)
    first = path_attention(q, k, torch.eye(s).expand(1, 1, s, s), w, beta, chunk=4)
    fq, fk, _, fw, fbeta = random_inputs(1, 1, m, s, seed=6)  # m other tokens in front
    later = path_attention(
        torch.cat([fq, q], 2),
        torch.cat([fk, k], 2),
        torch.eye(s + m).expand(1, 1, s + m, s + m),
        torch.cat([fw, w], 2),
        torch.cat([fbeta, beta], -1),
        chunk=4,
    )[..., m:, m:]
    keep = torch.ones(s, s, dtype=torch.bool).tril()[1:, 1:]  # rows 1.., keys 1..i

    def log_ratio(weights: torch.Tensor) -> torch.Tensor:  # key j against key 0, row by row
        return (weights[..., 1:, 1:].log() - weights[..., 1:, :1].log())[..., keep]

    assert torch.allclose(log_ratio(first), log_ratio(later), atol=1e-4)
    flipped = beta.clone()
    flipped[..., 3] = 2 - flipped[..., 3]  # H_3 lies between key 0 and every query from 3 on
    third = path_attention(q, k, torch.eye(s).expand(1, 1, s, s), w, flipped, chunk=4)
    assert torch.allclose(first[..., :3, :], third[..., :3, :], atol=1e-6)
    assert not torch.allclose(first[..., 3:, :], third[..., 3:, :], atol=1e-3)


def test_blocks_agree_far_past_training():
    """1024 tokens by blocks of 64 (16 frames carried) equal one block of 1024 (one UT
    transform), and 4096 tokens stay finite with rows of weights summing to 1."""
    q, k, v, w, beta = random_inputs(1, 2, 1024, 8, seed=7)
    by_blocks = path_attention(q, k, v, w, beta)
    assert torch.allclose(by_blocks, path_attention(q, k, v, w, beta, chunk=1024), atol=1e-4)
    q, k, v, w, beta = random_inputs(1, 2, 4096, 8, seed=8)
    ones = path_attention(q, k, torch.ones_like(v), w, beta)
    assert torch.isfinite(ones).all() and torch.allclose(ones, torch.ones_like(ones), atol=1e-5)


def test_reflections_are_fla_layers():
    """w and beta as fla's PaTHAttention.forward makes them: w_proj = Linear(d, 32) then
    Linear(32, d), a ShortConvolution (nn.Conv1d, groups=d, padding=K-1, its first T outputs)
    with SiLU, l2_norm per head (x / sqrt(sum x^2 + 1e-6)); beta = 2 sigmoid(bt_proj(x)). The
    weights start as fla's _init_weights sets them: N(0, 0.02), biases 0."""
    model = tiny_model("path")
    layer = model.pe.reflections[1]
    for m in (layer.down, layer.up, layer.conv, layer.beta):
        assert m.weight.std().item() == pytest.approx(0.5, rel=0.3)  # tiny_model: N(0, 0.5)
    fresh = build_scheme({"name": "path"}, model.pe.dims).reflections[0]
    assert (
        fresh.up.weight.std().item() == pytest.approx(0.02, rel=0.2) and not fresh.beta.bias.any()
    )
    x = torch.randn(2, 11, 32)
    w, beta = layer(x)
    conv = torch.nn.Conv1d(32, 32, 3, groups=32, bias=False, padding=2)
    conv.weight.data.copy_(layer.conv.weight)
    y = conv(layer.up(layer.down(x)).transpose(1, 2))[..., :11].transpose(1, 2)
    y = F.silu(y).view(2, 11, 4, 8)
    y = y / torch.sqrt(y.square().sum(-1, keepdim=True) + 1e-6)
    assert torch.allclose(w, y.transpose(1, 2), atol=1e-6)
    assert torch.allclose(beta, 2 * torch.sigmoid(layer.beta(x)).transpose(1, 2), atol=1e-6)


def test_path_attends_itself_from_the_layer_input_and_reads_no_position():
    model = tiny_model("path")
    assert attention_path(model.pe) == "scheme"
    q, k, v, _, _ = random_inputs(2, 4, 30, 8)
    x, pos = torch.randn(2, 30, 32), torch.arange(30)
    out = model.pe.attend(x, q, k, v, pos, 0)
    assert torch.equal(out, model.pe.attend(x, q, k, v, pos + 1000, 0))
    assert not torch.allclose(out, model.pe.attend(x.flip(1), q, k, v, pos, 0))


def test_path_conforms():
    report = assert_conforms("path")
    assert report["attend"].status == "PASS"


def test_fused_log_sum_exp_equals_the_written_out_one():
    """The CPU kernel behind ``attention_with_lse`` (no gradients) gives the written-out
    softmax's output and log-sum-exp (taken with gradients on)."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) for n in (7, 19, 19))
    with torch.no_grad():
        fused = attention_with_lse(q, k, v)
    written = attention_with_lse(q, k, v.requires_grad_())
    for a, b in zip(fused, written, strict=True):
        assert torch.allclose(a, b.detach(), atol=1e-5)
