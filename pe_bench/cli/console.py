"""What every console script does around its work: a bad ``OMP_NUM_THREADS`` is refused in
one line before anything runs (libgomp only warns, then uses every core), and Ctrl-C ends the
command in one line with status 130, saying what a rerun does, instead of a traceback. Nothing
is half-written either way: every file pe-bench writes replaces the old one whole
(``records.atomic_write``), and a folder's lock goes with its process."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
from collections.abc import Iterator

from pe_bench.errors import UserError

INTERRUPTED = 130  # 128 + SIGINT: the status a shell gives a command that Ctrl-C ended
RESUME = "rerun the same command to resume (finished records and checkpoints are kept)"
THREADS = re.compile(r"[1-9]\d*(,[1-9]\d*)*")  # OpenMP's form: a count, or counts per level


def check_threads() -> None:
    """Refuse an ``OMP_NUM_THREADS`` that OpenMP cannot read (``0``, ``abc``, empty)."""
    value = os.environ.get("OMP_NUM_THREADS")
    if value is not None and not THREADS.fullmatch(value.strip()):
        raise UserError(
            f"OMP_NUM_THREADS={value!r} is not a number of threads; allowed: a whole number "
            ">= 1, e.g. OMP_NUM_THREADS=2, or unset (every core)"
        )


@contextlib.contextmanager
def console(prog: str, rerun: str = RESUME) -> Iterator[None]:
    """Run a console script's work: the environment checked first, Ctrl-C one line saying
    ``rerun`` (status ``INTERRUPTED``)."""
    try:
        check_threads()
    except UserError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        sys.exit(2)
    try:
        yield
    except KeyboardInterrupt:
        fresh_line = "\n" if sys.stderr.isatty() else ""  # after the terminal's ^C
        print(f"{fresh_line}{prog}: interrupted; {rerun}", file=sys.stderr)
        sys.exit(INTERRUPTED)


def launch(prog: str, module: str, rerun: str = RESUME) -> None:
    """A console script: ``module``'s ``main`` imported and run inside ``console``, so that a
    Ctrl-C while its imports load (torch, Hydra: seconds) is one line too."""
    with console(prog, rerun):
        importlib.import_module(module).main()


def pe_bench() -> None:
    """``pe-bench`` (``cli.bench``)."""
    launch("pe-bench", "pe_bench.cli.bench")


def pe_bench_report() -> None:
    """``pe-bench-report`` (``cli.report``)."""
    launch("pe-bench-report", "pe_bench.cli.report", "rerun it to write the report")


def pe_bench_check() -> None:
    """``pe-bench-check`` (``cli.check``)."""
    launch("pe-bench-check", "pe_bench.cli.check", "rerun it to check again")


def pe_bench_place() -> None:
    """``pe-bench-place`` (``cli.place``)."""
    launch("pe-bench-place", "pe_bench.cli.place")
