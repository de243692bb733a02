"""The console script end to end: the smoke experiment, sweeps, and one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pe_bench.results import load_records

from .conftest import CLASSIC

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


def pe_bench(*args: str, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, "-m", "pe_bench.cli", *args, f"out_root={out}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    return pe_bench("experiment=smoke", out=out), out / "smoke"


def test_smoke_experiment_runs_every_scheme(smoke):
    proc, folder = smoke
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = load_records(folder)
    assert set(df["scheme"]) == set(CLASSIC)
    assert set(df["eval_len"]) == {16, 32, 64}
    rope = df[df["scheme"] == "rope"]
    assert set(rope["variant"]) == {"none", "pi", "ntk"}
    assert len(df) == (len(CLASSIC) + 2) * 3  # one record per (run, variant, length, mode)
    assert df["tokens"].nunique() == 1  # every length scores the same tokens
    assert {"nll", "ppl", "bpb", "corpus_sha", "config_hash", "git_sha", "peak_mem_mb"} <= set(df)


def test_smoke_prints_and_writes_the_table(smoke):
    proc, folder = smoke
    assert "bpb by eval length" in proc.stdout and "ppl by eval length" in proc.stdout
    for label in ("rope+ntk", "alibi", "xl"):
        assert label in proc.stdout
    assert (folder / "tables" / "bpb.csv").exists()
    assert (folder / "pe=rope" / "positions.jsonl").exists()
    assert (folder / "pe=rope" / "curve.jsonl").exists()


def test_sweep_over_schemes_and_seeds(tmp_path):
    proc = pe_bench("-m", "pe=rope,alibi", "train.seed=0,1", "name=sweep", *TINY, out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = load_records(tmp_path / "sweep")
    assert sorted(df.groupby(["scheme", "seed"]).size().index.tolist()) == [
        ("alibi", 0),
        ("alibi", 1),
        ("rope", 0),
        ("rope", 1),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pe=ropee"], "Could not find 'pe/ropee'"),
        (["pe=pi"], "pe=pi is an eval-time variant of rope"),
        (["pe=learned", "pe.max_positions=32"], "scheme 'learned' cannot serve length 64"),
        (["data=text", "data.path=/no/such/folder"], "data.path='/no/such/folder' does not exist"),
        (["eval.tokens=99999999"], "evaluation needs 99,999,937 to score 99,999,936 targets"),
        (["train.steps=abc"], "train.steps='abc' must be an integer"),
        (["model.num_heads=3"], "model.num_heads (3) must divide model.d_model (32)"),
        (["eval.lengths=[0,16]"], "eval length 0 must be >= 1"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, args, message):
    proc = pe_bench(*TINY, *args, out=tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_eval_tokens_rounded_to_longest_length(tmp_path):
    proc = pe_bench(*TINY, "eval.tokens=300", "pe=nope", out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert set(load_records(tmp_path)["tokens"]) == {256}
