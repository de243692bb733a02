"""p-RoPE, HoPE, Resonance RoPE, the RoPE/NoPE hybrid, and the NTK-by-parts, Llama 3 and
LongRoPE variants: frequencies pinned by hand and against the reference implementations (HF
transformers' ``ROPE_INIT_FUNCTIONS``, sheryc/resonance_rope), what each claims about the
logits, and what happens past the training length."""

from __future__ import annotations

import math

import pytest
import torch

from pe_bench.conformance import assert_conforms
from pe_bench.errors import UserError
from pe_bench.model.attention import attention_logits
from pe_bench.positions import ModelDims, build_scheme
from pe_bench.run.config import RunConfig
from tests.helpers import compose

DIMS = ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=4, train_len=16)
QUICK = ModelDims(d_model=128, num_heads=4, head_dim=32, num_layers=4, train_len=64)
THETA8 = torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=torch.float64)  # 10000^(-2k/8)

# (head_dim, L_train, s): the tests' shape, the quick suite's at 4x, a wider head at 16x
SHAPES = [(8, 16, 4.0), (32, 64, 4.0), (64, 128, 16.0)]


def dims_for(head_dim: int, train_len: int) -> ModelDims:
    return ModelDims(
        d_model=4 * head_dim, num_heads=4, head_dim=head_dim, num_layers=4, train_len=train_len
    )


def hf_rope(rope_type: str, head_dim: int, max_len: int, seq_len: int, **params):
    """HF transformers' (inv_freq, attention_factor) for ``rope_type`` on a Llama config of
    ``head_dim`` and ``max_position_embeddings = max_len``, for a context of ``seq_len``."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_len,
        rope_parameters={"rope_type": rope_type, "rope_theta": 10000.0, **params},
    )
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)
    return inv_freq, attention_factor


def assert_same_frequencies(ours: torch.Tensor, hf: torch.Tensor) -> None:
    """pe-bench's float64 theta against HF's float32 one: within 1e-6 relative (HF rounds
    each step to float32, a few units of 6e-8)."""
    torch.testing.assert_close(ours.float(), hf, rtol=1e-6, atol=0)


def logits(scheme, q, k, pos, layer: int = 0) -> torch.Tensor:
    return attention_logits(scheme, q, k, pos, pos, layer)


def plain_logits(q, k) -> torch.Tensor:
    """q . k / sqrt(h_d): what an unrotated pair (or a NoPE layer) gives at any position."""
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def only_pairs(x: torch.Tensor, pairs: list[int]) -> torch.Tensor:
    """``x`` with every dim zeroed but those of ``pairs`` (half-split: k and k + h_d/2)."""
    half = x.shape[-1] // 2
    mask = torch.zeros(x.shape[-1], dtype=torch.bool)
    for k in pairs:
        mask[k] = mask[k + half] = True
    return x * mask


# ---- p-RoPE -------------------------------------------------------------------------------


def test_p_rope_frequencies_by_hand():
    # int(0.75 * 8 // 2) = 3 pairs rotate: theta = 1, 0.1, 0.01, then 0 for the slowest
    p_rope = build_scheme({"name": "p_rope"}, DIMS)
    assert p_rope.rotated == 3
    expected = THETA8 * torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    assert torch.allclose(p_rope.inv_freq(16), expected, rtol=1e-15, atol=0)
    # h_d = 32 (the quick suite): 12 of 16 pairs; p = 0.25: int(8.0 // 2) = 4
    assert build_scheme({"name": "p_rope"}, QUICK).rotated == 12
    quarter = build_scheme({"name": "p_rope", "p": 0.25}, QUICK)
    assert (quarter.inv_freq(64) > 0).tolist() == [True] * 4 + [False] * 12
    assert torch.equal(quarter.frequencies(torch.arange(64)), quarter.inv_freq(64).float())


@pytest.mark.slow
@pytest.mark.parametrize("head_dim", [8, 32, 64])
@pytest.mark.parametrize("p", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_p_rope_equals_hf_proportional(head_dim, p):
    """HF ``rope_type="proportional"`` (Gemma 4's partial_rotary_factor) on the same head."""
    hf, attention_factor = hf_rope("proportional", head_dim, 64, 64, partial_rotary_factor=p)
    ours = build_scheme({"name": "p_rope", "p": p}, dims_for(head_dim, 64)).inv_freq(64)
    assert_same_frequencies(ours, hf)
    assert attention_factor == 1.0


def test_p_rope_at_one_is_rope_and_at_zero_is_nope():
    q, k, pos = torch.randn(1, 4, 40, 8), torch.randn(1, 4, 40, 8), torch.arange(40)
    rope = build_scheme({"name": "rope"}, DIMS)
    assert torch.equal(
        logits(build_scheme({"name": "p_rope", "p": 1.0}, DIMS), q, k, pos), logits(rope, q, k, pos)
    )
    nope_like = build_scheme({"name": "p_rope", "p": 0.0}, DIMS)
    assert torch.allclose(logits(nope_like, q, k, pos + 5000), plain_logits(q, k), atol=1e-6)


def test_p_rope_dropped_pairs_ignore_position_and_kept_pairs_rotate_as_rope():
    """Past the training length too: the slowest pair's term is q . k at every distance, the
    other pairs' terms are RoPE's."""
    p_rope, rope = build_scheme({"name": "p_rope"}, DIMS), build_scheme({"name": "rope"}, DIMS)
    q, k = torch.randn(1, 4, 64, 8), torch.randn(1, 4, 64, 8)
    pos = torch.arange(64) + 1000
    dropped_q, dropped_k = only_pairs(q, [3]), only_pairs(k, [3])
    assert torch.allclose(
        logits(p_rope, dropped_q, dropped_k, pos), plain_logits(dropped_q, dropped_k), atol=1e-6
    )
    kept_q, kept_k = only_pairs(q, [0, 1, 2]), only_pairs(k, [0, 1, 2])
    assert torch.equal(logits(p_rope, kept_q, kept_k, pos), logits(rope, kept_q, kept_k, pos))
    assert not torch.allclose(logits(p_rope, q, k, pos), logits(rope, q, k, pos))


def test_p_rope_refuses_p_outside_zero_one():
    with pytest.raises(UserError, match=r"pe.p must be >= 0 and <= 1, got 1.5"):
        build_scheme({"name": "p_rope", "p": 1.5}, DIMS)
    from pe_bench.positions.rotary_zoo import PRoPE

    with pytest.raises(UserError, match=r"p_rope: p must be in \[0, 1\], got -0.1"):
        PRoPE(DIMS, p=-0.1)


# ---- HoPE ---------------------------------------------------------------------------------


def test_hope_keeps_the_pairs_that_complete_a_period_in_training():
    # L_train = 16: only theta_0 = 1 (wavelength 6.28) completes a period; 0.1 has 62.8
    hope = build_scheme({"name": "hope"}, DIMS)
    assert hope.inv_freq(16).tolist() == [1.0, 0.0, 0.0, 0.0]
    # h_d = 32, L_train = 64: wavelengths 2 pi 10000^(k/16) = 6.28, 11.2, 19.9, 35.3, 62.8
    # (pair 4: theta = 0.1, kept), 111.7 (pair 5: dropped), ...
    quick = build_scheme({"name": "hope"}, QUICK).inv_freq(64)
    rope = build_scheme({"name": "rope"}, QUICK).inv_freq(64)
    assert torch.equal(quick[:5], rope[:5]) and quick[4].item() == pytest.approx(0.1)
    assert not quick[5:].any()
    # a longer training length keeps more: at 128, pair 5 (111.7) rotates too
    longer = build_scheme({"name": "hope"}, dims_for(32, 128)).inv_freq(128)
    assert (longer > 0).sum().item() == 6


def test_hope_is_p_rope_with_the_fraction_its_training_length_sets():
    """HoPE's rule picks 5 of 16 pairs at h_d = 32, L_train = 64: p-RoPE's p = 5/16 (HF
    ``proportional``), with frequencies that do not change past the training length."""
    hope = build_scheme({"name": "hope"}, QUICK)
    p_rope = build_scheme({"name": "p_rope", "p": 5 / 16}, QUICK)
    assert torch.equal(hope.inv_freq(64), p_rope.inv_freq(64))
    q, k, pos = torch.randn(1, 4, 256, 32), torch.randn(1, 4, 256, 32), torch.arange(256)
    assert torch.equal(logits(hope, q, k, pos), logits(p_rope, q, k, pos))  # 4x L_train
    dropped_q, dropped_k = only_pairs(q, list(range(5, 16))), only_pairs(k, list(range(5, 16)))
    assert torch.allclose(
        logits(hope, dropped_q, dropped_k, pos), plain_logits(dropped_q, dropped_k), atol=1e-5
    )


# ---- Resonance RoPE -----------------------------------------------------------------------


def test_resonance_wavelengths_by_hand():
    # 2 pi / theta = 6.283, 62.83, 628.3, 6283.2 -> 6, 63, 628, 6283; theta' = 2 pi / lambda
    resonance = build_scheme({"name": "resonance_rope"}, DIMS)
    assert resonance.wavelength.tolist() == [6, 63, 628, 6283]
    expected = 2 * math.pi / torch.tensor([6.0, 63.0, 628.0, 6283.0], dtype=torch.float64)
    assert torch.allclose(resonance.inv_freq(16), expected, rtol=1e-15, atol=0)


@pytest.mark.parametrize("head_dim", [8, 32, 64, 128])
@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_resonance_equals_the_reference_rounding(head_dim, base):
    """sheryc/resonance_rope ``ResonanceRotaryEmbedding._register_buffers``, as written there
    (float32): inv_freq = 1 / base^(arange(0, d, 2) / d), r_wavelengths = round(2 pi /
    inv_freq), r_inv_freq = 2 pi / r_wavelengths, for every pair."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    r_wavelengths = torch.round(2 * math.pi / inv_freq)
    r_inv_freq = 2 * math.pi / r_wavelengths
    resonance = build_scheme({"name": "resonance_rope", "base": base}, dims_for(head_dim, 64))
    assert resonance.wavelength.tolist() == r_wavelengths.long().tolist()
    assert_same_frequencies(resonance.inv_freq(64), r_inv_freq)


def test_resonance_angles_repeat_exactly_every_wavelength():
    """The reference repeats one period of angles (``compute_freqs``): the angle at m + lambda_k
    is the angle at m bit for bit, at any position, and lies in [0, 2 pi)."""
    resonance = build_scheme({"name": "resonance_rope"}, DIMS)
    pos = torch.arange(64)
    angles = resonance.angles(pos)
    for k, wavelength in enumerate(resonance.wavelength.tolist()):
        assert torch.equal(resonance.angles(pos + wavelength)[:, k], angles[:, k])
    far = torch.tensor([10**6, 10**7 + 3])
    exact = (far.double().unsqueeze(-1) % resonance.wavelength.double()) * resonance.inv_freq(0)
    assert torch.allclose(resonance.angles(far).double(), exact, atol=1e-6)
    assert (resonance.angles(far) < 2 * math.pi).all()


def test_resonance_logits_past_training_revisit_those_in_training():
    """Pair 0 (wavelength 6) at distances 3 and 3 + 6 far past L_train = 16 gives the same
    logit as in training; RoPE's pair 0 (wavelength 2 pi) does not repeat."""
    resonance, rope = (build_scheme({"name": n}, DIMS) for n in ("resonance_rope", "rope"))
    q, k = only_pairs(torch.randn(1, 4, 1, 8), [0]), only_pairs(torch.randn(1, 4, 1, 8), [0])

    def at_distance(scheme, distance: int, start: int) -> torch.Tensor:
        pos = torch.tensor([start, start + distance])
        both_q, both_k = q.expand(1, 4, 2, 8), k.expand(1, 4, 2, 8)
        return logits(scheme, both_q, both_k, pos)[..., 1, 0]

    trained = at_distance(resonance, 3, 0)
    assert torch.allclose(at_distance(resonance, 9, 1000), trained, atol=1e-5)
    assert not torch.allclose(at_distance(rope, 9, 1000), at_distance(rope, 3, 0), atol=1e-2)


# ---- RoPE/NoPE hybrid ---------------------------------------------------------------------


def test_hybrid_nope_layers_are_every_fourth_counting_from_one():
    hybrid = build_scheme({"name": "rope_nope_hybrid"}, DIMS)
    assert [hybrid.is_nope(layer) for layer in range(8)] == [False, False, False, True] * 2
    every_2 = build_scheme({"name": "rope_nope_hybrid", "nope_every": 2}, DIMS)
    assert [every_2.is_nope(layer) for layer in range(4)] == [False, True, False, True]


def test_hybrid_layer_pattern_equals_hf_llama4():
    """HF ``Llama4TextConfig.no_rope_layers`` (1: RoPE) from ``no_rope_layer_interval``."""
    transformers = pytest.importorskip("transformers")
    for interval in (2, 3, 4):
        config = transformers.Llama4TextConfig(
            num_hidden_layers=12, no_rope_layer_interval=interval
        )
        hybrid = build_scheme({"name": "rope_nope_hybrid", "nope_every": interval}, DIMS)
        assert [int(not hybrid.is_nope(i)) for i in range(12)] == config.no_rope_layers


def test_hybrid_rope_layers_are_rope_and_nope_layers_ignore_position():
    hybrid, rope = (
        build_scheme({"name": "rope_nope_hybrid"}, DIMS),
        build_scheme({"name": "rope"}, DIMS),
    )
    q, k = torch.randn(1, 4, 64, 8), torch.randn(1, 4, 64, 8)
    for start in (0, 1000):  # in training and far past it
        pos = torch.arange(64) + start
        for layer in (0, 1, 2):
            assert torch.equal(logits(hybrid, q, k, pos, layer), logits(rope, q, k, pos, layer))
        assert torch.allclose(logits(hybrid, q, k, pos, 3), plain_logits(q, k), atol=1e-6)
    assert not torch.allclose(logits(hybrid, q, k, pos, 3), logits(rope, q, k, pos, 3))


def test_hybrid_with_a_nope_layer_conforms():
    """The kit's model has 2 layers: with nope_every = 2 its second layer is NoPE, so causality,
    relativity and the rest are checked through a NoPE layer too."""
    report = assert_conforms("rope_nope_hybrid", options={"nope_every": 2})
    assert report["relative"].status == "PASS" and report["causality"].status == "PASS"


def test_hybrid_refuses_nope_every_below_two():
    with pytest.raises(UserError, match=r"pe.nope_every must be >= 2, got 1"):
        build_scheme({"name": "rope_nope_hybrid", "nope_every": 1}, DIMS)
    from pe_bench.positions.rotary_zoo import RoPENoPEHybrid

    with pytest.raises(UserError, match=r"rope_nope_hybrid: nope_every must be >= 2"):
        RoPENoPEHybrid(DIMS, nope_every=0)


# ---- NTK-by-parts -------------------------------------------------------------------------


@pytest.mark.parametrize(("head_dim", "train_len", "s"), SHAPES)
def test_ntk_by_parts_equals_hf_yarn_frequencies_without_its_attention_factor(
    head_dim, train_len, s
):
    """HF ``rope_type="yarn"`` with original_max_position_embeddings = L_train: the same
    inv_freq; YaRN's attention factor a (on cos and sin) is pe-bench YaRN's logit scale a^2
    and NTK-by-parts has none."""
    long = int(s * train_len)
    hf, a = hf_rope(
        "yarn", head_dim, long, long, factor=s, original_max_position_embeddings=train_len
    )
    dims = dims_for(head_dim, train_len)
    by_parts, yarn = (build_scheme({"name": n}, dims) for n in ("ntk_by_parts", "yarn"))
    assert_same_frequencies(by_parts.inv_freq(long), hf)
    assert torch.equal(by_parts.inv_freq(long), yarn.inv_freq(long))
    pos = torch.arange(long)
    assert by_parts.logit_scale(pos, pos, 0) is None
    assert yarn.logit_scale(pos, pos, 0)[0].item() == pytest.approx(a * a, abs=1e-6)


def test_ntk_by_parts_logits_are_yarns_without_the_temperature():
    # s = 64 / 16 = 4: YaRN's logits are NTK-by-parts' times (0.1 ln 4 + 1)^2 = 1.2965
    by_parts, yarn = (build_scheme({"name": n}, DIMS) for n in ("ntk_by_parts", "yarn"))
    q, k, pos = torch.randn(1, 4, 64, 8), torch.randn(1, 4, 64, 8), torch.arange(64)
    a2 = (0.1 * math.log(4) + 1) ** 2
    assert torch.allclose(logits(yarn, q, k, pos), a2 * logits(by_parts, q, k, pos), atol=1e-4)


# ---- Llama 3 ------------------------------------------------------------------------------


@pytest.mark.parametrize(("head_dim", "train_len", "s"), SHAPES)
@pytest.mark.parametrize(("low", "high"), [(1.0, 4.0), (2.0, 8.0)])
def test_llama3_equals_hf(head_dim, train_len, s, low, high):
    """HF ``rope_type="llama3"`` with original_max_position_embeddings = L_train."""
    long = int(s * train_len)
    params = {"low_freq_factor": low, "high_freq_factor": high}
    hf, a = hf_rope(
        "llama3",
        head_dim,
        long,
        long,
        factor=s,
        original_max_position_embeddings=train_len,
        **params,
    )
    llama3 = build_scheme({"name": "llama3", **params}, dims_for(head_dim, train_len))
    assert_same_frequencies(llama3.inv_freq(long), hf)
    assert a == 1.0 and llama3.logit_scale(torch.arange(long), torch.arange(long), 0) is None


def test_llama3_by_hand():
    # h_d = 32, L_train = 64, s = 4: wavelengths 6.28 and 11.2 < 64 / 4 = 16 keep theta;
    # 111.7 > 64 (pair 5 on) gets theta / 4; pair 2 (19.87) blends with
    # w = (64 / 19.87 - 1) / 3 = 0.7403: theta' = (0.7403 + 0.2597 / 4) theta
    llama3 = build_scheme({"name": "llama3"}, QUICK)
    theta = build_scheme({"name": "rope"}, QUICK).inv_freq(64)
    got = llama3.inv_freq(256)
    assert torch.equal(got[:2], theta[:2])
    assert torch.allclose(got[5:], theta[5:] / 4)
    w = (64 / (2 * math.pi / theta[2].item()) - 1) / 3
    assert w == pytest.approx(0.7403, abs=1e-4)
    assert got[2].item() == pytest.approx((w + (1 - w) / 4) * theta[2].item())


def test_llama3_refuses_high_freq_factor_not_above_low():
    with pytest.raises(UserError, match=r"llama3: need high_freq_factor > low_freq_factor"):
        build_scheme({"name": "llama3", "low_freq_factor": 4.0, "high_freq_factor": 4.0}, DIMS)


# ---- LongRoPE -----------------------------------------------------------------------------


@pytest.mark.parametrize(("head_dim", "train_len", "s"), SHAPES)
@pytest.mark.parametrize("given", [False, True])
def test_longrope_equals_hf(head_dim, train_len, s, given):
    """HF ``rope_type="longrope"``: short factors up to L_train, long ones past it, attention
    factor sqrt(1 + ln s / ln L_train) on cos and sin, i.e. a^2 on pe-bench's logits; the
    default long factors (NTK's s^(2k/(h_d-2))) given to HF as a list."""
    pairs, long = head_dim // 2, int(s * train_len)
    dims = dims_for(head_dim, train_len)
    short = [1.0 + 0.01 * k for k in range(pairs)] if given else [1.0] * pairs
    custom = [1.0 + (s - 1) * (k / (pairs - 1)) ** 2 for k in range(pairs)]
    cfg = {"name": "longrope", "short_factor": short if given else None}
    cfg["long_factor"] = custom if given else None
    longrope = build_scheme(cfg, dims)
    rule = [s ** (2 * k / (head_dim - 2)) for k in range(pairs)]
    params = {
        "factor": s,
        "original_max_position_embeddings": train_len,
        "short_factor": short,
        "long_factor": custom if given else rule,
    }
    hf_long, a = hf_rope("longrope", head_dim, long, long, **params)
    hf_short, _ = hf_rope("longrope", head_dim, long, train_len, **params)
    assert_same_frequencies(longrope.inv_freq(long), hf_long)
    fixed = build_scheme({**cfg, "factor": s}, dims)  # HF's static factor, at L_train too
    assert_same_frequencies(fixed.inv_freq(train_len), hf_short)
    pos = torch.arange(long)
    assert longrope.logit_scale(pos, pos, 0)[0].item() == pytest.approx(a * a, abs=1e-6)
    assert fixed.logit_scale(pos[:train_len], pos[:train_len], 0)[0].item() == pytest.approx(
        a * a, abs=1e-6
    )


def test_longrope_by_hand():
    # L_train = 16, s = 4: a^2 = 1 + ln 4 / ln 16 = 1.5 exactly; the default long factors are
    # NTK's, so the frequencies are ntk's; up to L_train it is rope (short factors 1, a = 1)
    longrope = build_scheme({"name": "longrope"}, DIMS)
    pos = torch.arange(64)
    assert longrope.logit_scale(pos, pos, 0).tolist() == pytest.approx([1.5] * 64)
    assert torch.allclose(longrope.inv_freq(64), build_scheme({"name": "ntk"}, DIMS).inv_freq(64))
    assert longrope.logit_scale(pos[:16], pos[:16], 0) is None
    assert torch.allclose(longrope.inv_freq(16), THETA8, rtol=1e-15, atol=0)
    q, k = torch.randn(1, 4, 64, 8), torch.randn(1, 4, 64, 8)
    ntk = build_scheme({"name": "ntk"}, DIMS)
    assert torch.allclose(logits(longrope, q, k, pos), 1.5 * logits(ntk, q, k, pos), atol=1e-4)


def test_longrope_says_its_default_long_factors_are_ntks_not_searched():
    assert (
        "NTK-aware's s^(2k/(h_d-2)), not ones found by"
        in build_scheme({"name": "longrope"}, DIMS).caveat
    )
    given = build_scheme({"name": "longrope", "long_factor": [1.0, 1.5, 2.5, 4.0]}, DIMS)
    assert given.caveat == ""


def test_longrope_takes_searched_factors_from_the_command_line_as_hf_does():
    """Lists as an HF config carries them (``rope_scaling.long_factor`` / ``short_factor``),
    given on the command line for the zoo's head_dim 32: the frequencies are HF
    ``rope_type="longrope"``'s with the same lists, past L_train and within it."""
    short = [1.0 + 0.005 * k for k in range(16)]
    long = [1.0 + 3.0 * (k / 15) ** 1.5 for k in range(16)]
    cfg = RunConfig.parse(
        compose(
            "experiment=zoo",
            f"eval.variants.longrope.short_factor=[{','.join(map(str, short))}]",
            f"eval.variants.longrope.long_factor=[{','.join(map(str, long))}]",
        )
    )
    longrope = build_scheme(cfg.eval.variants["longrope"], QUICK)
    assert longrope.caveat == ""
    params = {"factor": 4.0, "original_max_position_embeddings": 64}
    params |= {"short_factor": short, "long_factor": long}
    hf_long, a = hf_rope("longrope", 32, 256, 256, **params)
    hf_short, _ = hf_rope("longrope", 32, 256, 64, **params)
    assert_same_frequencies(longrope.inv_freq(256), hf_long)
    assert_same_frequencies(longrope.inv_freq(64), hf_short)
    pos = torch.arange(256)
    assert longrope.logit_scale(pos, pos, 0)[0].item() == pytest.approx(a * a, abs=1e-6)


def test_longrope_refuses_a_factor_list_of_the_wrong_length():
    with pytest.raises(UserError, match=r"longrope: long_factor needs 4 factors > 0"):
        build_scheme({"name": "longrope", "long_factor": [1.0, 2.0]}, DIMS)
    with pytest.raises(UserError, match=r"longrope: short_factor needs 4 factors > 0"):
        build_scheme({"name": "longrope", "short_factor": [1.0, 1.0, 1.0, 0.0]}, DIMS)


# ---- every variant: rope up to L_train, its own past it ----------------------------------


@pytest.mark.parametrize("name", ["ntk_by_parts", "llama3", "longrope"])
def test_variant_differs_from_rope_past_training_length(name):
    rope, variant = build_scheme({"name": "rope"}, DIMS), build_scheme({"name": name}, DIMS)
    q, k, pos = torch.randn(1, 4, 64, 8), torch.randn(1, 4, 64, 8), torch.arange(64)
    assert not torch.allclose(logits(rope, q, k, pos), logits(variant, q, k, pos))
    q, k, pos = q[..., :16, :], k[..., :16, :], pos[:16]
    assert torch.allclose(logits(rope, q, k, pos), logits(variant, q, k, pos))
