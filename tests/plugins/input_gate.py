"""A scheme that attends itself from the layer's input (the ``attend`` hook), for the tests of
that hook: causal attention whose values are gated per token and head by the layer's input,
v_t * sigmoid(w_h . x_t), with w per layer and head. Registered as ``input_gate``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.positions import ModelDims, PositionScheme, register


@register("input_gate")
class InputGate(PositionScheme):
    def __init__(self, dims: ModelDims) -> None:
        super().__init__(dims)
        shape = (dims.num_layers, dims.num_heads, dims.d_model)
        self.gate = nn.Parameter(0.5 * torch.randn(shape))

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, layer: int) -> Tensor:
        gate = torch.sigmoid(torch.einsum("bsd,hd->bhs", x, self.gate[layer].to(x.dtype)))
        return F.scaled_dot_product_attention(q, k, v * gate.unsqueeze(-1), is_causal=True)
