"""The predictions the RoPE-base report sets beside its measurements, pinned to their papers:
Liu et al. 2023's critical dimension and bound (no code published: OpenLMLab/scaling-rope
holds a README restating eqs. 12-16, "code coming soon"), and Men et al. 2024's bound, against
their Appendix E code, run here."""

from __future__ import annotations

import math

import pytest
import torch

from pe_bench.report import rope_theory


def test_critical_dimension_of_llama2_is_92():
    """Liu et al. 2023, section 3.2 and the authors' README: Llama 2 (d = 128, T_train = 4096,
    base 10,000) has d_extra = 92."""
    assert rope_theory.critical_dimension(128, 4096, 10000.0) == 92


def test_extrapolation_bound_of_llama2_tuned_at_a_larger_base():
    """Eq. 16b with d_extra counted at the pretraining base 10,000: base 1,000,000 gives
    2 pi 10^(6 * 92/128) = 129,027 tokens, between the 128K where the README's table has
    perplexity 7.07 and the 256K where it has 76.82."""
    limit = rope_theory.extrapolation_limit(128, 4096, 1e6, trained_base=10000.0)
    assert limit == pytest.approx(2 * math.pi * 10 ** (6 * 92 / 128))
    assert limit == pytest.approx(129026.78, abs=0.01)
    assert 128_000 < limit < 256_000


# The tiny model's (d = 32 = 128 / 4 heads, L_train = 64), by hand: (d/2) log_b(64 / 2 pi) =
# 16 log10(10.186) / log10(b) = 16.128 / log10(b); d_extra = 2 ceil of it; T_extra = 2 pi
# b^(d_extra / 32). Base 10: 16.13 -> 34 >= 32, so no bound.
TINY = {
    10.0: (34, math.inf),
    100.0: (18, 2 * math.pi * 10 ** (2 * 18 / 32)),  # 83.8
    1000.0: (12, 2 * math.pi * 10 ** (3 * 12 / 32)),  # 83.8
    10000.0: (10, 2 * math.pi * 10 ** (4 * 10 / 32)),  # 111.7
    100000.0: (8, 2 * math.pi * 10 ** (5 * 8 / 32)),  # 111.7
    1e6: (6, 2 * math.pi * 10 ** (6 * 6 / 32)),  # 83.8
}


@pytest.mark.parametrize("base", list(TINY))
def test_the_tiny_models_critical_dimension_and_bound(base):
    d_extra, limit = TINY[base]
    assert rope_theory.critical_dimension(32, 64, base) == d_extra
    assert rope_theory.extrapolation_limit(32, 64, base) == pytest.approx(limit)


def authors_decay(base: float, context_size: int, dim: int) -> torch.Tensor:
    """Men et al. 2024, Appendix E's ``get_BMtheta_expectation``, as printed."""
    realdim = dim / 2
    d = torch.arange(0, realdim, 1)
    theta = base ** (-2 * d / dim)
    dist = torch.outer(torch.arange(0, context_size), theta).cos()
    return dist.sum(dim=1) / realdim


@pytest.mark.parametrize(("base", "dim"), [(10.0, 32), (1e4, 128), (5e5, 128)])
def test_decay_is_appendix_e_b_m_theta(base, dim):
    ours = rope_theory.decay(base, dim, range(3000))
    theirs = authors_decay(base, 3000, dim).double().numpy()
    assert ours == pytest.approx(theirs, abs=1e-4)  # theirs in float32: angles up to 3000 rad


# Appendix E's search run here (torch float32, as printed, contexts 2^k): the first base of
# its grid with no negative B below the context. The float64 search of ``lower_bound_base``
# gives the same bases up to 64K (measured: 2026-11-27).
LOWER_BOUNDS = {
    1024: 4300.0,
    2048: 16000.0,
    4096: 29000.0,
    8192: 84000.0,
    16384: 350000.0,
    32768: 630000.0,
    65536: 2100000.0,
    131072: 8800000.0,
}


@pytest.mark.parametrize("context", list(LOWER_BOUNDS))
def test_the_lower_bound_base_supports_its_context_and_the_grid_base_before_it_does_not(context):
    """Cheap form of the search: the bound supports ``context``, the grid's previous base
    does not."""
    grid = rope_theory.search_bases()
    bound = LOWER_BOUNDS[context]
    before = grid[grid.index(bound) - 1]
    assert rope_theory.supported_length(bound, 128, context) is None
    assert rope_theory.supported_length(before, 128, context) < context


@pytest.mark.slow  # 2 s unloaded, minutes on a busy machine
@pytest.mark.parametrize("context", [1024, 2048, 4096, 8192])
def test_lower_bound_base_is_appendix_e_search(context):
    assert rope_theory.lower_bound_base(context) == LOWER_BOUNDS[context]


def test_supported_length_is_the_first_negative_distance_of_appendix_e():
    """For the tiny model's head (d = 32): B >= 0 below the supported length and < 0 at it,
    by the authors' function."""
    for base in (10.0, 100.0, 1000.0, 10000.0, 100000.0, 1e6):
        length = rope_theory.supported_length(base, 32, 1 << 16)
        theirs = authors_decay(base, length + 1, 32)
        assert (theirs[:length] >= 0).all() and theirs[length] < 0, base


def test_supported_length_none_past_its_limit():
    assert rope_theory.supported_length(1e6, 128, 1000) is None
    assert rope_theory.supported_length(10.0, 32, 1000) == 5  # cos sums go negative at m = 5
