"""RoPE, PI and NTK: frequencies pinned by hand, the rotation against the complex-number form,
and what the variants do at and past the training length."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from pe_bench.errors import UserError
from pe_bench.model.attention import attention_logits
from pe_bench.positions import ModelDims, build_scheme
from pe_bench.positions.rotary import apply_rotary
from tests.helpers import VARIANTS, WINDOWED

DIMS = ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=2, train_len=16)


def test_rope_frequencies():
    # theta_k = 10000^(-2k/8) for k = 0..3
    rope = build_scheme({"name": "rope"}, DIMS)
    assert torch.allclose(
        rope.inv_freq(16), torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=torch.float64)
    )


def test_pi_divides_every_frequency_by_the_factor():
    pi = build_scheme({"name": "pi", "factor": 4.0}, DIMS)
    expected = torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=torch.float64) / 4
    assert torch.allclose(pi.inv_freq(64), expected)


def test_ntk_keeps_highest_and_divides_lowest_frequency_by_the_factor():
    # base' = 10000 * 4^(8/6); theta_k = base'^(-2k/8): theta_0 = 1, theta_3 = 10000^-0.75 / 4
    ntk = build_scheme({"name": "ntk", "factor": 4.0}, DIMS)
    base = 10000 * 4 ** (8 / 6)
    expected = torch.tensor([base ** (-2 * k / 8) for k in range(4)], dtype=torch.float64)
    got = ntk.inv_freq(64)
    assert torch.allclose(got, expected)
    assert got[0].item() == pytest.approx(1.0)
    assert got[3].item() == pytest.approx(0.001 / 4)


@pytest.mark.parametrize("name", ["pi", "ntk"])
def test_variant_factor_defaults_to_eval_length_over_train_length(name):
    variant = build_scheme({"name": name}, DIMS)
    fixed = build_scheme({"name": name, "factor": 4.0}, DIMS)
    assert torch.allclose(variant.inv_freq(64), fixed.inv_freq(64))  # 64 / 16 = 4


@pytest.mark.parametrize("name", [n for n in VARIANTS if n not in WINDOWED])
@pytest.mark.parametrize("length", [8, 16])
def test_variant_equals_rope_at_and_below_training_length(name, length):
    rope = build_scheme({"name": "rope"}, DIMS)
    variant = build_scheme({"name": name}, DIMS)
    q, k = torch.randn(2, 4, length, 8), torch.randn(2, 4, length, 8)
    pos = torch.arange(length)
    assert torch.allclose(
        attention_logits(rope, q, k, pos, pos), attention_logits(variant, q, k, pos, pos)
    )
    assert torch.allclose(rope.inv_freq(length), variant.inv_freq(length))


@pytest.mark.parametrize("name", ["pi", "ntk"])
def test_variant_differs_from_rope_past_training_length(name):
    rope = build_scheme({"name": "rope"}, DIMS)
    variant = build_scheme({"name": name}, DIMS)
    q, k = torch.randn(1, 4, 64, 8), torch.randn(1, 4, 64, 8)
    pos = torch.arange(64)
    assert not torch.allclose(
        attention_logits(rope, q, k, pos, pos), attention_logits(variant, q, k, pos, pos)
    )


def test_rotation_matches_complex_form():
    """Half-split pairs (x_k, x_{k+d/2}) as complex numbers, multiplied by e^{i m theta_k}:
    q_m . k_n = Re sum_k q_k e^{i m theta_k} conj(k_k e^{i n theta_k})."""
    rope = build_scheme({"name": "rope", "base": 100.0}, DIMS)
    q, k = (
        torch.randn(1, 1, 5, 8, dtype=torch.float64),
        torch.randn(1, 1, 5, 8, dtype=torch.float64),
    )
    pos = torch.tensor([0, 3, 7, 20, 50])
    rq, rk = rope.transform_qk(q.float(), k.float(), pos, pos, 0)
    theta = 100.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    qc = torch.complex(q[..., :4], q[..., 4:]) * torch.exp(1j * pos.double().unsqueeze(-1) * theta)
    kc = torch.complex(k[..., :4], k[..., 4:]) * torch.exp(1j * pos.double().unsqueeze(-1) * theta)
    expected = (qc.unsqueeze(-2) * kc.conj().unsqueeze(-3)).sum(-1).real  # [1, 1, 5, 5]
    assert torch.allclose(rq.double() @ rk.double().transpose(-2, -1), expected, atol=1e-4)


def test_rope_rejects_odd_head_dim():
    with pytest.raises(UserError, match="even head_dim"):
        build_scheme(
            {"name": "rope"},
            ModelDims(d_model=12, num_heads=4, head_dim=3, num_layers=1, train_len=8),
        )


def test_factor_below_one_is_refused():
    with pytest.raises(UserError, match="factor must be >= 1"):
        build_scheme({"name": "pi", "factor": 0.5}, DIMS)


def test_rope_is_exact_at_long_positions():
    """Rotation angles are computed in float32 from integer positions: at position 16k a
    float32 angle is accurate to ~1e-3 rad, enough that q.k stays relative within tolerance."""
    rope = build_scheme({"name": "rope"}, DIMS)
    q, k = torch.randn(1, 4, 8, 8), torch.randn(1, 4, 8, 8)
    near, far = torch.arange(8), torch.arange(8) + 16384
    diff = attention_logits(rope, q, k, near, near) - attention_logits(rope, q, k, far, far)
    assert diff.abs().max().item() < 0.05 * math.sqrt(8)


def test_xpos_decay_by_hand():
    # zeta_k = (2k/8 + 0.4) / 1.4 = 2/7, 0.4643, 0.6429, 0.8214; with q and k only in pair 0,
    # the xPos logit is the RoPE logit times zeta_0^((i - j)/512): exactly 2/7 at i - j = 512.
    xpos = build_scheme({"name": "xpos"}, DIMS)
    assert xpos.zeta.tolist() == pytest.approx([2 / 7, 0.65 / 1.4, 0.9 / 1.4, 1.15 / 1.4])
    rope = build_scheme({"name": "rope"}, DIMS)
    q, k = torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8)
    q[..., 0], q[..., 4], k[..., 0], k[..., 4] = 1.0, 0.5, -0.3, 2.0
    pos = torch.tensor([100, 612])
    ratio = attention_logits(xpos, q, k, pos, pos) / attention_logits(rope, q, k, pos, pos)
    assert ratio[0, 0, 1, 0].item() == pytest.approx(2 / 7, rel=1e-4)  # i - j = 512
    assert ratio[0, 0, 1, 1].item() == pytest.approx(1.0, rel=1e-5)  # i = j


def test_dynamic_ntk_base_by_hand():
    # f = 2, L_train = 16, l = 64: base' = 10000 (2 * 64/16 - 1)^(8/6) = 10000 * 7^(4/3),
    # so theta_3 = base'^(-6/8) = 10000^-0.75 / 7; up to l = 16 plain RoPE.
    dyn = build_scheme({"name": "dynamic_ntk", "factor": 2.0}, DIMS)
    got = dyn.inv_freq(64)
    assert got[0].item() == pytest.approx(1.0)
    assert got[3].item() == pytest.approx(0.001 / 7)
    assert torch.allclose(dyn.inv_freq(16), build_scheme({"name": "rope"}, DIMS).inv_freq(16))
    assert dyn.context_len(torch.arange(40, 64)) == 64  # the largest position + 1, as HF


def test_yarn_ramp_by_hand():
    # h_d = 32, L_train = 64 (the quick suite): dim(r) = 32 ln(64 / (2 pi r)) / (2 ln 10000);
    # dim(32) = -1.99 -> low = 0, dim(1) = 4.03 -> high = 5: ramp k/5 for pairs 0..5, then 1.
    dims = ModelDims(d_model=128, num_heads=4, head_dim=32, num_layers=1, train_len=64)
    yarn = build_scheme({"name": "yarn"}, dims)
    assert yarn.ramp[:7].tolist() == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1, 1])
    theta = build_scheme({"name": "rope"}, dims).inv_freq(64)
    got = yarn.inv_freq(256)  # s = 256 / 64 = 4
    assert got[0].item() == theta[0].item()  # fastest pair unchanged
    assert got[2].item() == pytest.approx(0.6 * theta[2].item() + 0.4 * theta[2].item() / 4)
    assert torch.allclose(got[5:], theta[5:] / 4)  # slow pairs interpolated by s


def test_yarn_attention_factor_matches_scaling_cos_and_sin():
    # HF multiplies cos and sin by a = 0.1 ln s + 1; at s = 4, a = 1.1386 and logits scale a^2
    yarn = build_scheme({"name": "yarn"}, DIMS)
    assert yarn.attention_factor(64) == pytest.approx(0.1 * math.log(4) + 1)
    assert yarn.attention_factor(16) == 1.0
    q, k, pos = torch.randn(1, 4, 64, 8), torch.randn(1, 4, 64, 8), torch.arange(64)
    a = yarn.attention_factor(64)
    angles = pos.float().unsqueeze(-1) * yarn.inv_freq(64).float()
    hf_q, hf_k = (apply_rotary(x, angles) * a for x in (q, k))  # cos * a, sin * a
    expected = hf_q @ hf_k.transpose(-2, -1) / math.sqrt(8)
    assert torch.allclose(attention_logits(yarn, q, k, pos, pos), expected, atol=1e-4)


def test_logn_scale_by_hand():
    # max(1, ln p / ln 16) for 1-based p = 4, 16, 64, 256 -> 1, 1, 1.5, 2
    logn = build_scheme({"name": "logn"}, DIMS)
    scale = logn.logit_scale(torch.tensor([3, 15, 63, 255]), torch.arange(256), layer=0)
    assert scale.tolist() == pytest.approx([1.0, 1.0, 1.5, 2.0])
    q, k, pos = torch.randn(1, 4, 64, 8), torch.randn(1, 4, 64, 8), torch.arange(64)
    rope = build_scheme({"name": "rope"}, DIMS)
    ratio = attention_logits(logn, q, k, pos, pos) / attention_logits(rope, q, k, pos, pos)
    assert ratio[0, 1, 63, 10].item() == pytest.approx(1.5, rel=1e-4)  # p = 64
    assert ratio[0, 1, 15, 10].item() == pytest.approx(1.0, rel=1e-5)  # p = 16


ROTARY = ["rope", "xpos", "randomized_rope", *VARIANTS]


@pytest.mark.parametrize("name", ROTARY)
def test_frequencies_are_non_persistent_buffers(name):
    """Cached like torchtune's RoPE: buffers that move with the model, not in its state_dict
    (checkpoints of every scheme load as before)."""
    scheme = build_scheme({"name": name}, DIMS)
    buffers = dict(scheme.named_buffers())
    for cache in scheme.exact_caches:
        assert cache in buffers
    assert not any(key in scheme.state_dict() for key in buffers)
    if name == "yarn":
        assert buffers["ramp"].dtype == torch.float64


@pytest.mark.parametrize("name", ROTARY)
@pytest.mark.parametrize("length", [8, 16, 40])
def test_forward_frequencies_are_inv_freq_in_float32(name, length):
    """What the forward pass rotates with, from the caches, is bit for bit ``inv_freq`` of the
    context computed in float64 and rounded once to float32; dynamic NTK's context is the
    largest position + 1."""
    scheme = build_scheme({"name": name}, DIMS)
    k_pos = torch.arange(length)
    got = scheme.frequencies(k_pos)
    assert got.dtype == torch.float32
    assert torch.equal(got, scheme.inv_freq(length).float())
    if name == "dynamic_ntk":
        shifted = scheme.frequencies(torch.arange(length) + 24)
        assert torch.equal(shifted, scheme.inv_freq(length + 24).float())


@pytest.mark.parametrize("name", ["rope", "yarn", "dynamic_ntk"])
def test_a_cast_model_keeps_full_precision_frequencies(name):
    """``to(torch.bfloat16)`` casts every floating buffer; the frequencies are kept as they
    were (angles are computed in float32 whatever the dtype), so the logits of a bfloat16
    copy follow the float32 ones at positions past 1000."""
    scheme = build_scheme({"name": name}, DIMS)
    half = copy.deepcopy(scheme).to(torch.bfloat16)
    for cache in scheme.exact_caches:
        assert torch.equal(getattr(half, cache), getattr(scheme, cache)), cache
    pos = torch.arange(1000, 1040)
    assert torch.equal(half.frequencies(pos), scheme.frequencies(pos))


def test_dynamic_ntk_context_is_a_tensor():
    """The largest position is read on the device, never back to the host (no sync)."""
    dyn = build_scheme({"name": "dynamic_ntk"}, DIMS)
    assert isinstance(dyn.context_len(torch.arange(40, 64)), torch.Tensor)


@pytest.mark.parametrize("name", ["ntk", "dynamic_ntk"])
def test_ntk_needs_a_head_dim_of_four(name):
    dims = ModelDims(d_model=8, num_heads=4, head_dim=2, num_layers=1, train_len=8)
    with pytest.raises(UserError, match=f"{name} needs a head_dim of at least 4, got 2"):
        build_scheme({"name": name}, dims)


def test_cached_frequencies_equal_the_formula_bit_for_bit():
    """The caches change no number: theta_k = base^(-2k/h_d) in float64, rounded once to
    float32; dynamic NTK's base' from the host formula (f = 2, L_train = 16, l = 40)."""
    exponent = -torch.arange(0, 8, 2, dtype=torch.float64) / 8
    rope = build_scheme({"name": "rope"}, DIMS)
    assert torch.equal(rope.frequencies(torch.arange(40)), (10000.0**exponent).float())
    dyn = build_scheme({"name": "dynamic_ntk", "factor": 2.0}, DIMS)
    base = 10000.0 * (2.0 * 40 / 16 - 1.0) ** (8 / 6)
    assert torch.equal(dyn.frequencies(torch.arange(40)), (base**exponent).float())


@pytest.mark.parametrize("length", [16, 32, 64, 256])
def test_dynamic_ntk_default_scales_as_ntk_in_windowed_evaluation(length):
    """Every window of length L spans positions 0..L-1: dynamic NTK's default (f = 1) then
    rotates as NTK at s = L / L_train, so the two rows compare at equal scale (f = 2 would
    give s = 2 L / L_train - 1: 3, 7, 15, 31 at 2x-16x)."""
    dyn = build_scheme({"name": "dynamic_ntk"}, DIMS)
    assert dyn.factor == 1.0
    ntk = build_scheme({"name": "ntk"}, DIMS)
    q, k = (torch.randn(1, 4, length, 8) for _ in range(2))
    pos = torch.arange(length)
    assert torch.allclose(
        attention_logits(dyn, q, k, pos, pos), attention_logits(ntk, q, k, pos, pos), atol=1e-5
    )
