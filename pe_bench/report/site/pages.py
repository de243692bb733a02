"""The pages of a report's leaderboard site: the index (filters, the leaderboard, its curves,
cost, passkey or the synthetic tasks, the scheme list, provenance) and ``write_site``."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import pandas as pd

from pe_bench.errors import UserError
from pe_bench.files import atomic_write_bytes, atomic_write_text
from pe_bench.report import aggregate, cost
from pe_bench.report.best import score_marks
from pe_bench.report.figures import LANDMARKS
from pe_bench.report.inputs import Report, check_output_folder, commands
from pe_bench.report.markdown import caption
from pe_bench.report.metrics import spec
from pe_bench.report.passkey import accuracy_table, passkey_rows
from pe_bench.report.ranking import ranked_by
from pe_bench.report.ruler import ruler_rows, score_table
from pe_bench.report.sections import provenance_markdown, summary_markdown, trained_models
from pe_bench.report.site import boards, scale, schemes
from pe_bench.report.site.boards import (
    KINDS,
    Board,
    Label,
    board_panels,
    board_table,
    metric_board,
)
from pe_bench.report.site.costs import beside, cost_table
from pe_bench.report.site.html import (
    GENERATOR,
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
from pe_bench.report.site.positions import position_section
from pe_bench.report.site.tasks import factors, mrr_table, separating, task_boards, task_sections
from pe_bench.report.site.tasks import summary as task_summary
from pe_bench.report.tasks import provenance as task_provenance

ASSETS = ("site.css", "site.js")


def filters(info: dict[str, Label], factors: list[tuple[str, str]]) -> str:
    """The filter bar: a search box, family, kind, one length (``factors``: its multiple of
    the training length and how it reads), what to mark "not separated" from, compact mode
    and the column chooser (``site.js`` fills it from the tables' ``data-col`` columns)."""

    def select(name: str, title: str, options: list[tuple[str, str]]) -> str:
        items = "".join(f'<option value="{e(v)}">{e(t)}</option>' for v, t in options)
        return f'<label>{e(title)} <select data-filter="{name}">{items}</select></label>'

    families = sorted({lab.family for lab in info.values()})
    kinds = [k for k in (*KINDS, "pretrained") if any(lab.kind == k for lab in info.values())]
    return (
        '<form class="filters" onsubmit="return false">'
        '<label>search <input type="search" data-filter="q" placeholder="scheme or family" '
        'aria-label="search schemes"></label>'
        + select("family", "family", [("", "all"), *((f, f) for f in families)])
        + select("kind", "kind", [("", "all"), *((k, KINDS.get(k, k)) for k in kinds)])
        + select("length", "length", [("", "all"), *factors])
        + select(
            "ref",
            "mark not separated from",
            [("", "the best shown"), *((lab, lab) for lab in info)],
        )
        + '<label title="the means only: intervals, family and kind hidden (filter them above)">'
        '<input type="checkbox" data-view="compact"> compact</label>'
        '<details class="columns"><summary>columns</summary><div class="choices"></div></details>'
        "</form>"
    )


def legend_text(higher: bool) -> str:
    best = "highest" if higher else "lowest"
    return (
        f"**Bold**: the {best} mean of each column among the rows shown (or the scheme chosen "
        "above); underlined with ≈: the seeds do not separate it from that one (the 95% "
        "t-interval of their difference, paired over seeds, includes 0). Click a column "
        "heading to sort by it (best first, again to reverse); hover a curve for its values."
    )


def perplexity_index(
    report: Report, name: str, info: dict[str, Label], root: Path, src: Sources
) -> tuple[str, list[Board]]:
    """The index of a perplexity report, and its boards (for the scheme pages)."""
    df, opts, tables = report.frame, report.options, report.tables
    metric, stats, shown = opts.metric, tables[opts.metric], spec(opts.metric)
    train_len = int(df["train_len"].dropna().iloc[0])
    board = metric_board("main", shown.title, stats, tables["pairwise"], metric, train_len)
    board.lead, board.lead_pairs = [score_column(tables)], {"score": tables["score_pairwise"]}
    board.extra = beside(tables["cost"], board.lengths)
    board.csv = (metric, "pairwise", "score", "ratio", "ranks")
    boards_ = [board]
    parts = [
        f"<h1>Length extrapolation leaderboard: {e(name)}</h1>",
        paragraph(summary_markdown(df, trained_models(df), opts, stats), "lead"),
        toc(
            [
                "leaderboard",
                "curves",
                "cost",
                *(["passkey"] if passkey_present(report) else []),
                *(["ruler"] if ruler_board(report) is not None else []),
                *(["positions"] if not report.positions.empty else []),
                "schemes",
                "about",
            ]
        ),
        filters(info, [(board.factor(n), board.head(n)) for n in board.lengths]),
        section(
            "leaderboard",
            f"{shown.title} by evaluation length",
            paragraph(caption(stats, metric, df)[0].upper() + caption(stats, metric, df)[1:] + "."),
            board_table(board, info, ""),
            src.links(board.csv),
            paragraph(legend_text(shown.higher_is_better), "note"),
            caveats(df),
        ),
        section(
            "curves", f"{shown.title} vs evaluation length", board_panels(board, info, LANDMARKS)
        ),
        cost_section(report, info, src),
    ]
    parts += retrieval_sections(report, info, boards_)
    parts += [position_section(report.positions, train_len), scheme_list(info)]
    parts.append(about(report, root, src))
    return "\n".join(parts), boards_


def score_column(tables: dict[str, pd.DataFrame]) -> tuple[Column, dict[str, Cell]]:
    """The extrapolation score beside the lengths: mean [CI], marked like a length."""
    scores = tables["score"]
    marks = score_marks(scores, tables["score_pairwise"])
    fmt = f"{{:.{aggregate.SCORE_DIGITS}f}}"
    cells = {}
    for s in scores.itertuples():
        text = "–" if pd.isna(s.score) else fmt.format(s.score)
        ci = f"[{fmt.format(s.ci_low)}, {fmt.format(s.ci_high)}]" if s.n > 1 else ""
        cells[s.label] = Cell(text, s.score, marks.get(s.label, ""), ci=ci)
    title = "mean NLL over the lengths per run, then over seeds; lower is better"
    return Column("score", title=title, key="score", mark="score"), cells


def cost_section(report: Report, info: dict[str, Label], src: Sources) -> str:
    """The cost table, sortable and filtered like the leaderboard, with its notes."""
    notes = cost.cost_notes(report.frame, report.tables["cost"])
    body = cost_table(report.tables["cost"], info, "cost")
    notes_html = (paragraph(n, "note") for n in notes)
    return section("cost", "Cost", body, src.links(["cost"]), *notes_html)


def caveats(df: pd.DataFrame) -> str:
    noted = aggregate.caveats(df)
    if not noted:
        return ""
    return (
        '<div class="caveats"><h3>Caveats</h3>'
        + bullets([f"**{lab}**: {text}." for lab, text in noted.items()])
        + "</div>"
    )


PASSKEY = (
    "Mohtashami & Jaggi (2023): a key from 1 to 50000 hidden in filler text at a random "
    "depth, greedy decoding, exact match. Accuracy over trials with its 95% Wilson interval, "
    "per target prompt length; every label answers the same prompts."
)


RULER = (
    "Hsieh et al. (2024), RULER's synthetic tasks as its generators write them: the fraction "
    "of the expected strings in the greedy output, over every trial of the run's tasks (their "
    "mean), with its 95% Wilson interval, per target length; every label answers the same "
    "prompts. report.md has each task's."
)


def ruler_board(report: Report) -> Board | None:
    """RULER's score per label and length (the mean over the run's tasks) as a board; None
    without RULER records."""
    rows = ruler_rows(report.records) if len(report.records) else pd.DataFrame()
    if rows.empty:
        return None
    table = score_table(rows)
    several = table["task"].eq("mean").any()
    table = table[table["task"] == ("mean" if several else table["task"].iloc[0])]
    scores = table.rename(columns={"trials": "n", "score": "mean"}).drop(columns="task")
    train_len = int(rows["train_len"].iloc[0])
    return Board(
        "ruler", "RULER score", scores, None, "{:.2f}", train_len, "score",
        higher=True, bounds=(0.0, 1.0),
    )  # fmt: skip


def retrieval_sections(report: Report, info: dict[str, Label], boards_: list[Board]) -> list[str]:
    """The passkey and RULER sections of the index, where the run has them (their boards
    appended to ``boards_``)."""
    parts: list[str] = []
    if passkey_present(report):
        key = passkey_board(report)
        boards_.append(key)
        parts.append(
            section(
                "passkey",
                "Passkey retrieval",
                paragraph(PASSKEY),
                board_table(key, info, ""),
                board_panels(key, info),
            )
        )
    ruler = ruler_board(report)
    if ruler is not None:
        boards_.append(ruler)
        parts.append(
            section(
                "ruler",
                "RULER",
                paragraph(RULER),
                board_table(ruler, info, ""),
                board_panels(ruler, info),
            )
        )
    return parts


def passkey_present(report: Report) -> bool:
    return not passkey_rows(report.records).empty if len(report.records) else False


def passkey_board(report: Report) -> Board:
    """Passkey accuracy per label and length as a board (trials pooled, no paired test)."""
    rows = passkey_rows(report.records)
    acc = accuracy_table(rows).rename(columns={"trials": "n", "acc": "mean"})
    train_len = int(rows["train_len"].iloc[0])
    return Board(
        "passkey",
        "Passkey accuracy",
        acc,
        None,
        "{:.2f}",
        train_len,
        "accuracy",
        higher=True,
        bounds=(0.0, 1.0),
    )


def toc(anchors: list[str]) -> str:
    return '<nav class="toc">' + " · ".join(f'<a href="#{a}">{a}</a>' for a in anchors) + "</nav>"


def scheme_list(info: dict[str, Label]) -> str:
    """Every scheme page with its family, the labels on it and its paper."""
    pages: dict[str, list[Label]] = {}
    for lab in info.values():
        pages.setdefault(lab.page, []).append(lab)
    rows = []
    for page_name, labs in pages.items():
        link = f'<a href="schemes/{boards.slug(page_name)}.html">{e(page_name)}</a>'
        kinds = ", ".join(dict.fromkeys(KINDS.get(lab.kind, lab.kind) for lab in labs))
        cells = [
            Cell(page_name, page_name, html=link),
            Cell(labs[0].family, labs[0].family),
            Cell(kinds, kinds),
        ]
        cells.append(Cell(", ".join(lab.name for lab in labs), ", ".join(lab.name for lab in labs)))
        cells.append(boards.fact_cells(labs[0])[-1])  # its paper
        rows.append(
            Row(cells, {"label": labs[0].name, "family": labs[0].family, "kind": labs[0].kind})
        )
    columns = [
        Column("scheme", "text"),
        Column("family", "text"),
        Column("kind", "text"),
        Column("labels", "text"),
        boards.FACTS[-1],
    ]
    return section("schemes", "Schemes", table(columns, rows, "schemes"))


def about(report: Report, root: Path, src: Sources) -> str:
    """Provenance, the commands that made the records and the report's CSV tables."""
    df = report.frame
    lines = [
        line[2:] for line in provenance_markdown(df, trained_models(df)) if line.startswith("- ")
    ]
    found = commands(Path(root))
    code = "".join(f"{e(c)}\n" for c in found) or "# unknown\n"
    return section(
        "about",
        "Provenance",
        bullets(lines),
        "<p>The runs' commands:</p>",
        f"<pre><code>{code}</code></pre>",
        data_section(src),
    )


def data_section(src: Sources) -> str:
    """Every CSV table of the report, linked (they sit beside the report, not in the site)."""
    if not src.csv:
        return ""
    return (
        f"<p>The report's tables as CSV (in <code>{e(src.tables)}</code>, relative to this "
        "page):</p>" + src.links(sorted(src.csv))
    )


def mrr_text(tasks: list[str]) -> str:
    return (
        "As Kazemnejad et al. (2023) summarise: for each task and seed, schemes ranked by "
        f"{ranked_by(tasks)} averaged over the lengths beyond the training length (ties share "
        "the better rank), then 1/rank averaged over the (task, seed) cells (n). A point "
        "ranking: each task's table says which differences the seeds support."
    )


def task_index(
    report: Report, name: str, info: dict[str, Label], src: Sources
) -> tuple[str, list[Board]]:
    """The index of a synthetic-task report, and its boards."""
    found = task_boards(report)
    anchors = ["mrr", *(f"task-{t}" for t in report.tasks), "cost", "schemes", "about"]
    provenance = [
        line[2:] for line in task_provenance(report.frame, report.tasks) if line.startswith("- ")
    ]
    parts = [
        f"<h1>Synthetic task leaderboard: {e(name)}</h1>",
        paragraph(task_summary(report), "lead"),
        toc(anchors),
        filters(info, factors(report)),
        paragraph(legend_text(True), "note"),
        section(
            "mrr",
            "Mean reciprocal rank over tasks",
            paragraph(mrr_text(report.tasks)),
            paragraph(separating(report)),
            mrr_table(report, info),
            src.links(["mrr"]),
        ),
        *task_sections(report, found, info, src),
        cost_section(report, info, src),
        scheme_list(info),
        section("about", "Provenance", bullets(provenance), data_section(src)),
    ]
    return "\n".join(parts), found


def ladder_index(
    report: Report, name: str, info: dict[str, Label], root: Path, src: Sources
) -> str:
    """The index of a scale ladder's report: the scale view, the schemes, provenance."""
    anchors = ["rungs", "claims", "ratio", "nll", "ranking", "separated", "schemes", "about"]
    parts = [
        f"<h1>Scale ladder leaderboard: {e(name)}</h1>",
        scale.intro(report),
        toc(anchors),
        *scale.scale_sections(report, info),
        scheme_list(info),
        about(report, root, src),
    ]
    return "\n".join(parts)


def check_site_folder(out: Path) -> None:
    """Refuse ``out`` unless it is a new or empty folder or holds an earlier pe-bench site
    (which a new one replaces): checked before a report writes anything."""
    check_output_folder("--site", out)
    if not out.exists() or not any(out.iterdir()):
        return
    index = out / "index.html"
    if not index.is_file() or f'content="{GENERATOR}"' not in index.read_text(errors="replace"):
        raise UserError(
            f"--site {str(out)!r} is not empty and holds no pe-bench site; allowed: a new or "
            "empty folder, or an earlier pe-bench site"
        )


def prepare(out: Path, keep: set[str]) -> None:
    """Make ``out`` ready for the site (``check_site_folder``): an earlier site's scheme pages
    that this one does not write are removed."""
    check_site_folder(out)
    if not out.exists():
        return
    for stale in sorted((out / "schemes").glob("*.html")):
        if f"schemes/{stale.name}" not in keep:
            stale.unlink()


def sources(report: Report, root: Path, out: Path) -> Sources:
    """Where the site links the report's CSV tables and the run folders, relative to ``out``
    (``/``-separated, so a committed site is the same on every system)."""

    def relative(path: Path) -> str:
        return Path(os.path.relpath(path.resolve(), out.resolve())).as_posix()

    tables = report.path.parent / "tables"
    return Sources(
        relative(tables), relative(root), frozenset(p.stem for p in tables.glob("*.csv"))
    )


def write_site(report: Report, root: Path, out: Path) -> Path:
    """Write the leaderboard site of ``report`` (made from the records under ``root``) into
    ``out``: index.html, a page per scheme under schemes/, assets/site.css and site.js.
    Returns the index's path. The pages depend only on the records and the code's docstrings
    (no dates), so a committed site regenerates byte for byte."""
    name = Path(root).resolve().name
    info = boards.labels(report.frame)
    src = sources(report, Path(root), out)
    if report.tasks:
        body, found = task_index(report, name, info, src)
    elif "scale_far" in report.tables:
        body, found = ladder_index(report, name, info, root, src), []
    else:
        body, found = perplexity_index(report, name, info, root, src)
    files = {"index.html": page(f"pe-bench leaderboard: {name}", body, "", name)}
    by_page: dict[str, list[Label]] = {}
    for lab in info.values():
        by_page.setdefault(lab.page, []).append(lab)
    for page_name, labs in by_page.items():
        text = schemes.scheme_page(page_name, labs, found, report, info, name, src)
        files[f"schemes/{boards.slug(page_name)}.html"] = text
    prepare(out, set(files))
    for rel, text in files.items():
        atomic_write_text(out / rel, text)
    static = resources.files("pe_bench.report.site").joinpath("static")
    for asset in ASSETS:
        atomic_write_bytes(out / "assets" / asset, static.joinpath(asset).read_bytes())
    for figure in scale.FIGURES.keys() & report.figures.keys():  # a ladder's PNGs
        atomic_write_bytes(out / "figures" / f"{figure}.png", report.figures[figure].read_bytes())
    return out / "index.html"
