"""A page per scheme: what it is (its class's docstring: formula and reference), its options
and their defaults, the caveats its records carry, its numbers on every board and its cost."""

from __future__ import annotations

import inspect

import pandas as pd

from pe_bench.positions import registered
from pe_bench.report import aggregate
from pe_bench.report.inputs import Report
from pe_bench.report.site.boards import KINDS, Board, Label, board_table, slug
from pe_bench.report.site.costs import cost_table
from pe_bench.report.site.html import (
    LINK,
    Cell,
    Column,
    Row,
    Sources,
    bullets,
    e,
    page,
    paragraph,
    section,
    table,
)


def docstring(name: str) -> str:
    """The registered class's docstring as preformatted HTML (URLs linked), or why none."""
    cls = registered().get(name)
    if cls is None:
        return paragraph(
            f"No scheme class is registered under `{name}` where this site was made (a "
            "pretrained model, or a plugin that was not imported), so there is no docstring."
        )
    text = inspect.cleandoc(cls.__doc__ or "(no docstring)")
    linked = LINK.sub(r'<a href="\1">\1</a>', e(text))
    where = f"{cls.__module__}.{cls.__qualname__}"
    intro = f'<p class="note">From the docstring of <code>{e(where)}</code>:</p>'
    return f'{intro}<pre class="doc">{linked}</pre>'


def options(name: str, labs: list[Label], df: pd.DataFrame) -> str:
    """The constructor's options with their defaults, and the options the runs set."""
    cls = registered().get(name)
    if cls is None:
        return ""
    params = list(inspect.signature(cls.__init__).parameters.values())[2:]  # self, dims
    defaults = ["–" if p.default is inspect.Parameter.empty else repr(p.default) for p in params]
    rows = [Row([Cell(p.name, p.name), Cell(d, d)]) for p, d in zip(params, defaults, strict=True)]
    parts = []
    if rows:
        parts.append(
            table(
                [Column("option", "text"), Column("default in the code", "text")],
                rows,
                f"options-{slug(name)}",
            )
        )
    else:
        parts.append(paragraph("No options."))
    if getattr(cls, "variant_of", None):
        parts.append(
            paragraph(
                f"An eval-time variant of `{cls.variant_of}`: applied to its trained "
                "checkpoint, no training of its own."
            )
        )
    if "pe_options" in df:
        set_ = df[df["label"].isin([lab.name for lab in labs])]["pe_options"].dropna().unique()
        if len(set_):
            parts.append(
                paragraph("Set in these runs: " + "; ".join(f"`{o}`" for o in sorted(set_)) + ".")
            )
    return section("options", "Options", *parts)


def related(labs: list[Label], info: dict[str, Label]) -> str:
    """Links between a trained scheme's page and its eval-time variants' pages."""
    if labs[0].kind == "eval-time":
        bases = sorted({lab.scheme for lab in labs})
        links = ", ".join(f'<a href="{slug(b)}.html">{e(b)}</a>' for b in bases)
        return f"<p>Evaluated on the trained checkpoint of {links}.</p>"
    trained = {lab.scheme for lab in labs}
    variants = sorted(
        {lab.page for lab in info.values() if lab.kind == "eval-time" and lab.scheme in trained}
    )
    if not variants:
        return ""
    links = ", ".join(f'<a href="{slug(v)}.html">{e(v)}</a>' for v in variants)
    return f"<p>Eval-time variants scored on this checkpoint: {links}.</p>"


def numbers(
    name: str, labs: list[Label], found: list[Board], df: pd.DataFrame, src: Sources
) -> list[str]:
    """The page's labels on every board of the index (no marks: they compare all labels),
    each followed by its values per seed."""
    names = {lab.name: lab for lab in labs}
    parts = []
    for board in found:
        mine = board.stats[board.stats["label"].isin(names)]
        if mine.empty:
            continue
        sub = Board(
            f"{board.key}-{slug(name)}",
            board.title,
            mine,
            None,
            board.fmt,
            board.train_len,
            board.y_label,
            board.higher,
        )
        body = board_table(sub, names, "../", facts=False)
        seeds = per_seed(board, list(names), df, src, f"seeds-{board.key}-{slug(name)}")
        parts.append(section(f"numbers-{board.key}", board.title, body, seeds))
    return parts


def per_seed(board: Board, names: list[str], df: pd.DataFrame, src: Sources, key: str) -> str:
    """Each run's value of the board's metric per length (what the means and intervals above
    are computed from), with a link to the run's records ('' for a board of pooled trials)."""
    if not board.metric or board.metric not in df:
        return ""
    runs = df[df["label"].isin(names) & df["eval_len"].notna()]
    if board.task:
        runs = runs[runs["task"] == board.task]
    if runs.empty:
        return ""
    columns = [Column("scheme", "text"), Column("seed"), Column("records", "text")]
    columns += [Column(str(n), length=n, factor=board.factor(n)) for n in board.lengths]
    rows = []
    for (lab, seed, folder), run in runs.groupby(["label", "seed", "folder"], sort=False):
        by_length = run.groupby("eval_len")[board.metric].mean()  # one record per length
        cells = [Cell(lab, lab), Cell(f"{seed:g}", seed)]
        cells.append(Cell(folder, folder, html=src.records(folder, "../")))
        for n in board.lengths:
            value = by_length.get(n)
            shown = "–" if value is None or pd.isna(value) else board.fmt.format(value)
            cells.append(Cell(shown, value))
        rows.append(Row(cells, {"label": lab}))
    note = paragraph(
        "Per run (seed): the values the means and intervals above are computed from; each "
        "run's folder links its `records.jsonl`.",
        "note",
    )
    return f"<h3>Per seed</h3>{note}{table(columns, rows, key)}"


def scheme_page(
    name: str,
    labs: list[Label],
    found: list[Board],
    report: Report,
    info: dict[str, Label],
    site: str,
    src: Sources,
) -> str:
    """The page of one scheme (or eval-time variant, or pretrained model)."""
    df, costs = report.frame, report.tables.get("cost", pd.DataFrame(columns=["label"]))
    names = [lab.name for lab in labs]
    kinds = ", ".join(dict.fromkeys(KINDS.get(lab.kind, lab.kind) for lab in labs))
    shown = ", ".join(f"`{n}`" for n in names)
    parts = [
        f"<h1>{e(name)}</h1>",
        paragraph(f"Family: {labs[0].family}; {kinds}; on this site as {shown}.", "lead"),
        related(labs, info),
        section("what", "What it is", docstring(name)),
        options(name, labs, df),
    ]
    noted = {lab: text for lab, text in aggregate.caveats(df).items() if lab in names}
    if noted:
        items = [f"**{lab}**: {text}." for lab, text in noted.items()]
        parts.append(section("caveats", "Caveats", bullets(items)))
    parts += numbers(name, labs, found, df, src)
    mine = costs[costs["label"].isin(names)]
    if len(mine):
        body = cost_table(mine, {lab.name: lab for lab in labs}, f"cost-{slug(name)}")
        where = '<p class="note">Units, hardware and what each column measures: the '
        where += '<a href="../index.html#cost">cost section</a> of the leaderboard.</p>'
        parts.append(section("cost", "Cost", body, where))
    parts.append('<p><a href="../index.html">Back to the leaderboard</a></p>')
    return page(f"{name} · {site}", "\n".join(p for p in parts if p), "../", site)
