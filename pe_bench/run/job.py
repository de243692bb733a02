"""One run, whatever its model: plan -> store -> compute what is missing -> records.

``run(job, out_dir, steps)`` is the pipeline every run goes through, a model pe-bench trains
(a ``run.plan.Plan`` with ``run.trained.STEPS``) as well as a pretrained one (a
``pretrained.plan.PretrainedPlan`` with ``pretrained.evaluate.STEPS``):

1. the plan (already made: nothing read, nothing built) lists every record the run owes, by run
   id (``Job.owed``);
2. the job folder is locked and the data loaded (``Steps.open``), and the folder's records are
   read by ``RunStore`` under the keys that make them current: the corpus, the code, the
   tokenizer, each variant's and probe's settings;
3. what is missing is computed (``Steps.compute``: train or load the model, then evaluate),
   each record written as soon as it exists, so a killed run loses at most the one in progress.

Every job folder is named after its overrides, so rerunning a command finds its own folders:
a job whose records are complete is skipped, a job killed mid-training resumes from its last
checkpoint, a job killed mid-evaluation computes only its missing records. ``force=true``
starts over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from pe_bench.run import tracking
from pe_bench.run.config import RunConfig
from pe_bench.run.distributed import World, current_world
from pe_bench.run.evaluate import EvalTask
from pe_bench.run.store import FAILED, RunStore, job_lock, record_failure

log = logging.getLogger("pe_bench")


@dataclass(frozen=True)
class DataKey:
    """What a run's records are keyed on besides the plan: the data and the code."""

    corpus_sha: str
    tokenizer_sha: str
    pe_source: str  # the hash of the code that computes the numbers
    weights_sha: str | None = None  # a pretrained model's weights (``pretrained.key``)
    # each fine-tune's run id -> the key of its scheme's code (``run.plan.Finetune.source``)
    finetune_sources: dict[str, str] = field(default_factory=dict)


class Job(Protocol):
    """A plan: what a run owes, decided before anything is read or built."""

    cfg: RunConfig
    device: torch.device

    @property
    def run_ids(self) -> list[str]: ...

    def owed(self) -> list[tuple[str, list[EvalTask]]]:
        """(run id, every evaluation task it owes), in the order they are computed."""
        ...


@dataclass(frozen=True)
class RunContext:
    """What every step of a run needs besides the model."""

    job: Any  # the Job being run (its own type: its steps read its fields)
    data: Any  # what ``Steps.open`` loaded
    store: RunStore
    world: World
    device: torch.device
    tracker: tracking.Tracker


@dataclass(frozen=True)
class Steps:
    """How a kind of model gets its data (``open``: the data, and what its records are keyed
    on) and its missing records (``compute``: given the run id -> tasks still to do)."""

    open: Callable[[Any, torch.device], tuple[Any, DataKey]]
    compute: Callable[[RunContext, dict[str, list[EvalTask]]], None]


def run(job: Job, out_dir: Path, steps: Steps, sweep: bool = False) -> list[dict[str, Any]]:
    """Compute the records of ``job`` missing from ``out_dir`` and return all of them (cached
    included); rank 0 alone writes under torchrun, the other ranks return none. In a
    ``sweep``, a job folder that another process holds (another sweep into the same folder)
    is waited for, not a failure, and a failure is left in the folder's ``error.txt``, both
    under the job's lock: a run of the job removes an earlier one, never another's."""
    world, device = world_and_device(job.device)
    with job_lock(out_dir, take=world.main, wait=sweep):  # torchrun: rank 0 holds it for all
        if world.main:
            (out_dir / FAILED).unlink(missing_ok=True)
        try:
            return _run_locked(job, out_dir, steps, world, device)
        except Exception as err:  # bad input, a full disk, a plugin's bug: the sweep goes on
            if sweep and world.main:
                record_failure(out_dir, err)
            raise


def _run_locked(
    job: Job, out_dir: Path, steps: Steps, world: World, device: torch.device
) -> list[dict[str, Any]]:
    """``run``, the job folder held: load the data, read the store, compute what is missing."""
    data, key = steps.open(job, device)
    store = open_store(job, out_dir, key, world)
    todo = {rid: store.missing(rid, tasks) for rid, tasks in job.owed()}
    if not any(todo.values()):
        log.info(
            "%s: all %d records are there: skipped; force=true recomputes",
            out_dir,
            len(store.records),
        )
        return store.records
    store.write_config(job.cfg.yaml)
    tracker = start_tracker(job, world, out_dir)
    steps.compute(RunContext(job, data, store, world, device, tracker), todo)
    if not world.main:
        return []
    log.info("%s: done, %d records", out_dir, len(store.records))
    tracker.log_records(store.records)
    tracker.finish()
    return store.records


def open_store(job: Job, out_dir: Path, key: DataKey, world: World) -> RunStore:
    """The job folder's records that are current for ``job``: each variant's and probe's
    records under the settings hash the plan gives them, the rest stale."""
    tasks = [task for _, owed in job.owed() for task in owed]
    return RunStore(
        out_dir,
        job.run_ids,
        key.corpus_sha,
        job.cfg.force,
        writer=world.main,
        variants={t.variant: t.variant_hash for t in tasks},
        probes={t.mode: t.probe_hash for t in tasks if t.probe_hash},
        pe_source=key.pe_source,
        tokenizer_sha=key.tokenizer_sha,
        variant_sources={t.variant: t.variant_source for t in tasks},
        weights_sha=key.weights_sha,
        finetune_sources=key.finetune_sources,
    )


def world_and_device(device: torch.device) -> tuple[World, torch.device]:
    """The processes this run trains in (several under torchrun) and this one's device."""
    world = current_world(device.type)
    if device.type == "cuda" and world.size > 1:
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    return world, device


def start_tracker(job: Job, world: World, out_dir: Path) -> tracking.Tracker:
    """A no-op unless logger=wandb; a job that fails is closed by the next job's init or at
    exit. Rank 0 alone logs."""
    return tracking.start(
        job.cfg.logger if world.main else None,
        name=out_dir.name,
        group=job.cfg.name,
        job_type="train",
        folder=out_dir,
        config={**job.cfg.resolved, "run_id": job.run_ids[0]},
    )
