"""What a report refuses, in one line naming the file or option and what is allowed
(``report.inputs``: options, the checks a record must pass, the folder's lock), and the
commands a report lists."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from pe_bench.cli.report import main as report_main
from pe_bench.errors import UserError
from pe_bench.files import write_jsonl
from pe_bench.report.build import build_report
from pe_bench.report.inputs import commands
from tests.helpers import (
    read_rows,
    record,
    three_seeds,
    write_runs,
)


def test_empty_folder_is_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pe-bench-report: error: no records under") and err.count("\n") == 1


def test_a_run_stopped_during_its_passkey_test_is_one_line(tmp_path, capsys):
    """A pretrained run writes its passkey records first; stopped then, the folder has no
    perplexity record, and the report was an IndexError."""
    passkey = {"mode": "passkey", "status": "ok", "correct": [1, 0], "depth": [0.25, 0.75]}
    write_runs(tmp_path, [record("smol", 0, 4096, 0.0, **passkey)])
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert "no perplexity records under" in err and "only 1 of passkey" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [  # issue 29, items 7 and 9: two tracebacks and argparse's usage over six lines
        (["--out", "/proc/report"], "cannot write or read '/proc/report': No such file or"),
        (["--metric", "foo"], "argument --metric: invalid choice: 'foo' (choose from 'ppl', "),
    ],
)
def test_a_bad_report_argument_is_one_line(tmp_path, capsys, args, message):
    write_runs(tmp_path, three_seeds())
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(tmp_path), *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("pe-bench-report: error: ") and message in err


def test_a_report_on_a_read_only_disk_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    """A read-only file system (OSError 30, which root meets too) was a traceback."""
    write_runs(tmp_path, three_seeds())

    def read_only(*args):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(os, "fsync", read_only)
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert re.match(
        rf"pe-bench-report: error: cannot write or read '{tmp_path}/\S+': Read-only", err
    )


def test_mixed_protocols_are_one_line_error(tmp_path, capsys):
    write_runs(
        tmp_path,
        [r if r["scheme"] == "rope" else {**r, "corpus": "wikitext"} for r in three_seeds()],
    )
    with pytest.raises(SystemExit):
        report_main([str(tmp_path)])
    err = capsys.readouterr().err
    assert "records disagree on corpus: stdlib (rope); wikitext (alibi)" in err
    assert err.count("\n") == 1


def test_corrupt_line_is_skipped_with_file_and_line(tmp_path, caplog):
    write_runs(tmp_path, three_seeds())
    path = tmp_path / "rope-0" / "records.jsonl"
    good = path.read_text().splitlines()
    path.write_text("\n".join([good[0], '{"run_id": "rope-0", "sch', good[1]]) + "\n")
    with caplog.at_level(logging.WARNING, logger="pe_bench"):
        rep = build_report(tmp_path, echo=False)
    assert "rope-0/records.jsonl:2: corrupt line skipped" in caplog.text
    assert rep.tables["nll"]["n"].tolist() == [1, 1, 3, 3]


def test_bad_baseline_is_one_line_error(tmp_path, capsys):
    write_runs(tmp_path, three_seeds())
    with pytest.raises(SystemExit):
        report_main([str(tmp_path), "--baseline", "20"])
    assert (
        "baseline length 20 is not an eval length; the records have 16, 32"
        in capsys.readouterr().err
    )


def test_commands_come_from_hydra_files(tmp_path):
    write_runs(tmp_path / "sweep", three_seeds())
    (tmp_path / "sweep" / "multirun.yaml").write_text(
        json.dumps({"hydra": {"overrides": {"task": ["pe=rope,alibi", "eval.factors=[1,2]"]}}})
    )
    write_runs(tmp_path / "single", [record("t5", 0, 16, 1.0)])
    (tmp_path / "single" / "t5-0" / ".hydra").mkdir()
    (tmp_path / "single" / "t5-0" / ".hydra" / "overrides.yaml").write_text("- pe=t5\n")
    assert commands(tmp_path) == [
        "pe-bench pe=t5",
        "pe-bench -m pe=rope,alibi 'eval.factors=[1,2]'",
    ]


def test_two_reports_into_one_folder_at_once_are_refused(tmp_path):
    write_runs(tmp_path, three_seeds())
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a report writing there holds it
        with pytest.raises(UserError, match="is being written by another report"):
            build_report(tmp_path, echo=False)
    finally:
        os.close(fd)
    assert not (tmp_path / "report.md").exists()


def test_another_run_in_a_job_folder_is_refused(tmp_path, capsys):
    """A record of another seed dropped into a job folder used to be averaged in (n=2)."""
    write_runs(tmp_path, three_seeds())
    path = tmp_path / "rope-0" / "records.jsonl"
    write_jsonl(path, [*read_rows(path), record("rope", 1, 16, 1.1)])
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{path} holds records of 2 trained runs (rope-0, rope-1)" in err


def without(field: str) -> Callable[[Path], None]:
    """Setup: rope-0's first record lacks ``field``."""

    def setup(folder: Path) -> None:
        path = folder / "rope-0" / "records.jsonl"
        first, *rest = read_rows(path)
        first.pop(field)
        write_jsonl(path, [first, *rest])

    return setup


def with_value(field: str, value: object) -> Callable[[Path], None]:
    """Setup: rope-0's first record has ``value`` as its ``field``."""

    def setup(folder: Path) -> None:
        path = folder / "rope-0" / "records.jsonl"
        first, *rest = read_rows(path)
        write_jsonl(path, [{**first, field: value}, *rest])

    return setup


def replaced_by(data: bytes) -> Callable[[Path], None]:
    """Setup: rope-0's records.jsonl holds ``data``."""
    return lambda folder: (folder / "rope-0" / "records.jsonl").write_bytes(data)


def another_seed(folder: Path) -> None:
    path = folder / "rope-0" / "records.jsonl"
    write_jsonl(path, [*read_rows(path), record("rope", 1, 16, 1.1)])


def a_folder_named_records(folder: Path) -> None:
    (folder / "t5-0" / "records.jsonl").mkdir(parents=True)


# (what, setup of a folder of three_seeds' records, what the one-line error says after the
# file it names): bad records that pe-bench-report must refuse without a traceback.
BAD_RECORDS = [
    ("random bytes", replaced_by(random.Random(0).randbytes(4096)), ": not a JSON-lines file"),
    (
        "latin-1 text",
        replaced_by('{"scheme": "café"}\n'.encode("latin-1")),
        ": not a JSON-lines file (byte 15 is not UTF-8 text)",
    ),
    ("no scheme", without("scheme"), ":1: record lacks 'scheme'"),
    ("no variant", without("variant"), ":1: record lacks 'variant'"),
    ("no run id", without("run_id"), ":1: record lacks 'run_id'"),
    ("no eval length", without("eval_len"), ":1: record lacks 'eval_len'"),
    ("no mode", without("mode"), ":1: record lacks 'mode'"),
    ("no stride", without("stride"), ":1: record lacks 'stride'"),
    ("ok but no nll", without("nll"), ":1: record lacks 'nll'"),
    ("null scheme", with_value("scheme", None), ":1: record lacks 'scheme'"),
    ("seed a string", with_value("seed", "0"), ":1: record field 'seed' is '0'; expected int"),
    (
        "eval length a list",
        with_value("eval_len", [16]),
        ":1: record field 'eval_len' is [16]; expected int",
    ),
    (
        "nll a string",
        with_value("nll", "1.0"),
        ":1: record field 'nll' is '1.0'; expected int or float",
    ),
    (
        "unknown status",
        with_value("status", "done"),
        ":1: status 'done' is not one of ok, skipped, diverged",
    ),
    ("two trained runs", another_seed, " holds records of 2 trained runs (rope-0, rope-1)"),
    ("a folder named records.jsonl", a_folder_named_records, ": cannot be read: Is a directory"),
]


@pytest.mark.parametrize(
    ("what", "setup", "expected"), BAD_RECORDS, ids=[b[0] for b in BAD_RECORDS]
)
def test_bad_records_are_one_line_errors(tmp_path, capsys, what, setup, expected):
    write_runs(tmp_path, three_seeds())
    setup(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(tmp_path)])
    assert exit_info.value.code == 2, what
    err = capsys.readouterr().err
    assert err.startswith(f"pe-bench-report: error: {tmp_path}/") and err.count("\n") == 1, err
    assert "records.jsonl" + expected in err, err
