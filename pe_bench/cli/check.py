"""``pe-bench-check SCHEME``: every conformance check on one scheme, PASS/FAIL per check."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from pe_bench.cli.console import console
from pe_bench.conformance.kit import check_scheme, scheme_cost_report
from pe_bench.errors import OneLineParser, UserError
from pe_bench.positions import PositionScheme, checked_options, load_plugin, scheme_class


def _option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--option {text!r} is not key=value")
    return key, yaml.safe_load(value)


MAX_TRAIN_LEN = 4096  # the kit checks up to 3x the training length on a tiny model


def _train_len(text: str) -> int:
    """``--train-len``: an integer from 1 to ``MAX_TRAIN_LEN``."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_TRAIN_LEN or str(value) != text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer from 1 to {MAX_TRAIN_LEN}")
    return value


def main(argv: list[str] | None = None) -> None:
    """``pe-bench-check``: every check on one scheme, PASS/FAIL per check; a bad argument (an
    unknown scheme or option, an option of the wrong type or range, a plugin that does not
    import) is one line with status 2, never a failed check blamed on the scheme."""
    parser = OneLineParser(
        prog="pe-bench-check",
        description="Check that a position scheme keeps the contract of pe-bench's model.",
    )
    parser.add_argument("scheme", help="registered scheme name (e.g. rope, or your plugin's)")
    parser.add_argument("--plugin", help="module to import first, e.g. my_pkg.my_pe")
    parser.add_argument(
        "--option",
        type=_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a scheme option, as in the pe config (repeatable; values parsed as YAML)",
    )
    parser.add_argument(
        "--train-len", type=_train_len, default=16, help="training length (default 16)"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print the traceback of each check that crashed"
    )
    parser.add_argument(
        "--no-cost",
        action="store_true",
        help="skip timing a training step and a 1024-token evaluation against rope",
    )
    args = parser.parse_args(argv)
    with console("pe-bench-check", "nothing was written; rerun it to check again"):
        check_command(parser, args)


def check_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Run the checks ``args`` ask for and print them; exit 1 if one failed."""
    try:
        if args.plugin:
            load_plugin(args.plugin, "--plugin")
        options = dict(args.option)
        checked_options(_scheme_class(args.scheme, args.plugin), options, "--option ")
        report = check_scheme(
            args.scheme, options=options, plugin=args.plugin, train_len=args.train_len
        )
    except UserError as err:
        parser.error(str(err))
    print(report.text(args.verbose), flush=True)
    if report.passed and not args.no_cost:
        print(scheme_cost_report(args.scheme, options=options, plugin=args.plugin).text())
    sys.exit(0 if report.passed else 1)


def _scheme_class(name: str, plugin: str | None) -> type[PositionScheme]:
    """``scheme_class``, hinting at ``--plugin`` when a name is unknown and none was given."""
    try:
        return scheme_class(name)
    except UserError as err:
        if plugin:
            raise
        raise UserError(
            f"{err}; a plugin's scheme needs its module: pe-bench-check {name} --plugin "
            "<module>, e.g. --plugin my_pe"
        ) from None
