"""ReRoPE, leaky ReRoPE and Self-Extend: their logits are RoPE's at a capped relative
position, pinned against RoPE's logits at that position and the references' position maps."""

from __future__ import annotations

import math

import pytest
import torch

from pe_bench.errors import UserError
from pe_bench.model.attention import attention_logits, causal_allowed
from pe_bench.positions import ModelDims, build_scheme
from pe_bench.positions.rotary import rotate_half
from pe_bench.run.config import RunConfig
from tests.helpers import compose


def rope_at(rope, q: torch.Tensor, k: torch.Tensor, relative: torch.Tensor) -> torch.Tensor:
    """RoPE's logit of q_i and k_j at the (real) relative position ``relative[i, j]``: q
    rotated by it, k unrotated, over sqrt(h_d). ``[b, n_h, s_q, s_k]``."""
    angles = relative.unsqueeze(-1) * rope.theta32  # [s_q, s_k, h_d/2]
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1) for f in (torch.cos, torch.sin))
    q = q.unsqueeze(-2)  # [b, n_h, s_q, 1, h_d]
    q_rot = q * cos + rotate_half(q) * sin  # [b, n_h, s_q, s_k, h_d]
    return (q_rot * k.unsqueeze(-3)).sum(-1) / math.sqrt(q.shape[-1])


def distances(s: int) -> torch.Tensor:
    pos = torch.arange(s)
    return (pos.unsqueeze(-1) - pos).float()


# ---- ReRoPE and leaky ReRoPE -----------------------------------------------------------------


def test_rerope_defaults(dims):
    rerope = build_scheme({"name": "rerope"}, dims)
    leaky = build_scheme({"name": "leaky_rerope"}, dims)
    assert (rerope.window, rerope.logn, rerope.variant_of) == (4, True, "rope")  # L_train / 4
    assert (leaky.window, leaky.k, leaky.logn) == (4, 16.0, True)  # the patch's k
    assert leaky.max_positions == 4 + 11 * 16 + 1  # relative positions within 0..15


def test_rerope_is_rope_within_the_window_and_rope_at_w_beyond(dims):
    rope = build_scheme({"name": "rope"}, dims)
    rerope = build_scheme({"name": "rerope", "window": 5, "logn": False}, dims)
    q, k, pos = torch.randn(2, 4, 24, 8), torch.randn(2, 4, 24, 8), torch.arange(24)
    got = attention_logits(rerope, q, k, pos, pos)
    n = distances(24)
    allowed = causal_allowed(24, 24, q.device)
    rope_logits = attention_logits(rope, q, k, pos, pos)
    assert torch.allclose(
        rope_at(rope, q, k, n)[..., allowed], rope_logits[..., allowed], atol=1e-5
    )
    near, far = n < 5, n >= 5
    assert torch.allclose(got[..., near], rope_logits[..., near])
    at_w = rope_at(rope, q, k, torch.full((24, 24), 5.0))
    assert torch.allclose(got[..., far], at_w[..., far], atol=1e-5)
    assert not torch.allclose(got[..., far], rope_logits[..., far])


def test_leaky_rerope_grows_with_slope_one_over_k_beyond_the_window(dims):
    rope = build_scheme({"name": "rope"}, dims)
    leaky = build_scheme({"name": "leaky_rerope", "window": 4, "k": 8, "logn": False}, dims)
    q, k, pos = torch.randn(2, 4, 30, 8), torch.randn(2, 4, 30, 8), torch.arange(30)
    got = attention_logits(leaky, q, k, pos, pos)
    n = distances(30)
    # the patch: q at (i + w (k - 1)) / k, k at j / k: relative w + (n - w) / k past w
    expected = rope_at(rope, q, k, torch.where(n < 4, n, 4 + (n - 4) / 8))
    allowed = causal_allowed(30, 30, q.device)
    assert torch.allclose(got[..., allowed], expected[..., allowed], atol=1e-5)
    # distance 20: relative position 4 + 16 / 8 = 6
    assert torch.allclose(
        got[..., 25, 5], rope_at(rope, q, k, torch.full((30, 30), 6.0))[..., 25, 5]
    )


def test_leaky_rerope_with_k_one_is_rope(dims):
    rope = build_scheme({"name": "rope"}, dims)
    leaky = build_scheme({"name": "leaky_rerope", "k": 1, "logn": False}, dims)
    q, k, pos = torch.randn(1, 4, 40, 8), torch.randn(1, 4, 40, 8), torch.arange(40)
    expected = attention_logits(rope, q, k, pos, pos)
    assert torch.allclose(attention_logits(leaky, q, k, pos, pos), expected, atol=1e-5)


ZOO = ModelDims(d_model=128, num_heads=4, head_dim=32, num_layers=4, train_len=64)


def largest_relative_position(scheme, n: int) -> float:
    """The largest relative position ``scheme`` rotates a query and key to in a window of
    ``n`` tokens: the far branch's, q_pos - k_pos at the last query and the first key."""
    pos = torch.arange(n)
    q_at, k_at = scheme.far_positions(pos, pos)
    return float(q_at[-1] - k_at[0])


def test_leaky_rerope_k_null_keeps_the_longest_eval_length_within_training():
    """The zoo (L_train = 64, w = 16, up to 1024 tokens): k = 1007 / 47, so the query at 1023
    sees key 0 at relative position 63, the largest training saw; the patch's k = 16 would
    put it at 16 + 1007 / 16 = 78.9."""
    leaky = build_scheme({"name": "leaky_rerope", "k": None, "max_len": 1024}, ZOO)
    assert leaky.k == pytest.approx(1007 / 47)
    assert largest_relative_position(leaky, 1024) == pytest.approx(63.0, abs=1e-4)
    for n in (128, 256, 512):  # one k for every length: shorter windows stay further in
        assert largest_relative_position(leaky, n) < 63
    leaky.check_length(1024)
    patch = build_scheme({"name": "leaky_rerope", "k": 16.0}, ZOO)
    assert largest_relative_position(patch, 1024) == pytest.approx(16 + 1007 / 16, abs=1e-4)


def test_leaky_rerope_refuses_a_length_its_k_takes_past_training_in_one_line():
    patch = build_scheme({"name": "leaky_rerope", "k": 16.0}, ZOO)
    assert patch.max_positions == 16 + 47 * 16 + 1  # 769: relative position 63 exactly
    patch.check_length(769)
    with pytest.raises(UserError) as err:
        patch.check_length(1024)
    assert str(err.value) == (
        "leaky_rerope cannot serve length 1024: with window 16 and k = 16 its relative "
        "positions reach 78.9, past the 0..63 the model was trained on; allowed: lengths up "
        "to 769, or k >= 21.43 for it (k: null picks k for the longest eval length)"
    )


def test_leaky_rerope_k_null_without_a_length_or_with_a_wide_window_is_refused():
    with pytest.raises(UserError, match=r"k: null picks k for max_len"):
        build_scheme({"name": "leaky_rerope", "k": None}, ZOO)
    with pytest.raises(UserError, match=r"window below L_train - 1 = 63 .*got window 63"):
        build_scheme({"name": "leaky_rerope", "k": None, "max_len": 1024, "window": 63}, ZOO)
    assert build_scheme({"name": "leaky_rerope", "k": None, "max_len": 40}, ZOO).k == 1.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "longest"),
    [(["experiment=zoo"], 1024), (["experiment=zoo", "eval.lengths=[64,300]"], 300)],
)
def test_leaky_rerope_config_picks_k_for_the_runs_longest_eval_length(overrides, longest):
    """conf/pe/leaky_rerope.yaml: k: null and max_len the run's longest eval length
    (``${longest_eval_len:}``), so the zoo's rows stay within training at every length."""
    cfg = RunConfig.parse(compose(*overrides))
    variant = cfg.eval.variants["leaky_rerope"]
    assert (variant["k"], variant["max_len"]) == (None, longest)
    leaky = build_scheme(variant, ZOO)
    assert largest_relative_position(leaky, longest) == pytest.approx(63.0, abs=1e-4)
    leaky.check_length(longest)


@pytest.mark.slow
def test_longest_eval_len_of_a_pretrained_model_is_its_context_times_the_factors_or_unknown():
    """model=hf: the training length is the model's context, model.train_len; left null it
    is read from the model's own config, which the Hydra config does not hold, so k: null
    has no length to pick k for (a one-line error asks for k or max_len)."""
    overrides = ["+pe@eval.variants.leaky_rerope=leaky_rerope", "model=hf", "model.name=x"]
    cfg = compose(*overrides, "eval.factors=[1,2]")
    assert cfg.eval.variants.leaky_rerope.max_len is None
    cfg = compose(*overrides, "eval.factors=[1,2]", "model.train_len=256")
    assert cfg.eval.variants.leaky_rerope.max_len == 512
    cfg = compose(*overrides, "eval.lengths=[300,700]")
    assert cfg.eval.variants.leaky_rerope.max_len == 700


@pytest.mark.parametrize("name", ["rerope", "leaky_rerope"])
def test_rerope_scales_queries_by_log_n_as_the_patch(dims, name):
    """The patch multiplies q by max(1, ln(p + 1) / ln L_train) before rotating: rows past the
    training length are scaled, rows within it are not."""
    with_logn = build_scheme({"name": name}, dims)
    without = build_scheme({"name": name, "logn": False}, dims)
    q, k, pos = torch.randn(1, 4, 64, 8), torch.randn(1, 4, 64, 8), torch.arange(64)
    scale = ((pos + 1.0).log() / math.log(16)).clamp(min=1)  # [s_q]
    expected = attention_logits(without, q, k, pos, pos) * scale[:, None]
    assert torch.allclose(attention_logits(with_logn, q, k, pos, pos), expected, atol=1e-5)


@pytest.mark.parametrize("name", ["rerope", "leaky_rerope"])
def test_rerope_without_log_n_is_relative(dims, name):
    """Without log-n the logits depend on i - j only: shifted positions, same logits; with it,
    they do not (which is why the scheme declares relative = False)."""
    q, k, pos = torch.randn(1, 4, 40, 8), torch.randn(1, 4, 40, 8), torch.arange(40)
    allowed = causal_allowed(40, 40, q.device)
    for logn, same in [(False, True), (True, False)]:
        scheme = build_scheme({"name": name, "logn": logn}, dims)
        base = attention_logits(scheme, q, k, pos, pos)[..., allowed]
        moved = attention_logits(scheme, q, k, pos + 1000, pos + 1000)[..., allowed]
        assert torch.allclose(base, moved, atol=2e-4) is same


@pytest.mark.parametrize("name", ["rerope", "leaky_rerope", "self_extend"])
def test_windowed_variants_are_finite_at_sixty_four_times_training(dims, name):
    scheme = build_scheme({"name": name}, dims)
    q, k, pos = torch.randn(1, 4, 1024, 8), torch.randn(1, 4, 1024, 8), torch.arange(1024)
    logits = attention_logits(scheme, q[..., -8:, :], k, pos[-8:], pos)
    assert torch.isfinite(logits[..., causal_allowed(8, 1024, q.device)]).all()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": "rerope", "window": 0}, "pe.window must be >= 1, got 0"),
        ({"name": "leaky_rerope", "k": 0.5}, "pe.k must be >= 1, got 0.5"),
        ({"name": "self_extend", "group_size": 0}, "pe.group_size must be >= 1, got 0"),
    ],
)
def test_bad_options_are_refused(dims, options, message):
    with pytest.raises(UserError, match=message):
        build_scheme(options, dims)


# ---- Self-Extend -----------------------------------------------------------------------------


def test_self_extend_grouped_positions_for_a_small_example(dims):
    """datamllab/LongLM ``self_extend_forward`` with G = 2, w = 4: q at i // 2 + 4 - 4 / 2,
    k at j // 2 past the window, so the query at 10 sees keys 0..10 at relative positions
    7 7 6 6 5 5 | 4 3 2 1 0 (the last five its own neighbours, at i - j)."""
    rope = build_scheme({"name": "rope"}, dims)
    extend = build_scheme({"name": "self_extend", "group_size": 2, "window": 4}, dims)
    q, k, pos = torch.randn(1, 4, 11, 8), torch.randn(1, 4, 11, 8), torch.arange(11)
    got = attention_logits(extend, q, k, pos, pos)[..., 10, :]
    relative = torch.tensor([7.0, 7, 6, 6, 5, 5, 4, 3, 2, 1, 0]).expand(11, 11)
    assert torch.allclose(got, rope_at(rope, q, k, relative)[..., 10, :], atol=1e-5)


def test_self_extend_shift_is_fractional_when_g_does_not_divide_w(dims):
    """G = 3, w = 4: the reference's shift w - w / G = 8 / 3 (floating point, the non-flash
    patch), so the query at 20 sees key 0 at 20 // 3 + 8 / 3 - 0 = 26 / 3."""
    rope = build_scheme({"name": "rope"}, dims)
    extend = build_scheme({"name": "self_extend", "group_size": 3, "window": 4}, dims)
    q, k, pos = torch.randn(1, 4, 21, 8), torch.randn(1, 4, 21, 8), torch.arange(21)
    got = attention_logits(extend, q, k, pos, pos)[..., 20, 0]
    assert torch.allclose(got, rope_at(rope, q, k, torch.full((21, 21), 26 / 3))[..., 20, 0])


def test_self_extend_is_rope_within_the_window_and_not_relative(dims):
    rope = build_scheme({"name": "rope"}, dims)
    extend = build_scheme({"name": "self_extend"}, dims)  # G = 32, w = 4
    assert (extend.group_size, extend.window) == (32, 4)
    q, k, pos = torch.randn(1, 4, 40, 8), torch.randn(1, 4, 40, 8), torch.arange(40)
    got = attention_logits(extend, q, k, pos, pos)
    near = (distances(40) >= 0) & (distances(40) < 4)
    assert torch.allclose(got[..., near], attention_logits(rope, q, k, pos, pos)[..., near])
    grouped = build_scheme({"name": "self_extend", "group_size": 4, "window": 4}, dims)
    allowed = causal_allowed(40, 40, q.device)
    base = attention_logits(grouped, q, k, pos, pos)[..., allowed]
    moved = attention_logits(grouped, q, k, pos + 1, pos + 1)[..., allowed]
    assert not torch.allclose(base, moved, atol=1e-3)  # floor(i / G) reads the positions
