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

``--sigint-trials`` interrupt the command as Ctrl-C does (SIGINT) instead, delays drawn the
same way, and also require of each interrupted process one line saying so as its last, exit
status 130 and no traceback; or, where the Ctrl-C came once the work had ended (its report
line written, the interpreter shutting down), exit status 0 and nothing more
(``cli.console.end_on_ctrl_c``). ``--plugin-trial`` runs a sweep of ``PLUGIN_SWEEP``'s jobs,
one of whose schemes raises in training (``tests/plugins/hook_raises.py``), against the sweep
of the other jobs alone: the failing job named once, exit status 1, no traceback on the
console, the others' folders equal to the reference's and the report written.

The phase a kill landed in is read from the killed process's own log. Writes a table and a
summary with provenance to ``results/kill_anywhere/`` (atomically) and exits 1 on any mismatch.

    OMP_NUM_THREADS=1 python experiments/kill_anywhere.py --trials 24 --sigint-trials 12 \
        --plugin-trial --seed 0
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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import kill_together
import torch
from same_outputs import IGNORED, compare_folders

from pe_bench.files import atomic_write_text
from pe_bench.provenance import device_name, git_sha

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
ROOT = Path(__file__).parents[1]
# The longest a run may take before the experiment gives up on it: on a 2-core machine busy
# with 20 other processes a rerun that only found its records took over 10 minutes.
WAIT = 3600  # s
# pe-bench's exit status after Ctrl-C (pe_bench.cli.console), or its death by SIGINT, which a
# shell reports as 130 too: a Ctrl-C while torch is imported sometimes makes Python end by
# its own SIGINT after pe-bench's line (seen in 1 of 12 interrupts 1.6-2.7 s into a run)
INTERRUPTED = (130, -signal.SIGINT)
INTERRUPTED_LINE = "pe-bench: interrupted; rerun the same command to resume"
# A sweep whose second job's scheme raises in training (the key's probe runs without
# gradients, so the plan accepts it), against the sweep of the first alone.
PLUGIN_JOBS = ["pe=nope", "+pe.plugin=tests.plugins.hook_raises", *COMMAND[1:11]]
PLUGIN_SWEEP = ["-m", *PLUGIN_JOBS, "pe.name=nope,train_raises"]
PLUGIN_REFERENCE = ["-m", *PLUGIN_JOBS, "pe.name=nope"]


@dataclass
class Trial:
    number: int
    kills: list[tuple[float, str]] = field(default_factory=list)  # (delay s, phase)
    mismatches: list[str] = field(default_factory=list)
    kind: str = "SIGKILL"
    failed_job: str = ""  # the plugin trial's failed job, as its one line names it (no kill)


@dataclass
class Summary:
    duration: float  # the reference run's wall time, s
    trials: list[Trial]

    @property
    def mismatches(self) -> list[str]:
        return [f"trial {t.number}: {m}" for t in self.trials for m in t.mismatches]


def start(out_root: Path, log: Path, command: list[str] = COMMAND) -> subprocess.Popen:
    """``pe-bench COMMAND`` writing under ``out_root``, its output (unbuffered) to ``log``;
    the repository on the path (the plugin trial's plugin is in tests/plugins/)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    args = [sys.executable, "-m", "pe_bench.cli", *command, f"out_root={out_root}"]
    with open(log, "a") as f:
        return subprocess.Popen(
            args, stdout=f, stderr=subprocess.STDOUT, env=env, preexec_fn=ctrl_c_as_from_a_shell
        )


def ctrl_c_as_from_a_shell() -> None:
    """In the child, before it starts: SIGINT acts as it does for a command typed in a shell.
    An experiment started in the background by a script (``nohup ... &``) ignores SIGINT, and
    a child inherits an ignored signal: its runs slept through every Ctrl-C trial and ended as
    if never interrupted (the rerun of 2026-11-27, whose 12 SIGINT trials were all 'ended')."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_to_end(out_root: Path, log: Path) -> float:
    """Run the command to its end; returns when it started (``time.time()``)."""
    started = time.time()
    proc = start(out_root, log)
    if proc.wait(timeout=WAIT) != 0:
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


def run_and_kill(
    out_root: Path, log: Path, delay: float, sig: int = signal.SIGKILL
) -> tuple[str, str]:
    """Start the command, send it ``sig`` after ``delay`` s; the phase it was in (from its
    log), and what was wrong with how it ended ('' if nothing): after SIGINT, its last line
    must say it was interrupted, with status 130 (``INTERRUPTED``) and no traceback, or (the
    work had ended) status 0 without a traceback."""
    mark = log.stat().st_size if log.exists() else 0
    proc = start(out_root, log)
    try:
        proc.wait(timeout=delay)
        return "ended before the kill", ""
    except subprocess.TimeoutExpired:
        killed_at = log.stat().st_size  # the phase is the one the signal found, not the last
        os.kill(proc.pid, sig)
        status = proc.wait()
    with open(log, "rb") as f:
        f.seek(mark)
        written = f.read()
    text = written.decode(errors="replace")
    where, wrong = phase(written[: killed_at - mark].decode(errors="replace")), ""
    if sig == signal.SIGINT:
        last = (text.strip().splitlines() or [""])[-1]
        said = status in INTERRUPTED and last.startswith(INTERRUPTED_LINE)
        done = status == 0 and where == "ended"  # in Python's shutdown: the work had ended
        if not (said or done) or "Traceback" in text:
            wrong = f"exit {status}, last line {last[:120]!r}"
    return where, wrong


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


def trial(
    number: int,
    ref_root: Path,
    work: Path,
    rng: random.Random,
    phases: list,
    sig: int = signal.SIGKILL,
) -> Trial:
    """Kill (or interrupt, ``sig``) the command once (a third of the time twice), rerun it to
    the end, compare. The first kill's delay is drawn across the reference run's duration,
    phase by phase: a phase at random, then a moment in it (training takes a second of a run
    mostly spent importing and drawing figures); a second kill's delay across the whole
    duration."""
    kind = signal.Signals(sig).name
    out_root, log = work / f"{kind}-{number:02d}", work / f"{kind}-{number:02d}.log"
    result = Trial(number, kind=kind)
    _, low, high = rng.choice(phases)
    delays = [rng.uniform(low, high)]
    if rng.random() < 1 / 3:
        delays.append(rng.uniform(0, phases[-1][2]))
    for delay in delays:
        where, wrong = run_and_kill(out_root, log, delay, sig)
        result.kills.append((delay, where))
        result.mismatches += [f"interrupted at {delay:.2f} s: {wrong}"] if wrong else []
    run_to_end(out_root, log)
    result.mismatches += compare(ref_root, out_root)
    return result


def plugin_trial(work: Path) -> Trial:
    """The sweep with a job whose plugin raises in training, against the sweep without it."""
    result = Trial(1, kind="plugin failure")
    ref_root, got_root = work / "plugin-reference", work / "plugin-trial"
    if start(ref_root, work / "plugin-reference.log", PLUGIN_REFERENCE).wait(timeout=WAIT):
        return Trial(1, mismatches=["the reference sweep failed"], kind=result.kind)
    log = work / "plugin-trial.log"
    status = start(got_root, log, PLUGIN_SWEEP).wait(timeout=WAIT)
    text = log.read_text()
    failed = [line for line in text.splitlines() if "failed: " in line]
    if status != 1 or len(failed) != 1 or "RuntimeError" not in failed[0] or "Traceback" in text:
        result.mismatches.append(f"exit {status}, {len(failed)} failed lines")
    if not (got_root / "default" / "report.md").exists():
        result.mismatches.append("no report")
    for ref in (ref_root / "default").iterdir():
        if ref.is_dir():
            renamed = (str(got_root), str(ref_root))
            result.mismatches += compare_folders(ref, got_root / "default" / ref.name, renamed)
    result.failed_job = failed[0].split("failed: ", 1)[1][:80] if failed else "none"
    return result


def run_trials(
    work: Path, trials: int, seed: int, echo: bool = False, sigint: int = 0, plugin: bool = False
) -> Summary:
    """The reference run, then ``trials`` SIGKILL trials, ``sigint`` SIGINT trials and, with
    ``plugin``, the plugin trial under ``work``; what they found."""
    ref_root, ref_log = work / "reference", work / "reference.log"
    started = run_to_end(ref_root, ref_log)
    phases = timeline(ref_log.read_text(), started, time.time())
    rng = random.Random(seed)
    summary = Summary(phases[-1][2], [])
    kinds = [signal.SIGKILL] * trials + [signal.SIGINT] * sigint
    for number, sig in enumerate(kinds, 1):
        summary.trials.append(trial(number, ref_root, work, rng, phases, sig))
        if echo:
            print(row(summary.trials[-1]), flush=True)
    if plugin:
        summary.trials.append(plugin_trial(work))
        if echo:
            print(row(summary.trials[-1]), flush=True)
    return summary


def row(t: Trial) -> str:
    kills = "; ".join(f"{delay:.2f} s ({where})" for delay, where in t.kills)
    if t.kind == "plugin failure":
        kills = f"failed job named: {t.failed_job}"
    verdict = "equal" if not t.mismatches else "MISMATCH: " + ", ".join(t.mismatches)
    return f"| {t.number} | {t.kind} | {kills} | {verdict} |"


def markdown(summary: Summary, seed: int, elapsed: float) -> str:
    """The table, the summary and the provenance, as committed."""
    phases: dict[str, int] = {}
    for t in summary.trials:
        for _, where in t.kills:
            phases[where] = phases.get(where, 0) + 1
    kills = sum(len(t.kills) for t in summary.trials)
    bad = [t for t in summary.trials if t.mismatches]
    by_kind = Counter(t.kind for t in summary.trials)
    lines = [
        "# Kill-anywhere trials",
        "",
        "Written by `experiments/kill_anywhere.py` (its docstring says what is compared and",
        f"what is ignored: the record fields {', '.join(IGNORED)}; checkpoints' `elapsed`;",
        "those values in report.md and the cost table; `cli.log`).",
        "",
        f"- result: **{len(summary.trials) - len(bad)} of {len(summary.trials)} trials equal**"
        f" to the uninterrupted run ({kills} kills; {len(summary.mismatches)} mismatches)",
        "- trials by kind: " + ", ".join(f"{k} {n}" for k, n in by_kind.items()),
        "- SIGINT (Ctrl-C): each interrupted process's last line says so, exit status 130 (as a"
        " shell reports it: the status, or death by SIGINT), no traceback (or, a Ctrl-C once"
        " the work had ended, exit 0 and nothing more); plugin"
        " failure: `pe-bench "
        f"{shlex.join(PLUGIN_SWEEP)}` against the sweep without `train_raises`: the failed job"
        " named once, exit 1, no traceback, the other job's folder equal, the report written",
        "- kills by phase: " + ", ".join(f"{k} {n}" for k, n in sorted(phases.items())),
        f"- reference run: {summary.duration:.1f} s; all trials: {elapsed / 60:.1f} min",
        f"- command: `pe-bench {shlex.join(COMMAND)} out_root=<trial folder>`",
        f"- seed: {seed}; git: {git_sha()}; date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d}",
        f"- hardware: {device_name(torch.device('cpu'))}; torch {torch.__version__};"
        f" OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
        "",
        "| trial | kind | kills: delay after start (phase) | result |",
        "|---:|:---|:---|:---|",
        *(row(t) for t in summary.trials),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24, help="SIGKILL trials")
    parser.add_argument("--sigint-trials", type=int, default=0, help="Ctrl-C (SIGINT) trials")
    parser.add_argument("--plugin-trial", action="store_true", help="a plugin failing in a sweep")
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
        summary = run_trials(
            work, args.trials, args.seed, True, args.sigint_trials, args.plugin_trial
        )
        together, kinds = kill_together.run_trials(work / "together", counts, args.seed, True)
    text = markdown(summary, args.seed, time.perf_counter() - started)
    if together:
        text += "\n".join(kill_together.markdown(together, kinds))
    atomic_write_text(args.out / "trials.md", text)
    print(text)
    return 1 if summary.mismatches or any(t.mismatches for t in together) else 0


if __name__ == "__main__":
    sys.exit(main())
