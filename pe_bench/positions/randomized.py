"""Randomized positions (Ruoss et al. 2023) wrapping RoPE and learned absolute positions.

Training and evaluation both place a sequence at sorted random positions from [0, max_len), as
the reference does (google-deepmind/randomized_positional_encodings samples in every call of
its NOISY_* encodings, and ``range_evaluation.py`` hands every evaluation a fresh rng). Training
draws from torch's global generator (seeded by the training seed); evaluation averages
``eval_draws`` draws, each from a generator seeded by its draw index alone, independent of the
data and the training seed, and records their spread.

max_len defaults to 32 x L_train: twice the longest length of the default protocol (16 x), so
that even there a window's positions are a random half of the range rather than every position
(the paper samples from a range well above its longest test length). Lengths past max_len are
refused at plan time.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from pe_bench.config import Range
from pe_bench.errors import UserError
from pe_bench.positions.absolute import Learned
from pe_bench.positions.base import ModelDims, register
from pe_bench.positions.rotary import RoPE

MAX_LEN_FACTOR = 32  # default max_len = 32 x L_train


def sorted_sample(
    seq_len: int, max_len: int, device: torch.device, generator: torch.Generator | None = None
) -> Tensor:
    """``seq_len`` distinct positions drawn uniformly from [0, max_len), in increasing order;
    from ``generator`` (on CPU, then moved) when given, else from the global generator."""
    if generator is None:
        return torch.randperm(max_len, device=device)[:seq_len].sort().values
    return torch.randperm(max_len, generator=generator)[:seq_len].sort().values.to(device)


def default_max_len(max_len: int | None, dims: ModelDims, name: str) -> int:
    """``max_len``, or its default; refused below the training length."""
    max_len = MAX_LEN_FACTOR * dims.train_len if max_len is None else max_len
    if max_len < dims.train_len:
        raise UserError(f"{name}: max_len={max_len} is below the training length {dims.train_len}")
    return max_len


class SampledPositions:
    """Sorted random positions in training and evaluation (mixed into a scheme)."""

    max_len: int
    training: bool
    option_ranges: ClassVar[dict[str, Range]] = {"max_len": Range(ge=1), "eval_draws": Range(ge=1)}

    def init_sampling(self, eval_draws: int) -> None:
        self.eval_draws = eval_draws
        self.eval_generator = torch.Generator()

    def seed_eval_positions(self, draw: int) -> None:
        self.eval_generator.manual_seed(draw)

    def positions(self, seq_len: int, device: torch.device) -> Tensor:
        if self.training:
            return sorted_sample(seq_len, self.max_len, device)
        return sorted_sample(seq_len, self.max_len, device, self.eval_generator)


@register("randomized_rope")
class RandomizedRoPE(SampledPositions, RoPE):
    """RoPE with randomized positions (Ruoss et al. 2023, https://arxiv.org/abs/2305.16843):
    the positions of a sequence are a sorted random sample of distinct integers from
    [0, ``max_len``), in training and evaluation alike (see the module docstring), so the model
    sees rotations up to max_len - 1 while training on short sequences. Reference
    implementation: google-deepmind/randomized_positional_encodings
    (``noisy_fixed_positional_encodings``, ``NOISY_ROTARY``).

    Not ``relative``: the distance between indices i and j is p_i - p_j, not i - j.

    Args:
        base (float): frequency base. Default: 10000.
        max_len (int | None): L_max, the range positions are drawn from. Default: None,
            meaning 32 x L_train.
        eval_draws (int): position draws an evaluation averages. Default: 4.
    """

    relative = False
    option_ranges: ClassVar[dict[str, Range]] = {
        **RoPE.option_ranges,
        **SampledPositions.option_ranges,
    }

    def __init__(
        self,
        dims: ModelDims,
        *,
        base: float = 10000.0,
        max_len: int | None = None,
        eval_draws: int = 4,
    ) -> None:
        super().__init__(dims, base=base)
        self.max_len = default_max_len(max_len, dims, "randomized_rope")
        self.init_sampling(eval_draws)

    @property
    def max_positions(self) -> int:
        return self.max_len

    def describe_limit(self) -> str:
        return "raise pe.max_len"


@register("randomized_learned")
class RandomizedLearned(SampledPositions, Learned):
    """Learned absolute positions with randomized positions (Ruoss et al. 2023,
    https://arxiv.org/abs/2305.16843; ``NOISY_LEARNT`` in google-deepmind/
    randomized_positional_encodings): a table of ``max_len`` rows, each sequence at a sorted
    random sample of distinct rows, in training and evaluation alike (see the module
    docstring), so every row is trained.

    Args:
        max_len (int | None): L_max, rows in the table and the range positions are drawn from.
            Default: None, meaning 32 x L_train.
        eval_draws (int): position draws an evaluation averages. Default: 4.
    """

    def __init__(self, dims: ModelDims, *, max_len: int | None = None, eval_draws: int = 4) -> None:
        max_len = default_max_len(max_len, dims, "randomized_learned")
        super().__init__(dims, max_positions=max_len, beyond="error")
        self.max_len = max_len
        self.init_sampling(eval_draws)

    def describe_limit(self) -> str:
        return "raise pe.max_len"
