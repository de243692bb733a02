"""A sweep's time estimate before its first job (issue 41), from measured steps."""

from __future__ import annotations

import dataclasses
import re

import torch

from pe_bench.run import estimate
from pe_bench.run.config import RunConfig
from pe_bench.run.plan import plan


def test_the_estimate_is_steps_times_the_measured_step_and_says_what_it_depends_on(
    tiny_config, monkeypatch
):
    plans = [plan(RunConfig.parse(tiny_config(f"pe={name}"))) for name in ("rope", "alibi")]
    timed = []

    def step_seconds(job, train):
        timed.append((job.scheme.name, train.seq_len))
        return 0.5

    monkeypatch.setattr(estimate, "step_seconds", step_seconds)
    line = estimate.sweep_estimate([*plans, plans[0]])  # a second seed: measured once
    assert timed == [("rope", 16), ("alibi", 16)]
    assert line.startswith("3 jobs, about 4 s of training on cpu (")  # 3 x 3 steps x 0.5 s
    # the machine's own parentheses, then the measurement after a comma (issue 41 found the
    # cost note's "cpu (x86_64, 2 threads) (device cpu ...": one pair after another)
    assert re.search(r" threads?\), measured at 0\.5 to 0\.5 s a step \(evaluation", line), line
    assert ") (" not in line
    assert re.search(r"train.steps x batch_size x seq_len, the model's size, and this", line)


def test_a_step_is_measured_and_leaves_the_random_state_alone(tiny_config):
    job = plan(RunConfig.parse(tiny_config()))
    state = torch.get_rng_state()
    seconds = estimate.step_seconds(job, dataclasses.replace(job.cfg.train, batch_size=2))
    assert 0 < seconds < 10
    assert torch.equal(torch.get_rng_state(), state)
