"""The OmegaConf resolvers that pe-bench's configs (``conf/``) use, registered in one place.

- ``${trained_option:key,default}``: the trained scheme's option (variants and fine-tunes).
- ``${longest_eval_len:}``: the longest length the run evaluates.
- ``${run_dir:...}``: a job folder's name (``hydra.run.dir``, ``hydra.sweep.subdir``).

``register_resolvers`` registers them; the package's ``__init__`` calls it, once, because
every process that resolves a pe-bench config imports the package first but need not enter
through a pe-bench function: Hydra's launchers resolve ``hydra.sweep.subdir`` in their worker
processes (joblib, submitit on SLURM) after unpickling the job, before any pe-bench code runs;
tests and notebooks compose configs with Hydra's ``compose``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from omegaconf import DictConfig, OmegaConf


def trained_option(key: str, default: Any, *, _parent_: DictConfig, _root_: DictConfig) -> Any:
    """``${trained_option:base,10000.0}``: the trained scheme's ``pe.<key>`` (else ``default``),
    the value an eval-time variant or a fine-tune's scheme takes by default. A variant mounted
    as ``pe`` itself (``pe=pi``, which plan refuses) gets ``default`` instead of reading itself."""
    if _parent_._get_full_key(None) == "pe":
        return default
    return OmegaConf.select(_root_, f"pe.{key}", default=default)


def longest_eval_len(*, _root_: DictConfig) -> int | None:
    """``${longest_eval_len:}``: the longest length the run evaluates, ``eval.lengths`` or
    ``eval.factors`` x the training length as ``EvalConfig.eval_lengths`` computes them (for a
    variant that sets itself up for it, as leaky ReRoPE's k). The training length is
    ``train.seq_len``, or a pretrained model's ``model.train_len``; None where it is not in
    the config (a pretrained model's read from its own config) or outside a run's config."""
    lengths = OmegaConf.select(_root_, "eval.lengths", default=None)
    if not lengths:
        factors = OmegaConf.select(_root_, "eval.factors", default=None)
        pretrained = OmegaConf.select(_root_, "model.source", default=None) == "hf"
        where = "model.train_len" if pretrained else "train.seq_len"
        train_len = OmegaConf.select(_root_, where, default=None)
        if not factors or train_len is None:
            return None
        lengths = [round(f * train_len) for f in factors]
    return int(max(lengths))


def run_dir_name(overrides: str) -> str:
    """A job folder named after its overrides (``${run_dir:...}`` in conf/config.yaml):
    ``default`` without any, no ``/`` (a value like ``data.path=/a/b`` would nest folders), and
    a hash suffix instead of a name over 120 bytes (filesystems refuse names over 255)."""
    name = overrides.replace("/", "_") or "default"
    if len(name.encode()) > 120:
        digest = hashlib.sha256(name.encode()).hexdigest()[:10]
        name = name.encode()[:100].decode(errors="ignore") + "-" + digest
    return name


RESOLVERS = {
    "trained_option": trained_option,
    "longest_eval_len": longest_eval_len,
    "run_dir": run_dir_name,
}


def register_resolvers() -> None:
    """Register every resolver of ``RESOLVERS`` with OmegaConf (again: replaced, not doubled)."""
    for name, resolver in RESOLVERS.items():
        OmegaConf.register_new_resolver(name, resolver, replace=True)
