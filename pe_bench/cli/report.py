"""``pe-bench-report <results dir>``: the command line over ``report.build.build_report``,
with ``--latex DIR`` (the report's LaTeX tables copied into a paper's folder) and ``--site DIR``
(the report as a static leaderboard site, ``report.site``). Every output folder is checked
before anything is written."""

from __future__ import annotations

import argparse
from pathlib import Path

from pe_bench.cli.console import console
from pe_bench.errors import OneLineParser, UserError, os_message
from pe_bench.files import atomic_write_text
from pe_bench.records import MODES
from pe_bench.report import latex, metrics
from pe_bench.report.build import build_report
from pe_bench.report.inputs import Options, check_output_folder
from pe_bench.report.site import write_site
from pe_bench.report.site.pages import check_site_folder

DESCRIPTION = (
    "Write the report of a folder of pe-bench records: report.md, tables (Markdown, CSV, "
    "LaTeX) and figures; optionally a copy of the LaTeX tables and a static leaderboard site."
)
RERUN = "nothing was half-written (each file is replaced whole); rerun it to write the report"


def build_parser() -> OneLineParser:
    """The command's arguments."""
    parser = OneLineParser(prog="pe-bench-report", description=DESCRIPTION)
    parser.add_argument("results", help="folder with records (searched recursively)")
    parser.add_argument(
        "--metric",
        choices=metrics.names(metrics.LM),
        default="ppl",
        help="metric of the figures and the ratio table (default: ppl)",
    )
    parser.add_argument(
        "--mode", choices=list(MODES), help="eval mode (default: nonoverlap when present)"
    )
    parser.add_argument(
        "--baseline",
        type=int,
        help="length the ratio table divides by (default: the training length)",
    )
    parser.add_argument(
        "--schemes",
        nargs="+",
        default=(),
        metavar="NAME",
        help="schemes or labels to report (default: all), e.g. rope alibi rope+ntk",
    )
    parser.add_argument(
        "--compare",
        action="append",
        metavar="TABLE",
        help="a published table to compare with: published/alibi_paper, published/pi_paper "
        "(results/published/) or a path to a YAML file of the same form; repeat it to compare "
        "with several, each in its own section",
    )
    parser.add_argument("--out", help="output folder (default: the results folder)")
    parser.add_argument(
        "--latex",
        metavar="DIR",
        help="also copy the LaTeX tables (always written to tables/*.tex) into DIR, e.g. a "
        "paper's folder",
    )
    parser.add_argument(
        "--latex-style",
        choices=list(latex.STYLES),
        help="the form of the --latex copies: table (the default, as tables/*.tex: a column "
        "wide, intervals small after their means), table* (a two-column paper's full width), "
        "compact (means only, a smaller font), compact* (both)",
    )
    parser.add_argument(
        "--site",
        metavar="DIR",
        help="also write the report as a static leaderboard site into DIR (opens from the "
        "file system: DIR/index.html)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.latex_style and not args.latex:
        parser.error(
            f"--latex-style {args.latex_style} styles the --latex copies: add --latex DIR "
            "(the report's own tables/*.tex keep the default style)"
        )
    options = Options(args.metric, args.mode, args.baseline, tuple(args.schemes), args.compare)
    with console("pe-bench-report", RERUN):
        try:
            report_command(args, options)
        except UserError as err:
            parser.error(str(err))
        except OSError as err:  # a full disk, a folder made read-only meanwhile
            parser.error(os_message(err))


def report_command(args: argparse.Namespace, options: Options) -> None:
    """Check every output folder, then write the report, the LaTeX copy and the site, and say
    where each is."""
    check_output_folder("--out", args.out or args.results)
    if args.latex:
        check_output_folder("--latex", args.latex)
    if args.site:
        check_site_folder(Path(args.site))
    report = build_report(args.results, args.out, options)
    if args.latex:
        copy_latex(report.latex, Path(args.latex), args.latex_style or "table")
    site = write_site(report, Path(args.results), Path(args.site)) if args.site else None
    print(f"\n{report.where(Path(args.results), site.parent if site else None)}")


def copy_latex(tables: list[Path], folder: Path, style: str) -> None:
    """The report's LaTeX tables, in ``style``, into ``folder`` (a paper's)."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in tables:
        atomic_write_text(folder / path.name, latex.restyle(path.read_text(), style))
    print(f"LaTeX tables: {len(tables)} in {folder.resolve()} (style {style})")
