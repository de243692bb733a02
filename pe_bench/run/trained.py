"""The steps of a model pe-bench trains (``STEPS``, run by ``run.job.run``): load its corpus,
train it, evaluate it, then each fine-tune of it.

``finetunes`` (optional, e.g. ``+finetune@finetunes.pi=pi``) continue the trained model at a
longer length (Chen et al. 2023's FT and PI) and evaluate each fine-tuned model too; a
fine-tuned model has its own run id, checkpoint (``checkpoint-<key>.pt``) and records, labelled
``<scheme>:<key>``. The trained model's records are the same with or without fine-tunes.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pe_bench.data.corpus import Corpus, eval_stream, load_corpus
from pe_bench.data.tasks import TaskData
from pe_bench.data.tokenizer import BYTE, ByteTokenizer, Tokenizer
from pe_bench.model.gpt import GPT
from pe_bench.positions import options_label
from pe_bench.provenance import provenance
from pe_bench.records import make_record
from pe_bench.run.calibrate import calibrate_schemes
from pe_bench.run.evaluate import (
    EvalTask,
    Scorer,
    TaskScore,
    evaluate_tasks,
    lm_scorer,
    task_scorer,
)
from pe_bench.run.job import DataKey, RunContext, Steps
from pe_bench.run.plan import Finetune, Plan
from pe_bench.run.probes import ProbeTask, run_probes
from pe_bench.run.train import Diverged, TrainResult, finetune, fit

log = logging.getLogger("pe_bench")


@dataclass(frozen=True)
class TrainingData:
    """The corpus (or synthetic task) a model trains on, and its evaluation targets."""

    corpus: Corpus | TaskData
    stream: Tensor | None  # the eval targets, the same at every length (None for a task)
    scorer: Scorer  # scores an evaluation task: perplexity on text, accuracy on a task
    target_bytes: int = 0  # the UTF-8 bytes of the eval targets (``stream[1:]``)

    @property
    def tokenizer(self) -> Tokenizer:
        """The corpus's tokenizer (bytes for a synthetic task)."""
        return self.corpus.tokenizer if isinstance(self.corpus, Corpus) else ByteTokenizer()

    @property
    def bytes_per_token(self) -> float:
        """Of the eval targets, exactly: bits per byte = NLL / ln 2 / this is the scored
        targets' summed NLL over their own bytes (1.0 for bytes)."""
        return self.target_bytes / (len(self.stream) - 1) if self.stream is not None else 1.0


def open_data(job: Plan, device: torch.device) -> tuple[TrainingData, DataKey]:
    """Load the corpus and its eval targets (or a task's instances)."""
    corpus = load_corpus(job.cfg.data)
    batch_tokens = job.cfg.eval.batch_tokens
    if isinstance(corpus, TaskData):
        data = TrainingData(corpus, None, task_scorer(corpus, job.n_targets, batch_tokens, device))
    else:
        stream = eval_stream(corpus, job.n_targets)
        scorer = lm_scorer(stream, batch_tokens, device)
        target_bytes = corpus.tokenizer.count_bytes(stream[1:].numpy())
        data = TrainingData(corpus, stream, scorer, target_bytes)
    tokens = data.tokenizer.fingerprint
    return data, DataKey(corpus.sha, tokens, job.pe_source, finetune_sources=job.finetune_sources)


def train_and_evaluate(ctx: RunContext, todo: dict[str, list[EvalTask]]) -> None:
    """Train the model (resuming from its checkpoint), evaluate it, then each fine-tune."""
    job: Plan = ctx.job
    model = job.build_model(ctx.data.tokenizer.vocab_size)
    _log_start(ctx, model, todo)
    fields = run_fields(job, model, ctx.data, ctx.device)
    try:
        trained = fit(
            model,
            ctx.data.corpus,
            job.cfg.train,
            ctx.device,
            desc=f"train {model.pe.name}",
            on_log=ctx.tracker.log_point,
            **fit_args(ctx, job.run_id),
        )
    except Diverged as err:  # nothing to evaluate or fine-tune
        _record_diverged(ctx, fields, todo[job.run_id], err)
        for ft in job.finetunes:
            _record_diverged(ctx, {**fields, **ft.record_fields()}, todo[ft.run_id], err)
        return
    fields |= train_fields(trained)
    if ctx.world.main:  # rank 0 evaluates and writes; every rank trains the fine-tunes
        ctx.store.set_curve(job.run_id, trained.curve)
        evaluate(ctx, model, fields, todo[job.run_id])
    for ft in job.finetunes:
        if todo[ft.run_id]:
            _finetune(ctx, ft, model, {**fields, **ft.record_fields()}, todo[ft.run_id])


STEPS = Steps(open_data, train_and_evaluate)


def fit_args(ctx: RunContext, run_id: str, finetune: Finetune | None = None) -> dict[str, Any]:
    """``fit``'s checkpointing and process arguments for a run id (or a fine-tune's, whose
    checkpoint is also of its scheme's code: an edited fine-tune scheme trains afresh)."""
    job: Plan = ctx.job
    tokenizer, corpus_sha = ctx.data.tokenizer, ctx.data.corpus.sha
    tokens = "" if tokenizer.name == BYTE else f"-{tokenizer.fingerprint}"
    tuned = f"-{finetune.source}" if finetune else ""
    return {
        "checkpoint": ctx.store.checkpoint(finetune.key if finetune else None),
        "fingerprint": f"{run_id}-{corpus_sha}-{job.pe_source}{tuned}{tokens}",
        "world": ctx.world,
        "resume": not job.cfg.force,
    }


def evaluate(
    ctx: RunContext, net: GPT, fields: dict[str, Any], tasks: list[EvalTask], suffix: str = ""
) -> None:
    """Score ``tasks`` with ``net`` and store a record of each (ok or skipped); the
    context-use probes among them run last."""
    scheme, cfg = ctx.job.scheme.name, ctx.job.cfg
    probing = [t for t in tasks if isinstance(t, ProbeTask)]
    scoring = [t for t in tasks if not isinstance(t, ProbeTask)]
    lengths = cfg.eval.eval_lengths(cfg.train.seq_len)  # all of them: the same on a resume
    schemes = [t.scheme for t in tasks]
    notes = calibrate_schemes(net, schemes, lengths, ctx.data.corpus, cfg.eval.batch_tokens)
    for scored in evaluate_tasks(net, scoring, ctx.data.scorer, ctx.device, scheme, suffix):
        key = scored.task.fields()
        if (id(scored.task.scheme), scored.task.eval_len) in notes:
            key["calibration"] = notes[(id(scored.task.scheme), scored.task.eval_len)]
        if scored.result is None:
            ctx.store.add(make_record(fields, key, "skipped", reason=scored.skipped))
            continue
        cost = {"time_s": scored.time_s, "peak_mem_mb": scored.peak_mem_mb}
        if len(scored.draw_nll) > 1:  # random evaluation positions: the spread of the draws
            cost["position_draws"] = len(scored.draw_nll)
        if isinstance(scored.result, TaskScore):
            _add_task_record(ctx, scored.result, fields | key, cost, scored.label)
            continue
        if len(scored.draw_nll) > 1:
            cost["draw_nll_sd"] = statistics.stdev(scored.draw_nll)
        cost["target_bytes"] = ctx.data.target_bytes
        record = scored.result.record(fields | key, ctx.data.bytes_per_token, **cost)
        ctx.store.add(record, scored.result.position_loss())
        log.info("%s L=%d %s: bpb %.4f", scored.label, key["eval_len"], key["mode"], record["bpb"])
    if probing:
        _probe(ctx, net, fields, probing, suffix)


def _add_task_record(
    ctx: RunContext, score: TaskScore, fields: dict[str, Any], cost: dict[str, Any], label: str
) -> None:
    """Store a synthetic task's record: exact match and token accuracy at one length."""
    task = ctx.data.corpus.task.name
    ctx.store.add(score.record(fields | {"task": task}, **cost))
    log.info(
        "%s L=%d %s: exact match %.3f, token accuracy %.3f",
        label,
        fields["eval_len"],
        task,
        score.exact_match,
        score.token_acc,
    )


def _probe(
    ctx: RunContext, net: GPT, fields: dict[str, Any], tasks: list[ProbeTask], suffix: str
) -> None:
    """Run the context-use probes ``tasks`` with ``net`` and store a record of each."""
    scheme, batch_tokens = ctx.job.scheme.name, ctx.job.cfg.eval.batch_tokens
    test = ctx.data.corpus.splits["test"]  # copy-probe snippets and fillers come from all of it
    stream = ctx.data.stream
    for done in run_probes(net, tasks, stream, test, batch_tokens, ctx.device, scheme, suffix):
        if done.skipped:
            ctx.store.add(make_record(fields, done.task.fields(), "skipped", reason=done.skipped))
            continue
        ctx.store.add(done.record(fields))
        log.info("%s %s L=%d: %s", done.label, done.task.mode, done.task.eval_len, done.summary())


def _record_diverged(
    ctx: RunContext, fields: dict[str, Any], tasks: list[EvalTask], err: Diverged
) -> None:
    """A diverged record for each task the diverged model owed (rank 0 writes them)."""
    if not ctx.world.main:
        return
    log.error("%s: %s; recorded as diverged", fields["run_id"], err)
    for task in tasks:
        ctx.store.add(make_record(fields, task.fields(), "diverged", diverged_step=err.step))


def _finetune(
    ctx: RunContext, ft: Finetune, model: GPT, fields: dict[str, Any], tasks: list[EvalTask]
) -> None:
    """Fine-tune a copy of the trained model, then evaluate it (its records get ``fields``)."""
    name = f"{ctx.job.scheme.name}:{ft.key}"
    log.info("finetune %s: %d records to compute", name, len(tasks))
    try:
        tuned, result = finetune(
            model,
            ft.scheme,
            ctx.data.corpus,
            ft.train,
            ctx.device,
            desc=f"finetune {name}",
            **fit_args(ctx, ft.run_id, ft),
        )
    except Diverged as err:
        _record_diverged(ctx, fields, tasks, err)
        return
    if ctx.world.main:
        ctx.store.set_curve(ft.run_id, result.curve)
        fields = fields | train_fields(result, finetune=True)
        evaluate(ctx, tuned, fields, tasks, suffix=f":{ft.key}")


def _log_start(ctx: RunContext, model: GPT, todo: dict[str, list[EvalTask]]) -> None:
    owed = sum(len(tasks) for _, tasks in ctx.job.owed())
    log.info(
        "run %s: %d of %d records to compute, %s parameters, %s",
        ctx.job.run_id,
        sum(map(len, todo.values())),
        owed,
        f"{model.num_params()['params']:,}",
        ctx.data.corpus.describe(),
    )


def run_fields(job: Plan, model: GPT, data: TrainingData, device: torch.device) -> dict[str, Any]:
    """The fields every record of the trained model shares."""
    train, tokenizer = job.cfg.train, data.tokenizer
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
        "corpus": data.corpus.name,
        "corpus_sha": data.corpus.sha,
        "config_hash": job.cfg.run_hash,
        "pe_source": job.pe_source,
        **({"pe_options": options} if (options := options_label(job.cfg.pe)) else {}),
        **provenance(device),
        **({"caveat": model.pe.caveat} if model.pe.caveat else {}),
        # which tokens the records count (records without these were made with bytes)
        "tokenizer": tokenizer.name,
        "tokenizer_vocab": tokenizer.vocab_size,
        "tokenizer_sha": tokenizer.fingerprint,
    }


def train_fields(result: TrainResult, finetune: bool = False) -> dict[str, Any]:
    """What training (or a fine-tuning) adds to its model's records."""
    names = ["train_time_s", "final_train_loss", "final_val_loss"]
    if finetune:
        names = ["finetune_time_s", "finetune_final_train_loss", "finetune_final_val_loss"]
    values = [round(result.time_s, 2), result.final_loss, result.final_val_loss]
    return dict(zip(names, values, strict=True))
