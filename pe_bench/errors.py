"""Bad user input: the one exception type for it, and an argument parser that reports it alike.

The CLI prints a ``UserError`` as a single line and exits with status 2, so every message must
name the bad value and what is allowed instead.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class UserError(ValueError):
    """Bad input from the user (config, data, arguments): printed as one line, never a traceback."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (not usage + error) with status 2, as
    a ``UserError`` is reported."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)
