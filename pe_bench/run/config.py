"""The composed Hydra config of one run, parsed once into typed configs (``RunConfig.parse``).

Everything downstream (the plan, the store, training, evaluation, tracking) takes these, never
the Hydra node: a value is checked where it is parsed, once. ``model`` is a ``ModelConfig`` for
a model pe-bench trains and a ``PretrainedConfig`` for a pretrained Hugging Face model
(``model=hf``); both go through the same plan -> store -> evaluate steps (``pe_bench.run.job``).
"""

from __future__ import annotations

import difflib
import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pe_bench.config import Range, check_fields, config_hash, from_node, to_dict
from pe_bench.data.config import DataConfig
from pe_bench.data.corpus import identity_keys
from pe_bench.errors import UserError
from pe_bench.model.gpt import ModelConfig
from pe_bench.run.evaluate import EvalConfig
from pe_bench.run.tracking import WandbConfig, parse_logger
from pe_bench.run.train import FinetuneConfig, TrainConfig

# The keys a composed config may have at its top: conf/config.yaml's and its groups'.
# Anything else is a typo that Hydra added as a new key (``+modle=smoke``) and nothing reads.
TOP_KEYS = (
    *("pe", "model", "data", "train", "eval", "logger"),
    *("name", "out_root", "report", "force", "finetunes", "compare"),
)
# conf/ ships as the package pe_bench.conf (pyproject maps it): an absolute path to it works
# from the console script, ``python -m pe_bench.cli``, editable and regular installs alike.
CONF_DIR = str(importlib.resources.files("pe_bench.conf"))
PRETRAINED = "hf"  # model.source of a pretrained model (conf/model/hf.yaml)
ROPE_IMPLS = ("pe_bench", "hf")  # how a pretrained model's eval-time variants are applied


@dataclass
class PasskeyConfig:
    """``model.passkey`` in ``conf/model/hf.yaml`` (``pe_bench.pretrained.passkey``)."""

    factors: list[Annotated[float, Range(gt=0)]] = field(default_factory=lambda: [0.5, 1, 2, 4])
    lengths: list[Annotated[int, Range(ge=1)]] | None = None  # tokens; default: factors x L
    trials: Annotated[int, Range(ge=1)] = 10  # prompts per length (the CI is over them)
    depth_bins: Annotated[int, Range(ge=1)] = 5  # rows of the depth x length figure
    max_new_tokens: Annotated[int, Range(ge=1)] = 10  # as the originals
    seed: int = 0
    variants: list[str] | None = None  # eval.variants keys tested besides the model; null: all

    def __post_init__(self) -> None:
        check_fields(self, "model.passkey")

    def prompt_lengths(self, train_len: int) -> list[int]:
        """Sorted distinct target lengths in tokens."""
        return sorted(set(self.lengths or [round(f * train_len) for f in self.factors]))


@dataclass
class RulerConfig:
    """``model.ruler`` in ``conf/model/hf.yaml`` (``pe_bench.pretrained.ruler``)."""

    tasks: list[str] = field(default_factory=lambda: ["niah_single_1", "niah_multikey_1", "vt"])
    factors: list[Annotated[float, Range(gt=0)]] = field(default_factory=lambda: [0.5, 1, 2])
    lengths: list[Annotated[int, Range(ge=1)]] | None = None  # tokens; default: factors x L
    trials: Annotated[int, Range(ge=1)] = 5  # prompts per (task, length): the CI is over them
    depth_bins: Annotated[int, Range(ge=1)] = 5  # rows of the depth x length figure
    # greedy decoding budget; null: each task's own (RULER's: niah 128, vt 30, cwe 120, fwe 50)
    max_new_tokens: Annotated[int, Range(ge=1)] | None = None
    seed: int = 0
    variants: list[str] | None = None  # eval.variants keys tested besides the model; null: all

    def __post_init__(self) -> None:
        check_fields(self, "model.ruler")

    def prompt_lengths(self, train_len: int) -> list[int]:
        """Sorted distinct target lengths in tokens (prompt and generated tokens, as RULER's
        ``max_seq_length``)."""
        return sorted(set(self.lengths or [round(f * train_len) for f in self.factors]))


@dataclass
class PretrainedConfig:
    """``conf/model/hf.yaml``: which pretrained model, and how it is evaluated."""

    source: str = PRETRAINED
    # hub id (needs a network or the HF cache), local folder, .gguf file, or
    # pkg:<distribution>/<file> (a GGUF file shipped in an installed package)
    name: str = ""
    gguf_file: str | None = None  # a GGUF file inside the folder ``name``
    revision: str | None = None  # hub branch, tag or commit
    train_len: Annotated[int, Range(ge=2)] | None = None  # null: from the model's config
    rope_impl: str = "pe_bench"  # pe_bench | hf: how variants with an HF rope_type are applied
    test_slices: Annotated[int, Range(ge=1)] = 4  # disjoint test slices: the CIs are over them
    passkey: dict[str, Any] | None = None  # a PasskeyConfig (``passkey_config``); null: none
    ruler: dict[str, Any] | None = None  # a RulerConfig (``ruler_config``); null: none

    def __post_init__(self) -> None:
        if self.name in ("", "???"):
            raise UserError(
                "model=hf needs model.name=<hub id, local folder, .gguf file or "
                "pkg:<distribution>/<file>>"
            )

        if self.rope_impl not in ROPE_IMPLS:
            raise UserError(f"model.rope_impl={self.rope_impl!r}; allowed: {', '.join(ROPE_IMPLS)}")

    def check_path(self) -> None:
        """Refuse a ``name`` that can only be a local path (it starts with '/', '.' or '~',
        or has two '/': a hub id has at most one) where nothing is, before the hub is asked
        for it as a repo id."""
        name = self.name
        local = ":" not in name and (name.startswith(("/", ".", "~")) or name.count("/") > 1)
        if local and not Path(name).expanduser().exists():
            raise UserError(
                f"model.name={name!r}: no such file or folder; allowed: a local folder with "
                "config.json (e.g. one experiments/make_tiny_hf.py writes) or a hub id, e.g. "
                "EleutherAI/pythia-160m"
            )

    def passkey_config(self) -> PasskeyConfig | None:
        """``passkey`` checked and typed (None: no passkey test)."""
        return (
            None
            if self.passkey is None
            else from_node(PasskeyConfig, self.passkey, "model.passkey")
        )

    def ruler_config(self) -> RulerConfig | None:
        """``ruler`` checked and typed (None: no RULER tasks)."""
        return None if self.ruler is None else from_node(RulerConfig, self.ruler, "model.ruler")


@dataclass(frozen=True)
class RunConfig:
    """The composed config, parsed once: typed where pe-bench reads it, plain where a scheme or
    data source does."""

    model: ModelConfig | PretrainedConfig
    train: TrainConfig
    eval: EvalConfig
    pe: dict[str, Any]
    data: DataConfig
    finetunes: dict[str, FinetuneConfig]
    resolved: dict[str, Any]  # the whole config as plain values
    yaml: str  # what config.yaml in the job folder holds
    run_hash: str  # identifies the model and its data (``_run_hash``)
    name: str = "default"
    force: bool = False
    logger: WandbConfig | None = None  # None: no tracking

    @property
    def pretrained(self) -> bool:
        return isinstance(self.model, PretrainedConfig)

    @classmethod
    def parse(cls, cfg: DictConfig) -> RunConfig:
        if "hydra" in cfg:  # composed with return_hydra_config: the run's own config only
            cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        check_top_keys(cfg)
        resolved = resolved_dict(cfg)
        pretrained = OmegaConf.select(cfg, "model.source", default=None) == PRETRAINED
        model_type = PretrainedConfig if pretrained else ModelConfig
        return cls(
            model=from_node(model_type, resolved.get("model"), "model"),
            train=from_node(TrainConfig, resolved.get("train"), "train"),
            eval=from_node(EvalConfig, resolved.get("eval"), "eval"),
            pe=_scheme_config(resolved.get("pe")),
            data=DataConfig.parse(resolved.get("data")),
            finetunes=_finetunes(resolved.get("finetunes")),
            resolved=resolved,
            yaml=OmegaConf.to_yaml(cfg, resolve=True),
            run_hash=_pretrained_hash(resolved) if pretrained else _run_hash(cfg),
            name=str(resolved.get("name", "default")),
            force=bool(resolved.get("force", False)),
            logger=parse_logger(resolved.get("logger")),
        )


def resolved_dict(cfg: DictConfig) -> dict[str, Any]:
    """``cfg`` as plain values, its interpolations resolved; one that cannot be (``${oops}``,
    a resolver that fails) is refused in one line naming the key and what it holds."""
    try:
        return to_dict(cfg)
    except OmegaConfBaseException as err:
        key = str(getattr(err, "full_key", "") or "")
        raw = OmegaConf.to_container(cfg, resolve=False)
        for part in key.split(".") if key else []:
            raw = raw.get(part) if isinstance(raw, dict) else None
        given = f"{key}={raw}" if key else "the config"
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(
            f"{given} cannot be resolved ({reason}); allowed: a value, or ${{key}} naming a "
            "key the config has, e.g. ${train.seq_len}"
        ) from None


def check_top_keys(cfg: DictConfig) -> None:
    """Refuse a top-level key nothing reads (``+modle=smoke``: a misspelled group that Hydra
    adds as a plain value), naming the allowed keys and the closest one."""
    unknown = sorted(str(key) for key in cfg if key not in TOP_KEYS and key != "hydra")
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, TOP_KEYS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UserError(
            f"unknown key {key}{hint}; allowed: {', '.join(sorted(TOP_KEYS))}, experiment"
        )


def _scheme_config(pe: Any) -> dict[str, Any]:
    if not isinstance(pe, dict) or "name" not in pe:
        raise UserError("pe must be a scheme config with a name; pick one with pe=<name>")
    return pe


def _finetunes(finetunes: Any) -> dict[str, FinetuneConfig]:
    finetunes = finetunes or {}
    if not isinstance(finetunes, dict):
        raise UserError(
            f"finetunes={finetunes!r} must map keys to fine-tunes, e.g. +finetune@finetunes.pi=pi"
        )
    return {k: from_node(FinetuneConfig, v, f"finetunes.{k}") for k, v in finetunes.items()}


def _run_hash(cfg: DictConfig) -> str:
    """The trained model's identity: architecture, scheme, data and training; how attention is
    computed is left out (the numbers are the same either way). Each part enters as the text
    of its config node, ``str()``: its keys in config order, interpolations as written
    (``${train.seq_len}``, not the value), as every run id so far was made; the four parts by
    name, sorted (``config_hash`` of the text). A change here renames every stored run. The
    data's tokenizer keys enter only when they are not the byte tokenizer's."""
    arch = OmegaConf.masked_copy(cfg.model, [k for k in cfg.model if k != "attention"])
    data = OmegaConf.masked_copy(cfg.data, identity_keys(cfg.data))
    parts = {"model": arch, "pe": cfg.pe, "data": data, "train": cfg.train}
    return config_hash({name: str(node) for name, node in parts.items()})


def _pretrained_hash(resolved: dict[str, Any]) -> str:
    """A pretrained model's identity: the model config (its passkey and RULER settings aside,
    which have their own hash in its records) and the data."""
    model = {k: v for k, v in resolved["model"].items() if k not in ("passkey", "ruler")}
    if model.get("gguf_file") is None:  # added later: unset, it leaves earlier run ids as they were
        model.pop("gguf_file", None)
    return config_hash({"model": model, "data": resolved["data"]})
