"""Randomized positions: sorted distinct samples from [0, max_len) in training, 0..s-1 in eval."""

from __future__ import annotations

import pytest
import torch

from pe_bench.errors import UserError
from pe_bench.positions import build_scheme


@pytest.mark.parametrize("name", ["randomized_rope", "randomized_learned"])
def test_training_positions_are_sorted_distinct_samples(dims, name):
    scheme = build_scheme({"name": name, "max_len": 100}, dims).train()
    draws = [scheme.positions(16, torch.device("cpu")) for _ in range(20)]
    for pos in draws:
        assert pos.shape == (16,)
        assert (pos[1:] > pos[:-1]).all()  # sorted and distinct
        assert pos.min() >= 0 and pos.max() < 100
    assert len({tuple(p.tolist()) for p in draws}) == 20  # a new draw every call
    assert max(int(p.max()) for p in draws) > 16  # positions beyond the training length
    scheme.eval()
    assert torch.equal(scheme.positions(40, torch.device("cpu")), torch.arange(40))


def test_default_range_is_sixteen_training_lengths(dims):
    assert build_scheme({"name": "randomized_rope"}, dims).max_len == 16 * dims.train_len
    learned = build_scheme({"name": "randomized_learned"}, dims)
    assert learned.table.num_embeddings == 16 * dims.train_len
    assert learned.max_positions == 16 * dims.train_len


def test_randomized_learned_refuses_lengths_past_its_table(dims):
    scheme = build_scheme({"name": "randomized_learned", "max_len": 32}, dims)
    with pytest.raises(UserError, match=r"cannot serve length 33.*raise pe.max_len"):
        scheme.check_length(33)


@pytest.mark.parametrize("name", ["randomized_rope", "randomized_learned"])
def test_range_below_training_length_is_refused(dims, name):
    with pytest.raises(UserError, match=f"{name}: max_len=8 is below the training length 16"):
        build_scheme({"name": name, "max_len": 8}, dims)
