"""ALiBi, T5, KERPLE and Sandwich: defining numbers pinned by hand, and the bias each adds."""

from __future__ import annotations

import math

import pytest
import torch

from pe_bench.positions import build_scheme
from pe_bench.positions.bias import alibi_slopes, t5_bucket


def test_alibi_slopes_power_of_two():
    # Press et al. 2022: for 8 heads the slopes are 1/2, 1/4, ..., 1/256.
    assert alibi_slopes(8) == [2.0**-h for h in range(1, 9)]


def test_alibi_slopes_twelve_heads():
    # Not a power of two: the 8 slopes of 8 heads, then every other slope of 16 heads
    # (2^-0.5, 2^-1, 2^-1.5, ...), taking 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
    expected = [2.0**-h for h in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    assert all(
        math.isclose(a, b, rel_tol=1e-12) for a, b in zip(alibi_slopes(12), expected, strict=True)
    )


def test_alibi_bias_is_minus_slope_times_distance(dims):
    alibi = build_scheme({"name": "alibi"}, dims)
    pos = torch.arange(6)
    bias = alibi.score_bias(None, None, pos, pos, 0)  # [n_h, s, s]
    slopes = alibi_slopes(dims.num_heads)
    for h in range(dims.num_heads):
        for i in range(6):
            for j in range(i + 1):
                assert math.isclose(bias[h, i, j].item(), -slopes[h] * (i - j), rel_tol=1e-6)


def test_t5_buckets_at_pinned_distances():
    # num_buckets=32, max_distance=128, max_exact=16 (HF T5, bidirectional=False):
    # n < 16 -> n; else 16 + floor(ln(n/16) / ln(128/16) * 16), capped at 31.
    #   17: ln(17/16)/ln 8 * 16 = 0.466 -> 16;  64: ln 4/ln 8 * 16 = 10.67 -> 26;
    #   127: ln(127/16)/ln 8 * 16 = 15.94 -> 31;  128 and 1000: 32, 41 -> capped at 31.
    n = torch.tensor([0, 1, 15, 16, 17, 64, 127, 128, 1000])
    assert t5_bucket(n).tolist() == [0, 1, 15, 16, 16, 26, 31, 31, 31]


# T5 at L_train = 16: 32 buckets, max_distance = 32 (the default), max_exact = 16. HF T5's
# ``_relative_position_bucket(j - i, bidirectional=False)``: bucket n for n = i - j < 16, else
# 16 + floor(16 log2(n / 16)), capped at 31; future keys (n < 0) in bucket 0. By hand:
#   20: 16 log2(1.25) = 5.15 -> 21;  24: 16 log2(1.5) = 9.36 -> 25;  31: 15.27 -> 31;
#   32 and 39: 16 and 20.9 -> capped at 31.
T5_PAIRS = {  # (i, j) -> bucket of n = i - j
    (0, 0): 0,
    (7, 2): 5,
    (20, 5): 15,
    (30, 14): 16,
    (25, 5): 21,
    (30, 6): 25,
    (31, 0): 31,
    (39, 7): 31,
    (39, 0): 31,
    (3, 9): 0,  # a future key
}


def test_t5_bias_by_hand(dims):
    """Entry (h, bucket) of the table holds 100 h + bucket, so each bias names its bucket and
    head: sqrt(h_d) (100 h + bucket) (x-transformers' ``RelativePositionBias(scale=dim_head **
    0.5)``), the same in every layer."""
    t5 = build_scheme({"name": "t5"}, dims)
    assert t5.max_distance == 32
    with torch.no_grad():
        t5.bias.weight.copy_(torch.arange(32).unsqueeze(1) + 100.0 * torch.arange(4))
    pos = torch.arange(40)
    bias = t5.score_bias(None, None, pos, pos, 0)  # [n_h, s_q, s_k]
    assert bias.shape == (4, 40, 40)
    for (i, j), bucket in T5_PAIRS.items():
        for h in range(4):
            expected = math.sqrt(8) * (100 * h + bucket)
            assert bias[h, i, j].item() == pytest.approx(expected, rel=1e-6), (h, i, j)
    assert torch.equal(bias, t5.score_bias(None, None, pos, pos, 1))


def test_t5_max_distance_defaults_to_what_training_reaches(dims):
    from pe_bench.positions import ModelDims

    def built(train_len):
        d = ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=1, train_len=train_len)
        return build_scheme({"name": "t5"}, d).max_distance

    assert built(512) == 128  # the paper's default once training covers it
    assert built(64) == 64  # never a bucket that no training distance reaches
    assert built(16) == 32  # at least num_buckets, so the log-spaced half exists
    assert build_scheme({"name": "t5", "max_distance": 100}, dims).max_distance == 100


def test_shared_bias_flags():
    """Sharing one mask across layers is only right for a term that ignores layer and content."""
    from pe_bench.positions import registered

    shared = {name for name, cls in registered().items() if cls.shared_bias}
    assert {"alibi", "t5"} <= shared
    assert "xl" not in shared  # per-layer W_R and content terms


def set_kerple(scheme, r1: float, r2: float) -> None:
    """Set every head's (r1, r2) through the scheme's own parametrisation."""
    from pe_bench.positions.bias import KerplePower, inverse_softplus

    with torch.no_grad():
        scheme.raw_r1.fill_(inverse_softplus(torch.tensor(r1)).item())
        if isinstance(scheme, KerplePower):
            scheme.raw_r2.fill_(torch.logit(torch.tensor(r2 / 2)).item())
        else:
            scheme.raw_r2.fill_(inverse_softplus(torch.tensor(r2)).item())


def test_kerple_log_bias_by_hand(dims):
    # -r1 ln(1 + r2 n) with r1 = 2, r2 = 0.5: n = 3 -> -2 ln 2.5 = -1.8326, n = 0 -> 0
    scheme = build_scheme({"name": "kerple_log"}, dims)
    set_kerple(scheme, 2.0, 0.5)
    bias = scheme.score_bias(None, None, torch.arange(8), torch.arange(8), 0)  # [n_h, 8, 8]
    assert bias.shape == (dims.num_heads, 8, 8)
    assert bias[1, 5, 2].item() == pytest.approx(-2 * math.log(2.5), rel=1e-6)
    assert bias[0, 4, 4].item() == 0.0
    # shared by all layers
    assert torch.equal(bias, scheme.score_bias(None, None, torch.arange(8), torch.arange(8), 1))


def test_kerple_power_bias_by_hand(dims):
    # -r1 n^r2 with r1 = 0.5, r2 = 1.5: n = 4 -> -0.5 * 8 = -4, n = 0 -> 0
    scheme = build_scheme({"name": "kerple_power"}, dims)
    set_kerple(scheme, 0.5, 1.5)
    bias = scheme.score_bias(None, None, torch.arange(8), torch.arange(8), 0)
    assert bias[2, 6, 2].item() == pytest.approx(-4.0, rel=1e-5)
    assert bias[2, 6, 6].item() == 0.0


def test_kerple_parameters_start_in_the_reference_ranges(dims):
    # chijames/KERPLE: log r1 ~ U(0, 2), r2 ~ U(0, 1); power r1 ~ U(0, 1), r2 ~ U(0, 2); >= 0.01
    for name, (high1, high2) in {"kerple_log": (2, 1), "kerple_power": (1, 2)}.items():
        torch.manual_seed(1)
        r1, r2 = build_scheme({"name": name}, dims).coefficients()
        assert r1.shape == r2.shape == (dims.num_heads,)
        assert ((r1 >= 0.01 - 1e-6) & (r1 <= high1)).all() and (
            (r2 >= 0.01 - 1e-6) & (r2 <= high2)
        ).all()


def test_kerple_power_gradient_is_finite_at_distance_zero(dims):
    scheme = build_scheme({"name": "kerple_power"}, dims)
    scheme.score_bias(None, None, torch.arange(6), torch.arange(6), 0).sum().backward()
    assert torch.isfinite(scheme.raw_r1.grad).all() and torch.isfinite(scheme.raw_r2.grad).all()


def test_sandwich_bias_by_hand(dims):
    # d' = head_dim = 8: frequencies 10000^(-2k/8) = 0.1, 0.01, 0.001, 0.0001 for k = 1..4;
    # bias_h(n) = (sum_k cos(n f_k) - 4) / (8 h / 4) for heads h = 1..4
    scheme = build_scheme({"name": "sandwich"}, dims)
    assert scheme.inv_freq.tolist() == pytest.approx([0.1, 0.01, 0.001, 0.0001])
    assert scheme.compression.tolist() == [2.0, 4.0, 6.0, 8.0]
    bias = scheme.score_bias(None, None, torch.arange(10), torch.arange(10), 0)
    inner = sum(math.cos(5 * f) for f in (0.1, 0.01, 0.001, 0.0001))
    for h in range(4):
        assert bias[h, 7, 2].item() == pytest.approx((inner - 4) / (2 * (h + 1)), abs=1e-6)
        assert bias[h, 3, 3].item() == pytest.approx(0.0, abs=1e-6)
