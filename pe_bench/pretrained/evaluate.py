"""The steps of a pretrained model's run (``STEPS``, run by ``run.job.run``): load the corpus
and the model's tokenizer, then the weights, and compute the missing perplexity records of each
test slice and the passkey records (``pe_bench.pretrained.plan`` says what they are)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from pe_bench.data.corpus import Corpus, load_corpus
from pe_bench.data.tokenizer import HFTokenizer
from pe_bench.pretrained import passkey
from pe_bench.pretrained.key import pretrained_key, weights_key
from pe_bench.pretrained.load import (
    LogitsOnly,
    corpus_tokenizer,
    encode_prefix,
    load_model,
    load_tokenizer,
    tokenizer_fields,
)
from pe_bench.pretrained.plan import PretrainedPlan
from pe_bench.pretrained.rope import rope_variant
from pe_bench.records import PASSKEY_MODE, make_record, provenance
from pe_bench.run.evaluate import OUT_OF_MEMORY, EvalTask, is_out_of_memory, score
from pe_bench.run.job import DataKey, RunContext, Steps

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
    tokenizer = load_tokenizer(job.model.name, job.model.revision)
    tokens = corpus_tokenizer(tokenizer, job.model.name)
    return PretrainedData(corpus, tokenizer, tokens), DataKey(
        corpus.sha, tokens.fingerprint, code_hash(), weights_key(job.model)
    )


def evaluate_pretrained(ctx: RunContext, todo: dict[str, list[EvalTask]]) -> None:
    """Load the weights, score each slice's missing perplexity tasks on its own targets, then
    run the missing passkey tasks."""
    job: PretrainedPlan = ctx.job
    data: PretrainedData = ctx.data
    pk_todo = [t for t in todo[job.run_id(0)] if t.mode == PASSKEY_MODE]
    passkey.check_lengths(data.tokenizer.encode, [t.eval_len for t in pk_todo])
    n_targets, slices = job.n_targets, job.model.test_slices
    test = data.corpus.splits["test"].numpy().tobytes()
    stream = encode_prefix(data.tokens, test, slices * n_targets + 1, data.corpus.name)
    model = load_model(job.model, ctx.device)
    fields = _run_fields(job, model, data.corpus, ctx.device) | tokenizer_fields(data.tokens)
    log.info(
        "%s: %d perplexity and %d passkey records to compute, %s",
        job.model.name,
        sum(map(len, todo.values())) - len(pk_todo),
        len(pk_todo),
        data.corpus.describe(),
    )
    lm = LogitsOnly(model)
    for k in range(slices):
        start = k * n_targets
        piece = stream.ids[start : start + n_targets + 1]
        slice_fields = {**fields, "run_id": job.run_id(k), "seed": k, "test_slice": k}
        slice_fields["target_bytes"] = stream.target_bytes(start, start + n_targets)
        for task in todo[job.run_id(k)]:
            if task.mode != PASSKEY_MODE:
                ctx.store.add(*_score(job, lm, task, piece, slice_fields))
    if pk_todo:
        pk_fields = {**fields, "run_id": job.run_id(0), "seed": 0, "test_slice": 0}
        impl = job.model.rope_impl
        trials = passkey.run(
            model,
            data.tokenizer,
            pk_todo,
            job.variants,
            job.spec,
            job.short_name,
            impl,
            job.passkey,
        )
        for record in trials:
            ctx.store.add({**pk_fields, **record})


STEPS = Steps(open_data, evaluate_pretrained)


def _score(
    job: PretrainedPlan, lm: LogitsOnly, task: EvalTask, stream: Tensor, fields: dict[str, Any]
) -> tuple[dict[str, Any], list[float | None] | None]:
    """One perplexity record (ok, or skipped when the length does not fit in memory) and its
    per-position loss; bits per byte over the ``target_bytes`` of the scored targets."""
    n_targets = len(stream) - 1
    variant = job.variants.get(task.variant)
    label = job.short_name + ("" if variant is None else f"+{variant.key}")
    key = task.fields()
    start = time.perf_counter()
    try:
        with rope_variant(lm.model, variant, job.spec, task.eval_len, job.model.rope_impl) as impl:
            result = score(
                lm,
                stream,
                task.eval_len,
                task.mode,
                task.stride,
                job.cfg.eval.batch_tokens,
                job.device,
                f"eval {label} L={task.eval_len} slice {fields['test_slice']}",
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
        **provenance(device),
    }
