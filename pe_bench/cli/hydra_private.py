"""The three things pe-bench's command line needs from Hydra that Hydra does not make public
(``hydra._internal``, Hydra 1.3), each wrapped in one function so that nothing else imports
Hydra's internals and a Hydra upgrade that moves them breaks here alone
(``tests/cli/test_hydra_private.py`` holds each to what its caller relies on).

None is public in hydra-core 1.3.8 nor on Hydra's main branch (1.4.0.dev9, August 2026):
``hydra.main`` itself imports ``get_args_parser`` from ``hydra._internal.utils``, and neither
``hydra``, ``hydra.utils`` nor ``hydra.core`` exports the parser, ``run_and_report`` or the basic
sweeper. The job list could be rebuilt from the public ``Override.sweep_string_iterator``, but
that would copy the sweeper's rules (a later override of a key replacing an earlier one, the
product's order) instead of running them, and a copy that drifted would count a sweep's jobs
unlike Hydra."""

from __future__ import annotations

import argparse
import functools
from typing import NoReturn

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.utils import get_args_parser, run_and_report
from hydra.core.override_parser.types import Override


def hydra_args_parser() -> argparse.ArgumentParser:
    """The parser ``@hydra.main`` parses ``sys.argv`` with (its flags and the overrides), so that
    the command line is checked as Hydra will read it; Hydra has no public accessor for it."""
    return get_args_parser()


def report_as_hydra(err: BaseException) -> NoReturn:
    """End the process as Hydra ends one whose job raised ``err`` (its trimmed traceback, the
    ``HYDRA_FULL_ERROR`` hint, exit status 1): ``pe-bench`` asks Hydra to raise instead, so as
    to say an ``OSError`` in one line, and hands anything else back to Hydra's own report."""
    run_and_report(functools.partial(_raise, err))
    raise SystemExit(1)  # run_and_report exits itself; never reached


def _raise(err: BaseException) -> NoReturn:
    raise err


def basic_sweeper_jobs(overrides: list[Override]) -> list[list[str]]:
    """Each job's overrides as Hydra's basic sweeper lists them (the cartesian product of the
    sweeps, a later override of a key replacing an earlier one in its place); raises
    ``HydraException`` for a sweep the basic sweeper cannot list (ranges of floats)."""
    batches = BasicSweeper.split_arguments(overrides, None)
    return [job for batch in batches for job in batch]
