"""The console script end to end (slow: each test starts ``pe-bench``): the smoke experiment,
sweeps, paper minis and one-line errors; and the same refusals in process (fast)."""

from __future__ import annotations

import re
import subprocess
import sys

import pandas as pd
import pytest
import torch

from pe_bench import cli
from pe_bench.errors import UserError
from pe_bench.results import load_records

from .helpers import CLASSIC, TINY, assert_regenerates, pe_bench


@pytest.mark.slow
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


@pytest.mark.slow
def test_smoke_prints_and_writes_the_table(smoke):
    proc, folder = smoke
    assert "bpb by eval length" in proc.stdout and "ppl by eval length" in proc.stdout
    log = proc.stderr + proc.stdout
    assert "sweep: job 1 of 7" in log and "sweep: 7/7 jobs done" in log
    for label in ("rope+ntk", "alibi", "xl"):
        assert label in proc.stdout
    assert (folder / "tables" / "bpb.csv").exists()
    assert (folder / "pe=rope" / "positions.jsonl").exists()
    assert (folder / "pe=rope" / "curve.jsonl").exists()


@pytest.mark.slow
def test_sweep_over_schemes_and_seeds(tmp_path):
    proc = pe_bench("-m", "pe=rope,alibi", "train.seed=0,1", "name=sweep", *TINY, out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = load_records(tmp_path / "sweep")
    assert "n = 2 seeds per cell" in proc.stdout  # the end-of-run tables carry the CIs
    stats = pd.read_csv(tmp_path / "sweep" / "tables" / "ppl.csv")
    assert set(stats["n"]) == {2}
    assert (stats["ci_low"] < stats["mean"]).all() and (stats["mean"] < stats["ci_high"]).all()
    assert sorted(df.groupby(["scheme", "seed"]).size().index.tolist()) == [
        ("alibi", 0),
        ("alibi", 1),
        ("rope", 0),
        ("rope", 1),
    ]


# Bad input, refused before any training with one line naming the value and what is allowed.
BAD_INPUT = [
    (["pe=pi"], "pe=pi is an eval-time variant of rope"),
    (["pe=learned", "pe.max_positions=32"], "scheme 'learned' cannot serve length 64"),
    (["data=text", "data.path=/no/such/folder"], "data.path='/no/such/folder' does not exist"),
    (["eval.tokens=99999999"], "evaluation needs 99,999,937 to score 99,999,936 targets"),
    (["train.steps=abc"], "train.steps='abc' must be an integer"),
    (["model.num_heads=3"], "model.num_heads (3) must divide model.d_model (32)"),
    (["eval.lengths=[0,16]"], "eval length 0 must be >= 1"),
    (["eval.factors=[0]"], "eval factor 0 must be > 0"),
    (["model.d_model=36", "model.num_heads=4"], "rope needs an even head_dim, got 9"),
    (
        ["eval.modes=[sliding]", "eval.stride=100"],
        "eval.stride=100 is longer than the eval window 16",
    ),
    (["eval.modes=[overlap]"], "unknown eval mode 'overlap'; allowed: nonoverlap, sliding"),
    (["pe=t5", "+pe.buckets=8"], "scheme 't5' has no option buckets; allowed: num_buckets"),
    (["+pe.plugin=no_such_pkg.my_pe"], "pe.plugin='no_such_pkg.my_pe' does not import"),
    (["+train.stesp=3"], "unknown key train.stesp; allowed:"),
    (["model.attention=flex"], "model.attention=flex: FlexAttention has no backward on CPU"),
    pytest.param(
        ["train.device=cuda"],
        "train.device='cuda' but no CUDA device is available",
        marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here"),
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT)
def test_bad_input_is_refused_before_training(tmp_path, tiny_config, args, message):
    with pytest.raises(UserError, match=re.escape(message)):
        cli.run(tiny_config(*args), tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written, nothing trained


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pe=ropee"], "Could not find 'pe/ropee'"),  # Hydra's own error
        (["pe=pi"], "pe=pi is an eval-time variant of rope"),
        (["data=text", "data.path=/no/such/folder"], "data.path='/no/such/folder' does not exist"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, args, message):
    proc = pe_bench(*TINY, *args, out=tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_eval_tokens_rounded_to_longest_length(tmp_path):
    proc = pe_bench(*TINY, "eval.tokens=300", "pe=nope", out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert set(load_records(tmp_path)["tokens"]) == {256}


@pytest.mark.slow
def test_bad_data_files_are_one_clear_line(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    proc = pe_bench(*TINY, "data=text", f"data.path={empty}", out=tmp_path)
    assert proc.returncode == 2 and "every file is empty" in proc.stderr
    folder = tmp_path / "docs"
    folder.mkdir()
    proc = pe_bench(*TINY, "data=text", f"data.path={folder}", out=tmp_path)
    assert proc.returncode == 2 and "has no files matching data.glob='**/*.txt'" in proc.stderr


@pytest.mark.slow
def test_report_on_a_folder_without_records(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", "from pe_bench.report import main; main()", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "no records under" in proc.stderr and "Traceback" not in proc.stderr


# The paper experiments' CPU twins, shrunk to a toy model and a few steps: the same eval
# lengths, protocol, fine-tunes and comparison as the committed runs.
SHRUNK = [
    "model=smoke",
    "train.steps=3",
    "train.batch_size=4",
    "train.warmup_steps=1",
    "train.log_every=1",
    "train.val_batches=1",
]
MINIS = {
    "alibi_paper_mini": (
        ["eval.tokens=1878"],
        "Press et al. (2022), Table 2",
        "14.7x (7512 / 939)",
        {"sinusoidal", "rope", "t5", "alibi"},
    ),
    "pi_paper_mini": (
        [
            "finetunes.ft.steps=2",
            "finetunes.pi.steps=2",
            "finetunes.ft.warmup_steps=1",
            "finetunes.pi.warmup_steps=1",
            "eval.tokens=512",
        ],
        "Chen et al. (2023), Table 1",
        "4.0x (8192 / 256)",
        {"rope", "rope+pi", "rope+ntk", "rope:ft", "rope:pi"},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MINIS))
def test_paper_mini_end_to_end_shrunk(tmp_path, name):
    from pe_bench.aggregate import label

    overrides, cite, column, labels = MINIS[name]
    proc = pe_bench(f"experiment={name}", *SHRUNK, *overrides, out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / name
    assert set(label(load_records(folder))) == labels
    assert f"Comparison with {cite}:" in proc.stdout
    assert "Rank order past the training length" in proc.stdout
    text = (folder / "report.md").read_text()
    assert f"## Comparison with {cite}" in text and column in text
    assert f"--compare published/{name.removesuffix('_mini')}" in text
    compared = pd.read_csv(folder / "tables" / "compare.csv")
    assert set(compared["label"]) == labels - {"rope+ntk"}  # NTK is not in the paper
    assert_regenerates(folder, tmp_path / "regenerated")
