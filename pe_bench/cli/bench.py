"""Entry point ``pe-bench``: one Hydra job = one run of the config it composes.

``run(cfg, out_dir)`` parses the config once (``run.config.RunConfig``), plans it and runs the
one pipeline (``run.job.run``): a model pe-bench trains (``run.plan`` + ``run.trained``) or a
pretrained Hugging Face model (``model=hf``: ``pretrained.plan`` + ``pretrained.evaluate``).
Tests call ``run``; ``hydra_main`` is the thin Hydra wrapper; ``main`` the console script, which
checks the command line first (``cli.command_line``).

A sweep (``-m`` or an experiment with ``hydra.mode: MULTIRUN``) runs one job per override set
through Hydra's launcher (local, or SLURM via hydra-submitit-launcher); ``SweepCallback``
(``run.sweep``) logs its progress and writes the report when it ends.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from pe_bench.cli.command_line import announce, check_command
from pe_bench.cli.console import console
from pe_bench.cli.failure import fail, job_failed
from pe_bench.cli.hydra_private import report_as_hydra
from pe_bench.errors import UserError, from_ctrl_c, os_message
from pe_bench.pretrained import evaluate as pretrained
from pe_bench.pretrained.plan import plan_pretrained
from pe_bench.provenance import git_sha
from pe_bench.run import job, trained
from pe_bench.run.config import CONF_DIR, RunConfig
from pe_bench.run.distributed import rank_from_env
from pe_bench.run.plan import plan
from pe_bench.run.store import first_missing, record_failure, remove_refused

log = logging.getLogger("pe_bench")


def run(cfg: DictConfig | RunConfig, out_dir: Path, sweep: bool = False) -> list[dict[str, Any]]:
    """Compute the records of ``cfg`` missing from ``out_dir`` (train and evaluate a model, or
    evaluate a pretrained one) and return every record of the run, cached included. A job of
    a ``sweep`` waits for another process that holds its folder, and leaves its failure in
    the folder (``run.job.run``)."""
    try:
        cfg = cfg if isinstance(cfg, RunConfig) else RunConfig.parse(cfg)
        planned, steps = (
            (plan_pretrained(cfg), pretrained.STEPS)
            if cfg.pretrained
            else (plan(cfg), trained.STEPS)
        )
    except Exception as err:
        if sweep:  # bad input: every run of this job fails alike, no lock needed
            record_failure(out_dir, err)
        raise
    return job.run(planned, out_dir, steps, sweep=sweep)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    """One Hydra job: ``run`` it; a failure ends as ``job_failed`` says."""
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    if rank_from_env() != 0:  # one log per run under torchrun: rank 0's
        logging.getLogger().setLevel(logging.WARNING)
    sweep = hydra_cfg.mode == RunMode.MULTIRUN
    try:
        run(cfg, out_dir, sweep=sweep)
    except Exception as err:
        job_failed(err, out_dir, sweep)


def main() -> None:
    """The ``pe-bench`` console script: the command line is checked first (``check_command``),
    so that a misspelled group, key or option ends in one line, not in Hydra's list of every
    option over many lines; then Hydra runs the job (or the sweep, its estimate said first).
    A refused run leaves nothing it made (``run.store.remove_refused``). A file Hydra cannot
    write (multirun.yaml on a full disk) is one line too: Hydra is asked to raise, and any
    other error is then reported as Hydra reports it. Ctrl-C is one line (``cli.console``)."""
    with console("pe-bench"):
        run_command(sys.argv[1:])


def run_command(argv: list[str]) -> None:
    """``main``'s work, once the environment is checked."""
    try:
        command = check_command(argv)
    except UserError as err:
        fail(err)
    folder = command.folder if command else None
    made = first_missing(folder) if folder and not command.multirun else None
    if command:
        announce(command)
    git_sha()  # records name the code loaded now, not a commit made while a sweep runs
    logging.raiseExceptions = False  # a log file on a full disk: no traceback per line
    asked = os.environ.get(FULL_ERROR)
    os.environ[FULL_ERROR] = "1"  # the console script's process ends with this call
    try:
        hydra_main()
    except SystemExit as done:
        if done.code == 2 and folder:  # refused: what the run made goes
            remove_refused(folder, made)
        raise
    except OSError as err:
        if folder:
            remove_refused(folder, made)
        fail(UserError(os_message(err, folder)))
    except Exception as err:
        if asked == "1" or from_ctrl_c(err):  # a Ctrl-C surfaced as an error: console's line
            raise
        del os.environ[FULL_ERROR]
        report_as_hydra(err)  # as Hydra reports it, exit 1


FULL_ERROR = "HYDRA_FULL_ERROR"  # "1": Hydra raises what it would print as a traceback


if __name__ == "__main__":
    main()
