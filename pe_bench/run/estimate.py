"""A sweep's time, estimated before its first job from a few measured training steps of each
model it trains (issue 41: the time was said only after the first job, and the README's
figure holds on one kind of machine only).

Training is most of a run's time on a CPU (the quick suite: 89 to 117 s of about 113 s a
scheme, docs/protocol.md), and a step's time is that of its small fp32 matmuls: so it follows
``train.steps x batch_size x seq_len``, the model's size, the CPU's matmul speed and its
threads. The estimate times two steps (after one to warm up) on random tokens, for each
distinct model and training setting of the sweep and each fine-tune, and adds them up;
evaluation and the report come on top.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from pe_bench.provenance import device_name
from pe_bench.run.distributed import World
from pe_bench.run.plan import Plan
from pe_bench.run.progress import duration
from pe_bench.run.train import TrainConfig, _Training

MEASURED_STEPS = 2  # timed after one step that warms up


class RandomTokens:
    """A stand-in corpus for timing: random token windows, nothing read."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def train_batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, self.vocab_size, (batch_size, seq_len + 1), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]


def step_seconds(plan: Plan, train: TrainConfig) -> float:
    """Seconds a training step of ``plan``'s model takes here with ``train``'s batch and length
    (the mean of ``MEASURED_STEPS`` after a first); the global random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        model = plan.build_model()
        training = _Training.start(
            model, RandomTokens(model.cfg.vocab_size), train, plan.device, World()
        )
        training.step(0)[0].item()
        start = time.perf_counter()
        for step in range(1, MEASURED_STEPS + 1):
            training.step(step)[0].item()  # .item(): waits for the device
        return (time.perf_counter() - start) / MEASURED_STEPS


def training_seconds(plans: Sequence[Plan]) -> tuple[float, list[float]]:
    """Estimated seconds of training of every plan and its fine-tunes, and the measured step
    times (one measurement per distinct model and training setting)."""
    measured: dict[str, float | None] = {}
    total = 0.0
    for plan in plans:
        settings = [plan.cfg.train, *(ft.train for ft in plan.finetunes)]
        for train in settings:
            key = repr((plan.cfg.model, plan.cfg.pe, train.batch_size, train.seq_len))
            if key not in measured:
                try:
                    measured[key] = step_seconds(plan, train)
                except Exception:  # a plugin that fails in training: its job will say so
                    measured[key] = None
            total += (measured[key] or 0.0) * train.steps
    return total, [seconds for seconds in measured.values() if seconds is not None]


SHORT = 100  # training steps a job: a sweep of such jobs starts without an estimate


def worth_estimating(plans: Sequence[Plan]) -> bool:
    """Whether a sweep trains long enough for an estimate (measuring costs a few steps a
    model, as much as a job of a few steps)."""
    return any(plan.cfg.train.steps > SHORT for plan in plans)


def sweep_estimate(plans: Sequence[Plan]) -> str:
    """One line: the sweep's estimated training time here, what it was measured from and what
    it depends on."""
    total, steps = training_seconds(plans)
    device = plans[0].device
    if not steps:
        return f"{len(plans)} jobs; no training step could be measured"
    return (
        f"{len(plans)} jobs, about {duration(total)} of training on {device_name(device)}, "
        f"measured at {min(steps):.3g} to {max(steps):.3g} s a step (evaluation and the report "
        "come on top; a job whose records are there takes seconds); the time follows "
        "train.steps x batch_size x seq_len, the model's size, and this machine's matmul "
        "speed and threads"
    )
