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


def from_ctrl_c(err: BaseException) -> bool:
    """Whether a ``KeyboardInterrupt`` is in ``err``'s chain (``__cause__``, ``__context__``):
    a Ctrl-C while an extension imports, or while a library unwinds, can surface as the error
    raised in its place (an ``ImportError``, a ``RuntimeError``), which was the user's Ctrl-C
    all the same."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        each = todo.pop()
        if each is None or id(each) in seen:
            continue
        if isinstance(each, KeyboardInterrupt):
            return True
        seen.add(id(each))
        todo += [each.__cause__, each.__context__]
    return False


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
