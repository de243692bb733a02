"""The sweep callback's parts that need no running sweep: the job count behind the progress
line, and the report at the end (tests/cli/test_bench.py runs whole sweeps, slow)."""

from __future__ import annotations

import fcntl
import os
import re
import threading
import time
from pathlib import Path

import pytest
from omegaconf import DictConfig, open_dict

from pe_bench.files import write_jsonl
from pe_bench.report.inputs import commands
from pe_bench.run.sweep import (
    SweepCallback,
    log_command,
    plugin_pythonpath,
    sweep_size,
    with_pythonpath,
    write_report,
)
from tests.helpers import TINY, TRAINABLE, compose, pe_bench, record, three_seeds, write_runs


def test_sweep_size_counts_the_experiments_jobs():
    assert sweep_size(compose("experiment=zoo", hydra=True)) == len(TRAINABLE)
    assert sweep_size(compose("experiment=smoke", hydra=True)) == 7


def test_sweep_size_is_none_when_it_cannot_tell():
    assert sweep_size(compose()) is None  # no hydra node: no sweeper to read


def test_report_at_the_end_of_a_sweep(tmp_path):
    write_runs(tmp_path, three_seeds())
    assert write_report(tmp_path, compose())
    text = (tmp_path / "report.md").read_text()
    assert "| alibi" in text and "| rope" in text
    assert (tmp_path / "tables" / "ppl.csv").exists()


def test_a_sweep_without_records_logs_why_there_is_no_report(tmp_path, caplog):
    assert not write_report(tmp_path, compose())
    assert "no report: no records under" in caplog.text
    assert not (tmp_path / "report.md").exists()


@pytest.mark.slow
def test_a_sweep_over_a_setting_reports_each_value_as_its_own_row(tmp_path):
    """Jobs of one scheme and seed that differ in a swept key (train.lr) are rows named by it,
    never seeds of one row: their folder names say what sets them apart."""
    for lr, nll in (("0.1", 3.0), ("0.001", 1.0)):
        rows = [record("nope", 0, n, nll, run_id=f"nope-{lr}") for n in (16, 32)]
        write_jsonl(tmp_path / f"pe=nope,train.lr={lr}" / "records.jsonl", rows)
    assert write_report(tmp_path, compose())
    ppl = (tmp_path / "tables" / "ppl.csv").read_text()
    assert "nope [train.lr=0.1]" in ppl and "nope [train.lr=0.001]" in ppl


def test_every_sweep_into_a_folder_is_in_its_commands(tmp_path):
    """Seeds 1,2 added to a seed-0 suite: Hydra's multirun.yaml keeps the last sweep only, the
    report's commands keep both (once each, however often a sweep is rerun)."""
    write_runs(tmp_path, three_seeds())
    (tmp_path / "multirun.yaml").write_text("hydra: {overrides: {task: [train.seed=1,2]}}")
    for overrides in (["experiment=quick"], ["experiment=quick", "train.seed=1,2"]) * 2:
        log_command(tmp_path, overrides)
    assert commands(tmp_path) == [
        "pe-bench -m experiment=quick",
        "pe-bench -m experiment=quick train.seed=1,2",
    ]


def with_dirs(folder: Path) -> DictConfig:
    """The real config with its run and sweep folder set to ``folder``, as the callback sees it."""
    cfg = compose()
    with open_dict(cfg):
        cfg.hydra = {"run": {"dir": str(folder)}, "sweep": {"dir": str(folder)}}
    return cfg


def mixed_protocols(folder: Path) -> None:
    """Records that cannot share a report: two training lengths."""
    write_runs(folder, [*three_seeds(), record("t5", 0, 16, 1.0, train_len=32)])


@pytest.mark.parametrize("end", ["on_multirun_end", "on_run_end"])
def test_a_run_or_sweep_whose_report_fails_exits_1(tmp_path, caplog, end):
    """The report failing used to end a sweep with exit status 0 after "no report"."""
    mixed_protocols(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        getattr(SweepCallback(), end)(with_dirs(tmp_path))
    assert exit_info.value.code == 1
    assert "no report: records disagree on train_len" in caplog.text
    assert not (tmp_path / "report.md").exists()


@pytest.mark.slow
def test_a_report_that_fails_removes_the_earlier_one(tmp_path, caplog):
    """Records added to a reported folder that cannot share its report: the old report.md,
    tables and figures describe other records, so they go (they used to stay in place)."""
    write_runs(tmp_path, three_seeds())
    assert write_report(tmp_path, compose())
    mixed_protocols(tmp_path)
    assert not write_report(tmp_path, compose())
    assert not any((tmp_path / name).exists() for name in ("report.md", "tables", "figures"))
    assert "removed the earlier report" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("end", ["on_multirun_end", "on_run_end"])
def test_a_report_that_cannot_be_written_fails_the_run_in_one_line(
    tmp_path, caplog, monkeypatch, end
):
    """Issue 29, item 3: on a full disk the report's OSError became Hydra's "Callback ...
    raised OSError" warning and exit 0; now one line naming the file, and exit 1."""
    write_runs(tmp_path, three_seeds())

    def full(*args):
        raise OSError(28, "No space left on device")  # as a write to a full disk: no file

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(SystemExit) as exit_info:
        getattr(SweepCallback(), end)(with_dirs(tmp_path))
    assert exit_info.value.code == 1
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no report")]
    assert re.fullmatch(
        rf"no report: cannot write or read '{tmp_path}/\S+': No space left on device", line
    )


@pytest.mark.slow
def test_a_sweeps_report_waits_for_another_report_into_its_folder(tmp_path, caplog):
    """Issue 29, item 2: two sweeps into one folder: the second one's report was refused while
    the first one wrote, and its "no report" then removed the first one's report. It waits."""
    write_runs(tmp_path, three_seeds())
    (tmp_path / "report.md").write_text("the other sweep's report\n")
    fd = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the other sweep's report holds it
    released = threading.Timer(2.5, os.close, [fd])  # longer than loading the records
    released.start()
    start = time.monotonic()
    assert write_report(tmp_path, compose())
    assert time.monotonic() - start >= 2.4  # it waited for the other report to end
    assert "| alibi" in (tmp_path / "report.md").read_text() and "removed" not in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("end", ["on_multirun_end", "on_run_end"])
def test_a_run_or_sweep_whose_report_is_written_returns(tmp_path, end):
    write_runs(tmp_path, three_seeds())
    getattr(SweepCallback(), end)(with_dirs(tmp_path))
    assert (tmp_path / "report.md").exists()


@pytest.mark.slow
def test_a_whole_sweep_whose_report_fails_exits_1(tmp_path):
    """End to end (starts pe-bench and trains two tiny models): jobs fine, report refused."""
    tiny = [o for o in TINY if not o.startswith(("train.seq_len=", "eval.factors="))]
    proc = pe_bench(
        "-m", "pe=rope", "train.seq_len=8,16", "eval.factors=[1]", *tiny, "name=mixed", out=tmp_path
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "no report: records disagree on train_len" in proc.stdout + proc.stderr


def test_a_sweeps_command_says_where_its_plugin_was_imported_from(tmp_path, monkeypatch):
    """The report's Reproduce section printed a plugin sweep's command without the
    PYTHONPATH its module was found through (issue 17 item 4)."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "far_away_pe.py").write_text("")
    monkeypatch.syspath_prepend(str(plugins))
    cfg = compose()
    with open_dict(cfg):
        cfg.pe.plugin = "far_away_pe"
    assert plugin_pythonpath(cfg) == str(plugins)
    assert plugin_pythonpath(compose()) == ""  # no plugin
    command = log_command(tmp_path, ["pe=far"])
    line = with_pythonpath(tmp_path, command, plugin_pythonpath(cfg))
    assert line == f"PYTHONPATH={plugins} pe-bench -m pe=far"
    assert log_command(tmp_path, ["pe=far"]) == line  # the same sweep again: its line
    assert commands_file(tmp_path) == [line]


def commands_file(folder: Path) -> list[str]:
    return (folder / "commands.txt").read_text().splitlines()
