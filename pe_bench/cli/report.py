"""``pe-bench-report <results dir>``: the command line over ``report.build.build_report``,
with ``--latex DIR`` (the report's LaTeX tables copied into a paper's folder) and ``--site DIR``
(the report as a static leaderboard site, ``report.site``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from pe_bench.errors import OneLineParser, UserError, os_message
from pe_bench.records import (
    MODES,
)
from pe_bench.report.aggregate import METRICS
from pe_bench.report.build import build_report
from pe_bench.report.inputs import Options
from pe_bench.report.site import write_site


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="pe-bench-report", description=__doc__.split("\n")[0])
    parser.add_argument("results", help="folder with records (searched recursively)")
    parser.add_argument(
        "--metric",
        choices=list(METRICS),
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
        "--site",
        metavar="DIR",
        help="also write the report as a static leaderboard site into DIR (opens from the "
        "file system: DIR/index.html)",
    )
    args = parser.parse_args(argv)
    options = Options(args.metric, args.mode, args.baseline, tuple(args.schemes), args.compare)
    try:
        report = build_report(args.results, args.out, options)
        if args.latex:
            Path(args.latex).mkdir(parents=True, exist_ok=True)
            for path in report.latex:
                shutil.copyfile(path, Path(args.latex) / path.name)
            print(f"LaTeX tables: {len(report.latex)} in {args.latex}")
        if args.site:
            print(f"site: {write_site(report, Path(args.results), Path(args.site))}")
    except UserError as err:
        parser.error(str(err))
    except OSError as err:  # a read-only or full disk, an --out that cannot be made
        parser.error(f"{os_message(err)}; allowed: --out a folder you can write to")
