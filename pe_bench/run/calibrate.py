"""The evaluation's calibration step: before a model is scored, each of its schemes that
fits something on held-out text (``PositionScheme.calibrate``: nope_temp's temperatures) is
calibrated at every evaluation length, on the validation split, never the test split.

The calibration is made again whenever a model is evaluated (it is not in the checkpoint), the
same each time: the same windows from the start of the validation split, in the same order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

from pe_bench.data.corpus import Corpus
from pe_bench.data.tasks import IGNORE, TaskData
from pe_bench.model.gpt import GPT
from pe_bench.positions import PositionScheme
from pe_bench.run.evaluate import scheme_swapped
from pe_bench.run.train import autocast

log = logging.getLogger(__name__)


def held_out_loss(
    model: GPT, corpus: Corpus | TaskData, seq_len: int, tokens: int, batch_tokens: int
) -> Callable[[], Tensor]:
    """``loss()``: ``model``'s mean next-token loss (nats) on the first ``tokens`` tokens of
    the validation split (of a task: its validation instances) in windows of ``seq_len``,
    ``batch_tokens`` per forward pass, with gradients where they are enabled."""
    inputs, targets = corpus.valid_windows(max(1, tokens // seq_len), seq_len)
    device = next(model.parameters()).device
    size = max(1, batch_tokens // seq_len)

    def loss() -> Tensor:
        model.eval()
        total, count = torch.zeros((), device=device), 0
        for i in range(0, len(inputs), size):
            x, y = inputs[i : i + size].to(device), targets[i : i + size].to(device)
            with autocast(device):
                logits = model(x)
            nll = F.cross_entropy(
                logits.float().transpose(1, 2), y, ignore_index=IGNORE, reduction="sum"
            )
            total, count = total + nll, count + int((y != IGNORE).sum())
        return total / max(1, count)

    return loss


def calibrate_schemes(
    model: GPT,
    schemes: Iterable[PositionScheme | None],
    lengths: Iterable[int],
    corpus: Corpus | TaskData,
    batch_tokens: int,
) -> dict[tuple[int, int], str]:
    """Calibrate each of ``schemes`` that has ``calibrate`` (None: the model's own; a variant
    is swapped in as evaluation swaps it) at each of ``lengths``; returns each one's line for
    the records by (``id`` of the scheme as given, length)."""
    notes = {}
    for scheme in dict.fromkeys(schemes):  # each once, in order
        with scheme_swapped(model, scheme):
            if not model.pe.has_calibration:
                continue
            for length in sorted(set(lengths)):
                loss = held_out_loss(
                    model, corpus, length, model.pe.calibration_tokens, batch_tokens
                )
                note = model.pe.calibrate(loss, length)
                log.info("calibrated %s at L=%d: %s", model.pe.name, length, note)
                notes[(id(scheme), length)] = note
    return notes
