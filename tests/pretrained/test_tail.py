"""Tail windows (``eval.modes=[tail]``, pe_bench/pretrained/tail.py): every target is scored as
one of the last ``stride`` tokens of a window of L tokens that ends at it, the same targets at
every length, against an independent computation one target at a time; only for a
pretrained model."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pe_bench.errors import UserError
from pe_bench.pretrained.tail import score_tail
from pe_bench.run.config import RunConfig
from pe_bench.run.plan import plan
from tests.helpers import compose

VOCAB = 11


class Causal(nn.Module):
    """A causal LM whose logits at position p depend on every token up to p and on p itself
    (a decayed running sum of embeddings plus a position term): a window's start changes
    them, as it does a real model's. ``forward(x, keep)`` as ``load.LogitsOnly``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 8)
        self.head = nn.Linear(8, VOCAB)

    def forward(self, x: torch.Tensor, keep: int = 0) -> torch.Tensor:
        h = self.embed(x)  # [b, L, 8]
        decay = 0.9 ** torch.arange(x.shape[1], dtype=torch.float32)
        state = torch.cumsum(h / decay[:, None], dim=1) * decay[:, None]
        positions = torch.arange(x.shape[1], dtype=torch.float32)[:, None] / 10
        logits = self.head(torch.tanh(state + positions))
        return logits[:, -keep:] if keep else logits


def one_at_a_time(model, stream, context, length, stride) -> list[float]:
    """The loss of each target after ``context``, computed alone: target t belongs to the
    window of ``length`` inputs that ends at the first multiple of ``stride`` (counted from the
    first target) at or after it, and is predicted at its place in that window."""
    losses = []
    for t in range(context + 1, len(stream)):
        end = context + stride * math.ceil((t - context) / stride)  # one past the inputs
        window = stream[end - length : end].unsqueeze(0)
        logits = model(window)[0, length - 1 - (end - t)]
        losses.append(float(F.cross_entropy(logits, stream[t])))
    return losses


@pytest.mark.parametrize(("length", "stride"), [(4, 4), (12, 4), (16, 8), (16, 2)])
def test_tail_windows_score_each_target_as_the_end_of_a_window_of_its_length(length, stride):
    model = Causal().eval()
    context, n_targets = 16 - stride, 16
    generator = torch.Generator().manual_seed(length + stride)
    stream = torch.randint(0, VOCAB, (context + n_targets + 1,), generator=generator)
    with torch.no_grad():
        result = score_tail(model, stream, context, length, stride, 40, torch.device("cpu"))
        expected = one_at_a_time(model, stream, context, length, stride)
    assert result.tokens == n_targets
    assert result.nll == pytest.approx(sum(expected) / n_targets, rel=1e-6)
    counts = result.position_count.tolist()
    assert counts == [0] * (length - stride) + [n_targets // stride] * stride
    # the loss at window offset L - stride + i is the mean over the targets scored there
    by_offset = [sum(expected[i::stride]) / (n_targets // stride) for i in range(stride)]
    got = result.position_loss()[-stride:]
    assert got == pytest.approx(by_offset, rel=1e-6)
    assert all(v is None for v in result.position_loss()[: length - stride])


def test_tail_windows_need_their_context_and_whole_strides():
    model, stream = Causal(), torch.zeros(30, dtype=torch.long)
    with pytest.raises(ValueError, match="context"):
        score_tail(model, stream, 4, 16, 4, 64, torch.device("cpu"))  # 16 - 4 > 4
    with pytest.raises(ValueError, match="stride"):
        score_tail(model, stream, 12, 16, 5, 64, torch.device("cpu"))  # 17 targets


def test_tail_mode_is_refused_for_a_model_pe_bench_trains():
    cfg = RunConfig.parse(compose("model=smoke", "eval.modes=[tail]", "eval.stride=8"))
    with pytest.raises(UserError, match="tail .* is for model=hf"):
        plan(cfg)


def test_tail_targets_per_slice_are_a_multiple_of_the_stride():
    """Not of the longest length, as nonoverlap windows need."""
    pytest.importorskip("transformers")
    from pe_bench.pretrained.plan import _n_targets

    def parsed(stride: int) -> RunConfig:
        overrides = ["model=hf", "model.name=x", "eval.modes=[tail]", f"eval.stride={stride}"]
        return RunConfig.parse(compose(*overrides, "eval.tokens=100"))

    assert _n_targets(parsed(32), [32, 64, 96], 64) == 96  # 3 strides, not a multiple of 96
    with pytest.raises(UserError, match="eval.tokens=100 is below eval.stride=128"):
        _n_targets(parsed(128), [128], 64)
