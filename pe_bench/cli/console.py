"""What every console script does around its work: a bad ``OMP_NUM_THREADS`` is refused in
one line before anything runs (libgomp only warns, then uses every core), and Ctrl-C ends the
command in one line with status 130, saying what a rerun does, instead of a traceback (also when
it surfaces as another error, a KeyboardInterrupt in that error's chain). Nothing is
half-written either way: every file pe-bench writes replaces the old one whole
(``files.atomic_write``), and a folder's lock goes with its process. Once the work has ended,
a further Ctrl-C (Python's shutdown joins threads and runs exit hooks: seconds) ends the process
at once, silently, with the status it was ending with."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import signal
import sys
from collections.abc import Iterator
from typing import NoReturn

from pe_bench.errors import UserError, from_ctrl_c

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
        interrupted(prog, rerun)
    except Exception as err:
        if not from_ctrl_c(err):
            raise
        interrupted(prog, rerun)


def interrupted(prog: str, rerun: str) -> NoReturn:
    """End the command after a Ctrl-C: one line saying ``rerun``, status ``INTERRUPTED``."""
    fresh_line = "\n" if sys.stderr.isatty() else ""  # after the terminal's ^C
    print(f"{fresh_line}{prog}: interrupted; {rerun}", file=sys.stderr)
    sys.exit(INTERRUPTED)


def launch(prog: str, module: str, rerun: str = RESUME) -> None:
    """A console script: ``module``'s ``main`` imported and run inside ``console``, so that a
    Ctrl-C while its imports load (torch, Hydra: seconds) is one line too; then ``end_on_ctrl_c``
    for the interpreter's shutdown."""
    try:
        with console(prog, rerun):
            importlib.import_module(module).main()
    except SystemExit as done:
        end_on_ctrl_c(exit_status(done.code))
        raise
    except BaseException:
        end_on_ctrl_c(1)  # Python's own status for an uncaught error
        raise
    end_on_ctrl_c(0)


def exit_status(code: object) -> int:
    """The status ``sys.exit(code)`` gives the process: ``None`` is 0, a message 1."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def end_on_ctrl_c(status: int) -> None:
    """From now on a Ctrl-C ends the process at once with ``status``, printing nothing: the
    command has said how it ended, and the interpreter's shutdown (threads joined, exit hooks
    such as a tracker's upload) would otherwise answer a second Ctrl-C with a traceback of its
    own, or die by the signal, losing the status (130 after an interruption). Files are
    written whole (``records.atomic_write``), so ending here cuts nothing in half."""

    def end(signum: int, frame: object) -> None:
        with contextlib.suppress(Exception):  # a write that the signal interrupted
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)

    signal.signal(signal.SIGINT, end)


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
