"""Sinusoidal and learned absolute schemes: the table, and the learned table's limit policy."""

from __future__ import annotations

import math

import pytest
import torch

from pe_bench.errors import UserError
from pe_bench.positions import build_scheme
from pe_bench.positions.absolute import sinusoid_table


def test_sinusoid_table_values():
    table = sinusoid_table(torch.tensor([0, 1, 5]), 4)
    # PE[p, 2k] = sin(p / 10000^(2k/4)), PE[p, 2k+1] = cos(...)
    for row, p in enumerate([0, 1, 5]):
        expected = [math.sin(p), math.cos(p), math.sin(p / 100), math.cos(p / 100)]
        assert table[row].tolist() == pytest.approx(expected, abs=1e-6)


def test_sinusoidal_adds_the_table(dims):
    scheme = build_scheme({"name": "sinusoidal"}, dims)
    x = torch.zeros(2, 7, dims.d_model)
    table = sinusoid_table(torch.arange(7), 32) / math.sqrt(32)  # scaled by d_model^-0.5
    assert torch.allclose(scheme.embed(x, torch.arange(7)), table.expand(2, -1, -1))
    unscaled = build_scheme({"name": "sinusoidal", "scale": 1.0}, dims)
    assert torch.allclose(
        unscaled.embed(x, torch.arange(7)), table.expand(2, -1, -1) * math.sqrt(32)
    )


def test_learned_default_table_is_sixteen_training_lengths(dims):
    scheme = build_scheme({"name": "learned"}, dims)
    assert scheme.table.num_embeddings == 16 * dims.train_len
    scheme.check_length(16 * dims.train_len)


def test_learned_refuses_lengths_past_its_table(dims):
    """Refused by ``check_length``, which the run calls for every length before training;
    ``embed`` itself never reads a position back to the host to check it."""
    scheme = build_scheme({"name": "learned", "max_positions": 32}, dims)
    scheme.check_length(32)
    with pytest.raises(UserError, match=r"cannot serve length 33.*32 positions.*pe.beyond=clamp"):
        scheme.check_length(33)


def test_learned_clamp_reuses_the_last_row(dims):
    scheme = build_scheme({"name": "learned", "max_positions": 32, "beyond": "clamp"}, dims)
    scheme.check_length(1000)  # unbounded under clamp
    out = scheme.embed(torch.zeros(1, 40, dims.d_model), torch.arange(40))
    assert torch.equal(out[0, 35], scheme.table.weight[31])


def test_learned_bad_policy_is_refused(dims):
    with pytest.raises(UserError, match="beyond='wrap' is not one of"):
        build_scheme({"name": "learned", "beyond": "wrap"}, dims)
