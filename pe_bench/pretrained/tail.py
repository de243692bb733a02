"""``eval.modes: [tail]`` for a pretrained model: windows of L tokens that end at the scored
targets, each scoring its last S = ``eval.stride`` tokens, the context before the first target
taken from the corpus before it (``context`` tokens, enough for the longest window).

So every target is scored with L - S to L - 1 tokens of context at every length L: the
perplexity at 2x the pretraining context is that of tokens 2x - S/L into a window, not the
average over a window's positions (nonoverlap, where half of a 2x window's targets sit within
the pretraining context). It is also the cheapest protocol that scores the same targets at
every length: one window of L per S targets, where nonoverlap needs the targets to be a
multiple of every length (a 1.5x window over targets of 2x scores them in two windows).

PI's Table 1 (sliding windows of stride 256 over the PG-19 books, which are not truncated) is
close to it: there nearly every target has L - 256 or more tokens of context. YaRN's Table 6 is
not: its Proof-pile documents are truncated to the window and every position of it is scored
(``--truncate``), so at 2x half its targets sit within the pretraining context; that protocol is
``eval.modes: [truncate]`` (``pretrained.truncate``), which a comparison with YaRN's table reads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.run.evaluate import EvalResult
from pe_bench.run.train import autocast


@torch.no_grad()
def score_tail(
    model: nn.Module,
    stream: Tensor,
    context: int,
    length: int,
    stride: int,
    batch_tokens: int,
    device: torch.device,
) -> EvalResult:
    """Score targets ``stream[context + 1:]`` (a multiple of ``stride`` of them) with windows
    of ``length`` tokens, each ending at its ``stride`` targets; ``context >= length - stride``
    tokens before the first target. ``model(x, keep)`` gives the logits of the last ``keep``
    positions (``load.LogitsOnly``)."""
    n_targets = len(stream) - 1 - context
    if n_targets < stride or n_targets % stride or context < length - stride:
        raise ValueError(f"tail: {n_targets} targets, stride {stride}, context {context}")
    ends = torch.arange(context + stride, context + n_targets + 1, stride)  # one past inputs
    offsets = torch.arange(length)
    position_sum = torch.zeros(length, dtype=torch.float64)
    model.eval()
    size = max(1, batch_tokens // length)
    for i in range(0, len(ends), size):
        index = (ends[i : i + size] - length).unsqueeze(1) + offsets  # [b, L]
        x, y = stream[index].to(device), stream[index[:, -stride:] + 1].to(device)
        with autocast(device):
            logits = model(x, stride)  # [b, stride, vocab]
        nll = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none").cpu()
        position_sum[-stride:] += nll.double().sum(0)
    counts = torch.zeros(length, dtype=torch.long)
    counts[-stride:] = len(ends)
    return EvalResult(float(position_sum.sum()), n_targets, position_sum, counts)
