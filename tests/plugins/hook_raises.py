"""Plugin schemes whose hooks raise: on the probe that keys a scheme's records
(``probe_raises``), or only while training (``train_raises``: the probe runs without
gradients), so that a sweep meets the failure in the middle of a job."""

from __future__ import annotations

import torch
from torch import Tensor

from pe_bench.positions import PositionScheme, register


@register("probe_raises")
class ProbeRaises(PositionScheme):
    """A bias that raises wherever it is called."""

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        raise RuntimeError("the plugin's bias is broken")


@register("train_raises")
class TrainRaises(PositionScheme):
    """Adds nothing, but raises once gradients are on: in training, not on the key's probe."""

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        if torch.is_grad_enabled():
            raise RuntimeError("the plugin fails in training")
        return x
