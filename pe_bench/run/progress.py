"""Training progress where no progress bar shows it (output that is not a terminal: a log
file, a SLURM job, a pipe), and what a training run will read, said before it starts."""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger(__name__)


class Progress:
    """Training progress as log lines where no progress bar shows it (output not a terminal:
    a log file, a SLURM job, a pipe): at each curve point (every ``log_every`` steps) the step,
    the loss, tokens per second since the last line and the time left at the rate so far."""

    def __init__(
        self, desc: str, steps: int, step_tokens: int, first_step: int, logging_on: bool
    ) -> None:
        self.desc, self.steps, self.step_tokens, self.on = desc, steps, step_tokens, logging_on
        self.first_step = self.last_step = first_step
        self.started = self.last = time.perf_counter()

    def log(self, done: int, loss: float) -> None:
        """Log the line of step ``done`` (nothing when a progress bar shows it)."""
        if not self.on:
            return
        now = time.perf_counter()
        tokens = (done - self.last_step) * self.step_tokens
        rate = tokens / max(now - self.last, 1e-9)
        per_step = (now - self.started) / max(done - self.first_step, 1)
        left = (self.steps - done) * per_step
        log.info(
            "%s: step %d/%d, loss %.4f, %s tok/s, %s left",
            self.desc,
            done,
            self.steps,
            loss,
            f"{rate:,.0f}",
            duration(left),
        )
        self.last_step, self.last = done, now


def duration(seconds: float) -> str:
    """``42 s``, ``3.5 min`` or ``2.1 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


EPOCHS_WARNING = 100  # epochs of the train split past which the model mostly memorises it


def log_epochs(desc: str, corpus: Any, steps: int, batch_size: int, seq_len: int) -> None:
    """Say how many times training reads its train split over (a task's instances are drawn
    afresh: none), as a warning past ``EPOCHS_WARNING``."""
    split = getattr(corpus, "splits", {}).get("train")
    if split is None:
        return
    tokens = steps * batch_size * seq_len
    epochs = tokens / max(len(split), 1)
    level = logging.WARNING if epochs > EPOCHS_WARNING else logging.INFO
    log.log(
        level,
        "%s: %d steps x %d x %d tokens = %s tokens, %s epochs of the %s-token train split%s",
        desc,
        steps,
        batch_size,
        seq_len,
        f"{tokens:,}",
        f"{epochs:,.3g}",
        f"{len(split):,}",
        "; the model will mostly memorise it (fewer train.steps, or more data)"
        if epochs > EPOCHS_WARNING
        else "",
    )
