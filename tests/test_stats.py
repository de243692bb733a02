"""The shared statistics (``pe_bench/stats.py``) against hand computations and published
values."""

from __future__ import annotations

import math

import pytest

from pe_bench.stats import log_buckets, t_interval, wilson


def test_the_t_interval_of_three_values():
    # mean 2, sd 1, n 3: half width t(0.975, 2) * 1 / sqrt(3) = 4.302653 / 1.732051
    n, mean, low, high = t_interval([1.0, 2.0, 3.0, math.nan])  # a NaN is not a value
    assert (n, mean) == (3, 2.0)
    assert (low, high) == pytest.approx((2 - 2.484138, 2 + 2.484138), abs=1e-6)
    assert t_interval([5.0])[:2] == (1, 5.0) and math.isnan(t_interval([5.0])[2])
    assert t_interval([])[0] == 0


def test_the_wilson_interval():
    low, high = wilson(0, 5)
    assert low == 0.0 and high == pytest.approx(0.4345, abs=1e-4)
    low, high = wilson(5, 5)
    assert low == pytest.approx(0.5655, abs=1e-4) and high == 1.0
    low, high = wilson(10, 20)
    assert (low, high) == pytest.approx((0.2993, 0.7007), abs=1e-4)


def test_log_buckets_start_at_powers_of_two():
    assert log_buckets(8, per_octave=1).tolist() == [1, 2, 4, 8, 9]
    assert log_buckets(8).tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
