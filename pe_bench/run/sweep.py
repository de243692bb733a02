"""Hydra callback for sweeps: progress (job k of n, elapsed, ETA) and the report at the end.

``conf/config.yaml`` registers ``SweepCallback``; it runs in the process that launches the jobs
(and, under a parallel launcher, in each job's worker too). A job that stopped on bad input
leaves ``error.txt`` in its folder: the sweep goes on, then names every failed job and exits 1.
A report that cannot be made (records that cannot share one) also ends the run or sweep with
exit status 1, after the line that says why.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import shlex
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from pe_bench.errors import UserError, os_message
from pe_bench.files import atomic_write_text
from pe_bench.records import COMMANDS, searchpath, sweep_command
from pe_bench.report.build import build_report
from pe_bench.report.inputs import Options, report_lock
from pe_bench.run import tracking
from pe_bench.run.distributed import rank_from_env
from pe_bench.run.store import DONE, FAILED

log = logging.getLogger("pe_bench")


DONE_KEPT = 32  # sweep ids a job folder's DONE marker keeps


def sweep_size(config: DictConfig) -> int | None:
    """Number of jobs in a sweep: the product of the sweep overrides' lengths (None if unknown)."""
    try:
        params = dict(config.hydra.sweeper.get("params") or {})
        overrides = list(config.hydra.overrides.task)
        given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
        overrides += [f"{k}={v}" for k, v in params.items() if k not in given]
        total = 1
        for override in OverridesParser.create().parse_overrides(overrides):
            if override.is_sweep_override():
                total *= len(list(override.sweep_iterator()))
        return total
    except Exception:  # an unusual sweeper: progress is a nicety, never a failure
        return None


class SweepCallback(Callback):
    """Hydra callback: sweep progress (job k of n, elapsed, ETA) and the report at the end."""

    def __init__(self) -> None:
        self.total: int | None = None
        self.started = 0.0
        self.command = ""  # this sweep's line in COMMANDS
        self.jobs: list[Path] = []  # the job folders this process ran (basic launcher)
        self.unwritten = ""  # why COMMANDS could not be written (the sweep then exits 1)
        self.sweep_id = ""  # names this sweep in the job folders' DONE markers

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.total, self.started = sweep_size(config), time.time()
        self.sweep_id = uuid.uuid4().hex[:12]  # copied into a parallel launcher's workers
        if rank_from_env() == 0:
            overrides = [*searchpath(config.hydra.overrides.hydra), *config.hydra.overrides.task]
            try:
                self.command = log_command(Path(config.hydra.sweep.dir), overrides)
            except OSError as err:  # a full disk: said at the end (Hydra would only warn)
                self.unwritten = os_message(err)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        job = HydraConfig.get().job
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            self.jobs.append(Path(HydraConfig.get().runtime.output_dir))
            of = f" of {self.total}" if self.total else ""
            log.info("sweep: job %d%s: %s", job.num + 1, of, job.override_dirname or "default")
            pythonpath = plugin_pythonpath(config)
            if self.command and pythonpath and rank_from_env() == 0:
                sweep_dir = Path(config.hydra.sweep.dir)
                self.command = with_pythonpath(sweep_dir, self.command, pythonpath)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode != RunMode.MULTIRUN or not self.started:
            return
        # Jobs that ended are counted by their markers, not in this object: a parallel launcher
        # (joblib) runs jobs in worker processes, each with its own copy of the callback.
        mark_done(Path(hydra_cfg.runtime.output_dir), self.sweep_id)
        finished = max(1, jobs_done(Path(config.hydra.sweep.dir), self.sweep_id))
        elapsed = time.time() - self.started
        eta = ""
        if self.total and self.total > finished:
            left = elapsed / finished * (self.total - finished)
            eta = f", about {left / 60:.1f} min left"
        of = f"/{self.total}" if self.total else ""
        log.info("sweep: %d%s jobs done in %.1f min%s", finished, of, elapsed / 60, eta)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        failed = getattr(kwargs.get("job_return"), "status", None) == JobStatus.FAILED
        if failed:  # Hydra raises the job's error next: a missing report would hide it
            return
        wanted = config.get("report", True) and rank_from_env() == 0
        if wanted and not write_report(Path(config.hydra.run.dir), config):
            sys.exit(1)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        # this sweep's failures: a job folder of an earlier sweep into the same folder (or of
        # another sweep running beside this one) may hold one of a job this sweep did not run
        # (a job that runs removes its own first, under its lock)
        if self.jobs:
            failed = [job / FAILED for job in self.jobs if (job / FAILED).exists()]
        else:  # a launcher that runs jobs in other processes: the failures since it started
            failed = [p for p in sorted(sweep_dir.rglob(FAILED)) if mtime(p) >= self.started]
        reported = True
        if config.get("report", True) and rank_from_env() == 0:
            reported = write_report(sweep_dir, config)
        for path in failed:
            log.error("failed: %s: %s", path.parent.name, read_failure(path))
        if self.unwritten:
            log.error("no %s: %s", COMMANDS, self.unwritten)
        if failed or not reported or self.unwritten:
            sys.exit(1)


def mark_done(folder: Path, sweep_id: str) -> None:
    """Add ``sweep_id`` to ``folder``'s ``DONE`` marker: the sweeps that ended the job, one a
    line, the last ``DONE_KEPT``."""
    ids = [i for i in read_marker(folder / DONE) if i != sweep_id][-(DONE_KEPT - 1) :]
    atomic_write_text(folder / DONE, "".join(f"{i}\n" for i in [*ids, sweep_id]))


def jobs_done(sweep_dir: Path, sweep_id: str) -> int:
    """The jobs under ``sweep_dir`` that the sweep ``sweep_id`` ended (another sweep into the
    same folder counts its own)."""
    return sum(sweep_id in read_marker(marker) for marker in sweep_dir.rglob(DONE))


def read_marker(path: Path) -> list[str]:
    """The sweep ids in a ``DONE`` marker (none if it is gone or empty)."""
    try:
        return path.read_text().split()
    except (FileNotFoundError, UnicodeDecodeError):
        return []


def mtime(path: Path) -> float:
    """When ``path`` was last written (0 if it is gone: another sweep's job removed it)."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def read_failure(path: Path) -> str:
    """What a failed job's ``error.txt`` says ('' if another sweep's run of it removed it)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return "(rerun by another sweep since)"


def log_command(sweep_dir: Path, overrides: list[str]) -> str:
    """Add this sweep's command to the folder's ``COMMANDS`` (Hydra's multirun.yaml keeps only
    the last sweep's): a report of a folder that several sweeps filled, say seeds 1,2 added to a
    seed-0 suite, lists every command that made its records. Returns the command."""
    command = sweep_command(overrides)
    with report_lock(sweep_dir, wait=True):  # another sweep may add its own line at once
        known = command_lines(sweep_dir)
        logged = [line for line in known if line == command or line.endswith(f" {command}")]
        if not logged:  # (a line with a PYTHONPATH= prefix is this command too)
            write_command_lines(sweep_dir, [*known, command])
    return logged[0] if logged else command


def command_lines(folder: Path) -> list[str]:
    """The lines of ``folder``'s ``COMMANDS`` (none when it has no such file)."""
    path = folder / COMMANDS
    return path.read_text().splitlines() if path.exists() else []


def write_command_lines(folder: Path, lines: list[str]) -> None:
    """Replace ``folder``'s ``COMMANDS`` with ``lines``, whole."""
    atomic_write_text(folder / COMMANDS, "".join(f"{line}\n" for line in lines))


def with_pythonpath_prefix(command: str, pythonpath: str) -> str:
    """``command`` run with ``PYTHONPATH=pythonpath`` ('' leaves it as it is)."""
    return f"PYTHONPATH={shlex.quote(pythonpath)} {command}" if pythonpath else command


def plugin_pythonpath(config: DictConfig) -> str:
    """The ``PYTHONPATH`` a job's plugins were imported through ('' for none, or installed
    ones): the folder above each ``pe.plugin`` / ``eval.variants.*.plugin`` module that is not
    in site-packages, relative to the working folder when inside it."""
    variants = config.get("eval", {}).get("variants") or {}
    modules = [config.get("pe", {}).get("plugin"), *(v.get("plugin") for v in variants.values())]
    roots = []
    for module in filter(None, modules):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            continue
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin).resolve()
        root = origin.parents[module.count(".") + (origin.name == "__init__.py")]
        if "site-packages" not in root.parts:
            inside = root == Path.cwd() or Path.cwd() in root.parents
            roots.append(os.path.relpath(root) if inside else str(root))
    return os.pathsep.join(dict.fromkeys(roots))


def with_pythonpath(sweep_dir: Path, command: str, pythonpath: str) -> str:
    """This sweep's line in ``COMMANDS``, ``command``, prefixed with ``PYTHONPATH=...`` (its
    plugins are found through it); returns the new line."""
    prefixed = with_pythonpath_prefix(command[command.index("pe-bench") :], pythonpath)
    with report_lock(sweep_dir, wait=True):
        lines = command_lines(sweep_dir)
        if prefixed not in lines:
            kept = [line for line in lines if line != command]
            write_command_lines(sweep_dir, [*kept, prefixed])
    return prefixed


def write_report(root: Path, config: DictConfig) -> bool:
    """Write the report of ``root``; with logger=wandb, log it as a run of the sweep's group.
    False (after logging why) when the records cannot make a report or it cannot be written
    (a full or read-only disk): the caller exits 1. The report is built under the folder's
    report lock, waiting for another sweep's report into the same folder, so that one report
    never removes or cuts short another's."""
    try:
        with report_lock(root, wait=True):
            try:
                report = build_report(root, options=Options(compare=config.get("compare")))
                print(f"\n{report.where(root)}", flush=True)
            except UserError as err:
                log.error("no report: %s", err)
                remove_stale_report(root)
                return False
        tracker = tracking.start(
            tracking.parse_logger(config.get("logger")),
            name="report",
            group=str(config.get("name", "default")),
            job_type="report",
            folder=root,
            config={"results": str(root), **dataclasses.asdict(report.options)},
        )
    except UserError as err:
        log.error("no report: %s", err)
        return False
    except OSError as err:
        log.error("no report: %s", os_message(err))
        return False
    tracker.log_report(report)
    tracker.finish()
    return True


def remove_stale_report(root: Path) -> None:
    """Remove report.md, tables/ and figures/ left by an earlier report of ``root`` (its
    report lock held): after records were added that cannot share a report, they describe
    other records."""
    stale = [p for p in (root / "report.md", root / "tables", root / "figures") if p.exists()]
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    if stale:
        log.error("removed the earlier report of %s: it no longer matches its records", root)
