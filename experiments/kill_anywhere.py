"""Kill-anywhere: a run SIGKILLed at random moments and rerun ends with the files of a run that
was never interrupted.

One reference run of ``COMMAND`` (a tiny rope model, two fine-tunes, a report), then ``--trials``
trials: each starts the same command in a fresh folder, SIGKILLs it after a random delay drawn
across the reference run's duration (``trial``; a third of the trials kill the rerun too),
reruns it to completion and compares every file with the reference's:

- records.jsonl row by row, without ``IGNORED`` (measurements of time, memory, date and host:
  they differ between any two runs, killed or not);
- checkpoints: weights, optimizer and RNG states, step and curve (not ``elapsed``, a time);
- report.md and the cost table (tables/cost.md, .csv, .tex: rates and memory computed from
  those fields) with those values masked; every other file byte for byte (positions,
  curves, config, tables, figures with their data), after the trial's folder name is replaced
  by the reference's in text files (the command line and config name the output folder);
- no file more or less (a stray temporary file is a mismatch), except ``cli.log``, Hydra's log
  of every process that ran in the folder.

The phase a kill landed in is read from the killed process's own log. Writes a table and a
summary with provenance to ``results/kill_anywhere/`` (atomically) and exits 1 on any mismatch.

    OMP_NUM_THREADS=1 python experiments/kill_anywhere.py --trials 24 --seed 0
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import kill_together
import torch
from same_outputs import IGNORED, compare_folders

from pe_bench.records import atomic_write_text, device_name, git_sha

COMMAND = [
    "pe=rope",
    "model=smoke",
    "train.seq_len=16",
    "train.batch_size=8",
    "train.steps=150",
    "train.ckpt_every=10",
    "train.log_every=10",
    "train.val_every=50",
    "train.val_batches=1",
    "eval.factors=[1,2,4]",
    "eval.tokens=2048",
    "+finetune@finetunes.pi=pi",
    "finetunes.pi.steps=40",
    "finetunes.pi.warmup_steps=5",
    "+finetune@finetunes.ft=ft",
    "finetunes.ft.steps=40",
    "finetunes.ft.warmup_steps=5",
]
# The killed process's own log lines, in the order a run writes them: the phase each starts.
PHASES = [
    (r"records to compute, ", "train"),
    (r"all \d+ records are there", "report"),
    (r"\btrain \w+: \d+ steps in", "evaluate"),
    (r"finetune \w+:(\w+): \d+ records to compute", "finetune {}"),
    (r"finetune \w+:(\w+): \d+ steps in", "evaluate {}"),
    (r"run \S+: done, ", "report"),
    (r"^report: ", "ended"),
]
OUT = Path(__file__).parents[1] / "results" / "kill_anywhere"


@dataclass
class Trial:
    number: int
    kills: list[tuple[float, str]] = field(default_factory=list)  # (delay s, phase)
    mismatches: list[str] = field(default_factory=list)


@dataclass
class Summary:
    duration: float  # the reference run's wall time, s
    trials: list[Trial]

    @property
    def mismatches(self) -> list[str]:
        return [f"trial {t.number}: {m}" for t in self.trials for m in t.mismatches]


def start(out_root: Path, log: Path) -> subprocess.Popen:
    """``pe-bench COMMAND`` writing under ``out_root``, its output (unbuffered) to ``log``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    args = [sys.executable, "-m", "pe_bench.cli", *COMMAND, f"out_root={out_root}"]
    with open(log, "a") as f:
        return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env)


def run_to_end(out_root: Path, log: Path) -> float:
    """Run the command to its end; returns when it started (``time.time()``)."""
    started = time.time()
    proc = start(out_root, log)
    if proc.wait(timeout=600) != 0:
        raise RuntimeError(f"pe-bench failed (exit {proc.returncode}); see {log}")
    return started


def timeline(text: str, started: float, ended: float) -> list[tuple[str, float, float]]:
    """The phases of an uninterrupted run's log: (phase, from, to) in s after its start, from
    the timestamps of the lines that start them."""
    edges = [("startup", 0.0)]
    for line in text.splitlines():
        stamp = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]", line)
        now = phase(line, default="")
        if now and stamp:
            at = dt.datetime.strptime(stamp[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() - started
            edges.append((now, at))
    edges.append(("ended", ended - started))
    return [(name, a, b) for (name, a), (_, b) in itertools.pairwise(edges) if b > a]


def run_and_kill(out_root: Path, log: Path, delay: float) -> str:
    """Start the command, SIGKILL it after ``delay`` s; the phase it was in (from its log)."""
    mark = log.stat().st_size if log.exists() else 0
    proc = start(out_root, log)
    try:
        proc.wait(timeout=delay)
        return "ended before the kill"
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with open(log) as f:
        f.seek(mark)
        return phase(f.read())


def phase(text: str, default: str = "startup") -> str:
    """The phase of the last line in ``text`` that starts one (``PHASES``)."""
    current = default
    for line in text.splitlines():
        for pattern, name in PHASES:
            found = re.search(pattern, line)
            if found:
                current = name.format(*found.groups())
    return current


def job_folder(out_root: Path) -> Path:
    (folder,) = (out_root / "default").iterdir()
    return folder


def compare(ref_root: Path, got_root: Path) -> list[str]:
    """What differs between the two runs' job folders (empty: every file is equal)."""
    ref, got = job_folder(ref_root), job_folder(got_root)
    if ref.name != got.name:
        return [f"job folder {got.name} is not {ref.name}"]
    return compare_folders(ref, got, (str(got_root), str(ref_root)))


def trial(number: int, ref_root: Path, work: Path, rng: random.Random, phases: list) -> Trial:
    """Kill the command once (a third of the time twice), rerun it to the end, compare. The
    first kill's delay is drawn across the reference run's duration, phase by phase: a phase
    at random, then a moment in it (training takes a second of a run mostly spent importing
    and drawing figures); a second kill's delay across the whole duration."""
    out_root, log = work / f"trial-{number:02d}", work / f"trial-{number:02d}.log"
    result = Trial(number)
    _, low, high = rng.choice(phases)
    delays = [rng.uniform(low, high)]
    if rng.random() < 1 / 3:
        delays.append(rng.uniform(0, phases[-1][2]))
    for delay in delays:
        result.kills.append((delay, run_and_kill(out_root, log, delay)))
    run_to_end(out_root, log)
    result.mismatches = compare(ref_root, out_root)
    return result


def run_trials(work: Path, trials: int, seed: int, echo: bool = False) -> Summary:
    """The reference run, then ``trials`` kill trials under ``work``; what they found."""
    ref_root, ref_log = work / "reference", work / "reference.log"
    started = run_to_end(ref_root, ref_log)
    phases = timeline(ref_log.read_text(), started, time.time())
    rng = random.Random(seed)
    summary = Summary(phases[-1][2], [])
    for number in range(1, trials + 1):
        summary.trials.append(trial(number, ref_root, work, rng, phases))
        if echo:
            print(row(summary.trials[-1]), flush=True)
    return summary


def row(t: Trial) -> str:
    kills = "; ".join(f"{delay:.2f} s ({where})" for delay, where in t.kills)
    verdict = "equal" if not t.mismatches else "MISMATCH: " + ", ".join(t.mismatches)
    return f"| {t.number} | {kills} | {verdict} |"


def markdown(summary: Summary, seed: int, elapsed: float) -> str:
    """The table, the summary and the provenance, as committed."""
    phases: dict[str, int] = {}
    for t in summary.trials:
        for _, where in t.kills:
            phases[where] = phases.get(where, 0) + 1
    kills = sum(len(t.kills) for t in summary.trials)
    bad = [t for t in summary.trials if t.mismatches]
    lines = [
        "# Kill-anywhere trials",
        "",
        "Written by `experiments/kill_anywhere.py` (its docstring says what is compared and",
        f"what is ignored: the record fields {', '.join(IGNORED)}; checkpoints' `elapsed`;",
        "those values in report.md and the cost table; `cli.log`).",
        "",
        f"- result: **{len(summary.trials) - len(bad)} of {len(summary.trials)} trials equal**"
        f" to the uninterrupted run ({kills} kills; {len(summary.mismatches)} mismatches)",
        "- kills by phase: " + ", ".join(f"{k} {n}" for k, n in sorted(phases.items())),
        f"- reference run: {summary.duration:.1f} s; all trials: {elapsed / 60:.1f} min",
        f"- command: `pe-bench {shlex.join(COMMAND)} out_root=<trial folder>`",
        f"- seed: {seed}; git: {git_sha()}; date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d}",
        f"- hardware: {device_name(torch.device('cpu'))}; torch {torch.__version__};"
        f" OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
        "",
        "| trial | kills: delay after start (phase) | result |",
        "|---:|:---|:---|",
        *(row(t) for t in summary.trials),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--place-trials", type=int, default=0, help="kill_together.py's")
    parser.add_argument("--place-pair-trials", type=int, default=0)
    parser.add_argument("--sweep-pair-trials", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT, help="where the table is written")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: temp)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    counts = {
        "place": args.place_trials,
        "place-pair": args.place_pair_trials,
        "sweep-pair": args.sweep_pair_trials,
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kill_anywhere-") as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        summary = run_trials(work, args.trials, args.seed, echo=True)
        together, kinds = kill_together.run_trials(work / "together", counts, args.seed, True)
    text = markdown(summary, args.seed, time.perf_counter() - started)
    if together:
        text += "\n".join(kill_together.markdown(together, kinds))
    atomic_write_text(args.out / "trials.md", text)
    print(text)
    return 1 if summary.mismatches or any(t.mismatches for t in together) else 0


if __name__ == "__main__":
    sys.exit(main())
