"""The statistics both the runs and the reports use: a t-interval over seeds or windows, a Wilson
interval of a proportion, log-spaced buckets of positions. Here, on a floor below ``run/``,
``pretrained/`` and ``report/``, so that a run's probes and evaluations need not import the
report's package for them (``tests/test_stats.py`` checks them against hand computations)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from scipy import stats

Z95 = 1.959963984540054  # the 97.5% normal quantile


def t_interval(values: Iterable[float]) -> tuple[int, float, float, float]:
    """(n, mean, low, high): the 95% t-interval of the finite values; NaN bounds when n < 2."""
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    n = len(v)
    if n == 0:
        return 0, math.nan, math.nan, math.nan
    mean = float(v.mean())
    if n == 1:
        return 1, mean, math.nan, math.nan
    half = float(stats.t.ppf(0.975, n - 1) * v.std(ddof=1) / math.sqrt(n))
    return n, mean, mean - half, mean + half


def wilson(hits: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a proportion ``hits / n`` (never outside [0, 1])."""
    p = hits / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def log_buckets(length: int, per_octave: int = 4) -> np.ndarray:
    """Edges of log-spaced buckets of window positions 1..length, bucket i = [e_i, e_i+1).
    Edges fall on powers of two, so a power-of-two training length starts a bucket."""
    k = np.arange(math.ceil(per_octave * math.log2(length)) + 1)
    edges = np.round(2.0 ** (k / per_octave)).astype(int)
    return np.unique(np.append(edges[edges <= length], length + 1))
