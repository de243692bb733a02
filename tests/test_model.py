"""The shared model: causality for every scheme, identical trunks, lengths past training."""

from __future__ import annotations

import pytest
import torch

from pe_bench.errors import UserError
from pe_bench.model import ModelConfig

from .helpers import TRAINABLE, VARIANTS, tiny_model, with_variant

ALL = [(name, tiny_model) for name in TRAINABLE] + [(name, with_variant) for name in VARIANTS]


@pytest.mark.parametrize(("name", "make"), ALL, ids=[n for n, _ in ALL])
def test_future_tokens_never_change_past_outputs(name, make):
    model = make(name)
    x = torch.randint(0, 256, (2, 48))  # 3x the training length: variants are active
    changed = x.clone()
    t = 30
    changed[:, t] = (changed[:, t] + 1) % 256
    with torch.no_grad():
        before, after = model(x), model(changed)
    assert torch.allclose(before[:, :t], after[:, :t], atol=1e-5), f"{name} leaks the future"
    assert not torch.allclose(before[:, t], after[:, t]), "the changed token must matter"


@pytest.mark.parametrize(("name", "make"), ALL, ids=[n for n, _ in ALL])
def test_every_scheme_runs_at_four_times_training_length(name, make):
    model = make(name)
    with torch.no_grad():
        logits = model(torch.randint(0, 256, (1, 64)))
    assert logits.shape == (1, 64, 256)
    assert torch.isfinite(logits).all()


def test_trunk_initialisation_is_the_same_for_every_scheme():
    cfg = ModelConfig(d_model=32, num_layers=2, num_heads=4, mlp_ratio=2)
    from pe_bench.model import build_model

    models = {name: build_model(cfg, {"name": name}, 16, seed=3) for name in TRAINABLE}
    reference = {k: v for k, v in models["nope"].state_dict().items() if not k.startswith("pe.")}
    for name, model in models.items():
        trunk = {k: v for k, v in model.state_dict().items() if not k.startswith("pe.")}
        assert trunk.keys() == reference.keys()
        assert all(torch.equal(trunk[k], reference[k]) for k in trunk), name


def test_position_parameters_are_counted():
    counts = {name: tiny_model(name).num_params() for name in ("nope", "learned", "t5")}
    assert counts["nope"]["pe_params"] == 0
    assert counts["learned"]["pe_params"] == 16 * 16 * 32  # 16 x train_len rows of d_model
    assert counts["t5"]["pe_params"] == 32 * 4  # buckets x heads
    assert counts["learned"]["params"] - counts["nope"]["params"] == counts["learned"]["pe_params"]


def test_heads_must_divide_width():
    with pytest.raises(UserError, match=r"num_heads \(3\) must divide model.d_model \(32\)"):
        ModelConfig(d_model=32, num_heads=3)


def test_learned_model_refuses_past_its_table():
    model = tiny_model("learned", max_positions=20)
    with pytest.raises(UserError, match="cannot serve length 24"):
        model(torch.randint(0, 256, (1, 24)))


def test_unknown_attention_is_a_clear_error():
    with pytest.raises(UserError, match="model.attention='fast' is not one of auto, sdpa, flex"):
        ModelConfig(attention="fast")
