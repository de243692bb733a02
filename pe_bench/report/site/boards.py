"""A *board*: one metric's table (label x length, mean [95% interval], the best cell of each
column and the cells the seeds do not separate from it marked) with its length curves, as the
site shows it; and the facts about each label the filters and scheme pages use."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import pandas as pd

from pe_bench.positions import scheme_family
from pe_bench.report import aggregate
from pe_bench.report.best import value_marks
from pe_bench.report.metrics import spec
from pe_bench.report.site import svg
from pe_bench.report.site.html import Cell, Column, Row, data_json, e, table
from pe_bench.report.site.papers import citation
from pe_bench.report.styles import MAX_LINES, Style, report_styles

KINDS = {"trained": "trained", "eval-time": "eval-time variant", "fine-tuned": "fine-tuned"}


@dataclass(frozen=True)
class Label:
    """What the site knows of a label: its scheme page, family, kind and curve panel."""

    name: str
    scheme: str
    page: str  # the registered name its page is about (a variant's name for a variant)
    family: str
    kind: str  # trained, eval-time, fine-tuned or pretrained
    group: str  # the curve panel it is drawn in


def slug(name: str) -> str:
    """A file name for a scheme page: the registry name, other characters as '-'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name)


def labels(df: pd.DataFrame) -> dict[str, Label]:
    """Every label of the records, in the canonical order (``aggregate.label_order``), which
    gives each its style as in the report's figures."""
    keys = ["label", "scheme", "variant"] + [k for k in ("finetune", "pretrained") if k in df]
    found = {}
    for row in df[keys].drop_duplicates("label").itertuples():
        tuned = getattr(row, "finetune", None)
        tuned = tuned if isinstance(tuned, str) and tuned != "none" else ""
        pretrained = getattr(row, "pretrained", False) is True
        family = "pretrained" if pretrained else scheme_family(row.scheme)
        if row.variant != "none":
            kind, page, group = "eval-time", row.variant, f"{row.scheme} at eval time"
        else:
            kind = "fine-tuned" if tuned else ("pretrained" if pretrained else "trained")
            page, group = row.scheme, family
        found[row.label] = Label(row.label, row.scheme, page, family, kind, group)
    return {lab: found[lab] for lab in aggregate.label_order(df) if lab in found}


@dataclass
class Board:
    """One metric's numbers: ``stats`` (``aggregate.seed_stats`` rows), the ``pairs`` of
    paired differences (None: untested), how to print a value, and extra columns."""

    key: str  # unique on its page
    title: str
    stats: pd.DataFrame
    pairs: pd.DataFrame | None
    fmt: str  # a format for one value, e.g. "{:.2f}"
    train_len: int
    y_label: str
    higher: bool = False
    log: bool = False
    bounds: tuple[float, float] | None = None
    lead: list[tuple[Column, dict[str, Cell]]] = field(default_factory=list)  # before lengths
    lead_pairs: dict[str, pd.DataFrame] = field(default_factory=dict)  # a lead column's mark
    extra: list[tuple[Column, dict[str, Cell]]] = field(default_factory=list)  # after them
    metric: str = ""  # the records' field it is the mean of ('' for pooled trials: passkey)
    task: str = ""  # the synthetic task whose records it holds ('' for every record)
    csv: tuple[str, ...] = ()  # the report's tables/*.csv it is read from, without .csv

    @property
    def lengths(self) -> list[int]:
        return sorted(int(n) for n in self.stats["eval_len"].unique())

    def head(self, length: int) -> str:
        return f"{length} ({self.factor(length)}x)"

    def factor(self, length: int) -> str:
        """``length`` as a multiple of the training length (what the length filter picks)."""
        return f"{length / self.train_len:g}"

    def parts(self, cell: pd.Series) -> tuple[str, str]:
        """The mean and ``[low, high]`` of a stats row, as the report prints them ('–' and ''
        without them)."""
        if cell["n"] == 0 or pd.isna(cell["mean"]):
            return "–", ""
        if pd.isna(cell["ci_low"]) or pd.isna(cell["ci_high"]):
            return self.fmt.format(cell["mean"]), ""
        low, high = self.fmt.format(cell["ci_low"]), self.fmt.format(cell["ci_high"])
        return self.fmt.format(cell["mean"]), f"[{low}, {high}]"

    def text(self, cell: pd.Series) -> str:
        """``mean [low, high]`` of a stats row, as the report prints it ('–' without one)."""
        return " ".join(part for part in self.parts(cell) if part)


def metric_board(
    key: str,
    title: str,
    stats: pd.DataFrame,
    pairs: pd.DataFrame | None,
    metric: str,
    train_len: int,
) -> Board:
    """The board of a registered metric (``report.metrics``): its format, axis, direction,
    scale and bounds from its spec."""
    shown = spec(metric)
    return Board(
        key,
        title,
        stats,
        pairs,
        shown.fmt,
        train_len,
        shown.axis,
        higher=shown.higher_is_better,
        log=shown.log_axis,
        bounds=shown.bounds,
        metric=metric,
    )


def board_table(board: Board, info: dict[str, Label], root: str, facts: bool = True) -> str:
    """The board's sortable table: the label, ``board.lead``, a column per length,
    ``board.extra`` and, when ``facts``, the label's family, kind and paper; on a board of
    every label, the data ``site.js`` needs to mark the rows shown."""
    pairs = board.pairs if board.pairs is not None else pd.DataFrame()
    marks = value_marks(board.stats, pairs, board.higher) if len(pairs) else {}
    best = "high" if board.higher else "low"
    lengths = [
        Column(board.head(n), best=best, length=n, factor=board.factor(n)) for n in board.lengths
    ]
    columns = [Column("scheme", "text"), *(col for col, _ in board.lead), *lengths]
    columns += [col for col, _ in board.extra] + (FACTS if facts else [])
    rows = []
    for lab, cells in board.stats.groupby("label", sort=False):
        about = info[lab]
        link = f'<a href="{root}schemes/{slug(about.page)}.html">{e(lab)}</a>'
        row = [
            Cell(lab, lab, html=link),
            *(by_label.get(lab, Cell()) for _, by_label in board.lead),
        ]
        for cell in cells.itertuples():
            value = cell.mean if cell.n > 0 else math.nan
            mark = marks.get((lab, cell.eval_len), "")
            mean, ci = board.parts(pd.Series(cell._asdict()))
            row.append(Cell(mean, value, mark, ci=ci))
        row += [by_label.get(lab, Cell()) for _, by_label in board.extra]
        row += fact_cells(about) if facts else []
        rows.append(Row(row, {"label": lab, "family": about.family, "kind": about.kind}))
    html = table(columns, rows, board.key)
    if board.pairs is None:  # no paired test (passkey) or a part of a board (a scheme page)
        return html
    data = {"higher": board.higher, **not_separated(board, pairs)}
    return html + "\n" + data_json(f"pairs-{board.key}", data)


FACTS = [
    Column("family", "text", key="family"),
    Column("kind", "text", key="kind"),
    Column("paper", "text", key="paper", title="the reference its class's docstring cites"),
]


def fact_cells(about: Label) -> list[Cell]:
    """A label's family, kind and paper (linked where its docstring gives the address)."""
    kind = KINDS.get(about.kind, about.kind)
    cite = citation(about.page)
    paper = Cell(cite.text, f"{cite.year} {cite.text}" if cite.year else "", html=cite.html())
    return [Cell(about.family, about.family), Cell(kind, about.kind), paper]


def not_separated(board: Board, pairs: pd.DataFrame) -> dict[str, object]:
    """The labels of the board, and for each marked column (a length, or a lead column's
    mark such as the score) and label the indices of the labels the seeds do not separate
    from it (tested pairs only): what ``site.js`` reads."""
    names = list(dict.fromkeys(board.stats["label"]))
    index = {lab: i for i, lab in enumerate(names)}
    found: dict[str, dict[int, list[int]]] = {}
    tables = [(None, pairs), *board.lead_pairs.items()]
    for key, table_ in tables:
        tested = (
            table_[(table_["n"] >= 2) & ~table_["separated"].astype(bool)]
            if len(table_)
            else table_
        )
        for pair in tested.itertuples():
            if pair.label_a not in index or pair.label_b not in index:
                continue
            a, b = index[pair.label_a], index[pair.label_b]
            at = found.setdefault(key or str(int(pair.eval_len)), {})
            at.setdefault(a, []).append(b)
            at.setdefault(b, []).append(a)
    ties = {n: [sorted(at.get(i, [])) for i in range(len(names))] for n, at in found.items()}
    return {"labels": names, "ties": dict(sorted(ties.items()))}


def board_panels(board: Board, info: dict[str, Label], landmarks: tuple[str, ...] = ()) -> str:
    """The board's curves: one panel per group of labels (one panel if they fit), a legend
    under each; ``landmarks`` drawn faintly in the panels that lack them."""
    stats = board.stats[board.stats["n"] > 0]
    order = list(dict.fromkeys(stats["label"]))
    style = report_styles(list(info), {lab: info[lab].group for lab in info})
    many = len(order) > MAX_LINES
    groups: dict[str, list[str]] = {}
    for lab in order:
        groups.setdefault(info[lab].group if many else board.title, []).append(lab)
    values = [
        v
        for v in stats[["mean", "ci_low", "ci_high"]].to_numpy().ravel()
        if v == v and (v > 0 or not board.log)
    ]
    bounds = board.bounds or svg.y_range(values or [0.0, 1.0], board.log, None)
    figures_html = []
    for name, members in groups.items():
        lines = [series(board, stats, lab, style[lab]) for lab in members]
        lines += [
            series(board, stats, lab, style[lab], faint=True)
            for lab in landmarks
            if lab in order and lab not in members
        ]
        picture = svg.panel(
            lines,
            board.lengths,
            board.train_len,
            "evaluation length (tokens, log2 scale)",
            board.y_label,
            board.log,
            bounds,
        )
        figures_html.append(panel_figure(name, picture, members, style))
    return '<div class="panels">' + "\n".join(figures_html) + "</div>"


def panel_figure(name: str, picture: str, members: list[str], style: dict[str, Style]) -> str:
    """A curve panel as the site shows it: its caption, the ``<svg>`` and a legend under it
    (filtered and hovered by label, ``site.js``)."""
    legend = "".join(
        f'<li data-label="{e(lab)}">{svg.swatch(style[lab].color, style[lab].linestyle)}'
        f"{e(lab)}</li>"
        for lab in members
    )
    return (
        f'<figure class="panel"><figcaption>{e(name)}</figcaption>{picture}'
        f'<ul class="legend">{legend}</ul></figure>'
    )


def series(
    board: Board, stats: pd.DataFrame, lab: str, style: Style, faint: bool = False
) -> svg.Series:
    """A label's line: a point per length with a number, its hover text naming all."""
    points = []
    for cell in stats[stats["label"] == lab].itertuples():
        tip = f"{lab} · {board.head(int(cell.eval_len))}: {board.text(pd.Series(cell._asdict()))}"
        points.append(svg.Point(int(cell.eval_len), cell.mean, cell.ci_low, cell.ci_high, tip))
    return svg.Series(lab, style.color, style.linestyle, points, faint)
