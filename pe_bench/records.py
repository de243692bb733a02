"""Records: one JSON line per (run, variant, eval length, mode), written atomically.

Each run directory holds ``records.jsonl`` (the numbers), ``positions.jsonl`` (per-position
loss per eval length) and ``curve.jsonl`` (training curve); ``pe_bench.run.store.RunStore`` owns
them. ``make_record`` builds every record and ``RECORD_KEY`` names what identifies one. Files
are rewritten whole through a temporary file and ``os.replace``, so a crash leaves the old file
or the new one, never a half line (``atomic_write``, also for the report's figures).
``load_records`` reads every ``records.jsonl`` under a folder into one DataFrame, refusing a
file that is not JSON lines or that holds more than one trained run.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import os
import platform
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import Any, BinaryIO

import pandas as pd
import torch

from pe_bench.errors import UserError

log = logging.getLogger(__name__)

RECORDS = "records.jsonl"
POSITIONS = "positions.jsonl"
CURVE = "curve.jsonl"
COMMANDS = "commands.txt"  # in a sweep folder: the command of every sweep that wrote into it

# A record's identity within its run (with its ``run_id``): a record with the same run id and
# the same values of these fields is the same measurement, computed once.
# The ``mode`` of a record says what it measures:
# perplexity over windows (pe_bench/run/evaluate.py); tail, a pretrained model's only: windows
# that end at the scored targets, each scoring its last eval.stride (pe_bench/pretrained/tail.py);
# truncate, a pretrained model's only: documents truncated to the window, every position scored
# (the papers' protocol, pe_bench/pretrained/truncate.py)
MODES = ("nonoverlap", "sliding", "tail", "truncate")
TAIL_MODE = "tail"
TRUNCATE_MODE = "truncate"
PROBES = ("context_gain", "retrieval", "attention")  # context-use probes (pe_bench/run/probes.py)
TASK_MODE = "task"  # a synthetic task (pe_bench/data/tasks.py): instances, not windows
PASSKEY_MODE = "passkey"  # passkey retrieval on a pretrained model (pe_bench/pretrained/passkey.py)
# RULER's tasks on a pretrained model, mode "ruler:<task>" (pe_bench/pretrained/ruler_eval.py)
RULER_MODE = "ruler"
RECORD_KEY = ("variant", "variant_hash", "eval_len", "mode", "stride", "tokens")


def is_ruler(mode: object) -> bool:
    """Whether a record's ``mode`` is one of RULER's tasks."""
    return isinstance(mode, str) and mode.startswith(f"{RULER_MODE}:")


def sweep_command(overrides: Iterable[str]) -> str:
    """The ``pe-bench -m`` command line of a sweep with ``overrides``, as ``COMMANDS`` and the
    report's Reproduce section write it."""
    return shlex.join(["pe-bench", "-m", *overrides])


def searchpath(hydra_overrides: list[str]) -> list[str]:
    """The ``hydra.searchpath=...`` and ``hydra.sweep.dir=...`` overrides among Hydra's own: a
    command that finds a plugin's YAML through the one, or writes where the other says,
    cannot be rerun without them."""
    kept = ("hydra.searchpath", "hydra.sweep.dir")
    return [o for o in hydra_overrides if o.split("=", 1)[0] in kept]


def record_key(record: dict) -> tuple:
    """The values of ``RECORD_KEY`` in ``record``, run id first."""
    return (record.get("run_id"), *(record.get(f) for f in RECORD_KEY))


def make_record(
    run: dict[str, Any],
    key: dict[str, Any],
    status: str,
    nll: float | None = None,
    bytes_per_token: float = 1.0,
    **details: Any,
) -> dict[str, Any]:
    """Every record pe-bench writes: the run's fields, the key's, the status, the numbers.

    ``status`` is ``ok`` (``nll`` given; ``details`` are costs such as ``time_s``), ``skipped``
    (``reason``) or ``diverged`` (``diverged_step``); the numbers are null unless ok.
    """
    numbers = {"nll": None, "ppl": None, "bpb": None}
    if nll is not None:
        numbers = {"nll": nll, "ppl": math.exp(nll), "bpb": bits_per_byte(nll, bytes_per_token)}
    if status == "ok":
        return {**run, **key, "status": status, **numbers, **details}
    return {**run, **key, "status": status, **details, **numbers}


def bits_per_byte(nll: float, bytes_per_token: float = 1.0) -> float:
    """Nats per token -> bits per byte of text."""
    return nll / math.log(2) / bytes_per_token


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write`` on a binary file that then replaces ``path`` whole, so that readers see
    the old file or the new one: a unique temporary file beside it (two writers never share
    one), flushed to disk, then ``os.replace``; removed if anything fails or interrupts. An
    ``OSError`` names ``path`` (a write that fails on a full disk names no file of its own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        cause = _os_error(err)  # torch.save's RuntimeError on a full disk hides an OSError
        if cause is not None and cause.filename is None:
            raise OSError(cause.errno, cause.strerror or str(cause), str(path)) from err
        raise


def _os_error(err: BaseException | None) -> OSError | None:
    """``err`` if it is an ``OSError``, else the one it was raised while handling."""
    while err is not None and not isinstance(err, OSError):
        err = err.__context__
    return err


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """``atomic_write`` of ``data``."""
    atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: Path, text: str) -> None:
    """``atomic_write_bytes`` of ``text`` as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(row, allow_nan=True) + "\n" for row in rows))


def read_jsonl(path: Path, move_aside: bool = False) -> list[dict]:
    """Rows of a JSON-lines file; corrupt lines are skipped with one log line naming the file
    and the first of them (once a process). With ``move_aside`` (the run that holds the job
    folder), they are moved to ``<name>.corrupt`` beside it, so that no later run or report
    meets them again and nothing is lost."""
    return [row for _, row in numbered_rows(path, move_aside)]


CORRUPT = ".corrupt"  # suffix of the file beside a JSON-lines file that holds its corrupt lines
_warned: set[tuple[str, tuple[int, ...]]] = set()  # (file, its corrupt lines) said once


def numbered_rows(path: Path, move_aside: bool = False) -> list[tuple[int, dict]]:
    """(line number, row) of each JSON object line of ``path``. Lines that are not a JSON
    object are skipped with one log line naming the file and the first of them (moved aside
    with ``move_aside``: ``read_jsonl``); a file that is not UTF-8 text (binary) is a
    ``UserError`` naming it."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(
            f"{path}: not a JSON-lines file (byte {err.start} is not UTF-8 text); "
            "pe-bench writes one JSON object per line"
        ) from None
    except OSError as err:
        raise UserError(f"{path}: cannot be read: {err.strerror}") from None
    rows, bad = [], []
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # as open() reads
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append((number, row))
        else:
            bad.append((number, line))
    if bad and move_aside:
        _move_aside(Path(path), [line for _, line in bad], [row for _, row in rows])
    elif bad and (str(path), tuple(n for n, _ in bad)) not in _warned:
        _warned.add((str(path), tuple(n for n, _ in bad)))
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        log.warning(
            "%s:%d: corrupt line skipped%s; the next pe-bench run of its job moves it to %s",
            path,
            bad[0][0],
            more,
            Path(path).name + CORRUPT,
        )
    return rows


def _move_aside(path: Path, lines: list[str], rows: list[dict]) -> None:
    """Append ``lines`` to ``path``'s ``.corrupt`` file, then rewrite ``path`` with ``rows``
    alone (in that order: a kill between the two leaves a line in both, never in neither)."""
    aside = path.with_name(path.name + CORRUPT)
    kept = aside.read_text(encoding="utf-8") if aside.exists() else ""
    atomic_write_text(aside, kept + "".join(f"{line}\n" for line in lines))
    write_jsonl(path, rows)
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    log.warning("%s: a corrupt line%s moved to %s", path, more, aside.name)


def load_records(root: str | Path, check: Callable[[dict], str] | None = None) -> pd.DataFrame:
    """Every record under ``root`` (multirun folders included) as one DataFrame, with the
    job folder each came from (``folder``, relative to ``root``).

    ``check`` returns what is wrong with a record ('' if nothing), e.g. a field the caller
    needs; a file with such a record, or with the records of more than one trained run, is a
    ``UserError`` naming it.
    """
    root = Path(root)
    if not root.exists():
        raise UserError(f"results folder {str(root)!r} does not exist")
    rows = []
    for file in sorted(root.rglob(RECORDS)):
        numbered = numbered_rows(file)
        for number, row in numbered if check else ():
            problem = check(row)
            if problem:
                raise UserError(f"{file}:{number}: {problem}")
        check_one_run(file, [row for _, row in numbered])
        folder = file.parent.relative_to(root).as_posix()
        rows += [{**row, "folder": folder} for _, row in numbered]
    if not rows:
        raise UserError(f"no records under {str(root)!r} (looked for **/{RECORDS})")
    return pd.DataFrame(rows)


def check_one_run(file: Path, rows: list[dict]) -> None:
    """Refuse a records file holding more than one trained run: a job folder holds one trained
    model (its run id, and ``<run_id>:<key>-<hash>`` for its fine-tunes), so other runs in it
    were put there by hand and would be averaged in as seeds."""
    runs = sorted({str(r["run_id"]).split(":")[0] for r in rows if r.get("run_id") is not None})
    if len(runs) > 1:
        raise UserError(
            f"{file} holds records of {len(runs)} trained runs ({', '.join(runs)}); a job "
            "folder holds one trained model and its fine-tunes: move each run into a folder "
            "of its own"
        )


CODE_PATHS = (":(top)pe_bench", ":(top)conf", ":(top)pyproject.toml")


@cache
def git_sha() -> str:
    """The code's git commit, with ``-dirty`` for uncommitted changes to what sets the numbers
    (the package, its configs, its pins; not results or docs, which runs themselves rewrite);
    ``unknown`` outside git."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS],
            cwd=here,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    plural = "" if threads == 1 else "s"
    return f"cpu ({platform.processor() or platform.machine()}, {threads} thread{plural})"


@cache
def cpu_model() -> str:
    """The CPU's model name: ``model name`` of /proc/cpuinfo (Linux), else the platform's
    processor string, else the machine type (``x86_64``)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return " ".join(value.split())
    return platform.processor() or platform.machine() or "unknown"


def provenance(device: torch.device) -> dict:
    """Where and with what a record was made. ``cpu_model`` and ``cpu_capability`` (the
    vector kernels ATen dispatches to: ``DEFAULT``, ``AVX2``, ``AVX512``, ...; it follows
    ``ATEN_CPU_CAPABILITY``) name what decides the last bits of a CPU run's numbers: two
    machines of another kind give other numbers (docs/reliability.md#determinism)."""
    return {
        "git_sha": git_sha(),
        "torch": torch.__version__.split("+")[0],
        "device": device.type,
        "hardware": device_name(device),
        "cpu_model": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory measurement (see ``peak_memory_mb``)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        with contextlib.suppress(OSError):  # Linux: "5" resets the peak RSS (VmHWM)
            Path("/proc/self/clear_refs").write_text("5")


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory since ``reset_peak_memory``: the CUDA allocator's peak on GPU; on CPU the
    process's peak resident set (Linux ``VmHWM``; elsewhere the peak since the process started)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
