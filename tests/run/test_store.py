"""A job folder's files across reruns: per-position losses and curves are kept with their
records, stray temporary files are removed, and one run at a time holds the folder."""

from __future__ import annotations

import fcntl
import json
import logging
import threading
import time
from pathlib import Path

import pytest

from pe_bench.cli import bench
from pe_bench.config import config_hash
from pe_bench.errors import UserError
from pe_bench.files import read_jsonl, write_jsonl
from pe_bench.positions import scheme_key
from pe_bench.records import POSITIONS, RECORD_KEY, RECORDS
from pe_bench.run.plan import plan
from pe_bench.run.store import FAILED, LOCK, RunStore


def rows(folder: Path, name: str) -> list[dict]:
    return read_jsonl(folder / name)


def test_a_rerun_that_computes_one_record_keeps_every_position_row(tmp_path, tiny_config):
    """The issue's reproduction: drop the last record, rerun: positions.jsonl kept whole (its
    row of the dropped record recomputed once, never duplicated)."""
    cfg = tiny_config("pe=rope")
    bench.run(cfg, tmp_path)
    positions, records = rows(tmp_path, POSITIONS), rows(tmp_path, RECORDS)
    assert len(positions) == len(records) == 9
    write_jsonl(tmp_path / RECORDS, records[:-1])  # killed after positions, before records
    bench.run(cfg, tmp_path)
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


def test_records_of_other_code_or_without_its_key_are_stale_and_the_log_says_why(tmp_path, caplog):
    """A record is kept only under the key of the code that runs now: the trained scheme's
    (``pe_source``) and a planned variant's (``variant_source``); one without a key (made before
    records carried it) or of another is recomputed. A variant no longer planned is kept."""
    pi = {"variant": "pi", "variant_hash": "p", "pe_source": "k1"}
    rows = [
        {**record("a", 16), "pe_source": "k1"},
        {**record("a", 32), "pe_source": "k0"},
        record("a", 64),
        {**record("a", 16), **pi, "variant_source": "v1"},
        {**record("a", 32), **pi, "variant_source": "v0"},
        {**record("a", 64), **pi},
        {**record("a", 16), "variant": "yarn", "variant_hash": "y", "pe_source": "k1"},
    ]
    write_jsonl(tmp_path / RECORDS, rows)
    with caplog.at_level(logging.INFO, logger="pe_bench.run.store"):
        again = RunStore(
            tmp_path,
            ["a"],
            "c1",
            fresh=False,
            variants={"none": "", "pi": "p"},
            pe_source="k1",
            variant_sources={"none": "", "pi": "v1"},
        )
    assert [(r["variant"], r["eval_len"]) for r in again.records] == [
        ("none", 16),
        ("pi", 16),
        ("yarn", 16),
    ]
    assert "1 records stale, recomputed: pe_source k0, the code's key is now k1" in caplog.text
    assert "1 records stale, recomputed: no pe_source (made before records carried it)" in (
        caplog.text
    )
    assert "1 records stale, recomputed: variant_source v0, the code's key is now v1" in caplog.text
    assert "1 records stale, recomputed: no variant_source" in caplog.text


def test_a_fine_tunes_records_are_kept_under_the_key_of_its_scheme_s_code(tmp_path, caplog):
    """A planned fine-tune's record (by its run id) is kept only under the key of its
    fine-tuning scheme's code (``finetune_source``): one of other code or without the key is
    recomputed; the trained model's records, which carry none, are not asked for it."""
    rows = [
        {**record("a", 16), "pe_source": "k1"},
        {**record("a:ft", 16), "pe_source": "k1", "finetune_source": "f1"},
        {**record("a:ft", 32), "pe_source": "k1", "finetune_source": "f0"},
        {**record("a:ft", 64), "pe_source": "k1"},
    ]
    write_jsonl(tmp_path / RECORDS, rows)
    with caplog.at_level(logging.INFO, logger="pe_bench.run.store"):
        again = RunStore(
            tmp_path,
            ["a", "a:ft"],
            "c1",
            fresh=False,
            pe_source="k1",
            finetune_sources={"a:ft": "f1"},
        )
    assert [(r["run_id"], r["eval_len"]) for r in again.records] == [("a", 16), ("a:ft", 16)]
    assert "1 records stale, recomputed: finetune_source f0, the code's key is now f1" in (
        caplog.text
    )
    assert "1 records stale, recomputed: no finetune_source" in caplog.text


def test_a_record_without_the_key_of_its_code_is_recomputed(tmp_path, tiny_config, caplog):
    """A record written before records carried the key is not served: the run computes it
    again (and writes it with the key), once."""
    cfg = tiny_config("pe=alibi")
    bench.run(cfg, tmp_path)
    records = rows(tmp_path, RECORDS)
    keyless = {k: v for k, v in records[0].items() if k != "pe_source"}
    write_jsonl(tmp_path / RECORDS, [keyless, *records[1:]])
    with caplog.at_level(logging.INFO):
        again = bench.run(cfg, tmp_path)
    assert "1 records stale, recomputed: no pe_source" in caplog.text
    assert "1 of 3 records to compute" in caplog.text
    assert len(again) == 3 and {r["pe_source"] for r in again} == {records[0]["pe_source"]}
    assert len(rows(tmp_path, POSITIONS)) == 3


TUNED = ["pe=rope", "+finetune@finetunes.pi=pi", "+finetune@finetunes.ft=ft", "eval.variants=null"]
TUNED += [
    f"finetunes.{key}.{field}=1" for key in ("pi", "ft") for field in ("steps", "warmup_steps")
]


def test_a_fine_tune_record_without_the_key_of_its_scheme_s_code_is_recomputed(
    tmp_path, tiny_config, caplog
):
    """Each fine-tune's records carry the key of its scheme's code (PI's; FT fine-tunes with
    the trained scheme, so rope's); one written without it is computed again, from the
    fine-tune's checkpoint, which that code made: the same numbers."""
    cfg = tiny_config(*TUNED)
    job = plan(cfg)
    sources = {ft.key: ft.source for ft in job.finetunes}
    assert sources == {"pi": scheme_key(job.cfg.finetunes["pi"].pe), "ft": job.pe_source}
    records = bench.run(cfg, tmp_path)
    tuned = [r for r in records if "finetune" in r]
    assert {(r["finetune"], r["finetune_source"]) for r in tuned} == set(sources.items())
    (lost,) = [r for r in tuned if r["finetune"] == "pi" and r["eval_len"] == 32]
    write_jsonl(
        tmp_path / RECORDS,
        [
            r if r is not lost else {k: v for k, v in r.items() if k != "finetune_source"}
            for r in records
        ],
    )
    with caplog.at_level(logging.INFO):
        again = bench.run(cfg, tmp_path)
    assert "1 records stale, recomputed: no finetune_source" in caplog.text
    assert "finetune rope:pi: resumed at step 1 of 1" in caplog.text
    assert again[:-1] == [r for r in records if r is not lost]
    assert again[-1]["finetune_source"] == sources["pi"] and again[-1]["nll"] == lost["nll"]


def test_a_variant_is_named_by_its_config_and_kept_under_the_key_of_its_code(tiny_config):
    """``variant_hash`` is the hash of the variant's config alone (part of the record's key, as
    before code entered it); the key of its code is ``variant_source``, outside the record key."""
    job = plan(tiny_config("pe=rope"))
    (pi, *_) = [task for task in job.tasks if task.variant == "pi"]
    assert pi.variant_hash == config_hash(job.cfg.eval.variants["pi"])
    assert pi.variant_source == scheme_key(job.cfg.eval.variants["pi"]) != job.pe_source
    assert pi.fields()["variant_source"] == pi.variant_source
    assert "variant_source" not in RECORD_KEY


def test_stray_temporary_files_of_a_killed_run_are_removed(tmp_path):
    strays = [".records.jsonl.x1.tmp", ".checkpoint.pt.tmp", ".checkpoint-pi.pt.k2.tmp"]
    for name in [*strays, "notes.tmp", ".report.md.x3.tmp"]:
        (tmp_path / name).write_text("half")
    store(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".report.md.x3.tmp", "notes.tmp"]


@pytest.mark.slow
def test_a_sweeps_job_waits_for_another_run_of_its_folder(tmp_path, tiny_config):
    """Issue 29, item 2: a job of a sweep whose folder another process is running (a second
    sweep into the same folder) was a failure ("in use", error.txt in a complete folder); it
    waits for that run to end and finds its records."""
    with open(tmp_path / LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process's run
        threading.Timer(0.5, fcntl.flock, [held, fcntl.LOCK_UN]).start()
        start = time.monotonic()
        found = bench.run(tiny_config("pe=nope"), tmp_path, sweep=True)
        assert time.monotonic() - start >= 0.4
    assert len(found) == 3 and not (tmp_path / FAILED).exists()


def test_a_sweeps_failed_job_says_why_in_its_folder_until_it_runs_again(tmp_path, tiny_config):
    with pytest.raises(UserError):
        bench.run(tiny_config("pe=nope", "train.device=nosuch"), tmp_path, sweep=True)
    assert "train.device" in (tmp_path / FAILED).read_text()
    bench.run(tiny_config("pe=nope"), tmp_path, sweep=True)
    assert not (tmp_path / FAILED).exists()


@pytest.mark.slow
def test_a_folder_in_use_by_another_run_is_refused_in_one_line(tmp_path, tiny_config):
    with open(tmp_path / LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process's run
        with pytest.raises(UserError, match=f"{tmp_path} is in use by another pe-bench run"):
            bench.run(tiny_config("pe=nope"), tmp_path)
    assert not (tmp_path / RECORDS).exists()
    bench.run(tiny_config("pe=nope"), tmp_path)  # released: the next run goes ahead
    bench.run(tiny_config("pe=nope"), tmp_path)  # and the lock is released after each run
    assert len(rows(tmp_path, RECORDS)) == 3
    assert json.loads((tmp_path / RECORDS).read_text().splitlines()[0])["status"] == "ok"
