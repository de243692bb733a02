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

``tests/pretrained/test_hf.py`` holds both ways to the same logits on tiny random-weight models, so
a result can be trusted either way. On a partial-rotary model (Pythia rotates a quarter of each
head) an attention factor on cos and sin scales only the rotated part of q . k: HF does so, and
pe-bench follows it (an ``attention_factor`` goes on cos and sin, not on q).

The confidence intervals of a pretrained model are over ``model.test_slices`` disjoint slices
of the test split (one model, so no seeds): slice k is scored as its own run, with ``seed`` =
``test_slice`` = k, so the report's intervals over seeds are intervals over slices (the run
id is ``<model>-<hash>:slice-<k>``, one job folder for the model). The corpus is tokenized by
the model's tokenizer behind ``pe_bench.data.tokenizer``'s interface, as any tokenized run: bits
per byte divide by the summed UTF-8 bytes of exactly the scored targets (``target_bytes``).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import torch

from pe_bench.config import config_hash
from pe_bench.errors import UserError
from pe_bench.pretrained import passkey, ruler_eval
from pe_bench.pretrained.key import variant_key
from pe_bench.pretrained.load import load_config, source
from pe_bench.pretrained.rope import RopeSpec, Variant, build_variants, rope_spec, same_as
from pe_bench.records import TAIL_MODE, TRUNCATE_MODE
from pe_bench.run.config import PasskeyConfig, PretrainedConfig, RulerConfig, RunConfig
from pe_bench.run.evaluate import EvalTask, eval_tasks
from pe_bench.run.train import resolve_device
from pe_bench.run.weights import ModelSource, sha256

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PretrainedPlan:
    """A pretrained model's run: every record it owes, per test slice, and the RoPE spec and
    variants they are computed with. Like a trained model's ``Plan``, it is made before any
    data is read or any weights are loaded (only the model's config.json is)."""

    cfg: RunConfig
    device: torch.device
    spec: RopeSpec
    variants: dict[str, Variant]  # by eval.variants key
    tasks: list[EvalTask]  # perplexity, the same for every slice
    passkey: PasskeyConfig | None
    passkey_tasks: list[EvalTask]  # on slice 0
    source: ModelSource  # where the weights are
    # (variant, length) -> the label before it that computes the same numbers there (its
    # record is copied, not computed: ``rope.same_as``)
    same_as: dict[tuple[str, int], str]
    ruler: RulerConfig | None = None
    ruler_tasks: list[EvalTask] = field(default_factory=list)  # on slice 0

    @property
    def model(self) -> PretrainedConfig:
        return self.cfg.model

    @property
    def short_name(self) -> str:
        """The model's name in labels: the last part of its hub id or folder, or the GGUF
        file's name without its suffix."""
        return self.source.short_name

    @property
    def identity(self) -> str:
        """The run hash, with a GGUF file's sha256: other weights under the same name (a new
        release of a package) are another run."""
        if self.source.path is None:
            return self.cfg.run_hash
        return config_hash({"run": self.cfg.run_hash, "weights": sha256(self.source.path)})

    def run_id(self, test_slice: int) -> str:
        """One model, several test slices: ``<model>-<hash>:slice-<k>``, the form of a
        fine-tune's id (one job folder, one model), though with no fine-tune."""
        return f"{self.short_name}-{self.identity}:slice-{test_slice}"

    @property
    def run_ids(self) -> list[str]:
        return [self.run_id(k) for k in range(self.model.test_slices)]

    @property
    def n_targets(self) -> int:
        """Scored targets of one slice, at every length (of the modes but truncate)."""
        return next((t.tokens for t in self.tasks if t.mode != TRUNCATE_MODE), 0)

    @property
    def documents(self) -> int:
        """Documents per slice of the truncate mode (0 without it)."""
        task = next((t for t in self.tasks if t.mode == TRUNCATE_MODE), None)
        return 0 if task is None else task.tokens // self.doc_len

    @property
    def doc_len(self) -> int:
        """Tokens of a truncate-mode document: the longest eval length."""
        return max(t.eval_len for t in self.tasks)

    @property
    def stream_tokens(self) -> int:
        """Test tokens every slice's perplexity reads, from the split's start: the tail's
        context and every slice's targets, and the truncate mode's documents."""
        windowed = [t for t in self.tasks if t.mode != TRUNCATE_MODE]
        targets = self.tail_context + self.model.test_slices * self.n_targets if windowed else 0
        return max(targets, self.model.test_slices * self.documents * self.doc_len) + 1

    @property
    def tail_context(self) -> int:
        """Tokens before the first target that the tail windows read (0 without tail mode):
        enough for the longest window, which scores its last ``stride`` tokens."""
        tails = [t for t in self.tasks if t.mode == TAIL_MODE]
        return max((t.eval_len - t.stride for t in tails), default=0)

    def owed(self) -> list[tuple[str, list[EvalTask]]]:
        """Each slice's perplexity tasks; slice 0's then passkey's and RULER's."""
        retrieval = [*self.passkey_tasks, *self.ruler_tasks]
        return [
            (self.run_id(k), [*self.tasks, *(retrieval if k == 0 else [])])
            for k in range(self.model.test_slices)
        ]


def plan_pretrained(cfg: RunConfig) -> PretrainedPlan:
    """The pretrained model's plan: refuses what cannot be served before any weights load."""
    if cfg.data.source == "task":
        raise UserError("model=hf evaluates text; allowed data: stdlib, text, hf")
    if cfg.eval.probes:
        log.info("eval.probes (%s): not run on a pretrained model", ", ".join(cfg.eval.probes))
    device = resolve_device(cfg.train.device)
    cfg.model.check_path()
    where = source(cfg.model)
    spec = rope_spec(load_config(cfg.model), cfg.model.train_len, cfg.model.name)
    variants = build_variants(cfg.eval, spec)
    train_len = spec.dims.train_len
    lengths = cfg.eval.eval_lengths(train_len)
    schemes = [("none", "", None, "")] + [
        (v.key, config_hash(cfg.eval.variants[v.key]), v.scheme, variant_key(v, spec.dims))
        for v in variants
    ]
    tasks = eval_tasks(schemes, lengths, cfg.eval, train_len, _n_targets(cfg, lengths, train_len))
    documents = cfg.eval.documents or cfg.eval.tokens // max(lengths)
    if TRUNCATE_MODE in cfg.eval.modes and documents < 1:
        raise UserError(
            f"eval.modes: truncate needs documents of {max(lengths)} tokens (the longest length); "
            f"eval.tokens={cfg.eval.tokens} holds none; allowed: eval.documents=<n> >= 1"
        )
    tasks = [  # truncate: the slice's documents, each the longest length's tokens
        dataclasses.replace(t, tokens=documents * max(lengths)) if t.mode == TRUNCATE_MODE else t
        for t in tasks
    ]
    pk_cfg = cfg.model.passkey_config()
    pk_tasks = passkey.tasks(pk_cfg, schemes, train_len) if pk_cfg else []
    ruler_cfg = cfg.model.ruler_config()
    ruler_tasks = ruler_eval.tasks(ruler_cfg, schemes, train_len) if ruler_cfg else []
    by_key = {v.key: v for v in variants}
    pk_lengths = pk_cfg.prompt_lengths(train_len) if pk_cfg else []
    ruler_lengths = ruler_cfg.prompt_lengths(train_len) if ruler_cfg else []
    same = same_as(variants, spec, sorted(set(lengths) | set(pk_lengths) | set(ruler_lengths)))
    return PretrainedPlan(
        cfg, device, spec, by_key, tasks, pk_cfg, pk_tasks, where, same, ruler_cfg, ruler_tasks
    )


def _n_targets(cfg: RunConfig, lengths: list[int], train_len: int) -> int:
    """Targets per slice: ``eval.tokens`` rounded down to a multiple of the longest length, or
    in tail mode alone (with truncate or not) to a multiple of the targets each window scores."""
    windowed = [mode for mode in cfg.eval.modes if mode != TRUNCATE_MODE]
    if windowed and windowed != [TAIL_MODE]:
        return cfg.eval.n_targets(lengths)
    if not windowed:
        return cfg.eval.tokens
    stride = cfg.eval.stride_for(TAIL_MODE, min(lengths), train_len)
    if cfg.eval.tokens < stride:
        raise UserError(f"eval.tokens={cfg.eval.tokens} is below eval.stride={stride}")
    return cfg.eval.tokens - cfg.eval.tokens % stride
