"""A job folder's files: which records are cached, which are missing, adding records, the
training curves, starting over.

A job folder holds one trained model and its fine-tunes (each a run id): ``records.jsonl``,
``positions.jsonl`` (per-position loss of each ok record), ``curve.jsonl`` (training curves,
the trained model's first), ``config.yaml`` and the checkpoints. Records of other run ids or
another corpus, or of an eval-time variant whose config has changed since (``variant_hash``),
or of a context-use probe whose settings have (``probe_hash``), or made by other code of their
scheme (``pe_source``, ``variant_source``, a fine-tune's ``finetune_source``:
``positions.scheme_key``), or by other weights of a
pretrained model (``weights_sha``), are stale and dropped at the next write; skipped records
are retried. A position row lives as long as its record, a curve as long as a record of its
run id: neither carries the corpus hash, and a row whose record was never written (a kill
between the two writes) is computed again with it, never twice.

One run at a time holds a job folder (``job_lock``): it may then delete the temporary files a
killed run left behind, since nobody else is writing them.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pe_bench.data.tokenizer import ByteTokenizer
from pe_bench.errors import UserError, os_message
from pe_bench.files import atomic_write_text, exclusive_lock, read_jsonl, write_jsonl
from pe_bench.records import CURVE, POSITIONS, RECORD_KEY, RECORDS, record_key
from pe_bench.run.evaluate import EvalTask

log = logging.getLogger(__name__)

BYTES = ByteTokenizer.fingerprint  # the tokenizer of records that name none

CHECKPOINT = "checkpoint.pt"  # the trained model's; a fine-tune's is checkpoint-<key>.pt
LOCK = ".lock"  # held (flock) by the run that owns the folder; reports read records only
FAILED = "error.txt"  # why a sweep's job failed, written and removed under the job's lock
DONE = ".done"  # the sweeps that ended the job, their progress across processes (run.sweep)
# Temporary files of this folder's own writes (``atomic_write_text``, ``save_checkpoint``):
# ".<name>.<random>.tmp", and ".checkpoint.pt.tmp" as older versions named it.
STRAYS = [f".{name}.*tmp" for name in (RECORDS, POSITIONS, CURVE, "config.yaml", DONE)] + [
    ".checkpoint*.pt.*tmp"
]


@contextlib.contextmanager
def job_lock(folder: Path, take: bool = True, wait: bool = False) -> Iterator[None]:
    """Hold ``folder`` for one run: two runs of one job would both train and overwrite each
    other's checkpoints. A second run is refused at once in one line, or with ``wait`` (a job
    of a sweep: another sweep into the same folder may be running it) waits for the first to
    end and then finds its records; the kernel releases the lock when its process dies, so a
    killed run never leaves it held. ``take=False`` (torchrun ranks but 0, which share rank
    0's job) holds nothing."""
    if not take:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)

    def busy() -> None:
        if not wait:
            raise UserError(
                f"{folder} is in use by another pe-bench run (it holds {folder / LOCK}); "
                "wait for it to end, or pick another out_root"
            ) from None
        log.info("%s: another pe-bench run holds it; waiting for that run to end", folder)

    with exclusive_lock(folder / LOCK, busy):
        yield


def record_failure(folder: Path, err: BaseException) -> None:
    """Leave ``err`` in ``folder``'s ``error.txt``: the job of a sweep failed, the sweep goes
    on and names it at its end (a run of the job removes it first, under the job's lock)."""
    atomic_write_text(folder / FAILED, f"{failure_line(err, folder)}\n")


def failure_line(err: BaseException, folder: Path) -> str:
    """Why a job failed, in one line: bad input as it says it; anything else (a bug, a
    plugin's) by its type and first line, its traceback in the job's ``cli.log``."""
    if isinstance(err, UserError):
        return str(err)
    if isinstance(err, OSError):
        return os_message(err)
    first = (str(err).strip().splitlines() or [""])[0][:300]
    return f"{type(err).__name__}: {first} (its traceback: {folder / JOB_LOG})"


JOB_LOG = "cli.log"  # Hydra's log of a job (hydra.job.name: cli)
# What a run writes in a job folder before it computes anything: Hydra's files, the lock, the
# config. A refused run that made the folder removes them (``remove_refused``).
BEFORE_ANY_RECORD = (".hydra", JOB_LOG, LOCK, "config.yaml")


def first_missing(folder: Path) -> Path | None:
    """The first folder on the way to ``folder`` that does not exist yet (None: it does):
    what a command that writes into ``folder`` will make."""
    missing = None
    for path in [folder, *folder.parents]:
        if path.exists():
            return missing
        missing = path
    return missing


def remove_refused(folder: Path, made: Path | None) -> None:
    """Remove what a refused run made: in ``folder``, ``BEFORE_ANY_RECORD``, then each folder
    left empty, up to ``made`` (the first that did not exist before the command; None: it
    made none). Anything else stays: it is another process's."""
    if made is None or (folder != made and made not in folder.parents):
        return
    for name in BEFORE_ANY_RECORD:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    for path in [folder, *folder.parents]:
        try:
            path.rmdir()
        except OSError:  # not empty, or gone
            return
        if path == made:
            return


class RunStore:
    """The files of one job folder, for run ids ``run_ids`` (trained model first) on the corpus
    with hash ``corpus_sha``.

    ``variants`` maps each eval-time variant of the plan to its config hash: records of that
    variant under another hash are superseded (a variant key names one config at a time, else
    the report would see two rows for one cell). ``pe_source`` is the key of the trained
    scheme's code (``positions.scheme_key``) and ``variant_sources`` maps each variant of the
    plan to the key of its code, ``finetune_sources`` each fine-tune's run id to the key of its
    fine-tuning scheme's code: records made by other code, or that carry no key (made before
    records did), are stale and computed again, with a log line saying why (``pe_source``
    None: not checked, for tools that only read a folder). ``probes`` maps each context-use
    probe of the plan to the hash of its settings (``probes.probe_hashes``): its records of
    another hash are superseded the same way. ``tokenizer_sha`` is the fingerprint of the
    corpus's tokenizer: records of another are stale (records without one were made with
    bytes). ``weights_sha`` is the key of a pretrained model's weights
    (``pretrained.key.weights_key``): records of others, or of none, are stale (None: not
    checked, a trained model's). ``fresh`` ignores what is there (``force=true``); only the
    ``writer`` (rank 0 under torchrun) deletes or writes files, so every rank decides from the
    files as they were.
    """

    def __init__(
        self,
        folder: Path,
        run_ids: list[str],
        corpus_sha: str,
        fresh: bool,
        writer: bool = True,
        variants: dict[str, str] | None = None,
        probes: dict[str, str] | None = None,
        pe_source: str | None = None,
        tokenizer_sha: str = BYTES,
        variant_sources: dict[str, str] | None = None,
        weights_sha: str | None = None,
        finetune_sources: dict[str, str] | None = None,
    ) -> None:
        self.folder, self.run_ids, self.corpus_sha = folder, run_ids, corpus_sha
        self.writer = writer
        folder.mkdir(parents=True, exist_ok=True)
        if writer:
            self._remove_strays()
        if fresh and writer:
            self.start_over()
        variants, probes = variants or {}, probes or {}
        self.records = [
            r
            for r in self._rows(RECORDS, fresh)
            if r.get("run_id") in run_ids
            and r.get("corpus_sha") == corpus_sha
            and r.get("status") != "skipped"
            and variants.get(r.get("variant"), r.get("variant_hash")) == r.get("variant_hash")
            and probes.get(r.get("mode"), r.get("probe_hash")) == r.get("probe_hash")
            and r.get("tokenizer_sha", BYTES) == tokenizer_sha
        ]
        if pe_source is not None:
            self.records = self._of_this_code(
                pe_source, variant_sources or {}, finetune_sources or {}, weights_sha
            )
        self._done = {record_key(r) for r in self.records}
        self.positions = [r for r in self._rows(POSITIONS, fresh) if record_key(r) in self._done]
        trained = {r["run_id"] for r in self.records}
        self.curves: dict[str, list[dict]] = {}
        for row in self._rows(CURVE, fresh):
            if row.get("run_id") in trained:
                self.curves.setdefault(row["run_id"], []).append(row)

    def _of_this_code(
        self,
        pe_source: str,
        variant_sources: dict[str, str],
        finetune_sources: dict[str, str],
        weights_sha: str | None,
    ) -> list[dict]:
        """The records made by the code that runs now: the trained scheme's key
        (``pe_source``) and, for a variant of the plan, the variant's (``variant_source``),
        for a fine-tune of the plan, its fine-tuning scheme's (``finetune_source``); a
        pretrained model's, of the weights there now (``weights_sha``); the others are
        logged, by why they are stale."""
        kept, stale = [], Counter()
        for r in self.records:
            expected = [("pe_source", pe_source)]
            if weights_sha is not None:
                expected.append(("weights_sha", weights_sha))
            if variant_sources.get(r.get("variant")):  # a variant not planned now: kept
                expected.append(("variant_source", variant_sources[r["variant"]]))
            if r.get("run_id") in finetune_sources:  # a fine-tune's: of its scheme's code too
                expected.append(("finetune_source", finetune_sources[r["run_id"]]))
            wrong = [(field, r.get(field), key) for field, key in expected if r.get(field) != key]
            if wrong:
                stale[wrong[0]] += 1
            else:
                kept.append(r)
        for (field, found, key), count in stale.items():
            why = f"{field} {found}" if found else f"no {field} (made before records carried it)"
            log.info(
                "%s: %d records stale, recomputed: %s, the code's key is now %s",
                self.folder,
                count,
                why,
                key,
            )
        return kept

    def _rows(self, name: str, fresh: bool) -> list[dict]:
        """The rows of file ``name`` (none when starting over); its corrupt lines are moved
        aside by the writer (``files.read_jsonl``)."""
        if fresh or not (self.folder / name).exists():
            return []
        return read_jsonl(self.folder / name, move_aside=self.writer)

    def _remove_strays(self) -> None:
        """Delete the temporary files a killed run of this folder left (the lock is ours)."""
        for pattern in STRAYS:
            for path in self.folder.glob(pattern):
                path.unlink(missing_ok=True)
                log.info("removed %s, left by a run that was stopped", path)

    def start_over(self) -> None:
        """Delete the records, curves and checkpoints."""
        for path in [self.folder / RECORDS, self.folder / POSITIONS, self.folder / CURVE]:
            path.unlink(missing_ok=True)
        for path in self.folder.glob("checkpoint*.pt"):
            path.unlink()
        log.info("force=true: recomputing %s from scratch", self.folder)

    def missing(self, run_id: str, tasks: list[EvalTask]) -> list[EvalTask]:
        """The tasks of ``run_id`` that have no record yet."""
        return [t for t in tasks if (run_id, *t.key()) not in self._done]

    def add(
        self,
        record: dict[str, Any],
        position_loss: list[float | None] | None = None,
        window_loss: list[list[float | None]] | None = None,
    ) -> None:
        """Add a record (and the per-position loss of an ok one, with each window's loss by
        bucket of positions where the scorer keeps it) and rewrite the files whole:
        a kill loses at most the record being computed. The position row is written first: a
        kill between the two writes leaves a row without its record, which the next run drops
        and computes again (the other order would leave a record whose row is never made)."""
        self.records.append(record)
        self._done.add(record_key(record))
        if position_loss is not None:
            who = {k: record[k] for k in ("run_id", "scheme", "finetune") if k in record}
            key = {k: record[k] for k in RECORD_KEY}
            windows = {"window_loss": window_loss} if window_loss is not None else {}
            self.positions.append({**who, **key, "loss": position_loss, **windows})
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
