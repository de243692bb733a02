"""FIRE: the normalised log distance pinned by hand, the per-layer MLP, the threshold default."""

from __future__ import annotations

import math

import pytest
import torch

from pe_bench.positions import ModelDims, build_scheme


def test_defaults_from_the_paper_code(dims):
    fire = build_scheme({"name": "fire"}, dims)
    assert fire.c.tolist() == pytest.approx([0.1] * dims.num_layers)  # init_c = 0.1
    assert fire.mlp[0][0].out_features == 32  # mlp_width = 32
    assert fire.mlp[0][2].out_features == dims.num_heads
    assert len(fire.mlp) == dims.num_layers
    assert fire.init_tau == 4  # L_train / 4 = 16 / 4
    long = ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=1, train_len=2048)
    assert build_scheme({"name": "fire"}, long).init_tau == 512  # the paper code's init_L


@pytest.mark.parametrize("train_len", [16, 64, 2048])
def test_training_positions_straddle_the_threshold(train_len):
    """Training sees both regimes of psi(max(tau, i)): queries before tau (a constant
    normaliser) and after it (progressive interpolation), as in the paper (512 of 2048)."""
    dims = ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=1, train_len=train_len)
    tau = build_scheme({"name": "fire"}, dims).init_tau
    queries = torch.arange(train_len).float()
    assert (queries < tau).any() and (queries > tau).mean(dtype=torch.float) >= 0.5


def test_normalised_distance_by_hand(dims):
    # psi(x) = ln(0.1 x + 1), tau = 16:
    #   i = 20, j = 5:  psi(15) / psi(max(16, 20)) = ln 2.5 / ln 3
    #   i = 4,  j = 0:  psi(4) / psi(16)          = ln 1.4 / ln 2.6   (the threshold applies)
    fire = build_scheme({"name": "fire", "init_tau": 16}, dims)
    x = fire.normalised_distance(torch.arange(24), torch.arange(24), 0)
    assert x[20, 5].item() == pytest.approx(math.log(2.5) / math.log(3), rel=1e-5)
    assert x[4, 0].item() == pytest.approx(math.log(1.4) / math.log(2.6), rel=1e-5)
    assert x[20, 20].item() == 0.0
    assert x[20, 0].item() == pytest.approx(1.0, rel=1e-5)  # the farthest key maps to 1


def test_bias_is_the_layers_mlp_of_the_normalised_distance(dims):
    fire = build_scheme({"name": "fire"}, dims)
    pos = torch.arange(12)
    bias = fire.score_bias(None, None, pos, pos, 1)  # [n_h, 12, 12]
    x = fire.normalised_distance(pos, pos, 1)[9, 3].reshape(1, 1)
    assert torch.allclose(bias[:, 9, 3], fire.mlp[1](x).flatten(), atol=1e-6)
    assert not torch.allclose(bias, fire.score_bias(None, None, pos, pos, 0))


@pytest.mark.parametrize(("s_q", "shift"), [(1, 0), (64, 0), (300, 0), (64, 1000)])
def test_fast_bias_equals_the_mlp_on_long_windows(dims, s_q, shift):
    """The bias read from lines by runs of a row (``score_bias``) equals the MLP itself
    (``score_bias_reference``) at 1,200 keys (the training length is 64) for the last s_q
    queries, positions shifted or not, with kinks inside the distances' range (an MLP
    perturbed so that every unit has one between 0 and 1, some with w < 0)."""
    fire = build_scheme({"name": "fire"}, dims)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        first = fire.mlp[1][0]
        first.weight.copy_(torch.randn(first.weight.shape, generator=generator))
        kinks = torch.rand(first.bias.shape, generator=generator)
        first.bias.copy_(-kinks * first.weight[:, 0])
        fire.c[1] = 0.3
    keys = torch.arange(1200) + shift
    fast = fire.score_bias(None, None, keys[-s_q:], keys, 1)
    slow = fire.score_bias_reference(None, None, keys[-s_q:], keys, 1)
    allowed = keys <= keys[-s_q:].unsqueeze(-1)
    assert torch.allclose(fast[:, allowed], slow[:, allowed], rtol=1e-5, atol=1e-5)
