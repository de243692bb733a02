"""A job folder's files: which records are cached, which are missing, adding records, the
training curves, starting over.

A job folder holds one trained model and its fine-tunes (each a run id): ``records.jsonl``,
``positions.jsonl`` (per-position loss of each ok record), ``curve.jsonl`` (training curves,
the trained model's first), ``config.yaml`` and the checkpoints. Rows of other run ids or
another corpus are stale and dropped at the next write; skipped records are retried.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pe_bench.evaluate import EvalTask
from pe_bench.results import (
    CURVE,
    POSITIONS,
    RECORD_KEY,
    RECORDS,
    atomic_write_text,
    read_jsonl,
    record_key,
    write_jsonl,
)

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"  # the trained model's; a fine-tune's is checkpoint-<key>.pt


class RunStore:
    """The files of one job folder, for run ids ``run_ids`` (trained model first) on the corpus
    with hash ``corpus_sha``.

    ``fresh`` ignores what is there (``force=true``); only the ``writer`` (rank 0 under
    torchrun) deletes or writes files, so every rank decides from the files as they were.
    """

    def __init__(
        self, folder: Path, run_ids: list[str], corpus_sha: str, fresh: bool, writer: bool = True
    ) -> None:
        self.folder, self.run_ids, self.corpus_sha = folder, run_ids, corpus_sha
        self.writer = writer
        folder.mkdir(parents=True, exist_ok=True)
        if fresh and writer:
            self.start_over()
        self.records = [r for r in self._ours(RECORDS, fresh) if r.get("status") != "skipped"]
        self.positions = self._ours(POSITIONS, fresh)
        self.curves: dict[str, list[dict]] = {}
        for row in self._ours(CURVE, fresh):
            self.curves.setdefault(row["run_id"], []).append(row)
        self._done = {record_key(r) for r in self.records}

    def _ours(self, name: str, fresh: bool) -> list[dict]:
        """Rows of this very run (same run ids and corpus); the rest is stale."""
        if fresh or not (self.folder / name).exists():
            return []
        rows = read_jsonl(self.folder / name)
        return [
            r
            for r in rows
            if r.get("run_id") in self.run_ids and r.get("corpus_sha") == self.corpus_sha
        ]

    def start_over(self) -> None:
        """Delete the records, curves and checkpoints."""
        for path in [self.folder / RECORDS, self.folder / POSITIONS, self.folder / CURVE]:
            path.unlink(missing_ok=True)
        for path in self.folder.glob("checkpoint*.pt"):
            path.unlink()
        log.info("force=true: recomputing %s from scratch", self.folder)

    def missing(self, run_id: str, tasks: list[EvalTask], tokens: int) -> list[EvalTask]:
        """The tasks of ``run_id`` that have no record yet."""
        return [t for t in tasks if (run_id, *t.key(tokens)) not in self._done]

    def add(self, record: dict[str, Any], position_loss: list[float | None] | None = None) -> None:
        """Add a record (and the per-position loss of an ok one) and rewrite the files whole:
        a kill loses at most the record being computed."""
        self.records.append(record)
        self._done.add(record_key(record))
        if position_loss is not None:
            who = {k: record[k] for k in ("run_id", "scheme", "finetune") if k in record}
            key = {k: record[k] for k in RECORD_KEY}
            self.positions.append({**who, **key, "loss": position_loss})
            write_jsonl(self.folder / POSITIONS, self.positions)
        write_jsonl(self.folder / RECORDS, self.records)

    def set_curve(self, run_id: str, points: list[dict]) -> None:
        """Store ``run_id``'s training curve (rows in ``run_ids`` order)."""
        self.curves[run_id] = [{"run_id": run_id, **point} for point in points]
        rows = [row for rid in self.run_ids for row in self.curves.get(rid, [])]
        write_jsonl(self.folder / CURVE, rows)

    def write_config(self, text: str) -> None:
        if self.writer:
            atomic_write_text(self.folder / "config.yaml", text)

    def checkpoint(self, finetune: str | None = None) -> Path:
        """Where the trained model's (or a fine-tune's) training state is saved."""
        return self.folder / (CHECKPOINT if finetune is None else f"checkpoint-{finetune}.pt")
