"""Shared fixtures: tiny dimensions, seeded randomness, model builders, the smoke experiment."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pe_bench.model import GPT, ModelConfig, build_model
from pe_bench.positions import ModelDims

# Every trainable scheme, and the eval-time variants with the scheme they apply to.
CLASSIC = ["nope", "sinusoidal", "learned", "t5", "xl", "rope", "alibi"]
TRAINABLE = [
    *CLASSIC,
    "shaw",
    "kerple_log",
    "kerple_power",
    "fire",
    "sandwich",
    "xpos",
    "cope",
    "randomized_rope",
    "randomized_learned",
]
VARIANTS = ["pi", "ntk", "dynamic_ntk", "yarn", "logn"]
RELATIVE = [
    "t5",
    "xl",
    "rope",
    "alibi",
    "pi",
    "ntk",
    "shaw",
    "kerple_log",
    "kerple_power",
    "sandwich",
    "xpos",
    "yarn",
]
NOT_RELATIVE = [
    "nope",
    "sinusoidal",
    "learned",
    "fire",
    "cope",
    "randomized_rope",
    "randomized_learned",
    "dynamic_ntk",
    "logn",
]


@pytest.fixture(autouse=True)
def seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def dims() -> ModelDims:
    return ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=2, train_len=16)


def tiny_model(scheme: str, train_len: int = 16, **options) -> GPT:
    """A tiny model whose every parameter (the scheme's too) is random, so no term is zero."""
    cfg = ModelConfig(d_model=32, num_layers=2, num_heads=4, mlp_ratio=2)
    model = build_model(cfg, {"name": scheme, **options}, train_len, seed=0)
    with torch.no_grad():
        for p in model.pe.parameters():
            p.normal_(0, 0.5)
    return model.eval()


def with_variant(scheme: str, train_len: int = 16) -> GPT:
    """A rope model whose scheme is replaced by an eval-time variant (as evaluation does)."""
    model = tiny_model("rope", train_len)
    variant = tiny_model(scheme, train_len).pe
    model.pe = variant
    return model


# A run small enough for a test: smoke model, 3 steps, 3 eval lengths.
TINY = [
    "model=smoke",
    "train.seq_len=16",
    "train.steps=3",
    "train.batch_size=4",
    "train.warmup_steps=1",
    "train.log_every=1",
    "train.val_batches=1",
    "eval.factors=[1,2,4]",
    "eval.tokens=256",
]


def pe_bench(
    *args: str, out: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The ``pe-bench`` console entry point in a subprocess, writing under ``out``."""
    return subprocess.run(
        [sys.executable, "-m", "pe_bench.cli", *args, f"out_root={out}"],
        capture_output=True,
        text=True,
        env={**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})},
        timeout=600,
    )


@pytest.fixture(scope="session")
def smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """``pe-bench experiment=smoke`` once per session: (process, its output folder)."""
    out = tmp_path_factory.mktemp("smoke")
    return pe_bench("experiment=smoke", out=out), out / "smoke"


def record(scheme: str, seed: int, eval_len: int | None, nll: float, **fields) -> dict:
    """A hand-made record with every field a real one has; ``fields`` override."""
    return {
        "run_id": f"{scheme}-{seed}",
        "scheme": scheme,
        "variant": "none",
        "seed": seed,
        "train_len": 16,
        "eval_len": eval_len,
        "mode": "nonoverlap",
        "stride": eval_len,
        "nll": nll,
        "ppl": math.exp(nll),
        "bpb": nll / math.log(2),
        "tokens": 256,
        "params": 1000,
        "pe_params": 0,
        "d_model": 32,
        "num_layers": 2,
        "train_steps": 3,
        "train_tokens": 192,
        "train_time_s": 1.0,
        "final_val_loss": 2.0,
        "corpus": "stdlib",
        "corpus_sha": "c17d74",
        "config_hash": "0123456789ab",
        "git_sha": "8dde27a",
        "torch": "2.13.0",
        "device": "cpu",
        "hardware": "cpu (x86_64, 2 threads)",
        "date": "2026-11-23T14:00:00+00:00",
        **fields,
    }


def diverged(scheme: str, seed: int, step: int, lengths: tuple[int, ...] = (16, 32)) -> list[dict]:
    """The records of a run whose training diverged, as ``pe-bench`` writes them: one per eval
    length, ``status: diverged``, the step, and null numbers."""
    nothing = {"nll": None, "ppl": None, "bpb": None}
    return [
        {**record(scheme, seed, n, 0.0, status="diverged", diverged_step=step), **nothing}
        for n in lengths
    ]
