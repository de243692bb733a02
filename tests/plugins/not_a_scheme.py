"""A plugin that registers a function instead of a ``PositionScheme`` subclass."""

from __future__ import annotations

from pe_bench.positions import register


@register("not_a_scheme")
def not_a_scheme(x):
    """Not a scheme: ``@register`` refuses it when the module is imported."""
    return x
