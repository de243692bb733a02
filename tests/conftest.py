"""Shared fixtures: tiny dimensions, seeded randomness, and model builders."""

from __future__ import annotations

import pytest
import torch

from pe_bench.model import GPT, ModelConfig, build_model
from pe_bench.positions import ModelDims

# Every trainable scheme, and the eval-time variants with the scheme they apply to.
CLASSIC = ["nope", "sinusoidal", "learned", "t5", "xl", "rope", "alibi"]
TRAINABLE = [
    *CLASSIC,
    "shaw",
    "kerple_log",
    "kerple_power",
    "fire",
    "sandwich",
    "xpos",
    "cope",
    "randomized_rope",
    "randomized_learned",
]
VARIANTS = ["pi", "ntk", "dynamic_ntk", "yarn", "logn"]
RELATIVE = [
    "t5",
    "xl",
    "rope",
    "alibi",
    "pi",
    "ntk",
    "shaw",
    "kerple_log",
    "kerple_power",
    "sandwich",
    "xpos",
    "yarn",
]
NOT_RELATIVE = [
    "nope",
    "sinusoidal",
    "learned",
    "fire",
    "cope",
    "randomized_rope",
    "randomized_learned",
    "dynamic_ntk",
    "logn",
]


@pytest.fixture(autouse=True)
def seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def dims() -> ModelDims:
    return ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=2, train_len=16)


def tiny_model(scheme: str, train_len: int = 16, **options) -> GPT:
    """A tiny model whose every parameter (the scheme's too) is random, so no term is zero."""
    cfg = ModelConfig(d_model=32, num_layers=2, num_heads=4, mlp_ratio=2)
    model = build_model(cfg, {"name": scheme, **options}, train_len, seed=0)
    with torch.no_grad():
        for p in model.pe.parameters():
            p.normal_(0, 0.5)
    return model.eval()


def with_variant(scheme: str, train_len: int = 16) -> GPT:
    """A rope model whose scheme is replaced by an eval-time variant (as evaluation does)."""
    model = tiny_model("rope", train_len)
    variant = tiny_model(scheme, train_len).pe
    model.pe = variant
    return model
