"""Pretrained Hugging Face causal LMs with RoPE under pe-bench's protocol (``model=hf``).

``model=hf model.name=<hub id or local folder>`` loads a pretrained causal LM (Llama, Mistral,
Qwen2, GPT-NeoX/Pythia and any other model whose rotary embedding is HF's standard module) in
float32 and evaluates it, without training, as pe-bench evaluates its own models: the same
windows (``pe_bench.run.evaluate.score``), records, reports and CIs, with the model's own tokenizer,
then passkey retrieval (``pe_bench.pretrained.passkey``).

Eval-time RoPE variants (``eval.variants``: pi, ntk, dynamic_ntk, yarn, logn, ...) are
pe-bench's scheme classes, built for the model's rotary dims, ``rope_theta`` and pretraining
context, and applied in one of two ways (``model.rope_impl``):

- ``pe_bench`` (default): the model's rotary embedding takes its frequencies from the scheme's
  ``frequencies`` (its ``inv_freq`` at the evaluated context length) and its cos/sin factor
  from the scheme's ``attention_factor`` where it has one (YaRN: HF's ``attention_scaling``);
  a scheme with any other ``logit_scale`` (log-n) has its queries scaled in the attention
  function ``pe_bench`` registered with HF's ``AttentionInterface`` (SDPA otherwise).
- ``hf``: where Hugging Face has a ``rope_type`` for the method (``HF_ROPE_TYPES``: linear =
  PI, dynamic, yarn, llama3, longrope), the rotary embedding is rebuilt from the model's config
  with those ``rope_parameters``; the other variants fall back to the pe-bench hook. Each
  record's ``rope_impl`` says which one computed it.

``tests/test_hf.py`` holds both ways to the same logits on tiny random-weight models, so a
result can be trusted either way. On a partial-rotary model (Pythia rotates a quarter of each
head) an attention factor on cos and sin scales only the rotated part of q . k: HF does so,
and pe-bench follows it (an ``attention_factor`` goes on cos and sin, not on q).

The confidence intervals of a pretrained model are over ``model.test_slices`` disjoint slices
of the test split (one model, so no seeds): slice k is scored as its own run, with ``seed`` =
``test_slice`` = k, so the report's intervals over seeds are intervals over slices (the run
id is ``<model>-<hash>:slice-<k>``, one job folder for the model). The corpus is tokenized by
the model's tokenizer behind ``pe_bench.data.tokenizer``'s interface, as any tokenized run: bits
per byte divide by the summed UTF-8 bytes of exactly the scored targets (``target_bytes``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from pe_bench.config import config_hash, from_node, to_dict
from pe_bench.data.corpus import check_config, load_corpus
from pe_bench.errors import UserError
from pe_bench.pretrained import passkey
from pe_bench.pretrained.key import pretrained_key, variant_key
from pe_bench.pretrained.load import (
    HFConfig,
    LogitsOnly,
    corpus_tokenizer,
    encode_prefix,
    load_config,
    load_model,
    load_tokenizer,
    tokenizer_fields,
)
from pe_bench.pretrained.rope import RopeSpec, Variant, build_variants, rope_spec, rope_variant
from pe_bench.records import PASSKEY_MODE, make_record, provenance
from pe_bench.run.evaluate import (
    OUT_OF_MEMORY,
    EvalConfig,
    EvalTask,
    eval_tasks,
    is_out_of_memory,
    score,
)
from pe_bench.run.store import RunStore, job_lock
from pe_bench.run.train import resolve_device

log = logging.getLogger(__name__)


@dataclass
class HFRun:
    """A parsed ``model=hf`` config: what to evaluate, and the identity of its records."""

    model: HFConfig
    eval: EvalConfig
    data: dict[str, Any]
    device: torch.device
    force: bool
    run_hash: str
    yaml: str
    resolved: dict[str, Any] = field(default_factory=dict)

    @property
    def short_name(self) -> str:
        """The model's name in labels: the last part of its hub id or folder."""
        return Path(self.model.name.rstrip("/")).name

    def run_id(self, test_slice: int) -> str:
        """One model, several test slices: ``<model>-<hash>:slice-<k>``, the form of a
        fine-tune's id (one job folder, one model), though with no fine-tune."""
        return f"{self.short_name}-{self.run_hash}:slice-{test_slice}"


def parse(cfg: DictConfig) -> HFRun:
    """The ``model=hf`` config, checked before anything is loaded."""
    if "hydra" in cfg:
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    resolved = to_dict(cfg)
    model = from_node(HFConfig, resolved["model"], "model")
    eval_cfg = from_node(EvalConfig, resolved["eval"], "eval")
    data = resolved["data"]
    check_config(data)
    if data.get("source") == "task":
        raise UserError("model=hf evaluates text; allowed data: stdlib, text, hf")
    device = resolve_device(resolved["train"]["device"])
    identity = {"model": {k: v for k, v in resolved["model"].items() if k != "passkey"}}
    return HFRun(
        model=model,
        eval=eval_cfg,
        data=data,
        device=device,
        force=bool(resolved.get("force", False)),
        run_hash=config_hash({**identity, "data": data}),
        yaml=OmegaConf.to_yaml(cfg, resolve=True),
        resolved=resolved,
    )


def code_hash() -> str:
    """The key of the code that computes a pretrained model's numbers
    (``pretrained.key.pretrained_key``): records made by other code are recomputed."""
    return pretrained_key()


def run(cfg: DictConfig, out_dir: Path) -> list[dict[str, Any]]:
    """Evaluate the pretrained model of ``cfg`` (perplexity per test slice, then passkey) and
    write its records into ``out_dir``; only missing records are computed."""
    job = parse(cfg)
    if job.eval.probes:
        log.info("eval.probes (%s): not run on a pretrained model", ", ".join(job.eval.probes))
    hf_config = load_config(job.model)
    spec = rope_spec(hf_config, job.model.train_len, job.model.name)
    variants = build_variants(job.eval, spec)
    train_len = spec.dims.train_len
    lengths = job.eval.eval_lengths(train_len)
    n_targets = job.eval.n_targets(lengths)
    schemes = [("none", "", None, "")] + [
        (v.key, config_hash(job.eval.variants[v.key]), v.scheme, variant_key(v, spec.dims))
        for v in variants
    ]
    tasks = eval_tasks(schemes, lengths, job.eval, train_len)
    by_key = {v.key: v for v in variants}
    slices = list(range(job.model.test_slices))
    pk_cfg = passkey.parse_config(job.model.passkey)
    pk_tasks = passkey.tasks(pk_cfg, schemes, train_len) if pk_cfg else []
    with job_lock(out_dir):
        corpus = load_corpus(job.data)
        tokenizer = load_tokenizer(job.model.name, job.model.revision)
        corpus_tokens = corpus_tokenizer(tokenizer, job.model.name)
        token_fields = tokenizer_fields(corpus_tokens)
        store = RunStore(
            out_dir,
            [job.run_id(k) for k in slices],
            corpus.sha,
            job.force,
            variants={key: digest for key, digest, _, _ in schemes},
            probes={PASSKEY_MODE: passkey.settings_hash(pk_cfg)} if pk_cfg else {},
            pe_source=code_hash(),
            tokenizer_sha=token_fields["tokenizer_sha"],
            variant_sources={key: source for key, _, _, source in schemes},
        )
        todo = {k: store.missing(job.run_id(k), tasks, n_targets) for k in slices}
        pk_todo = store.missing(job.run_id(0), pk_tasks, pk_cfg.trials) if pk_cfg else []
        if not any(todo.values()) and not pk_todo:
            log.info("%s: all %d records are there: skipped", out_dir, len(store.records))
            return store.records
        store.write_config(job.yaml)
        passkey.check_lengths(tokenizer.encode, [t.eval_len for t in pk_todo])
        test = corpus.splits["test"].numpy().tobytes()
        stream = encode_prefix(corpus_tokens, test, len(slices) * n_targets + 1, corpus.name)
        model = load_model(job.model, job.device)
        fields = _run_fields(job, model, spec, corpus) | token_fields
        log.info(
            "%s: %d perplexity and %d passkey records to compute, %s",
            job.model.name,
            sum(map(len, todo.values())),
            len(pk_todo),
            corpus.describe(),
        )
        lm = LogitsOnly(model)
        for k in slices:
            start = k * n_targets
            piece = stream.ids[start : start + n_targets + 1]
            n_bytes = stream.target_bytes(start, start + n_targets)
            slice_fields = {**fields, "run_id": job.run_id(k), "seed": k, "test_slice": k}
            slice_fields["target_bytes"] = n_bytes
            for task in todo[k]:
                store.add(*_score(job, lm, by_key, spec, task, piece, slice_fields))
        if pk_todo:
            pk_fields = {**fields, "run_id": job.run_id(0), "seed": 0, "test_slice": 0}
            for record in passkey.run(
                model, tokenizer, pk_todo, by_key, spec, job.short_name, job.model.rope_impl, pk_cfg
            ):
                store.add({**pk_fields, **record})
    return store.records


def _score(
    job: HFRun,
    lm: LogitsOnly,
    variants: dict[str, Variant],
    spec: RopeSpec,
    task: EvalTask,
    stream: Tensor,
    fields: dict[str, Any],
) -> tuple[dict[str, Any], list[float | None] | None]:
    """One perplexity record (ok, or skipped when the length does not fit in memory) and its
    per-position loss; bits per byte over the ``target_bytes`` of the scored targets."""
    n_targets = len(stream) - 1
    variant = variants.get(task.variant)
    label = job.short_name + ("" if variant is None else f"+{variant.key}")
    key = task.fields(n_targets)
    start = time.perf_counter()
    try:
        with rope_variant(lm.model, variant, spec, task.eval_len, job.model.rope_impl) as impl:
            result = score(
                lm,
                stream,
                task.eval_len,
                task.mode,
                task.stride,
                job.eval.batch_tokens,
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


def _run_fields(job: HFRun, model: nn.Module, spec: RopeSpec, corpus: Any) -> dict[str, Any]:
    """The fields every record of the pretrained model shares."""
    config = model.config
    return {
        "scheme": job.short_name,
        "model": job.model.name,
        "revision": job.model.revision,
        "pretrained": True,
        "train_len": spec.dims.train_len,
        "params": sum(p.numel() for p in model.parameters()),
        "d_model": config.hidden_size,
        "num_layers": config.num_hidden_layers,
        "num_heads": spec.dims.num_heads,
        "rotary_dim": spec.dims.head_dim,
        "rope_theta": spec.theta,
        "corpus": corpus.name,
        "corpus_sha": corpus.sha,
        "config_hash": job.run_hash,
        "pe_source": code_hash(),
        **provenance(job.device),
    }
