"""What a run of a model pe-bench trains will do, decided before any data is read or any
model is trained.

``plan(cfg)`` takes the typed configs (``run.config.RunConfig``), checks everything that can be
refused (an unknown scheme or option, a length a scheme cannot serve, a fine-tune of a wrong
value, a batch that cannot fit) and lists every record the run owes: the trained model's
evaluation tasks (its own scheme and every eval-time variant that applies to it, then the
context-use probes of each) and each fine-tune's. The scheme is built once, here, as the model
will have it; the model itself only when the run needs it (``Plan.build_model``).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from omegaconf import DictConfig

from pe_bench.config import config_hash
from pe_bench.data.corpus import VOCAB_SIZE, tokens_bound
from pe_bench.data.tasks import build_task
from pe_bench.data.tokenizer import BPE, BYTE
from pe_bench.errors import UserError
from pe_bench.model.gpt import GPT, ModelConfig, check_attention, model_with_scheme, seeded_scheme
from pe_bench.positions import (
    META_KEYS,
    PositionScheme,
    build_scheme,
    checked_options,
    load_plugin,
    scheme_class,
    scheme_key,
)
from pe_bench.records import TAIL_MODE, TASK_MODE, TRUNCATE_MODE
from pe_bench.run.config import RunConfig
from pe_bench.run.evaluate import EvalTask, eval_tasks
from pe_bench.run.probes import probe_tasks
from pe_bench.run.train import TrainConfig, resolve_device

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finetune:
    """One fine-tuning of the trained model (``finetunes.<key>``) and the records it owes."""

    key: str
    config_hash: str  # of the fine-tune's config: a changed fine-tune retrains and recomputes
    train: TrainConfig  # the fine-tuning's own training settings
    scheme: PositionScheme  # the scheme it fine-tunes and evaluates with
    tasks: list[EvalTask]
    run_id: str
    # the key of the fine-tuning scheme's code (``positions.scheme_key``), as ``pe_source`` is
    # the trained scheme's: an edited fine-tune scheme retrains the fine-tune and recomputes
    # its records (``RunStore``, the checkpoint's fingerprint), and nothing else
    source: str

    def record_fields(self) -> dict[str, Any]:
        """What a fine-tuned model's records add to (or change in) the trained model's: the
        fine-tuning scheme's caveat, where it has one, in place of the trained scheme's, and
        the key of its code."""
        caveat = {"caveat": self.scheme.caveat} if self.scheme.caveat else {}
        return caveat | {
            "run_id": self.run_id,
            "finetune": self.key,
            "finetune_pe": self.scheme.name,
            "finetune_len": self.train.seq_len,
            "finetune_steps": self.train.steps,
            "finetune_tokens": self.train.steps * self.train.batch_size * self.train.seq_len,
            "finetune_lr": self.train.lr,
            "finetune_source": self.source,
            "config_hash": self.config_hash,
        }


@dataclass(frozen=True)
class Plan:
    """A model pe-bench trains: its scheme, device, and every record it and its fine-tunes owe."""

    cfg: RunConfig
    scheme: PositionScheme  # the trained scheme, built once as the model's (``build_model``)
    device: torch.device
    tasks: list[EvalTask]  # of the trained model: perplexity (or a task's accuracy), then probes
    n_targets: int  # eval targets (a task's instances), the same at every length
    finetunes: list[Finetune]
    pe_source: str  # the key of the trained scheme's code (``positions.scheme_key``)

    @property
    def run_id(self) -> str:
        return f"{self.scheme.name}-{self.cfg.run_hash}"

    @property
    def run_ids(self) -> list[str]:
        """The trained model's run id, then each fine-tune's."""
        return [self.run_id, *(ft.run_id for ft in self.finetunes)]

    @property
    def finetune_sources(self) -> dict[str, str]:
        """Each fine-tune's run id -> the key of its scheme's code (``Finetune.source``)."""
        return {ft.run_id: ft.source for ft in self.finetunes}

    def owed(self) -> list[tuple[str, list[EvalTask]]]:
        """(run id, its evaluation tasks): the trained model's, then each fine-tune's."""
        return [(self.run_id, self.tasks), *((ft.run_id, ft.tasks) for ft in self.finetunes)]

    def build_model(self, vocab_size: int = VOCAB_SIZE) -> GPT:
        """The model to train around a copy of the planned scheme: the same trunk for every
        scheme (``model_with_scheme``), with the vocabulary of the corpus's tokenizer
        (``model_vocab``)."""
        cfg = self.cfg
        model_cfg = dataclasses.replace(cfg.model, vocab_size=model_vocab(cfg.model, vocab_size))
        return model_with_scheme(model_cfg, copy.deepcopy(self.scheme), cfg.train.seed)


def model_vocab(model: ModelConfig, tokenizer_vocab: int) -> int:
    """The model's vocabulary for a tokenizer of ``tokenizer_vocab`` ids: the tokenizer's when
    ``model.vocab_size`` is the byte vocabulary every model config has (it follows the
    tokenizer), ``model.vocab_size`` when larger; a smaller one is refused."""
    if model.vocab_size == VOCAB_SIZE:
        return tokenizer_vocab
    if model.vocab_size < tokenizer_vocab:
        raise UserError(
            f"model.vocab_size={model.vocab_size} is smaller than the tokenizer's "
            f"{tokenizer_vocab:,} ids; allowed: >= {tokenizer_vocab}, or {VOCAB_SIZE} (the "
            "default) to follow the tokenizer"
        )
    return model.vocab_size


def plan(cfg: DictConfig | RunConfig) -> Plan:
    """Check the config and list every record the run owes; refuses anything that cannot be
    served, before any data is read or any training."""
    run_cfg = cfg if isinstance(cfg, RunConfig) else RunConfig.parse(cfg)
    train_len = run_cfg.train.seq_len
    device = _check_inputs(run_cfg)
    dims = run_cfg.model.dims(train_len)
    scheme = seeded_scheme(
        partial(build_scheme, run_cfg.pe, prefix="pe."), dims, run_cfg.train.seed
    )
    if scheme.variant_of:
        raise UserError(
            f"pe={scheme.name} is an eval-time variant of {scheme.variant_of}: train "
            f"pe={scheme.variant_of}; its runs evaluate eval.variants ({scheme.name} "
            "included by default)"
        )
    lengths = run_cfg.eval.eval_lengths(train_len)
    schemes = [("none", "", scheme, ""), *_variants(run_cfg, scheme)]
    for _, _, each, _ in schemes:
        for length in lengths:
            each.check_length(length)
    # The trained scheme's tasks evaluate the model's own scheme (None), not the planned copy.
    evaluated = [
        (key, digest, None if key == "none" else s, code) for key, digest, s, code in schemes
    ]
    modes = _modes(run_cfg, lengths)
    if modes == [TASK_MODE]:  # a synthetic task scores instances, the same number per length
        n_targets = run_cfg.data.eval_instances
    else:
        n_targets = run_cfg.eval.n_targets(lengths)
    tasks = with_probes(
        eval_tasks(evaluated, lengths, run_cfg.eval, train_len, n_targets, modes), run_cfg
    )
    run_id = f"{scheme.name}-{run_cfg.run_hash}"
    finetunes = _finetunes(run_cfg, scheme, lengths, run_id, modes, n_targets)
    # keyed now, not when the data is loaded: a scheme whose hooks fail on the key's probe (a
    # broken plugin) is refused before any job of a sweep starts
    pe_source = scheme_key(run_cfg.pe, scheme.dims)
    return Plan(run_cfg, scheme, device, tasks, n_targets, finetunes, pe_source)


def with_probes(tasks: list[EvalTask], cfg: RunConfig) -> list[EvalTask]:
    """``tasks`` then the context-use probes of every scheme they evaluate (text only)."""
    return [*tasks, *probe_tasks(tasks, cfg.eval, cfg.train.seq_len)]


def _modes(cfg: RunConfig, lengths: list[int]) -> list[str]:
    """The eval modes: ``eval.modes`` for text, ``task`` for a synthetic task (whose lengths
    and training length it checks against the task's shortest instance)."""
    if TAIL_MODE in cfg.eval.modes:
        raise UserError(
            "eval.modes: tail (windows that end at the scored targets, the context before them "
            "taken from the corpus) is for model=hf; allowed here: nonoverlap, sliding"
        )
    if TRUNCATE_MODE in cfg.eval.modes:
        raise UserError(
            "eval.modes: truncate (documents truncated to the window, the papers' protocol) is "
            "for model=hf; allowed here: nonoverlap (every position of windows back to back)"
        )
    if cfg.data.source != "task":
        return cfg.eval.modes
    task = build_task(cfg.data.task_config())
    task.check_length(cfg.train.seq_len, "train.seq_len")
    task.check_length(min(lengths), "the shortest eval length")
    return [TASK_MODE]


def _check_inputs(cfg: RunConfig) -> torch.device:
    """Check what the typed configs cannot check alone (data, vocabulary, device, memory,
    logger); returns the device the run trains on."""
    byte = cfg.data.tokenizer == BYTE  # others: checked once loaded
    if byte and cfg.model.vocab_size < VOCAB_SIZE:
        raise UserError(
            f"model.vocab_size={cfg.model.vocab_size} is smaller than the corpus's "
            f"{VOCAB_SIZE} byte symbols; allowed: >= {VOCAB_SIZE}"
        )
    device = resolve_device(cfg.train.device)
    check_attention(cfg.model, device)
    model, vocab = cfg.model, "model.vocab_size"  # a BPE's logits are up to data.vocab_size wide
    if cfg.data.tokenizer == BPE and (cfg.data.vocab_size or 0) > model.vocab_size:
        model, vocab = (
            dataclasses.replace(model, vocab_size=cfg.data.vocab_size),
            "data.vocab_size",
        )
    check_corpus_length(cfg)
    check_step_memory(cfg.train, model, device, "train", vocab)
    for key, ft in cfg.finetunes.items():
        check_step_memory(ft.train_config(cfg.train), model, device, f"finetunes.{key}", vocab)
    return device


def check_corpus_length(cfg: RunConfig) -> None:
    """Refuse a training length the corpus cannot hold a window of (its size from its files,
    ``corpus.tokens_bound``: a text path without files is refused there), before the memory
    check would suggest a smaller batch; an empty text is refused too, before anything is
    made."""
    size = tokens_bound(cfg.data)
    settings = [("train", cfg.train)]
    settings += [(f"finetunes.{k}", ft.train_config(cfg.train)) for k, ft in cfg.finetunes.items()]
    for where, train in settings:
        if size is not None and train.seq_len + 1 > size:
            path = cfg.data.path
            corpus = f"data.path={path!r}" if path else f"data={cfg.data.source}"
            share = 1 - cfg.data.valid_frac - cfg.data.test_frac
            least = math.ceil(round((train.seq_len + 2) / share, 6))  # 18 / 0.8999..: 20
            enough = f"a text of at least {least:,} bytes (windows of seq_len + 1 tokens in its "
            enough += "train split)"
            if not size:
                raise UserError(f"{corpus}: every file is empty; allowed: {enough}")
            raise UserError(
                f"{where}.seq_len={train.seq_len:,} is longer than the corpus: {corpus} holds "
                f"{size:,} byte{'' if size == 1 else 's'}, at most as many tokens; allowed: "
                f"{enough}, or a shorter seq_len"
            )


def device_memory(device: torch.device) -> int:
    """Bytes of memory of ``device``: the GPU's, or the machine's for the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_step_memory(
    train: TrainConfig, model: ModelConfig, device: torch.device, where: str, vocab: str = ""
) -> None:
    """Refuse a batch whose training step cannot fit in the device's memory even at its
    smallest (the global batch of token ids, and this process's embeddings and logits), which
    torch would find only by failing an allocation. The message names what to lower: the
    batch, or where even one sequence cannot fit, ``vocab`` (the key of the logits' width,
    ``model.vocab_size`` by default) or ``seq_len``."""
    world = max(1, int(os.environ.get("WORLD_SIZE", "1")))
    width = model.vocab_size + model.d_model

    def need(batch: int, seq_len: int, width: int) -> int:
        return 16 * batch * seq_len + 4 * (batch * seq_len // world) * width

    have = device_memory(device)
    if need(train.batch_size, train.seq_len, width) <= have:
        return
    most = train.batch_size * have // need(train.batch_size, train.seq_len, width)
    if most >= 1:
        allowed = f"a batch_size of at most {most:,}, or a shorter seq_len"
    elif need(1, train.seq_len, VOCAB_SIZE + model.d_model) <= have:  # the logits' width
        widest = (have - 16 * train.seq_len) * world // (4 * train.seq_len) - model.d_model
        allowed = f"{vocab or 'model.vocab_size'} of at most {widest:,} (now {model.vocab_size:,})"
    else:
        allowed = f"{where}.seq_len of at most {have // need(1, 1, width):,}"
    raise UserError(
        f"{where}.batch_size={train.batch_size} x seq_len {train.seq_len}: one training step "
        "needs at least "
        f"{need(train.batch_size, train.seq_len, width) / 2**30:,.1f} GiB, more than the "
        f"{have / 2**30:,.1f} GiB of {device.type} memory here; allowed: {allowed}"
    )


def _built(pe_cfg: dict[str, Any], cfg: RunConfig, prefix: str = "pe.") -> PositionScheme:
    """A scheme built for this model, leaving the global random stream as it was; ``prefix``
    is where its config sits, for the messages."""
    with torch.random.fork_rng(devices=[]):
        return build_scheme(pe_cfg, cfg.model.dims(cfg.train.seq_len), prefix)


def _variants(
    cfg: RunConfig, trained: PositionScheme
) -> list[tuple[str, str, PositionScheme, str]]:
    """(variant key, hash of its config, scheme, key of its code) of every eval-time variant
    that applies to the trained scheme (its ``variant_of`` names it); the others are left out."""
    variants = []
    for key, variant_cfg in (cfg.eval.variants or {}).items():
        where = f"eval.variants.{key}"
        if not isinstance(variant_cfg, dict) or "name" not in variant_cfg:
            raise UserError(
                f"{where}={variant_cfg!r} must be a variant config; add one with "
                f"+pe@{where}=<variant>, e.g. pi"
            )
        if variant_cfg.get("plugin"):
            load_plugin(variant_cfg["plugin"], f"{where}.plugin")
        cls = scheme_class(variant_cfg["name"])
        if cls.variant_of is None:
            raise UserError(
                f"{where}: {cls.name!r} is a trainable scheme, not an eval-time "
                "variant; use pe=" + cls.name
            )
        if cls.variant_of == trained.name:
            check_shared_options(variant_cfg, cfg.pe, where)
            variant = _built(variant_cfg, cfg, where + ".")
            # its code's key goes with its records, as a trained scheme's (pe_source): an
            # edited plugin variant recomputes its records instead of finding the old ones
            code = scheme_key(variant_cfg, variant.dims)
            variants.append((key, config_hash(variant_cfg), variant, code))
        else:  # not evaluated in this run, but a bad option is refused all the same
            options = {k: v for k, v in variant_cfg.items() if k not in META_KEYS}
            checked_options(cls, options, where + ".")
    return variants


def check_shared_options(variant: dict[str, Any], trained: dict[str, Any], where: str) -> None:
    """Refuse an eval-time variant whose options shared with the trained scheme (RoPE's
    ``base``) differ from the trained values: it would score a model other than the one
    trained. The variant configs take them from ``pe`` (``${trained_option:base,...}``); a
    fine-tune may change them, as it trains."""
    for key, value in variant.items():
        if key not in META_KEYS and key in trained and value != trained[key]:
            raise UserError(
                f"{where}.{key}={value} differs from the trained model's pe.{key}="
                f"{trained[key]}: a variant evaluates the trained model; leave "
                f"{where}.{key} unset to use the trained value"
            )


def _finetunes(
    cfg: RunConfig,
    trained: PositionScheme,
    lengths: list[int],
    run_id: str,
    modes: list[str],
    n_targets: int,
) -> list[Finetune]:
    """The fine-tunes that apply to the trained scheme (with it, or with a variant of it)."""
    finetunes = []
    for key, ft_cfg in cfg.finetunes.items():
        train = ft_cfg.train_config(cfg.train)  # refuses bad values now, not after training
        where = f"finetunes.{key}.pe." if ft_cfg.pe else "pe."
        pe_cfg = ft_cfg.pe or cfg.pe
        scheme = _built(pe_cfg, cfg, where)
        if trained.name not in (scheme.name, scheme.variant_of):
            log.info("finetunes.%s (%s) does not apply to %s", key, scheme.name, trained.name)
            continue
        for length in lengths:
            scheme.check_length(length)
        # A fine-tuned model is evaluated as it was fine-tuned: no eval-time variants.
        none = [("none", "", None, "")]
        tasks = eval_tasks(none, lengths, cfg.eval, cfg.train.seq_len, n_targets, modes)
        tasks = with_probes(tasks, cfg)
        ft_hash = config_hash(cfg.resolved["finetunes"][key])
        ft_id, source = f"{run_id}:{key}-{ft_hash}", scheme_key(pe_cfg, scheme.dims)
        finetunes.append(Finetune(key, ft_hash, train, scheme, tasks, ft_id, source))
    return finetunes
