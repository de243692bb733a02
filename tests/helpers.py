"""Helpers shared by the tests: scheme lists, tiny models, hand-made records, the CLI."""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig
from PIL import Image

from pe_bench.cli.report import main as report_main
from pe_bench.files import write_jsonl
from pe_bench.model.gpt import GPT, ModelConfig, build_model
from pe_bench.records import POSITIONS
from pe_bench.report import aggregate
from pe_bench.stats import log_buckets

# Every trainable scheme, and the eval-time variants with the scheme they apply to.
ROOT = Path(__file__).parents[1]  # the repository
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
    "p_rope",
    "hope",
    "resonance_rope",
    "rope_nope_hybrid",
    "irope",
    "dape_kerple",
    "dape_alibi",
    "ssmax_nope",
    "ssmax_rope",
    "ssmax_alibi",
    "fox",
    "stickbreaking",
    "pope",
    "fope",
    "bipe",
    "bipe_alibi",
    "cable",
    "path",
    "nope_temp",
]
VARIANTS = [
    "pi",
    "ntk",
    "dynamic_ntk",
    "yarn",
    "logn",
    "ntk_by_parts",
    "llama3",
    "longrope",
    "rerope",
    "leaky_rerope",
    "self_extend",
    "dca",
    "streaming_llm",
    "lm_infinite",
    "string",
]
# The fast lane's sample of the per-scheme tests (``pytest -m "not slow"``): one scheme of each
# attention path (fused causal, key term, distance table, float mask, explicit, hidden keys)
# and two variants; the full suite runs every scheme.
FAST_LANE = ["nope", "rope", "alibi", "fox", "fire", "stickbreaking", "irope", "yarn", "rerope"]


def fast_lane(names: list[str], sample: list[str] = FAST_LANE) -> list:
    """``names`` as pytest params, those not in ``sample`` marked slow."""
    return [pytest.param(n, marks=[] if n in sample else [pytest.mark.slow]) for n in names]


# Schemes that rewrite the logits or their normalisation (modify_logits, attention_weights) or
# scale their bias (scales_bias): they leave the fused attention paths on purpose.
LOGIT_HOOKS = [
    "dape_kerple",
    "dape_alibi",
    "ssmax_alibi",
    "stickbreaking",
    "rerope",
    "leaky_rerope",
    "self_extend",
    "dca",
    "streaming_llm",
    "lm_infinite",
    "string",
]
# Variants that change RoPE's logits past a window shorter than the training length.
WINDOWED = [
    "rerope",
    "leaky_rerope",
    "self_extend",
    "dca",
    "streaming_llm",
    "lm_infinite",
    "string",
]
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
    "p_rope",
    "hope",
    "resonance_rope",
    "rope_nope_hybrid",
    "ntk_by_parts",
    "llama3",
    "longrope",
    "dape_kerple",
    "dape_alibi",
    "pope",
    "string",
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
    "ssmax_nope",
    "ssmax_rope",
    "ssmax_alibi",
    "fox",
    "stickbreaking",
    "rerope",
    "leaky_rerope",
    "self_extend",
    "irope",
    "dca",
    "streaming_llm",
    "lm_infinite",
    "fope",
    "bipe",
    "bipe_alibi",
    "cable",
    "path",
    "nope_temp",
]


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


# A run small enough for a test: smoke model, 3 steps, 3 eval lengths, the perplexity records
# only (the tests count them; tests/run/test_probes.py switches the context-use probes back on).
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
    "eval.probes=[]",
]


def compose(*overrides: str, hydra: bool = False) -> DictConfig:
    """The real config (``conf/``) composed with ``overrides``, as ``pe-bench`` would run it;
    ``hydra=True`` keeps the hydra node (an experiment's sweep lives in hydra.sweeper.params)."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(version_base="1.3", config_module="pe_bench.conf"):
            return hydra_compose(
                config_name="config", overrides=list(overrides), return_hydra_config=hydra
            )
    finally:
        GlobalHydra.instance().clear()


def overridden(*args: str) -> list[str]:
    """``args`` where a key given again (``*TINY, "eval.factors=[1,2]"``) replaces its earlier
    value in place: pe-bench refuses a key given twice, and tests add to ``TINY``."""
    merged: dict[str, str] = {}
    for arg in args:
        key = arg.split("=", 1)[0].lstrip("+~") if "=" in arg and arg[0] != "-" else arg
        merged[key] = arg
    return list(merged.values())


def pe_bench(
    *args: str, out: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The ``pe-bench`` console entry point in a subprocess, writing under ``out``; ``args``
    given again replace earlier ones (``overridden``)."""
    return subprocess.run(
        [sys.executable, "-m", "pe_bench.cli", *overridden(*args, f"out_root={out}")],
        capture_output=True,
        text=True,
        env={**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})},
        timeout=600,
    )


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


def write_runs(folder: Path, rows: list[dict]) -> None:
    """Hand-made records, one job folder per run id, as pe-bench lays them out."""
    for run_id in dict.fromkeys(r["run_id"] for r in rows):
        write_jsonl(folder / run_id / "records.jsonl", [r for r in rows if r["run_id"] == run_id])


def diverged(scheme: str, seed: int, step: int, lengths: tuple[int, ...] = (16, 32)) -> list[dict]:
    """The records of a run whose training diverged, as ``pe-bench`` writes them: one per eval
    length, ``status: diverged``, the step, and null numbers."""
    nothing = {"nll": None, "ppl": None, "bpb": None}
    return [
        {**record(scheme, seed, n, 0.0, status="diverged", diverged_step=step), **nothing}
        for n in lengths
    ]


def three_seeds() -> list[dict]:
    """alibi: seeds 0-2, NLL 1.0/1.2/1.4 at L=16 and 1.3/1.5/1.7 at L=32; rope: one seed."""
    rows = []
    for seed, (short, long) in enumerate([(1.0, 1.3), (1.2, 1.5), (1.4, 1.7)]):
        rows += [record("alibi", seed, 16, short), record("alibi", seed, 32, long)]
    rows += [record("rope", 0, 16, 0.9), record("rope", 0, 32, 2.0)]
    return rows


# alibi is best at both lengths; at 16 rope is within seed noise of it (paired differences
# +0.05, +0.05, -0.02: not separated), at 32 it is 0.7 worse in every seed; nope is worse
# everywhere. Every record carries an evaluation time and peak memory.
SEPARABLE = {
    "alibi": {16: (1.00, 1.10, 1.20), 32: (1.30, 1.40, 1.50)},
    "rope": {16: (1.05, 1.15, 1.18), 32: (2.00, 2.10, 2.20)},
    "nope": {16: (3.00, 3.10, 3.25), 32: (3.30, 3.40, 3.55)},
}


def separable_seeds() -> list[dict]:
    """``SEPARABLE``'s records (3 seeds, 2 lengths), the first carrying a caveat."""
    rows = []
    for scheme, by_length in SEPARABLE.items():
        for length, values in by_length.items():
            for seed, nll in enumerate(values):
                rows.append(record(scheme, seed, length, nll, time_s=0.5, peak_mem_mb=600.0))
    rows[0]["caveat"] = "a caveat with an_underscore & 50% of a #"
    return rows


def prepared(rows: list[dict], **kwargs) -> pd.DataFrame:
    return aggregate.prepare(pd.DataFrame(rows), **kwargs)


GENERATED = ("report.md", "tables", "figures")  # what pe-bench-report writes


def report_command(folder: Path) -> list[str]:
    """The ``pe-bench-report`` arguments that report.md says made it."""
    lines = (folder / "report.md").read_text().splitlines()
    (line,) = [x for x in lines if x.startswith("pe-bench-report ")]
    return shlex.split(line.split("  #")[0])[1:]


def assert_regenerates(folder: Path, tmp_path: Path) -> None:
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.pt", "wandb"))
    shutil.rmtree(copy / "tables")
    shutil.rmtree(copy / "figures")
    (copy / "report.md").unlink()
    args = report_command(folder)
    report_main([str(copy / args[0]), *args[1:]])
    committed = sorted(p.relative_to(folder) for name in GENERATED for p in _files(folder / name))
    regenerated = sorted(p.relative_to(copy) for name in GENERATED for p in _files(copy / name))
    assert regenerated == committed
    for rel in committed:
        old, new = folder / rel, copy / rel
        if rel.suffix == ".png":
            with Image.open(old) as a, Image.open(new) as b:
                assert a.size == b.size, rel
        elif rel.suffix == ".pdf":
            assert new.read_bytes().startswith(b"%PDF"), rel
        else:
            assert new.read_text() == old.read_text(), f"{rel} differs from the committed file"


def _files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def read_rows(path: Path) -> list[dict]:
    """The JSON lines of ``path`` as they are (no line skipped, unlike ``files.read_jsonl``)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def truncate_runs(folder: Path) -> list[dict]:
    """Two seeds of rope and alibi with nonoverlap records and truncate ones at 16 and 32,
    written under ``folder`` with the truncate mode's position rows: each run's 2 documents'
    loss by bucket of positions (``stats.log_buckets``), ``window_loss`` = 2 + 0.5 (alibi)
    + 0.1 x seed + 0.2 x document - 0.01 x bucket. Returns the position rows."""
    rows, positions = [], []
    for scheme in ("rope", "alibi"):
        for seed in (0, 1):
            for length in (16, 32):
                rows.append(record(scheme, seed, length, 1.0 + seed))
                rows.append(record(scheme, seed, length, 2.0, mode="truncate", stride=length))
                buckets = len(log_buckets(length)) - 1
                base = 2 + 0.5 * (scheme == "alibi") + 0.1 * seed
                windows = [[base + 0.2 * d - 0.01 * b for b in range(buckets)] for d in (0, 1)]
                loss = [2.0] * (length - 1) + [None]
                key = {"run_id": f"{scheme}-{seed}", "scheme": scheme, "variant": "none"}
                at = {"eval_len": length, "mode": "truncate"}
                positions.append({**key, **at, "loss": loss, "window_loss": windows})
    write_runs(folder, rows)
    for run_id in dict.fromkeys(p["run_id"] for p in positions):
        write_jsonl(folder / run_id / POSITIONS, [p for p in positions if p["run_id"] == run_id])
    return positions
