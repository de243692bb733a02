"""Randomized positions: sorted distinct samples from [0, max_len), in training (global
generator) and in evaluation (a generator seeded by the draw index), as the reference samples."""

from __future__ import annotations

import pytest
import torch

from pe_bench.errors import UserError
from pe_bench.positions import build_scheme

RANDOMIZED = ["randomized_rope", "randomized_learned"]
CPU = torch.device("cpu")


def assert_sorted_samples(pos: torch.Tensor, length: int, max_len: int) -> None:
    assert pos.shape == (length,)
    assert (pos[1:] > pos[:-1]).all()  # sorted and distinct
    assert pos.min() >= 0 and pos.max() < max_len


@pytest.mark.parametrize("name", RANDOMIZED)
def test_training_positions_are_sorted_distinct_samples(dims, name):
    scheme = build_scheme({"name": name, "max_len": 100}, dims).train()
    draws = [scheme.positions(16, CPU) for _ in range(20)]
    for pos in draws:
        assert_sorted_samples(pos, 16, 100)
    assert len({tuple(p.tolist()) for p in draws}) == 20  # a new draw every call
    assert max(int(p.max()) for p in draws) > 16  # positions beyond the training length


@pytest.mark.parametrize("name", RANDOMIZED)
def test_evaluation_positions_are_sampled_too_and_reproducible_per_draw(dims, name):
    """The reference samples at evaluation as in training: evaluating at 0, 1, 2, ... shows
    the model spacings it never trained on (at 64 of 1024, neighbours are 1 apart 6% of the
    time)."""
    scheme = build_scheme({"name": name, "max_len": 100}, dims).eval()
    assert scheme.eval_draws == 4
    scheme.seed_eval_positions(0)
    first = [scheme.positions(40, CPU) for _ in range(3)]
    for pos in first:
        assert_sorted_samples(pos, 40, 100)
        assert not torch.equal(pos, torch.arange(40))
    scheme.seed_eval_positions(0)  # the same draw again: the same positions
    assert all(torch.equal(a, scheme.positions(40, CPU)) for a in first)
    scheme.seed_eval_positions(1)  # another draw: others
    assert not torch.equal(scheme.positions(40, CPU), first[0])
    torch.manual_seed(123)  # independent of the global (training) generator
    scheme.seed_eval_positions(0)
    assert torch.equal(scheme.positions(40, CPU), first[0])


def test_default_range_is_twice_the_longest_default_eval_length(dims):
    assert build_scheme({"name": "randomized_rope"}, dims).max_len == 32 * dims.train_len
    learned = build_scheme({"name": "randomized_learned"}, dims)
    assert learned.table.num_embeddings == 32 * dims.train_len
    assert learned.max_positions == 32 * dims.train_len


@pytest.mark.parametrize("name", RANDOMIZED)
def test_lengths_past_max_len_are_refused(dims, name):
    scheme = build_scheme({"name": name, "max_len": 32}, dims)
    scheme.check_length(32)
    with pytest.raises(UserError, match=r"cannot serve length 33.*raise pe.max_len"):
        scheme.check_length(33)


@pytest.mark.parametrize("name", RANDOMIZED)
def test_range_below_training_length_is_refused(dims, name):
    with pytest.raises(UserError, match=f"{name}: max_len=8 is below the training length 16"):
        build_scheme({"name": name, "max_len": 8}, dims)


@pytest.mark.parametrize("name", RANDOMIZED)
def test_eval_draws_must_be_positive(dims, name):
    with pytest.raises(UserError, match="pe.eval_draws must be >= 1, got 0"):
        build_scheme({"name": name, "eval_draws": 0}, dims)
