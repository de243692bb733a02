"""What two papers predict about RoPE's base, as numbers the RoPE-base report
(``rope_base``) sets beside its measurements.

- **Liu et al. 2023**, "Scaling Laws of RoPE-based Extrapolation" (arXiv 2310.05209): the
  critical dimension (eq. 13) counts the rotary dimensions that turn through a whole period
  within the training length; the dimensions past it never saw a whole period, and the
  extrapolation bound (eq. 16b) is the period of the first of them. The authors' repository
  (OpenLMLab/scaling-rope) holds only a README ("code coming soon") restating eqs. 12-16, so
  these follow the paper. The paper derives the bound for a model pretrained at base 10,000
  and tuned at another base; for a model trained from scratch at ``base`` the pretraining and
  the tuning base are one, which is how ``extrapolation_limit`` reads it by default.
- **Men et al. 2024**, "Base of RoPE Bounds Context Length" (arXiv 2405.14591): B(m) = sum_i
  cos(m theta_i), the long-term decay of a query's preference for a similar key over a random
  one (their Theorem 1); a base supports context L when B(m) >= 0 for every m < L. The
  authors' code is their Appendix E (searching bases (i + j/10) 10^x for the first with no
  negative B below ``context_size``); ``lower_bound_base`` is that search, ``supported_length``
  its inverse for one base.
"""

from __future__ import annotations

import math

import numpy as np

TWO_PI = 2 * math.pi
FIRST_CHUNK = 64  # distances ``supported_length`` scores first; each next chunk is twice as long


def frequencies(base: float, head_dim: int) -> np.ndarray:
    """RoPE's theta_i = base^(-2i/d), i = 0 .. d/2 - 1 (float64)."""
    return base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def critical_dimension(head_dim: int, train_len: float, base: float) -> int:
    """Liu et al. 2023 eq. (13), d_extra = 2 ceil((d/2) log_base(T_train / 2 pi)), with the
    base as a parameter (the paper writes 10,000; eq. 16c uses another base): the number of
    dimensions whose period 2 pi base^(2n/d) fits in the training length. Llama 2 (d = 128,
    T_train = 4096, base 10,000): 92. It may exceed ``head_dim``: every dimension fits."""
    return 2 * math.ceil(head_dim / 2 * math.log(train_len / TWO_PI, base))


def extrapolation_limit(
    head_dim: int, train_len: float, base: float, trained_base: float | None = None
) -> float:
    """Liu et al. 2023 eq. (16b), T_extra = 2 pi base^(d_extra / d): the period of the first
    dimension that did not turn through a whole period in training, with d_extra counted at
    the base the positions were learned with (``trained_base``; default ``base``, a model
    trained from scratch). ``math.inf`` where every dimension turned through a whole period
    (d_extra >= d): the paper then predicts no bound, only a slow rise in perplexity (its
    Theorem 1, bases below the critical base)."""
    d_extra = critical_dimension(head_dim, train_len, trained_base or base)
    if d_extra >= head_dim:
        return math.inf
    return TWO_PI * base ** (d_extra / head_dim)


def decay(base: float, head_dim: int, distances: np.ndarray) -> np.ndarray:
    """Men et al. 2024's B(m) / (d/2), the mean of cos(m theta_i) over RoPE's frequencies, at
    each relative distance m (Appendix E's ``get_BMtheta_expectation``, in float64)."""
    angles = np.outer(np.asarray(distances, dtype=np.float64), frequencies(base, head_dim))
    return np.cos(angles).mean(axis=1)


def supported_length(base: float, head_dim: int, limit: int) -> int | None:
    """The longest context ``base`` supports by Men et al. 2024's bound: the first relative
    distance m with B(m) < 0 (every distance below it has B >= 0, so a context of m tokens
    is supported); None when B stays >= 0 below ``limit``. Scored in chunks that double, so
    that a base failing early (most of Appendix E's grid) costs little."""
    start, size = 0, FIRST_CHUNK
    while start < limit:
        distances = np.arange(start, min(start + size, limit))
        negative = np.flatnonzero(decay(base, head_dim, distances) < 0)
        if len(negative):
            return start + int(negative[0])
        start, size = start + size, 2 * size
    return None


def search_bases() -> list[float]:
    """Appendix E's grid: (i + j/10) 10^x for x = 3..9, i = 1..9, j = 0..9, in its order."""
    return [(i + j / 10) * 10**x for x in range(3, 10) for i in range(1, 10) for j in range(10)]


def lower_bound_base(context: int, head_dim: int = 128) -> float | None:
    """Men et al. 2024's lower bound of the base for ``context`` tokens: the first base of
    Appendix E's grid with B(m) >= 0 for all m < ``context``; None if none in the grid."""
    for base in search_bases():
        if supported_length(base, head_dim, context) is None:
            return base
    return None
