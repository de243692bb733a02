"""nope_temp: NoPE in training, the authors' head scale at evaluation (q times s_h / sqrt(h_d)),
searched on held-out text per length: the search picks the scale that minimises the held-out
loss, and moves nothing but its own scales."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pe_bench.conformance import assert_conforms
from pe_bench.conformance.calibrate import held_out
from pe_bench.conformance.kit import FAIL, check_scheme
from pe_bench.errors import UserError
from pe_bench.model.attention import attention_logits, attention_path
from pe_bench.model.gpt import ModelConfig, build_model
from pe_bench.positions import build_scheme

from ..plugins import broken_pe

CFG = ModelConfig(d_model=32, num_layers=2, num_heads=4, mlp_ratio=2)


def tokens(s: int, seed: int = 0) -> torch.Tensor:
    """Text with structure (a repeated random phrase) so attention's sharpness matters."""
    phrase = torch.randint(0, 256, (1, 7), generator=torch.Generator().manual_seed(seed))
    return phrase.repeat(2, s // 7 + 2)[:, : s + 1]


def model(**options):
    """A tiny nope_temp model trained 40 steps on such text at 16 tokens (as NoPE: training
    reads no scale), so that attention, and its temperature, matter."""
    net = build_model(CFG, {"name": "nope_temp", **options}, 16, 0).train()
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for step in range(40):
        text = tokens(16, seed=100 + step)
        net(text[:, :-1], text[:, 1:]).backward()
        opt.step()
        opt.zero_grad()
    return net.eval()


def test_trains_and_starts_as_nope():
    """In training, and before any calibration, the logits are NoPE's (scale 1) and the model
    keeps the fused causal path."""
    net = build_model(CFG, {"name": "nope_temp"}, 16, 0).eval()
    nope = build_model(CFG, {"name": "nope"}, 16, 0).eval()
    x = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        assert torch.equal(net(x), nope(x))
    assert attention_path(net.pe) == "causal"
    net.pe.fitted[40] = torch.full((2, 4), 2.0)
    net.train()
    with torch.no_grad():
        assert torch.equal(net(x), nope.train()(x))


def test_the_scale_multiplies_each_heads_logits_as_the_authors_query_scale():
    """AntNLP/nope_head_scale ScaleMixin.query_scale (HS): q * scale_param[h] / sqrt(h_d),
    then softmax(q k^T) with softmax_scale=1: the logits s_h q . k / sqrt(h_d)."""
    scheme = build_scheme({"name": "nope_temp"}, CFG.dims(16)).eval()
    scales = torch.tensor([[1.0, 1.5, 2.0, 3.0], [1.2, 1.2, 1.7, 1.1]])
    scheme.fitted[24] = scales
    q, k, pos = torch.randn(2, 4, 24, 8), torch.randn(2, 4, 24, 8), torch.arange(24)
    for layer in (0, 1):
        query_scale = q * (scales[layer].view(1, 4, 1, 1) / math.sqrt(8))
        expected = query_scale @ k.transpose(-1, -2)
        assert torch.allclose(attention_logits(scheme, q, k, pos, pos, layer), expected, atol=1e-5)


def test_a_window_takes_the_scales_of_the_nearest_calibrated_length():
    scheme = build_scheme({"name": "nope_temp"}, CFG.dims(16)).eval()
    scheme.fitted = {16: torch.full((2, 4), 1.0), 64: torch.full((2, 4), 2.0)}
    assert scheme.scales(16)[0, 0] == 1.0 and scheme.scales(64)[0, 0] == 2.0
    assert scheme.scales(31)[0, 0] == 1.0 and scheme.scales(33)[0, 0] == 2.0  # 32: the middle
    assert scheme.scales(1000)[0, 0] == 2.0 and scheme.scales(3)[0, 0] == 1.0


def test_uniform_search_picks_the_candidate_with_the_lowest_held_out_loss():
    net = model(search="uniform", candidates=[0.5, 1.0, 2.0, 4.0, 8.0])
    text = tokens(48)
    by_hand = []
    for value in (0.5, 1.0, 2.0, 4.0, 8.0):
        net.pe.fitted = {48: torch.full((2, 4), value)}
        with torch.no_grad():
            by_hand.append(held_out(net, text)().item())
    net.pe.fitted = {}
    note = net.pe.calibrate(held_out(net, text), 48)
    best = [0.5, 1.0, 2.0, 4.0, 8.0][min(range(5), key=by_hand.__getitem__)]
    assert torch.equal(net.pe.fitted[48], torch.full((2, 4), best))
    assert f"{min(by_hand):.4f}" in note and "uniform search" in note


def test_head_search_reaches_the_minimum_of_the_held_out_loss():
    """On a loss whose minimum is known (a quadratic in the scales the model's logit_scale
    gives, centred on a target per head), the head search lands on the target, or on the
    floor where the target lies below it."""
    scheme = build_scheme({"name": "nope_temp", "steps": 100}, CFG.dims(16)).eval()
    target = torch.tensor([[1.3, 2.0, 0.7, 2.6], [1.0, 1.9, 3.1, 1.45]])
    pos = torch.arange(8)

    def loss() -> torch.Tensor:
        scales = torch.stack([scheme.logit_scale(pos, pos, layer)[:, 0] for layer in (0, 1)])
        return (scales - target).square().sum()

    scheme.calibrate(loss, 8)
    assert torch.allclose(scheme.fitted[8], target.clamp(min=1.0), atol=0.03)


def test_head_search_lowers_a_models_held_out_loss():
    net = model(steps=30)
    text = tokens(48, seed=3)
    loss = held_out(net, text)
    with torch.no_grad():
        net.pe.fitted = {48: torch.full((2, 4), 1.6)}
        at_init = loss().item()
        net.pe.fitted = {48: torch.ones(2, 4)}
        at_one = loss().item()
    net.pe.fitted = {}
    note = net.pe.calibrate(loss, 48)
    with torch.no_grad():
        found = loss().item()
    assert found < at_init and found < at_one and (net.pe.fitted[48] >= 1.0).all()
    assert f"{at_one:.4f} at scale 1, {found:.4f} at scales" in note


def test_head_search_follows_the_authors_schedule():
    """AdamW (no weight decay) at lr x the HF linear schedule with ceil(10%) warmup steps from
    0, the scales clamped at >= floor after every step, and the model's own weights frozen."""
    net = model(steps=10, lr=0.1, init=1.6, floor=1.3)
    text = tokens(40, seed=5)
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    net.pe.calibrate(held_out(net, text), 40)
    assert all(torch.equal(v, weights[k]) for k, v in net.state_dict().items())
    scales = torch.full((2, 4), 1.6, requires_grad=True)
    opt = torch.optim.AdamW([scales], lr=0.1, weight_decay=0.0)
    warmup = 1
    for step in range(10):  # transformers.get_linear_schedule_with_warmup, by hand
        factor = step / warmup if step < warmup else max(0.0, (10 - step) / (10 - warmup))
        for group in opt.param_groups:
            group["lr"] = 0.1 * factor
        net.pe._trying = scales
        (scales.grad,) = torch.autograd.grad(held_out(net, text)(), [scales])
        opt.step()
        with torch.no_grad():
            scales.clamp_(min=1.3)
    net.pe._trying = None
    assert torch.allclose(net.pe.fitted[40], scales.detach(), atol=1e-6)


def test_bad_options_are_one_line():
    with pytest.raises(UserError, match="search='grid' is not one of head, uniform"):
        build_scheme({"name": "nope_temp", "search": "grid"}, CFG.dims(16))
    with pytest.raises(UserError, match="candidates=.* must all be > 0"):
        build_scheme({"name": "nope_temp", "candidates": [1.0, 0.0]}, CFG.dims(16))


def test_nope_temp_conforms_and_a_calibration_that_moves_a_parameter_fails():
    report = assert_conforms("nope_temp", options={"steps": 5})
    assert report["calibration"].status == "PASS"
    broken = check_scheme(broken_pe.CalibratesItsParameter)
    assert broken["calibration"].status == FAIL
    assert "calibrate changed 'pe.scale'" in broken["calibration"].reason


def test_calibration_is_finite_far_past_training():
    net = model(steps=3)
    text = tokens(256, seed=7)
    net.pe.calibrate(held_out(net, text), 256)
    with torch.no_grad():
        out = net(text[:, :-1])
    assert torch.isfinite(out).all() and torch.isfinite(net.pe.fitted[256]).all()
    assert F.cross_entropy(out.flatten(0, 1), text[:, 1:].flatten()).item() < 10
