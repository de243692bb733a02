"""Randomized positions (Ruoss et al. 2023) wrapping RoPE and learned absolute positions."""

from __future__ import annotations

import torch
from torch import Tensor

from pe_bench.errors import UserError
from pe_bench.positions.absolute import Learned
from pe_bench.positions.base import ModelDims, register
from pe_bench.positions.rotary import RoPE


def sorted_sample(seq_len: int, max_len: int, device: torch.device) -> Tensor:
    """``seq_len`` distinct positions drawn uniformly from [0, max_len), in increasing order."""
    if seq_len > max_len:
        raise UserError(f"randomized positions: length {seq_len} exceeds max_len={max_len}")
    return torch.randperm(max_len, device=device)[:seq_len].sort().values


@register("randomized_rope")
class RandomizedRoPE(RoPE):
    """RoPE with randomized positions (Ruoss et al. 2023, https://arxiv.org/abs/2305.16843):
    while training, the positions of a sequence are a sorted random sample of distinct
    integers from [0, ``max_len``), so the model sees rotations up to max_len - 1 while
    training on short sequences; at evaluation they are 0, 1, 2, ... Reference implementation:
    google-deepmind/randomized_positional_encodings (``noisy_fixed_positional_encodings``,
    ``NOISY_ROTARY``), which samples at evaluation too.

    Positions are drawn from torch's global generator (seeded by the training seed). Not
    ``relative``: while training, the distance between indices i and j is p_i - p_j, not i - j.

    Args:
        base (float): frequency base. Default: 10000.
        max_len (int | None): L_max, the range positions are drawn from. Default: None,
            meaning 16 x L_train (the longest default eval length).
    """

    relative = False

    def __init__(self, dims: ModelDims, *, base: float = 10000.0, max_len: int | None = None):
        super().__init__(dims, base=base)
        self.max_len = 16 * dims.train_len if max_len is None else max_len
        if self.max_len < dims.train_len:
            raise UserError(
                f"randomized_rope: max_len={self.max_len} is below the training length "
                f"{dims.train_len}"
            )

    def positions(self, seq_len: int, device: torch.device) -> Tensor:
        if self.training:
            return sorted_sample(seq_len, self.max_len, device)
        return super().positions(seq_len, device)


@register("randomized_learned")
class RandomizedLearned(Learned):
    """Learned absolute positions with randomized positions (Ruoss et al. 2023,
    https://arxiv.org/abs/2305.16843; ``NOISY_LEARNT`` in google-deepmind/
    randomized_positional_encodings): a table of ``max_len`` rows, each sequence trained at a
    sorted random sample of distinct rows, so every row is trained; at evaluation the rows
    0, 1, 2, ... Past the table, ``beyond`` decides (as for ``learned``).

    Args:
        max_len (int | None): L_max, rows in the table and the range positions are drawn from.
            Default: None, meaning 16 x L_train.
        beyond (str): past the table, ``"error"`` or ``"clamp"``. Default: ``"error"``.
    """

    def __init__(
        self, dims: ModelDims, *, max_len: int | None = None, beyond: str = "error"
    ) -> None:
        if max_len is not None and max_len < dims.train_len:
            raise UserError(
                f"randomized_learned: max_len={max_len} is below the training length "
                f"{dims.train_len}"
            )
        super().__init__(dims, max_positions=max_len, beyond=beyond)

    def describe_limit(self) -> str:
        return "raise pe.max_len or set pe.beyond=clamp"

    def positions(self, seq_len: int, device: torch.device) -> Tensor:
        if self.training:
            return sorted_sample(seq_len, self.rows, device)
        return super().positions(seq_len, device)
