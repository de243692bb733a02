"""Transformer-XL: the strided relative shift and the fast path against the written-out formula."""

from __future__ import annotations

import pytest
import torch

from pe_bench.model.attention import causal_allowed
from pe_bench.positions import ModelDims, build_scheme
from pe_bench.positions.relative import rel_shift

DIMS = ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=3, train_len=16)


def pad_and_reshape_shift(x: torch.Tensor) -> torch.Tensor:
    """The original Transformer-XL ``_rel_shift`` (zero pad, reshape, drop a row)."""
    b, h, s_q, s_k = x.shape
    padded = torch.cat((x.new_zeros(b, h, s_q, 1), x), dim=-1).view(b, h, s_k + 1, s_q)
    return padded[:, :, 1:].reshape(b, h, s_q, s_k)


@pytest.mark.parametrize(("s_q", "s_k"), [(1, 1), (5, 5), (3, 9), (1, 6), (16, 16)])
def test_rel_shift_equals_original_on_allowed_entries(s_q, s_k):
    x = torch.randn(2, 3, s_q, s_k)
    allowed = causal_allowed(s_q, s_k, x.device)
    assert torch.equal(rel_shift(x)[..., allowed], pad_and_reshape_shift(x)[..., allowed])


@pytest.fixture
def xl():
    scheme = build_scheme({"name": "xl"}, DIMS)
    with torch.no_grad():
        for p in scheme.parameters():
            p.normal_(0, 0.5)  # u and v start at zero: make every term count
    return scheme


@pytest.mark.parametrize(("s_q", "s_k", "offset"), [(12, 12, 0), (12, 12, 100), (4, 12, 0)])
def test_fast_path_equals_reference_formula(xl, s_q, s_k, offset):
    q, k = torch.randn(2, 4, s_q, 8), torch.randn(2, 4, s_k, 8)
    k_pos = torch.arange(s_k) + offset
    q_pos = k_pos[-s_q:]
    allowed = causal_allowed(s_q, s_k, q.device)
    for layer in range(DIMS.num_layers):
        fast = xl.score_bias(q, k, q_pos, k_pos, layer)
        reference = xl.score_bias_reference(q, k, q_pos, k_pos, layer)
        assert torch.allclose(fast[..., allowed], reference[..., allowed], atol=1e-5)


def test_layers_have_their_own_projection(xl):
    q, k, pos = torch.randn(1, 4, 6, 8), torch.randn(1, 4, 6, 8), torch.arange(6)
    assert not torch.allclose(xl.score_bias(q, k, pos, pos, 0), xl.score_bias(q, k, pos, pos, 1))


def test_reference_formula_by_hand(xl):
    """One entry of the reference path, written out: (u.k_j + (q_i + v).W_R r_{i-j}) / sqrt(h_d)."""
    from pe_bench.positions.absolute import sinusoid_table

    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8)
    pos = torch.arange(5)
    got = xl.score_bias_reference(q, k, pos, pos, 2)
    i, j, h = 4, 1, 2
    r = xl.r_net[2](sinusoid_table(torch.tensor(i - j), 32)).view(4, 8)[h]
    expected = (xl.u[h] @ k[0, h, j] + (q[0, h, i] + xl.v[h]) @ r) / 8**0.5
    assert got[0, h, i, j].item() == pytest.approx(expected.item(), rel=1e-5)


def test_shaw_table_and_clipping_by_hand():
    # k = 16 (the paper's experiments): rows a_0..a_16 per layer, shared by the heads
    shaw = build_scheme({"name": "shaw"}, DIMS)
    assert shaw.rel_keys.shape == (DIMS.num_layers, 17, DIMS.head_dim)
    q, k = torch.randn(1, 4, 30, 8), torch.randn(1, 4, 30, 8)
    pos = torch.arange(30)
    bias = shaw.score_bias(q, k, pos, pos, 2)
    a = shaw.rel_keys[2]
    # i = 25, j = 3: distance 22, clipped to 16; i = 7, j = 5: distance 2
    assert bias[0, 1, 25, 3].item() == pytest.approx(
        (q[0, 1, 25] @ a[16]).item() / 8**0.5, rel=1e-5
    )
    assert bias[0, 3, 7, 5].item() == pytest.approx((q[0, 3, 7] @ a[2]).item() / 8**0.5, rel=1e-5)


@pytest.mark.parametrize(("s_q", "s_k", "offset"), [(12, 12, 0), (4, 40, 100)])
def test_shaw_fast_path_equals_reference(s_q, s_k, offset):
    shaw = build_scheme({"name": "shaw", "max_distance": 5}, DIMS)
    q, k = torch.randn(2, 4, s_q, 8), torch.randn(2, 4, s_k, 8)
    k_pos = torch.arange(s_k) + offset
    allowed = causal_allowed(s_q, s_k, q.device)
    fast = shaw.score_bias(q, k, k_pos[-s_q:], k_pos, 1)
    reference = shaw.score_bias_reference(q, k, k_pos[-s_q:], k_pos, 1)
    assert torch.allclose(fast[..., allowed], reference[..., allowed], atol=1e-5)
