"""Kill-anywhere, grown (issue 29): placements killed anywhere, their copy included, and two
processes on one folder at once, one of them sometimes killed.

Three kinds of trial, each against an uninterrupted run of the same command (its reference):

- ``place``: ``pe-bench-place my_pe --onto <committed> --out <trial>/placed`` SIGKILLed (its
  process group: the placement and the sweep it started), in half the trials as soon as its
  temporary copy appears (during the copy), else after a random delay, a third of the trials
  a second time after a random delay, then rerun to its end.
- ``place-pair``: the same placement started twice at once into one ``--out``; in half the
  trials one of the two is SIGKILLed (half of those during the copy) and rerun after.
- ``sweep-pair``: ``pe-bench -m pe=alibi,nope,rope`` started twice at once into one folder;
  in half the trials one of the two is SIGKILLed and rerun after.

Each trial's folder is then compared with the reference's file by file as
``same_outputs.compare_folders`` does (records row by row less time, memory, date and host;
checkpoints less ``elapsed``; report and cost table masked the same way; every other file byte
for byte; ``cli.log`` left out: every process appends to it). Beside that, every process that
exits 0 must leave its outputs at that moment (the report, and each job folder's records as
many as the reference's), a process that is not killed must exit 0, and no temporary copy
(``.placed.copy-*``) may be left. A delay is drawn as in ``kill_anywhere``: a phase of the
reference run at random (read from its output, which this script stamps with the time of
each line), then a moment in it.

The committed folder is a tiny sweep (rope and alibi, seeds 0 and 1, checkpoints removed as in
a committed folder) padded with ``PADDING_FILES`` files of ``PADDING_BYTES`` bytes in all,
results/zoo's size, which no report reads: its copy then takes as long as one of results/zoo
(a few hundredths of a second from the page cache, more from disk), long enough for a kill
triggered by the temporary copy's appearance (polled every millisecond) to land in it.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from same_outputs import compare_folders

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "my_pe"
# Each job trains 60 steps and scores 3 lengths (about 2 s of a tiny model on one thread).
PROTOCOL = [
    "model=smoke",
    "train.seq_len=16",
    "train.batch_size=8",
    "train.steps=60",
    "train.ckpt_every=10",
    "train.log_every=10",
    "train.val_every=0",
    "train.val_batches=1",
    "eval.factors=[1,2,4]",
    "eval.tokens=1024",
    "eval.probes=[]",
]
COMMITTED = ["-m", "pe=rope,alibi", "train.seed=0,1", "name=committed", *PROTOCOL]
SWEEP = ["-m", "pe=alibi,nope,rope", *PROTOCOL]
PADDING_FILES, PADDING_BYTES = 700, 16 * 2**20
# The phase a line of output starts (the last match wins), as kill_anywhere.PHASES.
PHASES = [
    (r"^pe-bench-place: copying ", "copy"),
    (r"^pe-bench-place: pe-bench -m ", "sweep startup"),
    (r"records to compute, ", "train"),
    (r"\btrain \w+: \d+ steps in", "evaluate"),
    (r"all \d+ records are there", "job found"),
    (r"another pe-bench run holds it", "waiting"),
    (r"sweep: \d+/\d+ jobs done", "between jobs"),
    (r"sweep: (\d+)/\1 jobs done", "report"),
    (r"^report: |pe-bench-place: my_pe beside", "ended"),
]


@dataclass
class Trial:
    kind: str
    number: int
    events: list[str] = field(default_factory=list)  # what happened, in order
    mismatches: list[str] = field(default_factory=list)


class Run:
    """A command in its own process group; its output, each line stamped with the time since
    it started, appended to ``log`` and kept (``lines``)."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.started = time.time()
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, args=(log,), daemon=True)
        self.reader.start()

    def _read(self, log: Path) -> None:
        with open(log, "a") as f:
            for line in self.proc.stdout:
                at = time.time() - self.started
                self.lines.append((at, line.rstrip("\n")))
                f.write(f"[{at:8.3f}] {line}")
                f.flush()

    def kill(self) -> str:
        """SIGKILL the whole process group now; the phase it was in."""
        at = time.time() - self.started
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.reader.join()
        return phase([line for t, line in self.lines if t <= at])

    def wait(self) -> int:
        code = self.proc.wait(timeout=900)
        self.reader.join()
        return code


def phase(lines: list[str], default: str = "startup") -> str:
    current = default
    for line in lines:
        for pattern, name in PHASES:
            if re.search(pattern, line):
                current = name
    return current


def environment() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(PLUGIN), os.environ.get("PYTHONPATH")]))
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "HYDRA_FULL_ERROR": "0",
        "PYTHONPATH": path,
    }


def place_command(committed: Path, out: Path) -> list[str]:
    code = "from pe_bench.cli.place import main; main()"
    args = ["my_pe", "--onto", str(committed), "--plugin", "my_pe", "--out", str(out)]
    return [sys.executable, "-c", code, *args]


def sweep_command(out_root: Path) -> list[str]:
    return [sys.executable, "-m", "pe_bench.cli", *SWEEP, f"out_root={out_root}"]


def make_committed(work: Path) -> Path:
    """The committed folder placements go onto (module docstring)."""
    log = work / "committed.log"
    args = [sys.executable, "-m", "pe_bench.cli", *COMMITTED, f"out_root={work}"]
    if Run(args, log, environment()).wait() != 0:
        raise RuntimeError(f"the committed sweep failed; see {log}")
    committed = work / "committed"
    for checkpoint in committed.rglob("*.pt"):
        checkpoint.unlink()
    rng = random.Random(0)
    for i in range(PADDING_FILES):
        path = committed / "padding" / f"part-{i // 100}" / f"{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(PADDING_BYTES // PADDING_FILES))
    return committed


@dataclass
class Kind:
    """A kind of trial: its command for a trial folder, where its outputs are, and what its
    reference run's output says about its phases."""

    name: str
    command: Callable[[Path], list[str]]  # trial folder -> argv
    outputs: Callable[[Path], Path]  # trial folder -> the folder compared with the reference's
    root: Path  # the reference run's trial folder
    phases: list[tuple[str, float, float]]

    @property
    def reference(self) -> Path:
        return self.outputs(self.root)


def timeline(run: Run, ended: float) -> list[tuple[str, float, float]]:
    """(phase, from, to) in s after the start, from the stamped lines of an uninterrupted run."""
    edges, current = [("startup", 0.0)], "startup"
    for at, line in run.lines:
        now = phase([line], default="")
        if now and now != current:
            edges.append((now, at))
            current = now
    edges.append(("end", ended))
    return [(name, a, b) for (name, a), (_, b) in itertools.pairwise(edges) if b > a]


def reference(
    name: str, work: Path, command: Callable[[Path], list[str]], outputs: Callable[[Path], Path]
) -> Kind:
    """The uninterrupted run of a kind, in ``work / f"reference-{name}"``."""
    folder = work / f"reference-{name}"
    folder.mkdir(parents=True)
    run = Run(command(folder), work / f"reference-{name}.log", environment())
    if run.wait() != 0:
        raise RuntimeError(f"the {name} reference failed; see its log")
    return Kind(name, command, outputs, folder, timeline(run, time.time() - run.started))


def delay(kind: Kind, rng: random.Random) -> float:
    _, low, high = rng.choice(kind.phases)
    return rng.uniform(low, high)


def check_outputs(kind: Kind, got: Path) -> list[str]:
    """What a process that exited 0 should have left and did not: the report, and each job
    folder's records (as many lines as the reference's)."""
    problems = [] if (got / "report.md").exists() else ["no report.md"]
    for records in kind.reference.rglob("records.jsonl"):
        rel = records.relative_to(kind.reference)
        mine = got / rel
        if not mine.exists() or len(mine.read_text().splitlines()) < len(
            records.read_text().splitlines()
        ):
            problems.append(f"{rel.parent}: records missing")
    return problems


def finish(kind: Kind, folder: Path, run: Run, result: Trial, who: str) -> None:
    """Wait for ``run``: it must exit 0, its outputs there when it does."""
    code = run.wait()
    result.events.append(f"{who} exit {code}")
    if code != 0:
        result.mismatches.append(f"{who} exited {code}")
    else:
        result.mismatches += [f"{who} exited 0 with {p}" for p in check_outputs(kind, folder)]


def kill(run: Run, kind: Kind, folder: Path, rng: random.Random, in_copy: bool) -> str:
    """SIGKILL ``run`` as soon as the placement's temporary copy (``.placed.copy-*``) appears
    (``in_copy``: the copy lasts a fraction of a second, too short to hit with a delay), else
    at a random moment of the reference's phases; what happened, for the table."""
    if in_copy:
        while not (copies := list(folder.glob(".placed.copy-*"))):
            if run.proc.poll() is not None:
                return "ended before a copy began"
            time.sleep(0.001)
        run.kill()
        if not copies[0].exists():
            return "killed as its copy ended (renamed)"
        done = sum(1 for p in copies[0].rglob("*") if p.is_file())
        total = sum(1 for p in kind.reference.rglob("*") if p.is_file())
        return f"killed in the copy ({done} files copied, of about {total})"
    wait = delay(kind, rng)
    try:
        run.proc.wait(timeout=max(wait - (time.time() - run.started), 0.0))
        return f"ended before the kill at {wait:.2f} s"
    except subprocess.TimeoutExpired:
        return f"killed at {wait:.2f} s ({run.kill()})"


def killed_then_rerun(kind: Kind, number: int, work: Path, rng: random.Random) -> Trial:
    """A ``place`` trial: kill the command once (a third of the time twice; the first kill in
    half the trials during the copy), rerun it."""
    folder, log = work / f"{kind.name}-{number:02d}", work / f"{kind.name}-{number:02d}.log"
    folder.mkdir(parents=True)
    result = Trial(kind.name, number)
    in_copy = rng.random() < 1 / 2
    for _ in range(2 if rng.random() < 1 / 3 else 1):
        run = Run(kind.command(folder), log, environment())
        result.events.append(kill(run, kind, folder, rng, in_copy))
        in_copy = False  # the copy is made once: a later kill lands elsewhere
    rerun = Run(kind.command(folder), log, environment())
    finish(kind, kind.outputs(folder), rerun, result, "rerun")
    compared(kind, folder, result)
    return result


def pair(kind: Kind, number: int, work: Path, rng: random.Random) -> Trial:
    """A ``*-pair`` trial: the command twice at once (the second 0-1 s after the first); in
    half the trials one of them is killed (a placement's, half the time, as its copy begins),
    then rerun."""
    folder, log = work / f"{kind.name}-{number:02d}", work / f"{kind.name}-{number:02d}.log"
    folder.mkdir(parents=True)
    result = Trial(kind.name, number)
    first = Run(kind.command(folder), log, environment())
    offset = rng.uniform(0, 1)
    time.sleep(offset)
    second = Run(kind.command(folder), log, environment())
    result.events.append(f"second started {offset:.2f} s after the first")
    runs = {"first": first, "second": second}
    victim = rng.choice(["first", "second"]) if rng.random() < 0.5 else None
    if victim is not None:
        in_copy = kind.name.startswith("place") and rng.random() < 1 / 2
        what = kill(runs[victim], kind, folder, rng, in_copy)
        result.events.append(f"{victim} {what}")
        if not what.startswith("killed"):
            victim = None
    for who, run in runs.items():
        if who != victim:
            finish(kind, kind.outputs(folder), run, result, who)
    if victim is not None:
        rerun = Run(kind.command(folder), log, environment())
        finish(kind, kind.outputs(folder), rerun, result, f"{victim} rerun")
    compared(kind, folder, result)
    return result


def compared(kind: Kind, folder: Path, result: Trial) -> None:
    """The trial's outputs against the reference's; no temporary copy left."""
    rename = (str(folder), str(kind.root))
    result.mismatches += compare_folders(kind.reference, kind.outputs(folder), rename)
    result.mismatches += [f"left {p.name}" for p in folder.glob(".*.copy-*")]


def kinds(work: Path, counts: dict[str, int]) -> list[Kind]:
    """The references of the kinds with trials (the committed folder made first)."""
    wanted = [name for name in ("place", "place-pair", "sweep-pair") if counts.get(name)]
    work.mkdir(parents=True, exist_ok=True)
    committed = make_committed(work) if {"place", "place-pair"} & set(wanted) else None
    made: list[Kind] = []
    for name in wanted:
        if name == "sweep-pair":
            made.append(reference(name, work, sweep_command, lambda f: f / "default"))
        elif made and made[-1].name == "place":  # the same command: the same reference
            made.append(dataclasses.replace(made[-1], name=name))
        else:
            made.append(
                reference(name, work, lambda f: place_command(committed, f / "placed"), placed)
            )
    return made


def placed(folder: Path) -> Path:
    return folder / "placed"


def run_trials(
    work: Path, counts: dict[str, int], seed: int, echo: bool = False
) -> tuple[list[Trial], list[Kind]]:
    """``counts[kind]`` trials of each kind under ``work``: what they found, and the kinds
    (their references' phases)."""
    rng = random.Random(seed)
    trials, made = [], kinds(work, counts)
    for kind in made:
        run = killed_then_rerun if kind.name == "place" else pair
        for number in range(1, counts.get(kind.name, 0) + 1):
            trials.append(run(kind, number, work, rng))
            if echo:
                print(row(trials[-1]), flush=True)
    return trials, made


def row(t: Trial) -> str:
    verdict = "equal" if not t.mismatches else "MISMATCH: " + ", ".join(t.mismatches)
    return f"| {t.kind} | {t.number} | {'; '.join(t.events)} | {verdict} |"


def markdown(trials: list[Trial], kinds_run: list[Kind]) -> list[str]:
    """The section of results/kill_anywhere/trials.md on these trials."""
    bad = [t for t in trials if t.mismatches]
    exits = sum(e.endswith("exit 0") for t in trials for e in t.events)
    lost = sum("no report.md" in m for t in trials for m in t.mismatches)
    lines = [
        "## Placements and two processes at once",
        "",
        "Written by `experiments/kill_together.py` (its docstring says what each kind does and",
        "what is compared).",
        "",
        f"- result: **{len(trials) - len(bad)} of {len(trials)} trials equal** to the"
        f" uninterrupted run; {exits} exits with status 0, each with its report and records"
        f" there; {lost} reports lost",
    ]
    for kind in kinds_run:
        shown = ", ".join(f"{n} {a:.1f}-{b:.1f} s" for n, a, b in kind.phases)
        lines.append(f"- {kind.name}: the reference run's phases: {shown}")
    lines += [
        f"- commands: `pe-bench-place my_pe --onto <committed> --plugin my_pe --out"
        f" <trial>/placed` and `pe-bench {' '.join(SWEEP)} out_root=<trial>`",
        "",
        "| kind | trial | what happened | result |",
        "|:---|---:|:---|:---|",
        *(row(t) for t in trials),
        "",
    ]
    return lines
