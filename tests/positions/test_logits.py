"""DAPE and SSMax: the MLP over heads and the s ln n temperature, pinned by hand against their
reference formulas, on the base schemes they extend."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pe_bench.errors import UserError
from pe_bench.model.attention import attention_logits, causal_allowed
from pe_bench.positions import build_scheme
from pe_bench.positions import logits as logits_module
from pe_bench.positions.base import WEIGHT_FLOOR
from tests.helpers import tiny_model

# ---- DAPE ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "base"), [("dape_kerple", "kerple_log"), ("dape_alibi", "alibi")])
def test_dape_with_a_zeroed_mlp_equals_its_base_scheme(dims, name, base):
    dape = build_scheme({"name": name}, dims)
    plain = build_scheme({"name": base}, dims)
    plain.load_state_dict(dape.state_dict(), strict=False)  # KERPLE's r1, r2
    for mlp in dape.mlps:
        torch.nn.init.zeros_(mlp[2].weight)
        torch.nn.init.zeros_(mlp[2].bias)
    q, k, pos = torch.randn(2, 4, 20, 8), torch.randn(2, 4, 20, 8), torch.arange(20)
    for layer in range(dims.num_layers):
        assert torch.allclose(
            attention_logits(dape, q, k, pos, pos, layer),
            attention_logits(plain, q, k, pos, pos, layer),
            atol=1e-6,
        )


def test_dape_mlp_is_the_references_shape_per_layer(dims):
    # chuanyang-Zheng/DAPE ``mlp2``: Linear(2 n_h, 32), LeakyReLU, Linear(32, n_h), per layer
    dape = build_scheme({"name": "dape_alibi"}, dims)
    assert len(dape.mlps) == dims.num_layers
    first, act, last = dape.mlps[0]
    assert (first.in_features, first.out_features) == (2 * dims.num_heads, 32)
    assert isinstance(act, torch.nn.LeakyReLU) and act.negative_slope == 0.01
    assert (last.in_features, last.out_features) == (32, dims.num_heads)
    assert not torch.equal(dape.mlps[0][0].weight, dape.mlps[1][0].weight)


def test_dape_logits_by_hand(dims):
    # Width 1, W1 = 1 on the A inputs and 3 on the B inputs (the reference concatenates the
    # logits first, the bias second), W2 = 2 per head: f_h(i, j) = 2 LeakyReLU(sum_h A_h +
    # 3 sum_h B_h), and the logits A + B + f (ALiBi's B).
    dape = build_scheme({"name": "dape_alibi", "mlp_width": 1}, dims)
    first, _, last = dape.mlps[1]
    with torch.no_grad():
        first.weight.copy_(torch.tensor([[1.0] * 4 + [3.0] * 4]))
        first.bias.zero_(), last.weight.fill_(2.0), last.bias.zero_()
    q, k, pos = torch.randn(1, 4, 6, 8), torch.randn(1, 4, 6, 8), torch.arange(6)
    got = attention_logits(dape, q, k, pos, pos, layer=1)
    a = (q @ k.transpose(-2, -1))[0] / math.sqrt(8)  # [n_h, s, s]
    slopes = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]  # ALiBi at 4 heads
    for i, j in [(5, 0), (5, 4), (3, 3), (2, 1)]:
        b = [-m * (i - j) for m in slopes]
        total = sum(a[h, i, j].item() + 3 * b[h] for h in range(4))
        f = 2 * (total if total > 0 else 0.01 * total)
        for h in range(4):
            assert got[0, h, i, j].item() == pytest.approx(a[h, i, j].item() + b[h] + f, abs=1e-5)


def test_dape_query_slices_equal_one_pass(dims, monkeypatch):
    dape = build_scheme({"name": "dape_kerple"}, dims)
    q, k, pos = torch.randn(2, 4, 30, 8), torch.randn(2, 4, 30, 8), torch.arange(30)
    whole = attention_logits(dape, q, k, pos, pos)
    monkeypatch.setattr(logits_module, "DAPE_BUDGET", 2 * 30 * 9 * 7)  # slices of 7 queries
    assert torch.allclose(attention_logits(dape, q, k, pos, pos), whole, atol=1e-6)


@pytest.mark.parametrize("name", ["dape_kerple", "dape_alibi"])
@pytest.mark.parametrize("s_q", [30, 7, 1])  # the whole window, or its last queries
@pytest.mark.parametrize("budget", [None, 2 * 32 * 7])  # rows whole, or blocks of 7 keys
def test_dape_rows_equal_slices(dims, monkeypatch, name, s_q, budget):
    """Row by row, with f's B part read from a table by distance (``rows_logits``), the
    logits equal those by slices of [A; B; 1] (``sliced_logits``) on every entry, the
    future keys' included, whatever the blocks of keys."""
    dape = build_scheme({"name": name}, dims)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in dape.parameters():
            p.add_(torch.randn(p.shape, generator=generator))
    q, k = torch.randn(2, 4, s_q, 8), torch.randn(2, 4, 30, 8)
    q_pos, k_pos = torch.arange(30 - s_q, 30), torch.arange(30)
    monkeypatch.setattr(logits_module, "ROW_PAIRS", 10**9)
    sliced = attention_logits(dape, q, k, q_pos, k_pos, layer=1)
    monkeypatch.setattr(logits_module, "ROW_PAIRS", 0)
    if budget:
        monkeypatch.setattr(logits_module, "DAPE_BUDGET", budget)
    rows = attention_logits(dape, q, k, q_pos, k_pos, layer=1)
    assert torch.allclose(rows, sliced, rtol=1e-5, atol=1e-5), (rows - sliced).abs().max()


@pytest.mark.slow
def test_dape_is_finite_and_relative_far_past_training(dims):
    dape = build_scheme({"name": "dape_kerple"}, dims)
    q, k, pos = torch.randn(1, 4, 512, 8), torch.randn(1, 4, 512, 8), torch.arange(512)
    logits = attention_logits(dape, q, k, pos, pos)
    allowed = causal_allowed(512, 512, q.device)
    assert torch.isfinite(logits[..., allowed]).all()
    shifted = attention_logits(dape, q, k, pos + 3000, pos + 3000)
    assert torch.allclose(logits[..., allowed], shifted[..., allowed], atol=1e-4)


def test_dape_rejects_a_zero_width(dims):
    with pytest.raises(UserError, match="pe.mlp_width must be >= 1, got 0"):
        build_scheme({"name": "dape_alibi", "mlp_width": 0}, dims)


# ---- SSMax -----------------------------------------------------------------------------------


def test_ssmax_scale_is_s_ln_n_per_layer_and_head(dims):
    ssmax = build_scheme({"name": "ssmax_nope", "init_s": 0.5}, dims)
    with torch.no_grad():
        ssmax.s[1] = torch.tensor([0.5, 1.0, 2.0, -1.0])
    q_pos = torch.tensor([0, 1, 3, 63])  # n = 1, 2, 4, 64 keys
    ln_n = torch.tensor([0.0, math.log(2), math.log(4), math.log(64)])
    assert torch.allclose(ssmax.logit_scale(q_pos, q_pos, 0), 0.5 * ln_n.expand(4, 4))
    expected = torch.tensor([0.5, 1.0, 2.0, -1.0]).unsqueeze(-1) * ln_n
    assert torch.allclose(ssmax.logit_scale(q_pos, q_pos, 1), expected)


def test_ssmax_default_s_is_one_at_the_training_length(dims):
    ssmax = build_scheme({"name": "ssmax_rope"}, dims)
    assert torch.allclose(ssmax.s, torch.full((2, 4), 1 / math.log(16)))
    scale = ssmax.logit_scale(torch.tensor([15, 63, 1023]), torch.arange(1024), 0)
    # s ln n: 1 at n = L_train = 16, growing as ln n past it (ln 64 / ln 16 = 1.5, then 2.5)
    assert torch.allclose(scale[0], torch.tensor([1.0, 1.5, 2.5]), atol=1e-6)


@pytest.mark.parametrize(("name", "base"), [("ssmax_nope", "nope"), ("ssmax_rope", "rope")])
def test_ssmax_multiplies_the_base_logits_of_each_query(dims, name, base):
    ssmax, plain = build_scheme({"name": name}, dims), build_scheme({"name": base}, dims)
    with torch.no_grad():
        ssmax.s.normal_()
    q, k, pos = torch.randn(2, 4, 24, 8), torch.randn(2, 4, 24, 8), torch.arange(24)
    expected = attention_logits(plain, q, k, pos, pos) * ssmax.logit_scale(pos, pos, 1)[..., None]
    assert torch.allclose(attention_logits(ssmax, q, k, pos, pos, layer=1), expected, atol=1e-5)


def test_ssmax_alibi_scales_the_bias_too(dims):
    ssmax, alibi = (
        build_scheme({"name": "ssmax_alibi"}, dims),
        build_scheme({"name": "alibi"}, dims),
    )
    with torch.no_grad():
        ssmax.s.normal_()
    q, k, pos = torch.randn(2, 4, 24, 8), torch.randn(2, 4, 24, 8), torch.arange(24)
    scale = ssmax.logit_scale(pos, pos, 0)[..., None]  # [n_h, s_q, 1]
    expected = (
        attention_logits(alibi, q, k, pos, pos)
    ) * scale  # (q.k / sqrt(h_d) - m (i-j)) s ln n
    assert torch.allclose(attention_logits(ssmax, q, k, pos, pos), expected, atol=1e-5)


def test_ssmax_alibi_model_attends_with_the_scaled_bias(monkeypatch):
    """Through the model: the bias path gets the scaled bias (logit_bias), per layer."""
    model = tiny_model("ssmax_alibi")
    seen = []
    real = model.pe.logit_bias
    monkeypatch.setattr(model.pe, "logit_bias", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    with torch.no_grad():
        out = model(torch.randint(0, 256, (1, 64)))  # 4x the training length
    assert torch.isfinite(out).all()
    assert [kw["layer"] for kw in seen] == [0, 1]  # built per layer: no mask shared


def test_ssmax_reads_positions_not_indices(dims):
    """A window that starts later (positions from 100) is scaled for its positions, and queries
    passed alone get their own rows' scale."""
    ssmax = build_scheme({"name": "ssmax_nope", "init_s": 1.0}, dims)
    pos = torch.arange(100, 110)
    assert torch.allclose(ssmax.logit_scale(pos, pos, 0)[0], (pos + 1.0).log())
    q, k = torch.randn(1, 4, 10, 8), torch.randn(1, 4, 10, 8)
    full = attention_logits(ssmax, q, k, pos, pos)
    alone = attention_logits(ssmax, q[..., -3:, :], k, pos[-3:], pos)
    assert torch.allclose(full[..., -3:, :], alone, atol=1e-6)


def test_ssmax_sharpens_attention_past_training(dims):
    """The point of SSMax: with s > 0 a query that sees more keys gets a larger temperature,
    so a key that stands out keeps more of the weight than plain softmax leaves it."""
    ssmax = build_scheme({"name": "ssmax_nope", "init_s": 0.43}, dims)
    n = 1024
    logits = torch.full((1, 1, 1, n), -2.0)
    logits[..., -1] = 3.0  # the paper's Figure 1 input
    pos = torch.tensor([n - 1])
    scaled = logits * ssmax.logit_scale(pos, pos, 0)[0, :, None]
    plain_top = F.softmax(logits, -1)[..., -1].item()
    assert plain_top < 0.13  # attention fades: e^5 / (e^5 + 1023)
    assert F.softmax(scaled, -1)[..., -1].item() > 0.8  # 1024^(0.43 * 5) / (... + 1023)


def test_softmax_weights_at_most_the_floor_are_zero(dims):
    """The default ``attention_weights`` (DAPE's, ReRoPE's) zeroes weights <= 1e-30 and keeps
    the others as the softmax gives them, with gradients as well."""
    dape = build_scheme({"name": "dape_alibi"}, dims)
    logits = torch.linspace(-120.0, 0.0, 64).expand(1, 2, 4, 64).clone()
    allowed = causal_allowed(4, 64, logits.device)
    got = dape.attention_weights(logits, allowed)
    softmax = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
    assert (got[softmax <= WEIGHT_FLOOR] == 0).all() and (softmax[softmax > 0] <= 1e-30).any()
    assert torch.equal(got[softmax > WEIGHT_FLOOR], softmax[softmax > WEIGHT_FLOOR])
    leaf = logits.requires_grad_()
    dape.attention_weights(leaf, allowed)[..., -1].sum().backward()
    assert torch.isfinite(leaf.grad).all()
