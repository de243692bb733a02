"""Records: one JSON line per (run, variant, eval length, mode).

Each run directory holds ``records.jsonl`` (the numbers), ``positions.jsonl`` (per-position
loss per eval length) and ``curve.jsonl`` (training curve); ``pe_bench.run.store.RunStore`` owns
them. ``make_record`` builds every record and ``RECORD_KEY`` names what identifies one; a
record's provenance (code, device, versions) is ``pe_bench.provenance``'s, and its file is
written whole by ``pe_bench.files``. ``load_records`` reads every ``records.jsonl`` under a
folder into one DataFrame, refusing a file that is not JSON lines or that holds more than one
trained run.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from pe_bench.errors import UserError
from pe_bench.files import numbered_rows

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
