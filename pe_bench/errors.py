"""Bad user input: the one exception type for it, and an argument parser that reports it alike.

The CLI prints a ``UserError`` as a single line and exits with status 2, so every message must
name the bad value and what is allowed instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn


class UserError(ValueError):
    """Bad input from the user (config, data, arguments): printed as one line, never a traceback."""


def os_message(err: OSError, folder: object = None) -> str:
    """An ``OSError`` as one line naming the file and the reason (``No space left on device``,
    ``Read-only file system``, ...); an error that names no file (a write to a full disk, in
    code that is not pe-bench's) is said to be in ``folder``, where the command writes."""
    if err.filename:
        where = f"{os.fsdecode(err.filename)!r}: "
    else:
        where = f"in {os.fsdecode(str(folder))!r}: " if folder else ""
    return f"cannot write or read {where}{err.strerror or err}"


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (not usage + error) with status 2, as
    a ``UserError`` is reported."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)
