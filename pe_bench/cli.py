"""Entry point ``pe-bench``: one Hydra job = one run of the config it composes.

``run(cfg, out_dir)`` parses the config once (``run.config.RunConfig``), plans it and runs the
one pipeline (``run.job.run``): a model pe-bench trains (``run.plan`` + ``run.trained``) or a
pretrained Hugging Face model (``model=hf``: ``pretrained.plan`` + ``pretrained.evaluate``).
Tests call ``run``; ``hydra_main`` is the thin Hydra wrapper; ``main`` the console script, which
checks the command line first (``run.checks``).

A sweep (``-m`` or an experiment with ``hydra.mode: MULTIRUN``) runs one job per override set
through Hydra's launcher (local, or SLURM via hydra-submitit-launcher); ``SweepCallback``
(``run.sweep``) logs its progress and writes the report when it ends.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from pe_bench.errors import UserError
from pe_bench.pretrained import evaluate as pretrained
from pe_bench.pretrained.plan import plan_pretrained
from pe_bench.records import atomic_write_text, git_sha
from pe_bench.run import job, trained
from pe_bench.run.checks import check_command, os_message
from pe_bench.run.config import CONF_DIR, RunConfig
from pe_bench.run.distributed import rank_from_env
from pe_bench.run.plan import plan
from pe_bench.run.sweep import FAILED

log = logging.getLogger("pe_bench")


def run(cfg: DictConfig | RunConfig, out_dir: Path) -> list[dict[str, Any]]:
    """Compute the records of ``cfg`` missing from ``out_dir`` (train and evaluate a model, or
    evaluate a pretrained one) and return every record of the run, cached included."""
    cfg = cfg if isinstance(cfg, RunConfig) else RunConfig.parse(cfg)
    if cfg.pretrained:
        return job.run(plan_pretrained(cfg), out_dir, pretrained.STEPS)
    return job.run(plan(cfg), out_dir, trained.STEPS)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    """One Hydra job: ``run`` it, and end a bad input (or a file that cannot be written) with
    one line and status 2; in a sweep, mark the job failed and go on."""
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    if rank_from_env() != 0:  # one log per run under torchrun: rank 0's
        logging.getLogger().setLevel(logging.WARNING)
    (out_dir / FAILED).unlink(missing_ok=True)
    try:
        run(cfg, out_dir)
    except (UserError, OSError) as caught:
        err = caught if isinstance(caught, UserError) else UserError(os_message(caught))
        log.error("error: %s", err)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            atomic_write_text(out_dir / FAILED, f"{err}\n")  # the sweep goes on
            return
        print(f"pe-bench: error: {err}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    """The ``pe-bench`` console script: the command line is checked first (``check_command``),
    so that a misspelled group, key or option ends in one line, not in Hydra's list of every
    option over many lines; then Hydra runs the job (or the sweep)."""
    try:
        check_command(sys.argv[1:])
    except UserError as err:
        print(f"pe-bench: error: {err}", file=sys.stderr)
        sys.exit(2)
    git_sha()  # records name the code loaded now, not a commit made while a sweep runs
    hydra_main()


if __name__ == "__main__":
    main()
