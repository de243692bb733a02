"""Entry point ``pe-bench``: one Hydra job = train one model, evaluate it, write its records.

``run(cfg, out_dir)`` does the work and is what tests call; ``main`` is the thin Hydra wrapper.
A run reads as plan -> store -> fit -> evaluate -> fine-tunes:

- ``plan`` (pe_bench/run/plan.py) parses the config once and refuses bad input before any work;
- ``RunStore`` (pe_bench/run/store.py) owns the job folder: cached records, missing ones, curves;
- ``fit`` and ``finetune`` (pe_bench/run/train.py) train, resuming from checkpoints;
- ``evaluate_tasks`` (pe_bench/run/evaluate.py) scores each task; ``make_record`` (results.py)
  turns every outcome (ok, skipped, diverged) into a record.

A sweep (``-m`` or an experiment with ``hydra.mode: MULTIRUN``) runs one job per override set
through Hydra's launcher (local, or SLURM via hydra-submitit-launcher); ``SweepCallback``
(pe_bench/run/sweep.py) logs its progress and writes the report when it ends.

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

import difflib
import hashlib
import importlib.resources
import logging
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import Tensor

from pe_bench.data.corpus import Corpus, eval_stream, load_corpus
from pe_bench.data.tasks import TaskData
from pe_bench.data.tokenizer import BYTE, ByteTokenizer, Tokenizer
from pe_bench.errors import UserError
from pe_bench.model.gpt import GPT
from pe_bench.positions import options_label
from pe_bench.pretrained import hf
from pe_bench.pretrained.load import is_pretrained
from pe_bench.records import atomic_write_text, git_sha, make_record, provenance
from pe_bench.run import probes, tracking
from pe_bench.run.distributed import World, current_world, rank_from_env
from pe_bench.run.evaluate import (
    EvalTask,
    Scored,
    Scorer,
    TaskScore,
    evaluate_tasks,
    lm_scorer,
    task_scorer,
)
from pe_bench.run.plan import Finetune, Plan, RunConfig, check_top_keys, plan
from pe_bench.run.store import RunStore, job_lock
from pe_bench.run.sweep import FAILED
from pe_bench.run.train import Diverged, TrainResult, finetune, fit

log = logging.getLogger("pe_bench")


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


def run(cfg: DictConfig | RunConfig, out_dir: Path) -> list[dict[str, Any]]:
    """Train the configured model, evaluate it at every eval length, write ``out_dir`` records;
    then the same for each fine-tune of it. Returns every record of the run (cached included).
    A pretrained model (``model=hf``) is evaluated without training (``pe_bench.pretrained.hf``)."""
    if isinstance(cfg, DictConfig) and is_pretrained(cfg):
        return hf.run(cfg, out_dir)
    job = plan(cfg)
    world, device = _world_and_device(job.device)
    with job_lock(out_dir, take=world.main):  # torchrun: rank 0 holds it for every rank
        return _run(_context(job, out_dir, world, device))


def _run(ctx: RunContext) -> list[dict[str, Any]]:
    """``run`` once the job folder is held: only the records missing from it are computed."""
    job, out_dir = ctx.job, ctx.store.folder
    owed = probes.owed(job)  # perplexity (or task) records, then the context-use probes
    todo = {rid: ctx.store.missing(rid, tasks, job.n_targets) for rid, tasks in owed}
    if not any(todo.values()):
        log.info(
            "%s: all %d records are there (run %s): skipped; force=true recomputes",
            out_dir,
            len(ctx.store.records),
            job.run_id,
        )
        return ctx.store.records
    ctx.store.write_config(job.cfg.yaml)
    model = job.build_model(ctx.tokenizer.vocab_size)
    _log_start(job, model, ctx.corpus, sum(map(len, todo.values())))
    tracker = _tracker(job, ctx.world, out_dir)
    fields = _run_fields(job, model, ctx.corpus, ctx.device) | _tokenizer_fields(ctx.tokenizer)
    try:
        trained = fit(
            model,
            ctx.corpus,
            job.cfg.train,
            ctx.device,
            desc=f"train {model.pe.name}",
            on_log=tracker.log_point,
            **ctx.fit_args(job.run_id),
        )
    except Diverged as err:  # nothing to evaluate or fine-tune
        _record_diverged(ctx, fields, todo[job.run_id], err)
        for ft in job.finetunes:
            _record_diverged(ctx, {**fields, **ft.record_fields()}, todo[ft.run_id], err)
        return _finish(tracker, ctx)
    fields |= _train_fields(trained)
    if ctx.world.main:  # rank 0 evaluates and writes; every rank trains the fine-tunes
        ctx.store.set_curve(job.run_id, trained.curve)
        _evaluate(ctx, model, fields, todo[job.run_id])
    for ft in job.finetunes:
        if todo[ft.run_id]:
            _finetune(ctx, ft, model, {**fields, **ft.record_fields()}, todo[ft.run_id])
    return _finish(tracker, ctx)


@dataclass(frozen=True)
class RunContext:
    """What every step of a run needs besides the model: the data, the job folder's files,
    and the processes and device it runs on."""

    job: Plan
    corpus: Corpus | TaskData
    stream: Tensor | None  # the eval targets, the same at every length (None for a task)
    scorer: Scorer  # scores an evaluation task: perplexity on text, accuracy on a task
    store: RunStore
    world: World
    device: torch.device
    target_bytes: int = 0  # the UTF-8 bytes of the eval targets (``stream[1:]``)

    @property
    def tokenizer(self) -> Tokenizer:
        return _tokenizer(self.corpus)

    @property
    def bytes_per_token(self) -> float:
        """Of the eval targets, exactly: bits per byte = NLL / ln 2 / this is the scored
        targets' summed NLL over their own bytes (1.0 for bytes)."""
        return self.target_bytes / (len(self.stream) - 1) if self.stream is not None else 1.0

    def fit_args(self, run_id: str, finetune: str | None = None) -> dict[str, Any]:
        """``fit``'s checkpointing and process arguments for a run id (or a fine-tune's)."""
        tokens = "" if self.tokenizer.name == BYTE else f"-{self.tokenizer.fingerprint}"
        return {
            "checkpoint": self.store.checkpoint(finetune),
            "fingerprint": f"{run_id}-{self.corpus.sha}-{self.job.pe_source}{tokens}",
            "world": self.world,
            "resume": not self.job.cfg.force,
        }


def _tokenizer(corpus: Corpus | TaskData) -> Tokenizer:
    """The corpus's tokenizer (bytes for a synthetic task)."""
    return corpus.tokenizer if isinstance(corpus, Corpus) else ByteTokenizer()


def _context(job: Plan, out_dir: Path, world: World, device: torch.device) -> RunContext:
    """Load the data and open the job folder."""
    corpus = load_corpus(job.cfg.data)
    batch_tokens = job.cfg.eval.batch_tokens
    target_bytes = 0
    if isinstance(corpus, TaskData):
        stream, scorer = None, task_scorer(corpus, job.n_targets, batch_tokens, device)
    else:
        stream = eval_stream(corpus, job.n_targets)
        scorer = lm_scorer(stream, batch_tokens, device)
        target_bytes = corpus.tokenizer.count_bytes(stream[1:].numpy())
    variants = {task.variant: task.variant_hash for task in job.tasks}
    store = RunStore(
        out_dir,
        job.run_ids,
        corpus.sha,
        job.cfg.force,
        writer=world.main,
        variants=variants,
        probes=probes.probe_hashes(job.cfg.eval),
        pe_source=job.pe_source,
        tokenizer_sha=_tokenizer(corpus).fingerprint,
        variant_sources={task.variant: task.variant_source for task in job.tasks},
    )
    return RunContext(job, corpus, stream, scorer, store, world, device, target_bytes)


def _evaluate(
    ctx: RunContext, net: GPT, fields: dict[str, Any], tasks: list[EvalTask], suffix: str = ""
) -> None:
    """Score ``tasks`` with ``net`` and store a record of each (ok or skipped); the
    context-use probes among them run last."""
    scheme = ctx.job.scheme.name
    probing = [t for t in tasks if isinstance(t, probes.ProbeTask)]
    tasks = [t for t in tasks if not isinstance(t, probes.ProbeTask)]
    for scored in evaluate_tasks(net, tasks, ctx.scorer, ctx.device, scheme, suffix):
        key = scored.task.fields(ctx.job.n_targets)
        if scored.result is None:
            ctx.store.add(make_record(fields, key, "skipped", reason=scored.skipped))
            continue
        cost = {"time_s": scored.time_s, "peak_mem_mb": scored.peak_mem_mb}
        if isinstance(scored.result, TaskScore):
            _add_task_record(ctx, scored, fields | key | cost)
            continue
        if len(scored.draw_nll) > 1:  # random evaluation positions: the spread of the draws
            spread = statistics.stdev(scored.draw_nll)
            cost |= {"position_draws": len(scored.draw_nll), "draw_nll_sd": spread}
        cost["target_bytes"] = ctx.target_bytes
        record = make_record(fields, key, "ok", scored.result.nll, ctx.bytes_per_token, **cost)
        ctx.store.add(record, scored.result.position_loss())
        log.info("%s L=%d %s: bpb %.4f", scored.label, key["eval_len"], key["mode"], record["bpb"])
    if probing:
        _probe(ctx, net, fields, probing, suffix)


def _add_task_record(ctx: RunContext, scored: Scored, fields: dict[str, Any]) -> None:
    """Store a synthetic task's record: exact match and token accuracy at one length."""
    score: TaskScore = scored.result
    numbers = {
        "task": ctx.corpus.task.name,
        "instances": score.instances,
        "answer_tokens": score.answer_tokens,
        "exact_match": score.exact_match,
        "token_acc": score.token_acc,
        "answer_nll": score.nll,
    }
    if len(scored.draw_nll) > 1:
        numbers["position_draws"] = len(scored.draw_nll)
    ctx.store.add({**fields, "status": "ok", **numbers})
    log.info(
        "%s L=%d %s: exact match %.3f, token accuracy %.3f",
        scored.label,
        fields["eval_len"],
        numbers["task"],
        score.exact_match,
        score.token_acc,
    )


def _probe(
    ctx: RunContext, net: GPT, fields: dict[str, Any], tasks: list[probes.ProbeTask], suffix: str
) -> None:
    """Run the context-use probes ``tasks`` with ``net`` and store a record of each."""
    scheme, batch_tokens = ctx.job.scheme.name, ctx.job.cfg.eval.batch_tokens
    test = ctx.corpus.splits["test"]  # copy-probe snippets and fillers come from all of it
    measured = probes.run_probes(
        net, tasks, ctx.stream, test, batch_tokens, ctx.device, scheme, suffix
    )
    for done in measured:
        key = done.task.fields(ctx.job.n_targets) | {"probe_hash": done.task.probe_hash}
        if done.skipped:
            ctx.store.add(make_record(fields, key, "skipped", reason=done.skipped))
            continue
        ctx.store.add(make_record(fields, key, "ok", **done.values, time_s=done.time_s))
        log.info("%s %s L=%d: %s", done.label, key["mode"], key["eval_len"], done.summary())


def _record_diverged(
    ctx: RunContext, fields: dict[str, Any], tasks: list[EvalTask], err: Diverged
) -> None:
    """A diverged record for each task the diverged model owed (rank 0 writes them)."""
    if not ctx.world.main:
        return
    log.error("%s: %s; recorded as diverged", fields["run_id"], err)
    for task in tasks:
        key = task.fields(ctx.job.n_targets)
        ctx.store.add(make_record(fields, key, "diverged", diverged_step=err.step))


def _finetune(
    ctx: RunContext, ft: Finetune, model: GPT, fields: dict[str, Any], tasks: list[EvalTask]
) -> None:
    """Fine-tune a copy of the trained model, then evaluate it (its records get ``fields``)."""
    log.info("finetune %s:%s: %d records to compute", ctx.job.scheme.name, ft.key, len(tasks))
    try:
        tuned, result = finetune(
            model,
            ft.scheme,
            ctx.corpus,
            ft.train,
            ctx.device,
            desc=f"finetune {ctx.job.scheme.name}:{ft.key}",
            **ctx.fit_args(ft.run_id, ft.key),
        )
    except Diverged as err:
        _record_diverged(ctx, fields, tasks, err)
        return
    if ctx.world.main:
        ctx.store.set_curve(ft.run_id, result.curve)
        fields = fields | _train_fields(result, finetune=True)
        _evaluate(ctx, tuned, fields, tasks, suffix=f":{ft.key}")


def _log_start(job: Plan, model: GPT, corpus: Corpus | TaskData, n_todo: int) -> None:
    n_tasks = sum(len(tasks) for _, tasks in probes.owed(job))
    log.info(
        "run %s: %d of %d records to compute, %s parameters, %s",
        job.run_id,
        n_todo,
        n_tasks,
        f"{model.num_params()['params']:,}",
        corpus.describe(),
    )


def _world_and_device(device: torch.device) -> tuple[World, torch.device]:
    """The processes this run trains in (several under torchrun) and this one's device."""
    world = current_world(device.type)
    if device.type == "cuda" and world.size > 1:
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    return world, device


def _run_fields(
    job: Plan, model: GPT, corpus: Corpus | TaskData, device: torch.device
) -> dict[str, Any]:
    """The fields every record of the trained model shares."""
    train = job.cfg.train
    return {
        "run_id": job.run_id,
        "scheme": model.pe.name,
        "seed": train.seed,
        "train_len": train.seq_len,
        **model.num_params(),
        "d_model": model.cfg.d_model,
        "num_layers": model.cfg.num_layers,
        "train_steps": train.steps,
        "train_tokens": train.steps * train.batch_size * train.seq_len,
        "corpus": corpus.name,
        "corpus_sha": corpus.sha,
        "config_hash": job.run_hash,
        "pe_source": job.pe_source,
        **({"pe_options": options} if (options := options_label(job.cfg.pe)) else {}),
        **provenance(device),
        **({"caveat": model.pe.caveat} if model.pe.caveat else {}),
    }


def _tokenizer_fields(tokenizer: Tokenizer) -> dict[str, Any]:
    """Which tokens the records count (records without these fields were made with bytes)."""
    return {
        "tokenizer": tokenizer.name,
        "tokenizer_vocab": tokenizer.vocab_size,
        "tokenizer_sha": tokenizer.fingerprint,
    }


def _train_fields(result: TrainResult, finetune: bool = False) -> dict[str, Any]:
    """What training (or a fine-tuning) adds to its model's records."""
    names = ["train_time_s", "final_train_loss", "final_val_loss"]
    if finetune:
        names = ["finetune_time_s", "finetune_final_train_loss", "finetune_final_val_loss"]
    values = [round(result.time_s, 2), result.final_loss, result.final_val_loss]
    return dict(zip(names, values, strict=True))


def _tracker(job: Plan, world: World, out_dir: Path) -> tracking.Tracker:
    """A no-op unless logger=wandb; a job that fails is closed by the next job's init or at
    exit. Rank 0 alone logs."""
    return tracking.start(
        job.cfg.logger if world.main else None,
        name=out_dir.name,
        group=job.cfg.name,
        job_type="train",
        folder=out_dir,
        config={**job.cfg.resolved, "run_id": job.run_id},
    )


def _finish(tracker: tracking.Tracker, ctx: RunContext) -> list[dict[str, Any]]:
    """Log the records to the tracker and return them (rank 0; the other ranks return none)."""
    if not ctx.world.main:
        return []
    log.info(
        "run %s: done, %d records in %s", ctx.job.run_id, len(ctx.store.records), ctx.store.folder
    )
    tracker.log_records(ctx.store.records)
    tracker.finish()
    return ctx.store.records


# conf/ ships as the package pe_bench.conf (pyproject maps it): an absolute path to it works
# from the console script, ``python -m pe_bench.cli``, editable and regular installs alike.
CONF_DIR = str(importlib.resources.files("pe_bench.conf"))


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    """One Hydra job: ``run`` it, and end a bad input (or a file that cannot be written) with
    one line and status 2; in a sweep, mark the job failed and go on."""
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    if rank_from_env() != 0:  # one log per run under torchrun: rank 0's
        logging.getLogger().setLevel(logging.WARNING)
    (out_dir / FAILED).unlink(missing_ok=True)
    try:
        run(cfg, out_dir)
    except (UserError, OSError) as caught:
        err = caught if isinstance(caught, UserError) else UserError(os_message(caught))
        log.error("error: %s", err)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            atomic_write_text(out_dir / FAILED, f"{err}\n")  # the sweep goes on
            return
        print(f"pe-bench: error: {err}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    """The ``pe-bench`` console script: the command line is checked first (``check_command``),
    so that a misspelled group, key or option ends in one line, not in Hydra's list of every
    option over many lines; then Hydra runs the job (or the sweep)."""
    try:
        check_command(sys.argv[1:])
    except UserError as err:
        print(f"pe-bench: error: {err}", file=sys.stderr)
        sys.exit(2)
    git_sha()  # records name the code loaded now, not a commit made while a sweep runs
    hydra_main()


def os_message(err: OSError) -> str:
    """An ``OSError`` as one line naming the file and the reason."""
    where = f"{os.fsdecode(err.filename)!r}: " if err.filename else ""
    return f"cannot write or read {where}{err.strerror or err}"


def check_command(argv: list[str]) -> None:
    """Compose the config as Hydra will, with Hydra's own parser, config search path
    (``hydra.searchpath`` included) and overrides, and turn a composition error into one
    ``UserError``; each value of a swept group is composed too. Commands that compose
    something else (``--help``, ``--config-dir``, ...) are left to Hydra."""
    for arg in argv:
        try:
            arg.encode()
        except UnicodeEncodeError as err:  # bytes that are not UTF-8 (surrogate escapes)
            raise UserError(
                f"{arg!r} is not UTF-8 text; allowed: UTF-8 keys and values (paths too)"
            ) from err
    args = get_args_parser().parse_intermixed_args(argv)  # Hydra's flags, anywhere
    elsewhere = (args.config_path, args.config_name, args.config_dir, args.experimental_rerun)
    if args.help or args.hydra_help or args.shell_completion or args.info or any(elsewhere):
        return
    try:
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except OverrideParseException as err:
        raise UserError(f"bad override: {_flat(str(err))}") from err
    base = [_first(o) for o in overrides]
    cfg = _composed([line for line in base if line is not None], overrides)
    check_top_keys(cfg)
    choices = cfg.hydra.runtime.choices
    for i, override in enumerate(overrides):
        key = override.get_key_element().lstrip("+~")
        if override.is_sweep_override() and base[i] is not None and key in choices:
            for value in list(override.sweep_string_iterator())[1:]:
                swapped = [*base[:i], f"{override.get_key_element()}={value}", *base[i + 1 :]]
                _composed([line for line in swapped if line is not None], overrides)
    if not args.cfg:
        _check_writable(str(cfg.out_root))


def _first(override: Override) -> str | None:
    """The override as a plain one (a sweep's first value); None for a sweep that cannot be
    listed without the sweeper (``glob``, ranges of floats): Hydra checks those itself."""
    if not override.is_sweep_override():
        return override.input_line
    try:
        first = next(iter(override.sweep_string_iterator()))
    except Exception:
        return None
    return f"{override.get_key_element()}={first}"


def _composed(lines: list[str], overrides: list[Override]) -> DictConfig:
    """The config Hydra composes from ``lines``, or a ``UserError`` saying in one line which
    override is wrong and what is allowed."""
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return compose("config", overrides=lines, return_hydra_config=True)
    except MissingConfigException as err:
        raise UserError(_missing_option(err, overrides)) from err
    except HydraException as err:
        cause = err.__cause__
        key = getattr(cause, "full_key", None)
        if isinstance(cause, OmegaConfBaseException) and key and "not in struct" in str(cause):
            raise UserError(_unknown_key(str(key), lines)) from err
        raise UserError(_flat(str(err))) from err


def _missing_option(err: MissingConfigException, overrides: list[Override]) -> str:
    """``pe=roep is not an option of pe; allowed: alibi, ...``: Hydra's list, on one line."""
    group, _, option = (err.missing_cfg_file or "").rpartition("/")
    allowed = f"; allowed: {', '.join(err.options)}" if err.options else ""
    for override in overrides:
        if override.key_or_group == group:
            return f"{override.get_key_element()}={option} is not an option of {group}{allowed}"
    return f"{group}={option} (asked for by the config) is not an option of {group}{allowed}"


def _unknown_key(key: str, lines: list[str]) -> str:
    """``unknown key train.step (did you mean train.steps?); allowed: ...``: the keys of the
    node it would go in, from the config composed without it."""
    parent, _, name = key.rpartition(".")
    rest = [line for line in lines if not line.lstrip("+~").startswith(f"{key}=")]
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("config", overrides=rest)
        node = OmegaConf.select(cfg, parent) if parent else cfg
        keys = sorted(str(k) for k in node) if isinstance(node, DictConfig) else []
    except HydraException:
        keys = []
    close = difflib.get_close_matches(name, keys, n=1)
    hint = f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""
    allowed = f"; allowed: {', '.join(keys)}" if keys else ""
    return f"unknown key {key}{hint}{allowed}"


def _flat(message: str) -> str:
    """A Hydra message on one line (without its config search path)."""
    message = message.split("\nConfig search path:")[0]
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def _check_writable(out_root: str) -> None:
    """Refuse an ``out_root`` where no job folder can be made (read-only, a file, a name the
    file system cannot hold) before Hydra creates one and fails with a traceback."""
    try:
        folder = Path(out_root).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except (OSError, UnicodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise UserError(
            f"out_root={out_root!r} cannot hold the job folders ({reason}); allowed: a folder "
            "you can write to, e.g. out_root=outputs"
        ) from err


if __name__ == "__main__":
    main()
