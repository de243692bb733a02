"""Runs that survive: SIGKILL then rerun, cached jobs, force, divergence, out of memory, and
fine-tunes that are cached and resumed. Those that start processes are marked slow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pe_bench.cli import bench
from pe_bench.errors import UserError
from pe_bench.files import read_jsonl, write_jsonl
from pe_bench.records import load_records
from pe_bench.run import evaluate
from pe_bench.run.plan import plan
from pe_bench.run.train import load_checkpoint, save_checkpoint
from tests.helpers import ROOT, TINY, overridden, pe_bench

# ~4 s of training on 2 cores, checkpoints every 20 of 400 steps: a kill lands mid-training.
SLOW = [
    "pe=alibi",
    "model=smoke",
    "train.seq_len=32",
    "train.batch_size=16",
    "train.steps=400",
    "train.ckpt_every=20",
    "train.log_every=20",
    "train.val_every=0",
    "train.val_batches=1",
    "eval.factors=[1,2]",
    "eval.tokens=512",
    "eval.probes=[]",  # the perplexity records only: the tests count them
]


# Three tiny jobs of about a second each: two sweeps at once meet on every job.
SWEEP = ["-m", "pe=alibi,nope,rope", *(o for o in SLOW if not o.startswith("pe="))]
SWEEP = [o if not o.startswith("train.steps=") else "train.steps=60" for o in SWEEP]


def command(*args: str) -> list[str]:
    """The ``pe-bench`` command line; a key given again replaces its earlier value."""
    return [sys.executable, "-m", "pe_bench.cli", *overridden(*args)]


def run(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(*args), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def kill_when(path_glob: str, root: Path, proc: subprocess.Popen, timeout: float = 600) -> None:
    """SIGKILL ``proc`` as soon as a file matching ``path_glob`` appears under ``root``."""
    deadline = time.time() + timeout
    try:
        while not list(root.glob(path_glob)):
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.time() < deadline, f"no {path_glob} under {root}"
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.rglob("records.jsonl")) for line in open(f)]


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    whole = tmp_path / "whole"
    run(*SLOW, f"hydra.run.dir={whole}")

    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        command(*SLOW, f"hydra.run.dir={cut}"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    kill_when("checkpoint.pt", cut, proc)
    step = torch.load(cut / "checkpoint.pt", weights_only=True)["step"]
    assert 0 < step < 400, "killed mid-training"
    assert not (cut / "records.jsonl").exists()

    rerun = run(*SLOW, f"hydra.run.dir={cut}")
    assert f"resumed at step {step} of 400" in rerun.stderr + rerun.stdout
    a, b = records(whole), records(cut)
    assert len(b) == 2  # one record per key
    assert [r["nll"] for r in a] == [r["nll"] for r in b]  # bitwise on CPU
    assert a[0]["final_train_loss"] == b[0]["final_train_loss"]


# Record fields that measure time, memory, date or host, never equal twice (as kill_anywhere.py)
MEASURED = {"time_s", "train_time_s", "peak_mem_mb", "date", "hardware", "git_sha"}


@pytest.mark.slow
def test_one_config_in_two_processes_gives_identical_records(tmp_path):
    """On one machine and thread count, a run is bitwise reproducible across processes: every
    record field but the measured ones is equal (the determinism claim of docs/reliability.md;
    sinusoidal is the scheme the review saw differ)."""
    args = ["pe=sinusoidal", *SLOW[1:]]
    for folder in ("a", "b"):
        run(*args, f"hydra.run.dir={tmp_path / folder}")
    a, b = records(tmp_path / "a"), records(tmp_path / "b")
    assert len(a) == 2
    assert [{k: v for k, v in r.items() if k not in MEASURED} for r in a] == [
        {k: v for k, v in r.items() if k not in MEASURED} for r in b
    ]


@pytest.mark.slow
def test_complete_run_is_skipped_and_force_recomputes(tmp_path):
    out = tmp_path / "run"
    run(*TINY, "pe=rope", f"hydra.run.dir={out}")
    first = records(out)
    again = run(*TINY, "pe=rope", f"hydra.run.dir={out}")
    assert "skipped; force=true recomputes" in again.stderr + again.stdout
    assert "steps in" not in again.stderr + again.stdout
    assert records(out) == first  # never duplicated
    forced = run(*TINY, "pe=rope", "force=true", f"hydra.run.dir={out}")
    assert "steps in" in forced.stderr + forced.stdout
    assert len(records(out)) == len(first)


@pytest.mark.slow
def test_new_eval_length_reuses_the_trained_model(tmp_path):
    out = tmp_path / "run"
    run(*TINY, "pe=alibi", "eval.factors=[1,2]", f"hydra.run.dir={out}")
    more = run(*TINY, "pe=alibi", f"hydra.run.dir={out}")
    log = more.stderr + more.stdout
    assert "1 of 3 records to compute" in log and "resumed at step 3 of 3" in log
    assert sorted(r["eval_len"] for r in records(out)) == [16, 32, 64]


@pytest.mark.slow
def test_killed_sweep_reruns_only_missing_jobs(tmp_path):
    args = ["-m", "pe=nope,alibi,rope", *SLOW[1:], f"out_root={tmp_path}", "name=sweep"]
    proc = subprocess.Popen(command(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when("*pe=alibi*/checkpoint.pt", tmp_path / "sweep", proc)  # job 2 mid-training
    assert not list((tmp_path / "sweep").glob("*pe=rope*"))  # job 3 never started
    rerun = run(*args)
    log = rerun.stderr + rerun.stdout
    assert log.count("skipped; force=true recomputes") == 1  # nope: complete, not redone
    assert log.count("resumed at step") == 1  # alibi: from its checkpoint
    assert log.count("steps in") == 2  # alibi finishing, rope from scratch
    df = load_records(tmp_path / "sweep")
    assert not df.duplicated(["run_id", "variant", "eval_len", "mode"]).any()
    assert len(df) == (1 + 1 + 3) * 2  # nope, alibi, rope + pi + ntk at two lengths


@pytest.mark.slow
def test_diverged_run_is_recorded_and_the_sweep_goes_on(tmp_path):
    proc = run("-m", "pe=nope", "train.lr=1e9,1e-3", *TINY, f"out_root={tmp_path}", "name=nan")
    df = load_records(tmp_path / "nan")
    diverged = df[df["status"] == "diverged"]
    assert set(diverged["eval_len"]) == {16, 32, 64} and diverged["nll"].isna().all()
    assert (diverged["diverged_step"] >= 1).all()
    assert (df[df["status"] == "ok"]["nll"] > 0).all()
    assert "training diverged" in proc.stderr + proc.stdout


def test_out_of_memory_length_is_recorded_as_skipped(tmp_path, monkeypatch, tiny_config):
    """A length that cannot fit is recorded as skipped with the reason; the others are scored."""
    real_score = evaluate.score

    def score(model, stream, length, *args, **kwargs):
        if length == 32:  # what torch 2.13's CPU allocator raises
            raise RuntimeError(
                "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: "
                "can't allocate memory: you tried to allocate 99999999999 bytes"
            )
        return real_score(model, stream, length, *args, **kwargs)

    monkeypatch.setattr(evaluate, "score", score)
    cfg = tiny_config("pe=alibi")
    rows = bench.run(cfg, tmp_path)
    by_len = {r["eval_len"]: r for r in rows}
    assert by_len[16]["status"] == "ok" and by_len[16]["nll"] > 0
    assert by_len[32]["status"] == "skipped" and "out of memory at L=32" in by_len[32]["reason"]
    monkeypatch.setattr(evaluate, "score", real_score)  # more memory next time: only L=32 is redone
    again = bench.run(cfg, tmp_path)
    assert [(r["eval_len"], r["status"]) for r in again] == [(16, "ok"), (64, "ok"), (32, "ok")]


def test_an_error_that_is_not_out_of_memory_is_raised(tmp_path, monkeypatch, tiny_config):
    def score(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(evaluate, "score", score)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        bench.run(tiny_config("pe=alibi"), tmp_path)


# A rope run with both fine-tunes of Chen et al. (2023), each 2 steps at 4 x 16 tokens.
FINETUNED = [
    "pe=rope",
    "+finetune@finetunes.ft=ft",
    "+finetune@finetunes.pi=pi",
    "finetunes.ft.steps=2",
    "finetunes.pi.steps=2",
    "finetunes.ft.warmup_steps=1",
    "finetunes.pi.warmup_steps=1",
]


def numbers(rows: list[dict], finetune: str | None = None) -> list[tuple]:
    return [(r["variant"], r["eval_len"], r["nll"]) for r in rows if r.get("finetune") == finetune]


@pytest.mark.slow
def test_finetunes_add_models_and_leave_the_trained_one_alone(tmp_path, tiny_config):
    plain = bench.run(tiny_config("pe=rope"), tmp_path / "plain")
    tuned = bench.run(tiny_config(*FINETUNED), tmp_path / "tuned")
    assert numbers(tuned) == numbers(plain)  # bitwise: fine-tunes change nothing before them
    assert {r["run_id"] for r in tuned if "finetune" not in r} == {plain[0]["run_id"]}
    for key, scheme in (("ft", "rope"), ("pi", "pi")):
        rows = [r for r in tuned if r.get("finetune") == key]
        assert [(r["variant"], r["eval_len"]) for r in rows] == [("none", n) for n in (16, 32, 64)]
        assert rows[0]["run_id"].startswith(plain[0]["run_id"] + f":{key}-")
        assert (rows[0]["finetune_pe"], rows[0]["finetune_len"]) == (scheme, 64)
        assert rows[0]["finetune_steps"] == 2 and rows[0]["train_len"] == 16
        assert rows[0]["nll"] != plain[0]["nll"]  # the fine-tuned model is another model
        assert (tmp_path / "tuned" / f"checkpoint-{key}.pt").exists()
    labels = aggregate_labels(tuned)
    assert labels == ["rope", "rope+pi", "rope+ntk", "rope:ft", "rope:pi"]


def aggregate_labels(rows: list[dict]) -> list[str]:
    import pandas as pd

    from pe_bench.report import aggregate

    return aggregate.label_order(aggregate.prepare(pd.DataFrame(rows)))


@pytest.mark.slow
def test_finetunes_are_cached_and_resumed(tmp_path, caplog, tiny_config):
    caplog.set_level("INFO")
    first = bench.run(tiny_config(*FINETUNED), tmp_path)
    assert bench.run(tiny_config(*FINETUNED), tmp_path) == first
    assert "all 15 records are there" in caplog.text

    caplog.clear()  # another PI fine-tune: only its records, from the trained checkpoint
    second = bench.run(tiny_config(*FINETUNED, "finetunes.pi.steps=3"), tmp_path)
    assert "3 of 15 records to compute" in caplog.text
    assert "train rope: resumed at step 3 of 3" in caplog.text
    assert numbers(second, "pi") != numbers(first, "pi")
    assert [r for r in second if r.get("finetune") != "pi"] == [
        r for r in first if r.get("finetune") != "pi"
    ]

    caplog.clear()  # the FT records lost, its checkpoint kept: resumed, the same numbers
    write_jsonl(tmp_path / "records.jsonl", [r for r in second if r.get("finetune") != "ft"])
    third = bench.run(tiny_config(*FINETUNED, "finetunes.pi.steps=3"), tmp_path)
    assert "finetune rope:ft: resumed at step 2 of 2" in caplog.text
    assert numbers(third, "ft") == numbers(first, "ft")


@pytest.mark.slow
def test_a_kill_in_the_second_finetunes_evaluation_keeps_the_first_ones_curve(
    tmp_path, tiny_config
):
    cfg = tiny_config(*FINETUNED)
    bench.run(cfg, tmp_path)
    curve, records = read_jsonl(tmp_path / "curve.jsonl"), read_jsonl(tmp_path / "records.jsonl")
    assert {r["run_id"].split(":")[-1][:2] for r in curve} == {"ft", "pi", "ro"}
    # killed while the second fine-tune's last record was being computed
    write_jsonl(tmp_path / "records.jsonl", records[:-1])
    bench.run(cfg, tmp_path)
    assert read_jsonl(tmp_path / "curve.jsonl") == curve
    assert len(read_jsonl(tmp_path / "positions.jsonl")) == len(records) == 15


@pytest.mark.slow
def test_a_diverged_finetune_is_recorded_and_the_rest_goes_on(tmp_path, tiny_config):
    overrides = ["finetunes.ft.lr=1e9", "finetunes.ft.steps=20"]
    rows = bench.run(tiny_config(*FINETUNED, *overrides), tmp_path)
    ft = [r for r in rows if r.get("finetune") == "ft"]
    assert [r["status"] for r in ft] == ["diverged"] * 3 and ft[0]["nll"] is None
    assert all(r["status"] == "ok" for r in rows if r.get("finetune") != "ft")


def test_a_finetune_applies_to_its_scheme_only(tiny_config):
    alibi = plan(tiny_config("pe=alibi", "+finetune@finetunes.pi=pi", "+finetune@finetunes.ft=ft"))
    assert [(ft.key, ft.scheme.name) for ft in alibi.finetunes] == [("ft", "alibi")]


@pytest.mark.slow
def test_a_corrupt_checkpoint_is_one_line_naming_it_and_force(tmp_path, tiny_config):
    """``truncate -s 50000 checkpoint.pt`` (a full disk, a copy cut short): every rerun said
    OSError/EOFError/UnpicklingError with a traceback; now one line naming the file and the way
    out, and force=true trains afresh."""
    cfg = tiny_config("pe=nope", "finetunes=null")
    first = bench.run(cfg, tmp_path)
    checkpoint = tmp_path / "checkpoint.pt"
    with open(checkpoint, "r+b") as f:
        f.truncate(checkpoint.stat().st_size // 2)
    write_jsonl(tmp_path / "records.jsonl", first[:-1])  # one record to compute: loads it
    with pytest.raises(UserError, match="force=true") as caught:
        bench.run(cfg, tmp_path)
    assert str(checkpoint) in str(caught.value) and "\n" not in str(caught.value)
    forced = bench.run(tiny_config("pe=nope", "force=true"), tmp_path)
    assert [r["nll"] for r in forced] == [r["nll"] for r in first]


def test_two_checkpoint_saves_never_share_a_temporary_file(tmp_path, monkeypatch):
    """Two identical commands both wrote ``.checkpoint.pt.tmp`` and one crashed; a failed save
    leaves no temporary file behind."""
    names = []
    real_save = torch.save

    def save(obj, f, *args, **kwargs):  # the temporary file: a path, or an open file in it
        names.append(f if isinstance(f, str | Path) else os.readlink(f"/proc/self/fd/{f.fileno()}"))
        if len(names) == 3:
            raise OSError("No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"step": 1})
    save_checkpoint(path, {"step": 2})
    assert len({str(n) for n in names}) == 2 and all(Path(n).parent == tmp_path for n in names)
    with pytest.raises(OSError, match="No space"):
        save_checkpoint(path, {"step": 3})
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    assert torch.load(path, weights_only=True) == {"step": 2}


@pytest.mark.slow
def test_two_identical_commands_at_once_never_crash(tmp_path):
    """With a checkpoint every step both processes used to write one temp file; now one trains
    and the other is refused in one line naming the folder (or runs after it, cached)."""
    args = [*SLOW, "train.ckpt_every=1", "train.steps=200", f"out_root={tmp_path}"]
    procs = [
        subprocess.Popen(command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    assert sorted(rc for rc, _, _ in outs) in ([0, 0], [0, 2]), [err[-2000:] for *_, err in outs]
    for rc, _, err in outs:
        assert "Traceback" not in err
        if rc == 2:
            assert err.strip().endswith("wait for it to end, or pick another out_root")
            assert "is in use by another pe-bench run" in err.strip().splitlines()[-1]
    df = load_records(tmp_path)
    assert len(df) == 2 and not df.duplicated(["run_id", "eval_len"]).any()


@pytest.mark.slow
def test_two_sweeps_into_one_folder_at_once_both_end_with_every_output(tmp_path):
    """Issue 29, item 2: the same sweep started twice at once used to end (1, 1) or (1, 0),
    naming as failed the jobs the other process ran, leaving error.txt in complete job
    folders, and once with no report at all while a process exited 0. Now each job runs once,
    the other process waits for it, and both end 0 with the report there."""
    args = [*SWEEP, f"out_root={tmp_path}"]
    procs = [
        subprocess.Popen(command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    assert [rc for rc, _, _ in outs] == [0, 0], [err[-2000:] for *_, err in outs]
    for _, out, err in outs:
        assert "failed:" not in out + err and "Traceback" not in err
        assert "no report" not in out + err and "removed the earlier report" not in out + err
    sweep = tmp_path / "default"
    assert not list(sweep.rglob("error.txt"))
    assert all((sweep / name).exists() for name in ("report.md", "tables", "figures"))
    df = load_records(tmp_path)
    assert set(df["scheme"]) == {"alibi", "nope", "rope"}
    assert not df.duplicated(["run_id", "variant", "eval_len"]).any()
    assert len((sweep / "commands.txt").read_text().splitlines()) == 1  # logged once


@pytest.mark.slow
def test_adding_an_eval_length_from_the_command_line_reuses_the_trained_model(tmp_path):
    """eval.* keys are left out of the job folder's name: the second command finds the first's
    folder and checkpoint and computes only the new length."""
    first = pe_bench(*TINY, "pe=alibi", "eval.factors=[1,2]", out=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    more = pe_bench(*TINY, "pe=alibi", "eval.factors=[1,2,4]", out=tmp_path)
    assert more.returncode == 0, more.stderr[-2000:]
    log = more.stderr + more.stdout
    assert "1 of 3 records to compute" in log and "resumed at step 3 of 3" in log
    (folder,) = [p for p in (tmp_path / "default").iterdir() if p.is_dir()]
    assert "eval" not in folder.name
    assert sorted(r["eval_len"] for r in records(folder)) == [16, 32, 64]


@pytest.mark.slow
def test_kill_anywhere_trials_end_equal_to_an_uninterrupted_run(tmp_path):
    """Three trials of experiments/kill_anywhere.py (the committed run has many more)."""
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import kill_anywhere
    finally:
        sys.path.pop(0)
    summary = kill_anywhere.run_trials(tmp_path, trials=3, seed=1)
    assert summary.mismatches == [], summary.mismatches
    assert len(summary.trials) == 3


@pytest.mark.slow  # a reference run and two sweeps: ~3 min on one thread
def test_a_plugin_failure_trial_names_the_job_and_keeps_the_others(tmp_path):
    """experiments/kill_anywhere.py's plugin trial: a sweep whose job's plugin raises in
    training names that job once, exits 1 without a traceback, writes the report, and leaves
    the other job's folder equal to the sweep without it."""
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import kill_anywhere
    finally:
        sys.path.pop(0)
    summary = kill_anywhere.run_trials(tmp_path, trials=0, seed=2, plugin=True)
    assert summary.mismatches == [], summary.mismatches
    (plugin,) = summary.trials
    assert plugin.kind == "plugin failure" and plugin.kills == []  # nothing was killed
    assert "train_raises" in plugin.failed_job
    assert "(0 kills;" in kill_anywhere.markdown(summary, seed=2, elapsed=0.0)


@pytest.mark.slow  # one run interrupted in its startup: ~10 s on one thread
def test_a_ctrl_c_trial_interrupts_the_run_even_from_a_background_experiment(tmp_path):
    """experiments/kill_anywhere.py started by ``nohup ... &`` ignores SIGINT, and its runs
    inherited that: each Ctrl-C trial ran to the end and passed as 'ended'. The run must be
    interrupted (one line, status 130), its phase read at the moment of the signal."""
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import kill_anywhere
    finally:
        sys.path.pop(0)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        where, wrong = kill_anywhere.run_and_kill(
            tmp_path / "out", tmp_path / "run.log", 1.0, signal.SIGINT
        )
    finally:
        signal.signal(signal.SIGINT, before)
    assert (where, wrong) == ("startup", "")  # '' : its last line said so, status 130


def test_a_checkpoint_of_other_code_or_from_before_the_key_starts_afresh(tmp_path):
    """A checkpoint's fingerprint ends in the key of its scheme's code: one saved by other
    code, or before fingerprints carried a key, is not resumed (its records are stale too)."""
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"fingerprint": "rope-c7bc28a482f9-c17d741c64d6", "step": 600})
    assert load_checkpoint(path, "rope-c7bc28a482f9-c17d741c64d6-0a1b2c3d4e5f") is None
    save_checkpoint(path, {"fingerprint": "rope-c7bc28a482f9-c17d741c64d6-0a1b2c3d4e5f"})
    assert load_checkpoint(path, "rope-c7bc28a482f9-c17d741c64d6-0a1b2c3d4e5f") is not None
    assert load_checkpoint(path, "rope-c7bc28a482f9-c17d741c64d6-ffffffffffff") is None
