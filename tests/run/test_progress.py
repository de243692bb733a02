"""Training says where it is when no progress bar can (issue 41: output that is not a terminal,
a log file or a SLURM job, was silent until training ended), and how many epochs of its train
split it will read (issue 37, item 8: 3.3M epochs started without a word)."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from pe_bench.data.corpus import Corpus
from pe_bench.run import progress
from pe_bench.run.progress import Progress, duration, log_epochs
from pe_bench.run.train import TrainConfig, fit

from ..helpers import tiny_model

STEP_LINE = re.compile(r"^train: step (\d+)/30, loss \d+\.\d{4}, [\d,]+ tok/s, \d+ s left$")


def corpus(tokens: int) -> Corpus:
    data = torch.tensor(list(b"abcdefgh" * (tokens // 8)), dtype=torch.uint8)
    return Corpus(name="abc", sha="x", splits={"train": data, "valid": data, "test": data})


def config(**changes) -> TrainConfig:
    settings = {"seq_len": 16, "batch_size": 4, "steps": 30, "warmup_steps": 2, "val_every": 0}
    return TrainConfig(**{**settings, "log_every": 10, "val_batches": 1, **changes})


def test_a_line_says_step_loss_tokens_per_second_and_time_left(caplog, monkeypatch):
    clock = iter([100.0, 102.0, 106.0])  # start, then 10 steps in 2 s, 10 more in 4 s
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    shown = Progress("train rope", 1000, 4 * 16, first_step=0, logging_on=True)
    with caplog.at_level(logging.INFO, logger="pe_bench"):
        shown.log(10, 2.5)
        shown.log(20, 2.25)
    assert caplog.messages == [
        "train rope: step 10/1000, loss 2.5000, 320 tok/s, 3.3 min left",  # 990 x 0.2 s
        "train rope: step 20/1000, loss 2.2500, 160 tok/s, 4.9 min left",  # 980 x 0.3 s
    ]


def test_no_line_where_a_progress_bar_shows_it(caplog):
    with caplog.at_level(logging.INFO, logger="pe_bench"):
        Progress("train", 30, 4 * 16, first_step=0, logging_on=False).log(10, 2.5)
    assert caplog.messages == []


def test_training_says_the_epochs_it_reads_and_warns_past_a_hundred(caplog):
    with caplog.at_level(logging.INFO, logger="pe_bench"):
        log_epochs("train", corpus(4096), 30, 4, 16)
        log_epochs("train", corpus(32), 10, 32, 16)
    assert caplog.messages[0] == (
        "train: 30 steps x 4 x 16 tokens = 1,920 tokens, 0.469 epochs of the 4,096-token "
        "train split"
    )
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.WARNING]
    assert "= 5,120 tokens, 160 epochs of the 32-token" in caplog.messages[1]
    assert caplog.messages[1].endswith("memorise it (fewer train.steps, or more data)")


def test_durations_read_as_seconds_minutes_or_hours():
    assert [duration(s) for s in (42, 210, 7560)] == ["42 s", "3.5 min", "2.1 h"]


@pytest.mark.slow  # a tiny model's 30 steps
def test_training_without_a_terminal_logs_every_log_every_steps(caplog):
    with caplog.at_level(logging.INFO, logger="pe_bench"):
        fit(tiny_model("rope"), corpus(4096), config(), torch.device("cpu"))
    steps = [STEP_LINE.match(m) for m in caplog.messages if ": step " in m]
    assert all(steps) and [int(m[1]) for m in steps] == [10, 20, 30]
