"""The index of a scale ladder's site (``report.ladder``): per label the 16x/1x perplexity
ratio and the NLL at 16x at each rung with their intervals, the rank per rung with Kendall's
tau between rungs, which pairs the seeds separate, and whether each README claim holds.

Every number is read from the tables the ladder report writes (``tables/scale_*.csv``), so
the site and report.md cannot disagree; the figures are the report's own PNGs, copied beside
the pages by ``write_site``."""

from __future__ import annotations

import pandas as pd

from pe_bench.report import claims
from pe_bench.report.inputs import Report
from pe_bench.report.ladder import FAR, INTRO, interval
from pe_bench.report.rungs import split_rungs
from pe_bench.report.site import boards
from pe_bench.report.site.boards import Label
from pe_bench.report.site.html import Cell, Column, Row, e, paragraph, section, table

FIGURES = {
    "scale_params": "against parameters (the rungs at the most common training length)",
    "scale_length": "against the training length (the rungs of the most common model)",
}
SEPARATED = (
    "`a < b`: a has the lower (better) extrapolation score and the seeds separate them (the "
    "95% t-interval of the difference, paired over seeds, excludes 0); `·`: not separated; "
    "`–`: not measured at that rung."
)


def rung_names(report: Report) -> list[str]:
    """The rungs in the report's order (the rank table's columns)."""
    return [str(c) for c in report.tables["scale_rank"].columns]


def label_row(lab: str, info: dict[str, Label], cells: list[Cell]) -> Row:
    """A row of a label table: the label linked to its scheme page, then ``cells``."""
    about = info[lab]
    link = f'<a href="schemes/{boards.slug(about.page)}.html">{e(lab)}</a>'
    data = {"label": lab, "family": about.family, "kind": about.kind}
    return Row([Cell(lab, lab, html=link), *cells], data)


def far_board(report: Report, info: dict[str, Label], column: str, fmt: str) -> str:
    """Label x rung: ``column`` of ``scale_far`` (``ratio`` or ``nll``), mean [95% interval]
    over seeds as report.md prints it; the lowest mean at each rung in bold (every label that
    prints the same as the lowest)."""
    far, names = report.tables["scale_far"], rung_names(report)
    lowest = {rung: fmt.format(v) for rung, v in far.groupby("rung")[column].min().items()}
    rows = []
    for lab, group in far.groupby("label", sort=False):
        by_rung = group.set_index("rung")
        cells = []
        for name in names:
            if name not in by_rung.index:
                cells.append(Cell())
                continue
            c = by_rung.loc[name]
            text = interval(c[column], c[f"{column}_low"], c[f"{column}_high"], fmt)
            best = lowest.get(name) == fmt.format(c[column])
            cells.append(Cell(text, c[column], "best" if best else ""))
        rows.append(label_row(lab, info, cells))
    columns = [Column("scheme", "text"), *(Column(n) for n in names)]
    return table(columns, rows, f"scale-{column}")


def rank_board(report: Report, info: dict[str, Label]) -> str:
    """Label x rung: the rank by extrapolation score (``scale_rank``), rank 1 in bold."""
    ranks = report.tables["scale_rank"]
    rows = []
    for lab, row in ranks.iterrows():
        cells = [Cell("–" if pd.isna(v) else f"{v:g}", v, "best" if v == 1 else "") for v in row]
        rows.append(label_row(str(lab), info, cells))
    columns = [Column("scheme", "text"), *(Column(str(n)) for n in ranks.columns)]
    return table(columns, rows, "scale-rank")


def frame_board(frame: pd.DataFrame, first: str, key: str, fmt: str = "{}") -> str:
    """A small table of text or numbers (rows: its index) as a sortable board."""
    rows = []
    for idx, row in frame.iterrows():
        cells = [Cell(str(idx), str(idx))]
        for v in row:
            numeric = isinstance(v, float)
            text = "–" if pd.isna(v) else (fmt.format(v) if numeric else str(v))
            cells.append(Cell(text, v if numeric else text))
        rows.append(Row(cells))
    sort = "num" if all(frame.dtypes.map(pd.api.types.is_float_dtype)) else "text"
    columns = [Column(first, "text"), *(Column(str(c), sort, best="high") for c in frame.columns)]
    return table(columns, rows, key)


def claims_board(report: Report) -> str:
    """Claim x rung (``scale_claims``): the README's sentence, then per rung ``holds``,
    ``no: <what failed>`` or ``–: <why untestable>``; ``holds`` in bold."""
    verdicts = report.tables["scale_claims"]
    rows = []
    for claim in claims.CLAIMS:
        if claim.key not in verdicts.index:
            continue
        cells = [Cell(claim.text, claim.text)]
        for v in verdicts.loc[claim.key]:
            cells.append(Cell(str(v), str(v), "best" if v == "holds" else ""))
        rows.append(Row(cells, {"claim": claim.key}))
    columns = [Column("claim", "text"), *(Column(str(c), "text") for c in verdicts.columns)]
    return table(columns, rows, "scale-claims")


def rungs_board(report: Report) -> str:
    """The rungs: width, depth, parameters (without the scheme's own) and training length."""
    rows = []
    for rung, _ in split_rungs(report.frame):
        values = (rung.d_model, rung.num_layers, rung.params, rung.train_len)
        cells = [Cell(rung.name, rung.name)]
        cells += [Cell(f"{v:,}", v) for v in values]
        rows.append(Row(cells))
    heads = ("d_model", "layers", "parameters", "L_train")
    return table([Column("rung", "text"), *(Column(h) for h in heads)], rows, "scale-rungs")


def figures_html(report: Report) -> str:
    """The report's ladder figures (copied to ``figures/`` beside index.html)."""
    shown = [
        f'<figure class="scale"><figcaption>{e(FAR)}x / 1x and NLL at {e(FAR)}x '
        f'{e(text)}</figcaption><img src="figures/{name}.png" alt="{e(text)}" '
        'style="max-width:100%"></figure>'
        for name, text in FIGURES.items()
        if name in report.figures
    ]
    return '<div class="panels">' + "\n".join(shown) + "</div>" if shown else ""


def scale_sections(report: Report, info: dict[str, Label]) -> list[str]:
    """The sections of the scale view, in the order of report.md."""
    kendall = report.tables["scale_kendall"]
    return [
        section("rungs", "Rungs", rungs_board(report)),
        section(
            "claims", "Whether the quick suite's claims hold at each rung", claims_board(report)
        ),
        section(
            "ratio",
            f"Perplexity at {FAR}x over 1x",
            paragraph("Geometric mean over seeds [95% t-interval]; bold: the lowest at a rung."),
            far_board(report, info, "ratio", "{:.2f}"),
            figures_html(report),
        ),
        section("nll", f"NLL at {FAR}x (nats/token)", far_board(report, info, "nll", "{:.3f}")),
        section(
            "ranking",
            "Ranking by extrapolation score",
            paragraph("Rank 1 is the lowest mean NLL over the rung's eval lengths."),
            rank_board(report, info),
            paragraph(
                "Kendall's tau-b between the rungs' extrapolation scores (1: the same order):"
            ),
            frame_board(kendall, "rung", "scale-kendall", "{:.2f}"),
        ),
        section(
            "separated",
            "Which pairs the seeds separate, by extrapolation score",
            paragraph(SEPARATED),
            frame_board(report.tables["scale_separated"], "pair", "scale-separated"),
        ),
    ]


def intro(report: Report) -> str:
    return paragraph(INTRO.format(rungs=len(rung_names(report))), "lead")
