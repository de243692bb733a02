"""The ``pe-bench`` console script end to end (slow: each test starts it): the smoke experiment,
sweeps, paper minis, caveats in records, and errors met while running (tests/cli/
test_command_line.py holds the refusals of bad input)."""

from __future__ import annotations

import pandas as pd
import pytest

from pe_bench.cli import bench
from pe_bench.records import load_records
from tests.helpers import CLASSIC, TINY, assert_regenerates, pe_bench


@pytest.mark.slow
def test_smoke_experiment_runs_every_scheme(smoke):
    proc, folder = smoke
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = load_records(folder)
    df = records[records["mode"] == "nonoverlap"]  # perplexity; then the context-use probes
    assert set(df["scheme"]) == set(CLASSIC)
    assert set(df["eval_len"]) == {16, 32, 64}
    rope = df[df["scheme"] == "rope"]
    assert set(rope["variant"]) == {"none", "pi", "ntk"}
    assert len(df) == (len(CLASSIC) + 2) * 3  # one record per (run, variant, length, mode)
    assert df["tokens"].nunique() == 1  # every length scores the same tokens
    assert {"nll", "ppl", "bpb", "corpus_sha", "config_hash", "git_sha", "peak_mem_mb"} <= set(df)
    probes = records[records["mode"] != "nonoverlap"].groupby(["scheme", "variant"])["mode"]
    assert len(probes) == len(CLASSIC) + 2  # every label ...
    assert all(set(modes) == {"context_gain", "retrieval", "attention"} for _, modes in probes)
    assert "## Context use" in (folder / "report.md").read_text()  # ... and in the report


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


@pytest.mark.slow
def test_an_error_in_a_run_is_printed_once(tmp_path):
    """Issue 29, item 10: a single run's one-line error went to stderr and, as a log line, to
    stdout too; now to stderr only, and a refused run leaves no job folder (issue 37)."""
    text = tmp_path / "small.txt"
    text.write_text("a few words, too few for 256 test tokens\n" * 3)
    proc = pe_bench(*TINY, "data=text", f"data.path={text}", out=tmp_path / "out")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("pe-bench: error: ")
    assert "error" not in proc.stdout.lower(), proc.stdout
    assert not list((tmp_path / "out").rglob("cli.log"))  # run/store.remove_refused


FULL_DISK = """
import os

if os.environ.get("FULL_DISK_AT"):  # tests/cli/test_bench.py: this file fills the disk
    from omegaconf import OmegaConf

    _save = OmegaConf.save

    def _full(config, f, resolve=False):
        if str(f).endswith(os.environ["FULL_DISK_AT"]):
            raise OSError(28, "No space left on device")  # as write() raises it: no file
        return _save(config, f, resolve)

    OmegaConf.save = _full
"""


@pytest.mark.slow
def test_a_sweep_on_a_full_disk_is_one_line_naming_where(tmp_path):
    """Hydra's own write of multirun.yaml failing (a full disk) was a traceback; it is one
    line naming the sweep's folder, exit 2."""
    (tmp_path / "sitecustomize.py").write_text(FULL_DISK)
    env = {"PYTHONPATH": str(tmp_path), "FULL_DISK_AT": "multirun.yaml"}
    proc = pe_bench("-m", "pe=rope,alibi", *TINY, out=tmp_path / "out", env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        f"pe-bench: error: cannot write or read in '{tmp_path / 'out' / 'default'}': No space "
        "left on device"
    ]


@pytest.mark.slow
def test_sweeps_help_and_cfg_still_run(tmp_path):
    assert "Docs: README.md" in pe_bench("--help", out=tmp_path).stdout  # conf's usage page
    proc = pe_bench("--cfg", "job", "pe=alibi", out=tmp_path / "not_made")
    assert proc.returncode == 0 and "name: alibi" in proc.stdout
    assert not (tmp_path / "not_made").exists()


@pytest.mark.slow
def test_eval_tokens_rounded_to_longest_length(tmp_path):
    proc = pe_bench(*TINY, "eval.tokens=300", "pe=nope", out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert set(load_records(tmp_path)["tokens"]) == {256}


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
    from pe_bench.report.aggregate import label

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


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scheme", "caveat"),
    [
        ("shaw", "key term a^K only"),
        ("xpos", "without the blockwise causal attention"),
        ("t5", "max_distance 32, lowered from T5's 128"),
    ],
)
def test_records_carry_the_schemes_caveat(tmp_path, tiny_config, scheme, caveat):
    rows = bench.run(tiny_config(f"pe={scheme}"), tmp_path)
    assert all(caveat in r["caveat"] for r in rows)


@pytest.mark.slow
def test_a_variants_records_carry_its_caveat(tmp_path, tiny_config):
    """LongRoPE with NTK's long factors (its default) says so on its own records, perplexity
    and probes alike, and only there: rope and its other variants carry none."""
    config = tiny_config(
        "pe=rope", "+pe@eval.variants.longrope=longrope", "eval.probes=[context_gain]"
    )
    rows = bench.run(config, tmp_path)
    longrope = [r for r in rows if r["variant"] == "longrope"]
    assert {r["mode"] for r in longrope} == {"nonoverlap", "context_gain"}
    assert all("NTK-aware's s^(2k/(h_d-2)), not ones found by" in r["caveat"] for r in longrope)
    assert all("caveat" not in r for r in rows if r["variant"] != "longrope")


def test_records_of_a_scheme_run_as_its_paper_did_carry_no_caveat(tmp_path, tiny_config):
    rows = bench.run(tiny_config("pe=alibi"), tmp_path)
    assert all("caveat" not in r for r in rows)


@pytest.mark.slow
def test_a_sweep_over_a_scheme_option_reports_one_row_per_value(tmp_path):
    """pe.base=10000,500 in one sweep: two rows, rope and rope(base=500), in one report (runs
    that differed only in an option could not share one)."""
    proc = pe_bench("-m", "pe=rope", "pe.base=10000,500", "name=bases", *TINY, out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ppl = pd.read_csv(tmp_path / "bases" / "tables" / "ppl.csv")
    trained = {label.split("+")[0] for label in ppl["label"]}
    assert trained == {"rope", "rope(base=500)"}
    assert "rope(base=500)+pi" in set(ppl["label"])  # its variants keep the options
