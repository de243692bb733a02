"""The steps of a pretrained model's run (``STEPS``, run by ``run.job.run``): load the corpus
and the model's tokenizer, then the weights, and compute the missing perplexity records of each
test slice and the passkey records (``pe_bench.pretrained.plan`` says what they are)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pe_bench.data.corpus import Corpus, load_corpus
from pe_bench.data.tokenizer import HFTokenizer
from pe_bench.pretrained import passkey, ruler_eval
from pe_bench.pretrained.key import pretrained_key, weights_key
from pe_bench.pretrained.load import (
    LogitsOnly,
    TokenStream,
    corpus_tokenizer,
    encode_prefix,
    load_model,
    load_tokenizer,
    tokenizer_fields,
)
from pe_bench.pretrained.plan import PretrainedPlan
from pe_bench.pretrained.rope import rope_variant
from pe_bench.pretrained.tail import score_tail
from pe_bench.pretrained.truncate import score_truncated, scored_bytes
from pe_bench.provenance import provenance
from pe_bench.records import PASSKEY_MODE, TAIL_MODE, TRUNCATE_MODE, is_ruler, make_record
from pe_bench.run.evaluate import OUT_OF_MEMORY, EvalTask, is_out_of_memory, score
from pe_bench.run.job import DataKey, RunContext, Steps
from pe_bench.run.store import RunStore
from pe_bench.run.weights import record_fields

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PretrainedData:
    """The corpus (as bytes) and the model's tokenizer, raw and behind pe-bench's interface."""

    corpus: Corpus
    tokenizer: Any  # the model's own (transformers)
    tokens: HFTokenizer  # the same, as pe-bench's tokenizers: fingerprint, bytes of tokens


def code_hash() -> str:
    """The key of the code that computes a pretrained model's numbers
    (``pretrained.key.pretrained_key``): records made by other code are recomputed."""
    return pretrained_key()


def open_data(job: PretrainedPlan, device: torch.device) -> tuple[PretrainedData, DataKey]:
    """Load the corpus and the model's tokenizer (not the weights: a complete job needs none);
    records are keyed on the weights there now (``pretrained.key.weights_key``)."""
    corpus = load_corpus(job.cfg.data)
    tokenizer = load_tokenizer(job.model)
    tokens = corpus_tokenizer(tokenizer, job.model.name)
    return PretrainedData(corpus, tokenizer, tokens), DataKey(
        corpus.sha, tokens.fingerprint, code_hash(), weights_key(job.model)
    )


def evaluate_pretrained(ctx: RunContext, todo: dict[str, list[EvalTask]]) -> None:
    """Load the weights, run the missing passkey and RULER tasks, then score each slice's
    missing perplexity tasks on its own targets (retrieval first: its prompts are the longest,
    and a run stopped half-way has its retrieval numbers)."""
    job: PretrainedPlan = ctx.job
    data: PretrainedData = ctx.data
    pk_todo = [t for t in todo[job.run_id(0)] if t.mode == PASSKEY_MODE]
    ruler_todo = [t for t in todo[job.run_id(0)] if is_ruler(t.mode)]
    passkey.check_lengths(data.tokenizer.encode, [t.eval_len for t in pk_todo])
    test = data.corpus.splits["test"].numpy().tobytes()
    stream = encode_prefix(data.tokens, test, job.stream_tokens, data.corpus.name)
    model = load_model(job.model, ctx.device)
    fields = _run_fields(job, model, data.corpus, ctx.device) | tokenizer_fields(data.tokens)
    log.info(
        "%s: %d perplexity, %d passkey and %d RULER records to compute, %s",
        job.model.name,
        sum(map(len, todo.values())) - len(pk_todo) - len(ruler_todo),
        len(pk_todo),
        len(ruler_todo),
        data.corpus.describe(),
    )
    pk_fields = {**fields, "run_id": job.run_id(0), "seed": 0, "test_slice": 0}
    text = test.decode("utf-8", errors="replace")  # RULER's essay haystack: the corpus's lines
    for task in [*pk_todo, *ruler_todo]:  # one at a time: a later one may copy an earlier one
        copied = _copy(job, ctx.store, job.run_id(0), task)
        if copied:
            ctx.store.add(copied[0])
            continue
        for record in _retrieval(job, model, data.tokenizer, task, text):
            ctx.store.add({**pk_fields, **record})
    lm = LogitsOnly(model)
    bos = data.tokenizer.bos_token_id  # the truncate mode's BOS, as YaRN's add_start_token
    for k in range(job.model.test_slices):
        slice_fields = {**fields, "run_id": job.run_id(k), "seed": k, "test_slice": k}
        for task in todo[job.run_id(k)]:
            if task.mode == PASSKEY_MODE or is_ruler(task.mode):
                continue
            copied = _copy(job, ctx.store, job.run_id(k), task)
            if copied:
                ctx.store.add(*copied)
            elif task.mode == TRUNCATE_MODE:
                ctx.store.add(*_score_truncated(job, lm, task, stream, k, slice_fields, bos))
            else:
                ctx.store.add(*_score(job, lm, task, stream, k, slice_fields))


STEPS = Steps(open_data, evaluate_pretrained)


def _retrieval(
    job: PretrainedPlan, model: nn.Module, tokenizer: Any, task: EvalTask, text: str
) -> Iterator[dict[str, Any]]:
    """The record of a passkey or RULER task (``text``: the corpus's, RULER's essay)."""
    common = (model, tokenizer, [task], job.variants, job.spec, job.short_name)
    if task.mode == PASSKEY_MODE:
        return passkey.run(*common, job.model.rope_impl, job.passkey)
    return ruler_eval.run(*common, job.model.rope_impl, job.ruler, text)


def _copy(
    job: PretrainedPlan, store: RunStore, run_id: str, task: EvalTask
) -> tuple[dict[str, Any], list[float | None] | None, list | None] | None:
    """The record (with its per-position loss and per-window buckets) of ``task`` copied from
    the label before it that computes the same numbers at its length
    (``PretrainedPlan.same_as``), marked ``same_as``; None when there is none, or its record is
    not there (it is computed then)."""
    source = job.same_as.get((task.variant, task.eval_len))
    if source is None:
        return None
    want = {"run_id": run_id, "variant": source, "eval_len": task.eval_len, "mode": task.mode}
    want |= {"stride": task.stride, "tokens": task.tokens}
    found = [r for r in store.records if all(r.get(k) == v for k, v in want.items())]
    found = [r for r in found if r["status"] == "ok" and r.get("probe_hash", "") == task.probe_hash]
    if not found:
        return None
    record = {k: v for k, v in found[0].items() if k not in COPY_DROPS}
    record = {**record, **task.fields(), "same_as": source}
    rows = [row for row in store.positions if all(row.get(k) == v for k, v in want.items())]
    log.info(
        "%s L=%d %s: the numbers of %s (the same function)",
        task.variant,
        task.eval_len,
        task.mode,
        source,
    )
    row = rows[0] if rows else {}
    return record, row.get("loss"), row.get("window_loss")


# What a copied record does not take from its source: its cost and its variant's code key.
COPY_DROPS = ("time_s", "peak_mem_mb", "variant_source", "probe_hash")


def _score(
    job: PretrainedPlan,
    lm: LogitsOnly,
    task: EvalTask,
    stream: TokenStream,
    k: int,
    fields: dict[str, Any],
) -> tuple[dict[str, Any], list[float | None] | None]:
    """One perplexity record of slice ``k`` (ok, or skipped when the length does not fit in
    memory) and its per-position loss; bits per byte over the ``target_bytes`` of the scored
    targets. Slice k's targets are the k-th ``n_targets`` of the stream, after the context of
    the tail windows in tail mode."""
    n_targets, context = job.n_targets, job.tail_context if task.mode == TAIL_MODE else 0
    first = context + k * n_targets  # the input before the slice's first target
    fields = {**fields, "target_bytes": stream.target_bytes(first, first + n_targets)}
    variant = job.variants.get(task.variant)
    label = job.short_name + ("" if variant is None else f"+{variant.key}")
    key = task.fields()
    start = time.perf_counter()
    batch, device = job.cfg.eval.batch_tokens, job.device
    try:
        with rope_variant(lm.model, variant, job.spec, task.eval_len, job.model.rope_impl) as impl:
            if task.mode == TAIL_MODE:
                piece = stream.ids[first - context : first + n_targets + 1]
                result = score_tail(lm, piece, context, task.eval_len, task.stride, batch, device)
            else:
                piece = stream.ids[first : first + n_targets + 1]
                desc = f"eval {label} L={task.eval_len} slice {k}"
                result = score(
                    lm, piece, task.eval_len, task.mode, task.stride, batch, device, desc
                )
    except OUT_OF_MEMORY as err:
        if not is_out_of_memory(err):
            raise
        reason = f"out of memory at L={task.eval_len}: {str(err).splitlines()[0][:200]}"
        log.error("%s: %s; recorded as skipped", label, reason)
        return make_record(fields, key, "skipped", reason=reason), None
    elapsed = round(time.perf_counter() - start, 3)
    bytes_per_token = fields["target_bytes"] / n_targets  # exact: their sum is target_bytes
    record = make_record(
        fields, key, "ok", result.nll, bytes_per_token, rope_impl=impl, time_s=elapsed
    )
    log.info(
        "%s L=%d %s slice %d: nll %.4f",
        label,
        task.eval_len,
        task.mode,
        fields["test_slice"],
        result.nll,
    )
    return record, result.position_loss()


def _score_truncated(
    job: PretrainedPlan,
    lm: LogitsOnly,
    task: EvalTask,
    stream: TokenStream,
    k: int,
    fields: dict[str, Any],
    bos: int | None,
) -> tuple[dict[str, Any], list[float | None] | None, list[list[float | None]] | None]:
    """One truncate-mode record of slice ``k`` (``pretrained.truncate``: slice k's documents,
    each truncated to the window), its per-position loss and each document's loss by bucket of
    positions; skipped when the length does not fit in memory."""
    documents, doc_len, length = job.documents, job.doc_len, task.eval_len
    first = k * documents * doc_len
    target_bytes = scored_bytes(stream.byte_ends, first, documents, doc_len, length, bos)
    fields = {**fields, "target_bytes": target_bytes, "documents": documents, "bos": bos}
    variant = job.variants.get(task.variant)
    label = job.short_name + ("" if variant is None else f"+{variant.key}")
    start = time.perf_counter()
    ids = stream.ids[first : first + documents * doc_len]
    try:
        with rope_variant(lm.model, variant, job.spec, length, job.model.rope_impl) as impl:
            batch = job.cfg.eval.batch_tokens
            result, buckets = score_truncated(
                lm, ids, documents, doc_len, length, bos, batch, job.device
            )
    except OUT_OF_MEMORY as err:
        if not is_out_of_memory(err):
            raise
        reason = f"out of memory at L={length}: {str(err).splitlines()[0][:200]}"
        log.error("%s: %s; recorded as skipped", label, reason)
        return make_record(fields, task.fields(), "skipped", reason=reason), None, None
    elapsed = round(time.perf_counter() - start, 3)
    record = make_record(
        fields, task.fields(), "ok", result.nll, target_bytes / result.tokens,
        rope_impl=impl, time_s=elapsed, scored=result.tokens,
    )  # fmt: skip
    log.info("%s L=%d truncate slice %d: nll %.4f", label, length, k, result.nll)
    return record, result.position_loss(), buckets


def _run_fields(
    job: PretrainedPlan, model: nn.Module, corpus: Corpus, device: torch.device
) -> dict[str, Any]:
    """The fields every record of the pretrained model shares."""
    config = model.config
    return {
        "scheme": job.short_name,
        "model": job.model.name,
        "revision": job.model.revision,
        "pretrained": True,
        "train_len": job.spec.dims.train_len,
        "params": sum(p.numel() for p in model.parameters()),
        "d_model": config.hidden_size,
        "num_layers": config.num_hidden_layers,
        "num_heads": job.spec.dims.num_heads,
        "rotary_dim": job.spec.dims.head_dim,
        "rope_theta": job.spec.theta,
        "corpus": corpus.name,
        "corpus_sha": corpus.sha,
        "config_hash": job.cfg.run_hash,
        "pe_source": code_hash(),
        "weights_sha": weights_key(job.model),
        **record_fields(job.source),
        **provenance(device),
    }
