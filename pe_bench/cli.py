"""Entry point ``pe-bench``: one Hydra job = train one model, evaluate it, write its records.

``run(cfg, out_dir)`` does the work and is what tests call; ``main`` is the thin Hydra wrapper.
A sweep (``-m`` or an experiment with ``hydra.mode: MULTIRUN``) runs one job per override set
through Hydra's launcher (local, or SLURM via hydra-submitit-launcher); ``SweepCallback`` logs
the sweep's progress and writes the report when it ends.

Every job folder is named after its overrides, so rerunning a command finds its own folders:
a job whose records are complete is skipped, a job killed mid-training resumes from its last
checkpoint, a job killed mid-evaluation computes only its missing records. ``force=true``
starts over.

``finetunes`` (optional, e.g. ``+finetune@finetunes.pi=pi``) continue the trained model at a
longer length (Chen et al. 2023's FT and PI) and evaluate each fine-tuned model too; a
fine-tuned model has its own run id, checkpoint (``checkpoint-<key>.pt``) and records, labelled
``<scheme>:<key>``. The trained model's records are the same with or without fine-tunes.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.resources
import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from pe_bench import tracking
from pe_bench.config import config_hash, from_node, to_dict
from pe_bench.data import check_config, eval_stream, load_corpus
from pe_bench.distributed import current_world, rank_from_env
from pe_bench.errors import UserError
from pe_bench.evaluate import EvalConfig, bits_per_byte, scheme_swapped, score
from pe_bench.model import GPT, ModelConfig, build_model
from pe_bench.positions import PositionScheme, build_scheme, scheme_class
from pe_bench.results import (
    CURVE,
    POSITIONS,
    RECORDS,
    atomic_write_text,
    peak_memory_mb,
    provenance,
    read_jsonl,
    reset_peak_memory,
    write_jsonl,
)
from pe_bench.train import Diverged, FinetuneConfig, TrainConfig, fit, resolve_device

log = logging.getLogger("pe_bench")

CHECKPOINT = "checkpoint.pt"  # fine-tunes: checkpoint-<key>.pt
FAILED = "error.txt"  # written into a job folder when the job stopped on bad input
DONE = ".done"  # touched in a job folder when the job ends: sweep progress across processes


def run_dir_name(overrides: str) -> str:
    """A job folder named after its overrides: ``default`` without any, no ``/`` (a value like
    ``data.path=/a/b`` would nest folders), and a hash suffix instead of a name over 120 bytes
    (filesystems refuse names over 255)."""
    name = overrides.replace("/", "_") or "default"
    if len(name.encode()) > 120:
        digest = hashlib.sha256(name.encode()).hexdigest()[:10]
        name = name.encode()[:100].decode(errors="ignore") + "-" + digest
    return name


OmegaConf.register_new_resolver("run_dir", run_dir_name, replace=True)


@dataclass(frozen=True)
class EvalTask:
    """One record to compute: a scheme (the trained one or a variant) at one length and mode."""

    variant: str  # "none" for the trained scheme, else the key in eval.variants
    variant_hash: str  # hash of the variant's config ("" for none): a changed variant recomputes
    scheme: PositionScheme
    eval_len: int
    mode: str
    stride: int

    def key(self, tokens: int) -> tuple:
        return (self.variant, self.variant_hash, self.eval_len, self.mode, self.stride, tokens)


def record_key(record: dict) -> tuple:
    """The identity of a record within its run (``EvalTask.key``)."""
    return tuple(
        record.get(f) for f in ("variant", "variant_hash", "eval_len", "mode", "stride", "tokens")
    )


def eval_schemes(
    pe_cfg: dict, variants: dict[str, dict], model_pe: PositionScheme
) -> list[tuple[str, str, PositionScheme]]:
    """(variant key, variant hash, scheme) to evaluate: the trained scheme as ``none``, then
    every eval-time variant that applies to it (``variant_of`` names the trained scheme)."""
    schemes: list[tuple[str, str, PositionScheme]] = [("none", "", model_pe)]
    for key, variant_cfg in variants.items():
        cls = scheme_class(variant_cfg.get("name", ""))
        if cls.variant_of is None:
            raise UserError(
                f"eval.variants.{key}: {cls.name!r} is a trainable scheme, not an eval-time "
                "variant; use pe=" + cls.name
            )
        if cls.variant_of == pe_cfg["name"]:
            scheme = build_scheme(variant_cfg, model_pe.dims)
            schemes.append((key, config_hash(variant_cfg), scheme))
        else:
            log.debug("variant %s applies to %s, not %s", key, cls.variant_of, pe_cfg["name"])
    return schemes


@dataclass(frozen=True)
class Finetune:
    """One fine-tuning of the trained model (``finetunes.<key>``) and the records it owes."""

    key: str
    config_hash: str  # of the fine-tune's config: a changed fine-tune retrains and recomputes
    cfg: FinetuneConfig
    scheme: PositionScheme  # the scheme it fine-tunes and evaluates with
    tasks: list[EvalTask]

    def run_id(self, trained_run_id: str) -> str:
        return f"{trained_run_id}:{self.key}-{self.config_hash}"


@dataclass(frozen=True)
class Plan:
    model: GPT
    tasks: list[EvalTask]  # of the trained model
    n_targets: int  # eval targets, the same at every length
    finetunes: list[Finetune]


def plan(cfg: DictConfig) -> Plan:
    """Build the model and list the evaluations, refusing anything that cannot be served.

    Everything that can be refused is checked here, before any data is read or any training.
    """
    model_cfg = from_node(ModelConfig, cfg.model, "model")
    train_cfg = from_node(TrainConfig, cfg.train, "train")
    eval_cfg = from_node(EvalConfig, cfg.eval, "eval")
    pe_cfg = to_dict(cfg.pe)
    if not isinstance(pe_cfg, dict) or "name" not in pe_cfg:
        raise UserError("pe must be a scheme config with a name; pick one with pe=<name>")
    check_config(to_dict(cfg.data))
    model = build_model(model_cfg, pe_cfg, train_cfg.seq_len, train_cfg.seed)
    if model.pe.variant_of:
        raise UserError(
            f"pe={pe_cfg['name']} is an eval-time variant of {model.pe.variant_of}: train "
            f"pe={model.pe.variant_of}; its runs evaluate eval.variants ({pe_cfg['name']} "
            "included by default)"
        )
    lengths = eval_cfg.eval_lengths(train_cfg.seq_len)

    def tasks_of(schemes: list[tuple[str, str, PositionScheme]]) -> list[EvalTask]:
        tasks = []
        for variant, variant_hash, scheme in schemes:
            for length in lengths:
                scheme.check_length(length)
                for mode in eval_cfg.modes:
                    stride = eval_cfg.stride_for(mode, length, train_cfg.seq_len)
                    tasks.append(EvalTask(variant, variant_hash, scheme, length, mode, stride))
        return tasks

    finetunes = []
    for key, node in (to_dict(cfg.get("finetunes")) or {}).items():
        ft_cfg = from_node(FinetuneConfig, node, f"finetunes.{key}")
        ft_cfg.train_config(train_cfg)  # refuses bad values now, not after training
        with torch.random.fork_rng(devices=[]):  # the trained run's random stream stays as is
            scheme = build_scheme(ft_cfg.pe or pe_cfg, model.pe.dims)
        if scheme.name != model.pe.name and scheme.variant_of != model.pe.name:
            log.info(
                "finetunes.%s (%s) applies to %s, not %s",
                key,
                scheme.name,
                scheme.variant_of,
                model.pe.name,
            )
            continue
        # A fine-tuned model is evaluated as it was fine-tuned: no eval-time variants.
        ft_tasks = tasks_of([("none", "", scheme)])
        finetunes.append(Finetune(key, config_hash(node), ft_cfg, scheme, ft_tasks))
    schemes = eval_schemes(pe_cfg, eval_cfg.variants or {}, model.pe)
    return Plan(model, tasks_of(schemes), eval_cfg.n_targets(lengths), finetunes)


def run(cfg: DictConfig, out_dir: Path) -> list[dict[str, Any]]:
    """Train the configured model, evaluate it at every eval length, write ``out_dir`` records;
    then the same for each fine-tune of it.

    Returns every record of the run (cached ones included).
    """
    job = plan(cfg)
    model = job.model
    train_cfg = from_node(TrainConfig, cfg.train, "train")
    eval_cfg = from_node(EvalConfig, cfg.eval, "eval")
    scheme_name = model.pe.name
    corpus = load_corpus(to_dict(cfg.data))
    stream = eval_stream(corpus, job.n_targets)
    device = resolve_device(train_cfg.device)
    world = current_world(device.type)  # several processes under torchrun
    if device.type == "cuda" and world.size > 1:
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)

    # How attention is computed is not part of a run's identity: the same numbers either way.
    arch = OmegaConf.masked_copy(cfg.model, [k for k in cfg.model if k != "attention"])
    run_hash = config_hash({"model": arch, "pe": cfg.pe, "data": cfg.data, "train": cfg.train})
    run_id = f"{scheme_name}-{run_hash}"
    out_dir.mkdir(parents=True, exist_ok=True)
    # Every rank decides from the config and the files as they were at start, never from files
    # another rank may be deleting: force=true ignores what is there; rank 0 alone deletes it.
    force = bool(cfg.get("force", False))
    if force and world.main:
        for path in [out_dir / RECORDS, out_dir / POSITIONS, out_dir / CURVE]:
            path.unlink(missing_ok=True)
        for path in out_dir.glob("checkpoint*.pt"):
            path.unlink()
        log.info("force=true: recomputing %s from scratch", out_dir)

    # Records of this very run (same configs and corpus) are kept; the rest is stale.
    run_ids = {run_id} | {ft.run_id(run_id) for ft in job.finetunes}

    def ours(name: str) -> list[dict]:
        if force or not (out_dir / name).exists():
            return []
        rows = read_jsonl(out_dir / name)
        return [r for r in rows if r.get("run_id") in run_ids and r.get("corpus_sha") == corpus.sha]

    records = [r for r in ours(RECORDS) if r.get("status") != "skipped"]  # skipped: retried
    positions = ours(POSITIONS)
    done = {(r["run_id"], *record_key(r)) for r in records}
    curves: dict[str, list[dict]] = {}  # run id -> training curve, the trained model's first
    for row in ours(CURVE):
        curves.setdefault(row["run_id"], []).append(row)

    def write_curve(rid: str, points: list[dict]) -> None:
        curves[rid] = [{"run_id": rid, **point} for point in points]
        order = [run_id, *(ft.run_id(run_id) for ft in job.finetunes)]
        write_jsonl(out_dir / CURVE, [row for r in order for row in curves.get(r, [])])

    def missing(rid: str, tasks: list[EvalTask]) -> list[EvalTask]:
        return [t for t in tasks if (rid, *t.key(job.n_targets)) not in done]

    todo = missing(run_id, job.tasks)
    ft_todo = {ft.key: missing(ft.run_id(run_id), ft.tasks) for ft in job.finetunes}
    n_tasks = len(job.tasks) + sum(len(ft.tasks) for ft in job.finetunes)
    n_todo = len(todo) + sum(map(len, ft_todo.values()))
    if not n_todo:
        log.info(
            "%s: all %d records are there (run %s): skipped; force=true recomputes",
            out_dir,
            len(records),
            run_id,
        )
        return records
    if world.main:
        atomic_write_text(out_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    log.info(
        "run %s: %d of %d records to compute, %s parameters, %s",
        run_id,
        n_todo,
        n_tasks,
        f"{model.num_params()['params']:,}",
        corpus.describe(),
    )

    base = {
        "run_id": run_id,
        "scheme": scheme_name,
        "seed": train_cfg.seed,
        "train_len": train_cfg.seq_len,
        **model.num_params(),
        "d_model": model.cfg.d_model,
        "num_layers": model.cfg.num_layers,
        "train_steps": train_cfg.steps,
        "train_tokens": train_cfg.steps * train_cfg.batch_size * train_cfg.seq_len,
        "corpus": corpus.name,
        "corpus_sha": corpus.sha,
        "config_hash": run_hash,
        **provenance(device),
    }
    # A no-op unless logger=wandb; a job that fails is closed by the next job's init or at exit.
    tracker = tracking.start(
        cfg.get("logger") if world.main else None,
        name=out_dir.name,
        group=str(cfg.get("name", "default")),
        job_type="train",
        folder=out_dir,
        config={**OmegaConf.to_container(cfg, resolve=True), "run_id": run_id},
    )

    def diverged(fields: dict, tasks: list[EvalTask], err: Diverged) -> None:
        log.error("%s: %s; recorded as diverged", fields["run_id"], err)
        nothing = {"nll": None, "ppl": None, "bpb": None}
        for task in tasks:
            status = {"status": "diverged", "diverged_step": err.step}
            records.append({**fields, **_task_fields(task, job.n_targets), **status, **nothing})
        write_jsonl(out_dir / RECORDS, records)

    def evaluate(net: GPT, fields: dict, tasks: list[EvalTask], suffix: str = "") -> None:
        """Score ``tasks`` with ``net``, appending records and per-position losses."""
        for task in tasks:
            start = time.perf_counter()
            reset_peak_memory(device)
            variant = "" if task.variant == "none" else f"+{task.variant}"
            label = scheme_name + variant + suffix
            try:
                with scheme_swapped(net, task.scheme):
                    result = score(
                        net,
                        stream,
                        task.eval_len,
                        task.mode,
                        task.stride,
                        eval_cfg.batch_tokens,
                        device,
                        desc=f"eval {label} L={task.eval_len}",
                    )
            except (torch.OutOfMemoryError, MemoryError, RuntimeError) as err:
                if not is_out_of_memory(err):
                    raise
                reason = f"out of memory at L={task.eval_len}: {str(err).splitlines()[0][:200]}"
                log.error("%s: %s; recorded as skipped", label, reason)
                records.append(
                    {
                        **fields,
                        **_task_fields(task, job.n_targets),
                        "status": "skipped",
                        "reason": reason,
                        "nll": None,
                        "ppl": None,
                        "bpb": None,
                    }
                )
                write_jsonl(out_dir / RECORDS, records)
                continue
            records.append(
                {
                    **fields,
                    **_task_fields(task, job.n_targets),
                    "status": "ok",
                    "nll": result.nll,
                    "ppl": math.exp(result.nll),
                    "bpb": bits_per_byte(result.nll, corpus.bytes_per_token),
                    "time_s": round(time.perf_counter() - start, 3),
                    "peak_mem_mb": round(peak_memory_mb(device), 1),
                }
            )
            position_fields = {
                k: fields[k] for k in ("run_id", "scheme", "finetune") if k in fields
            }
            positions.append(
                {
                    **position_fields,
                    **_task_fields(task, job.n_targets),
                    "loss": result.position_loss(),
                }
            )
            log.info("%s L=%d %s: bpb %.4f", label, task.eval_len, task.mode, records[-1]["bpb"])
            # rewritten whole after each record: a kill loses at most the record being computed
            write_jsonl(out_dir / RECORDS, records)
            write_jsonl(out_dir / POSITIONS, positions)

    try:
        trained = fit(
            model,
            corpus,
            train_cfg,
            device,
            desc=f"train {scheme_name}",
            on_log=tracker.log_point,
            checkpoint=out_dir / CHECKPOINT,
            fingerprint=f"{run_id}-{corpus.sha}",
            world=world,
            resume=not force,
        )
    except Diverged as err:  # nothing to evaluate or fine-tune
        if not world.main:
            return []
        diverged(base, todo, err)
        for ft in job.finetunes:
            diverged({**base, **_finetune_fields(ft, run_id, train_cfg)}, ft_todo[ft.key], err)
        tracker.log_records(records)
        tracker.finish()
        return records
    base.update(
        train_time_s=round(trained.time_s, 2),
        final_train_loss=trained.final_loss,
        final_val_loss=trained.final_val_loss,
    )
    if world.main:  # rank 0 evaluates and writes; every rank trains the fine-tunes
        write_curve(run_id, trained.curve)
        evaluate(model, base, todo)

    for ft in job.finetunes:
        if not ft_todo[ft.key]:
            continue
        fields = {**base, **_finetune_fields(ft, run_id, train_cfg)}
        tuned = copy.deepcopy(model)  # the trained model stays as it is
        ft.scheme.load_state_dict(model.pe.state_dict())
        tuned.pe = ft.scheme.to(device)
        try:
            result = fit(
                tuned,
                corpus,
                ft.cfg.train_config(train_cfg),
                device,
                desc=f"finetune {scheme_name}:{ft.key}",
                checkpoint=out_dir / f"checkpoint-{ft.key}.pt",
                fingerprint=f"{fields['run_id']}-{corpus.sha}",
                world=world,
                resume=not force,
            )
        except Diverged as err:
            if world.main:
                diverged(fields, ft_todo[ft.key], err)
            continue
        if not world.main:
            continue
        write_curve(fields["run_id"], result.curve)
        fields.update(
            finetune_time_s=round(result.time_s, 2),
            finetune_final_train_loss=result.final_loss,
            finetune_final_val_loss=result.final_val_loss,
        )
        evaluate(tuned, fields, ft_todo[ft.key], suffix=f":{ft.key}")
    if not world.main:
        return []
    tracker.log_records(records)
    tracker.finish()
    return records


def _finetune_fields(ft: Finetune, run_id: str, train_cfg: TrainConfig) -> dict[str, Any]:
    """What a fine-tuned model's records add to (or change in) the trained model's fields."""
    tune = ft.cfg.train_config(train_cfg)
    return {
        "run_id": ft.run_id(run_id),
        "finetune": ft.key,
        "finetune_pe": ft.scheme.name,
        "finetune_len": tune.seq_len,
        "finetune_steps": tune.steps,
        "finetune_tokens": tune.steps * tune.batch_size * tune.seq_len,
        "finetune_lr": tune.lr,
        "config_hash": ft.config_hash,
    }


def is_out_of_memory(err: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError / MemoryError."""
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    return "can't allocate memory" in str(err) or "out of memory" in str(err).lower()


def _task_fields(task: EvalTask, tokens: int) -> dict[str, Any]:
    return {
        "variant": task.variant,
        "variant_hash": task.variant_hash,
        "eval_len": task.eval_len,
        "mode": task.mode,
        "stride": task.stride,
        "tokens": tokens,
    }


def sweep_size(config: DictConfig) -> int | None:
    """Number of jobs in a sweep: the product of the sweep overrides' lengths (None if unknown)."""
    try:
        params = dict(config.hydra.sweeper.get("params") or {})
        overrides = list(config.hydra.overrides.task)
        given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
        overrides += [f"{k}={v}" for k, v in params.items() if k not in given]
        total = 1
        for override in OverridesParser.create().parse_overrides(overrides):
            if override.is_sweep_override():
                total *= len(list(override.sweep_iterator()))
        return total
    except Exception:  # an unusual sweeper: progress is a nicety, never a failure
        return None


class SweepCallback(Callback):
    """Hydra callback: sweep progress (job k of n, elapsed, ETA) and the report at the end."""

    def __init__(self) -> None:
        self.total: int | None = None
        self.started = 0.0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.total, self.started = sweep_size(config), time.time()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        job = HydraConfig.get().job
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            of = f" of {self.total}" if self.total else ""
            log.info("sweep: job %d%s: %s", job.num + 1, of, job.override_dirname or "default")

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode != RunMode.MULTIRUN or not self.started:
            return
        # Jobs that ended are counted by their markers, not in this object: a parallel launcher
        # (joblib) runs jobs in worker processes, each with its own copy of the callback.
        (Path(hydra_cfg.runtime.output_dir) / DONE).touch()
        markers = Path(config.hydra.sweep.dir).rglob(DONE)
        finished = max(1, sum(m.stat().st_mtime >= self.started for m in markers))
        elapsed = time.time() - self.started
        eta = ""
        if self.total and self.total > finished:
            left = elapsed / finished * (self.total - finished)
            eta = f", about {left / 60:.1f} min left"
        of = f"/{self.total}" if self.total else ""
        log.info("sweep: %d%s jobs done in %.1f min%s", finished, of, elapsed / 60, eta)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.get("report", True) and rank_from_env() == 0:
            _report(Path(config.hydra.run.dir), config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        failed = sorted(sweep_dir.rglob(FAILED))
        if config.get("report", True) and rank_from_env() == 0:
            _report(sweep_dir, config)
        if failed:
            for path in failed:
                log.error("failed: %s: %s", path.parent.name, path.read_text().strip())
            sys.exit(1)


def _report(root: Path, config: DictConfig) -> None:
    """Write the report of ``root``; with logger=wandb, log it as a run of the sweep's group."""
    from pe_bench.report import Options, build_report

    try:
        report = build_report(root, options=Options(compare=config.get("compare")))
        tracker = tracking.start(
            config.get("logger"),
            name="report",
            group=str(config.get("name", "default")),
            job_type="report",
            folder=root,
            config={"results": str(root), **dataclasses.asdict(report.options)},
        )
    except UserError as err:
        log.error("no report: %s", err)
        return
    tracker.log_report(report)
    tracker.finish()


# conf/ ships as the package pe_bench.conf (pyproject maps it): an absolute path to it works
# from the console script, ``python -m pe_bench.cli``, editable and regular installs alike.
CONF_DIR = str(importlib.resources.files("pe_bench.conf"))


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    if rank_from_env() != 0:  # one log per run under torchrun: rank 0's
        logging.getLogger().setLevel(logging.WARNING)
    (out_dir / FAILED).unlink(missing_ok=True)
    try:
        run(cfg, out_dir)
    except UserError as err:
        log.error("error: %s", err)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            atomic_write_text(out_dir / FAILED, f"{err}\n")  # the sweep goes on
            return
        print(f"pe-bench: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
