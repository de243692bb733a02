"""How a ``pe-bench`` job that raised ends: the command with one line (bad input, a file that
cannot be written), Hydra's report (a bug), Ctrl-C's line (an error a Ctrl-C caused), or, in a
sweep, the job marked failed while the sweep goes on."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import NoReturn

from pe_bench.errors import UserError, from_ctrl_c, os_message
from pe_bench.run.store import failure_line

log = logging.getLogger("pe_bench")


def job_failed(err: Exception, out_dir: Path, sweep: bool) -> None:
    """A Ctrl-C that surfaced as ``err`` ends the command, a sweep too (Hydra would run its next
    job); bad input (or a file that cannot be written) is one line and status 2, a bug (a
    plugin's, say) Hydra's report; in a sweep, the job is marked failed (``error.txt``, the
    traceback in its ``cli.log``) and the sweep goes on."""
    if from_ctrl_c(err):
        raise KeyboardInterrupt from err
    if isinstance(err, OSError):
        err = UserError(os_message(err, out_dir))
    if isinstance(err, UserError) and sweep:
        log.error("error: %s", err)
    elif isinstance(err, UserError):
        log_to_files(f"error: {err}")  # the console gets it once, on stderr
        fail(err)
    elif not sweep:
        raise err
    else:
        log_to_files("the job failed:", exc_info=err)
        log.error("error: %s", failure_line(err, out_dir))


def log_to_files(message: str, exc_info: BaseException | None = None) -> None:
    """``message`` (with ``exc_info``'s traceback) as an error in the log files (the job's
    ``cli.log``), not on the console."""
    info = (type(exc_info), exc_info, exc_info.__traceback__) if exc_info else None
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, info)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def fail(err: UserError) -> NoReturn:
    """End the command with ``err`` in one line and status 2."""
    print(f"pe-bench: error: {err}", file=sys.stderr)
    sys.exit(2)
