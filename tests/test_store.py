"""A job folder's files across reruns: per-position losses and curves are kept with their
records, stray temporary files are removed, and one run at a time holds the folder."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import pytest

from pe_bench import cli
from pe_bench.errors import UserError
from pe_bench.records import POSITIONS, RECORDS, read_jsonl, write_jsonl
from pe_bench.run.store import LOCK, RunStore


def rows(folder: Path, name: str) -> list[dict]:
    return read_jsonl(folder / name)


def test_a_rerun_that_computes_one_record_keeps_every_position_row(tmp_path, tiny_config):
    """The issue's reproduction: drop the last record, rerun: positions.jsonl kept whole (its
    row of the dropped record recomputed once, never duplicated)."""
    cfg = tiny_config("pe=rope")
    cli.run(cfg, tmp_path)
    positions, records = rows(tmp_path, POSITIONS), rows(tmp_path, RECORDS)
    assert len(positions) == len(records) == 9
    write_jsonl(tmp_path / RECORDS, records[:-1])  # killed after positions, before records
    cli.run(cfg, tmp_path)
    assert rows(tmp_path, RECORDS)[:-1] == records[:-1]
    assert rows(tmp_path, POSITIONS) == positions


def store(folder: Path, corpus_sha: str = "c1") -> RunStore:
    return RunStore(folder, ["a", "a:ft"], corpus_sha, fresh=False)


def record(run_id: str, eval_len: int, corpus_sha: str = "c1") -> dict:
    key = {"variant": "none", "variant_hash": "", "eval_len": eval_len, "mode": "nonoverlap"}
    key |= {"stride": eval_len, "tokens": 64}
    return {"run_id": run_id, **key, "corpus_sha": corpus_sha, "status": "ok", "nll": 1.0}


def test_positions_and_curves_follow_their_records(tmp_path):
    """Rows of a kept record (or of a run with a kept record) stay; rows of stale records (other
    corpus, other run id) and of records never written go."""
    old = store(tmp_path)
    old.add(record("a", 16), [1.0])
    old.add(record("a", 32), [2.0])
    old.set_curve("a", [{"step": 1, "loss": 3.0}])
    old.set_curve("a:ft", [{"step": 1, "loss": 2.0}])
    write_jsonl(tmp_path / RECORDS, [record("a", 16), record("b", 16)])
    again = store(tmp_path)
    assert [(p["run_id"], p["eval_len"]) for p in again.positions] == [("a", 16)]
    assert list(again.curves) == ["a"]  # a:ft has no record: its curve is redone with it
    other_corpus = store(tmp_path, corpus_sha="c2")
    assert other_corpus.records == other_corpus.positions == []
    assert other_corpus.curves == {}


def test_records_of_a_changed_variant_config_are_superseded(tmp_path):
    """A variant whose config changed (its hash) is recomputed and its old records dropped, or
    the report would find two rows for one cell; a variant no longer planned is kept."""
    old = [
        {**record("a", 16), "variant": "pi", "variant_hash": "old"},
        {**record("a", 16), "variant": "yarn", "variant_hash": "y"},
        record("a", 16),
    ]
    write_jsonl(tmp_path / RECORDS, old)
    again = RunStore(tmp_path, ["a"], "c1", fresh=False, variants={"none": "", "pi": "new"})
    assert [(r["variant"], r["variant_hash"]) for r in again.records] == [
        ("yarn", "y"),
        ("none", ""),
    ]


def test_stray_temporary_files_of_a_killed_run_are_removed(tmp_path):
    strays = [".records.jsonl.x1.tmp", ".checkpoint.pt.tmp", ".checkpoint-pi.pt.k2.tmp"]
    for name in [*strays, "notes.tmp", ".report.md.x3.tmp"]:
        (tmp_path / name).write_text("half")
    store(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".report.md.x3.tmp", "notes.tmp"]


def test_a_folder_in_use_by_another_run_is_refused_in_one_line(tmp_path, tiny_config):
    with open(tmp_path / LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process's run
        with pytest.raises(UserError, match=f"{tmp_path} is in use by another pe-bench run"):
            cli.run(tiny_config("pe=nope"), tmp_path)
    assert not (tmp_path / RECORDS).exists()
    cli.run(tiny_config("pe=nope"), tmp_path)  # released: the next run goes ahead
    cli.run(tiny_config("pe=nope"), tmp_path)  # and the lock is released after each run
    assert len(rows(tmp_path, RECORDS)) == 3
    assert json.loads((tmp_path / RECORDS).read_text().splitlines()[0])["status"] == "ok"
