"""The sweep callback's parts that need no running sweep: the job count behind the progress
line, and the report at the end (tests/test_cli.py runs whole sweeps, slow)."""

from __future__ import annotations

from pe_bench.results import write_jsonl
from pe_bench.sweep import sweep_size, write_report

from .helpers import TRAINABLE, compose, three_seeds


def test_sweep_size_counts_the_experiments_jobs():
    assert sweep_size(compose("experiment=zoo", hydra=True)) == len(TRAINABLE)
    assert sweep_size(compose("experiment=smoke", hydra=True)) == 7


def test_sweep_size_is_none_when_it_cannot_tell():
    assert sweep_size(compose()) is None  # no hydra node: no sweeper to read


def test_report_at_the_end_of_a_sweep(tmp_path):
    rows = three_seeds()
    for run_id in dict.fromkeys(r["run_id"] for r in rows):
        write_jsonl(tmp_path / run_id / "records.jsonl", [r for r in rows if r["run_id"] == run_id])
    write_report(tmp_path, compose())
    text = (tmp_path / "report.md").read_text()
    assert "| alibi" in text and "| rope" in text
    assert (tmp_path / "tables" / "ppl.csv").exists()


def test_a_sweep_without_records_logs_why_there_is_no_report(tmp_path, caplog):
    write_report(tmp_path, compose())
    assert "no report: no records under" in caplog.text
    assert not (tmp_path / "report.md").exists()
