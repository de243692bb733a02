"""A plugin scheme whose constructor raises (``pe-bench`` must say so in one line)."""

from __future__ import annotations

from pe_bench.positions import ModelDims, PositionScheme, register


@register("init_raises")
class InitRaises(PositionScheme):
    """Refuses every model: its ``__init__`` raises a plain ``ValueError``."""

    def __init__(self, dims: ModelDims) -> None:
        super().__init__(dims)
        raise ValueError(f"needs d_model >= 4096, got {dims.d_model}")
