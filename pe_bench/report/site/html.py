"""HTML building blocks of the leaderboard site: escaping, the page frame, sortable tables and
a little markdown. Strings in, strings out; nothing here reads records."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from html import escape

GENERATOR = "pe-bench-report"  # the page's generator meta: marks a folder as a pe-bench site


def e(value: object) -> str:
    """``value`` as HTML text (quotes escaped too, so it fits an attribute)."""
    return escape(str(value), quote=True)


def attrs(**values: object) -> str:
    """`` name="value"`` pairs (``class_`` for class, ``data_x`` for data-x); None left out."""
    out = []
    for name, value in values.items():
        if value is None or value is False:
            continue
        key = name.rstrip("_").replace("_", "-")
        out.append(f" {key}" if value is True else f' {key}="{e(value)}"')
    return "".join(out)


CODE = re.compile(r"`([^`]*)`")
BOLD = re.compile(r"\*\*([^*]+)\*\*")
ITALIC = re.compile(r"(?<![*\w])\*([^*\s][^*]*)\*(?![*\w])")
LINK = re.compile(r"(https?://[^\s)<>\"]+[^\s)<>\".,;:])")


def inline(text: str) -> str:
    """A markdown sentence (``code``, **bold**) as HTML, with bare URLs linked."""
    html = e(text)
    html = CODE.sub(r"<code>\1</code>", html)
    html = BOLD.sub(r"<strong>\1</strong>", html)
    html = ITALIC.sub(r"<em>\1</em>", html)
    return LINK.sub(r'<a href="\1">\1</a>', html)


def data_json(element_id: str, data: object) -> str:
    """``data`` as an inline JSON script element (read by site.js; no fetch, so file:// works)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":")).replace("</", "<\\/")
    return f'<script type="application/json" id="{e(element_id)}">{text}</script>'


def number(value: float) -> str:
    """A value for a ``data-v`` attribute: what sorting compares ('' when missing)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{float(value):.6g}"


@dataclass
class Column:
    """A table column: its header, how it sorts (``num``, ``text`` or '' for not at all),
    which way is better (``low`` or ``high``: the first click sorts best first), for a column
    of one evaluation length that length and its multiple of the training length (the length
    filter hides the others), ``key``: a name the column chooser shows and hides it by, and
    ``mark``: the key of its "not separated" pairs (``site.js`` marks its best cell among the
    rows shown; a length column's is its length)."""

    head: str
    sort: str = "num"
    best: str = "low"
    length: int | None = None
    title: str = ""
    key: str = ""
    mark: str = ""
    factor: str = ""

    def data(self) -> dict[str, object]:
        """The ``data-*`` attributes its header and cells carry (None: left out)."""
        return {
            "data_len": self.length,
            "data_x": self.factor or None,
            "data_col": self.key or None,
        }


@dataclass
class Cell:
    """A table cell: its text (or ``html``) and interval (``ci``: hidden in compact mode), the
    value it sorts by and its mark (``best``, ``tied`` or '')."""

    text: str = "–"
    value: float | str | None = None
    mark: str = ""
    html: str = ""
    ci: str = ""

    def render(self, column: Column) -> str:
        value = self.value if isinstance(self.value, str) else number(self.value)
        cls = " ".join(c for c in ("t" if column.sort == "text" else "", self.mark) if c) or None
        body = self.html or e(self.text)
        if self.ci:
            body += f'<span class="ci"> {e(self.ci)}</span>'
        return f"<td{attrs(data_v=value, **column.data(), class_=cls)}>{body}</td>"


@dataclass
class Row:
    """A table row: its cells and the ``data-*`` attributes the filters read."""

    cells: list[Cell]
    data: dict[str, str] = field(default_factory=dict)


def table(columns: list[Column], rows: list[Row], board: str, caption: str = "") -> str:
    """A sortable table (``site.js``): headers with ``aria-sort``, cells with ``data-v``."""
    heads = []
    for col in columns:
        sortable = {"data_sort": col.sort, "data_best": col.best, "tabindex": "0"}
        extra = sortable if col.sort else {}
        title = col.title or None
        mark = col.mark or (str(col.length) if col.length else None)
        heads.append(
            f"<th{attrs(**col.data(), data_mark=mark, title=title, **extra)}>{e(col.head)}</th>"
        )
    body = []
    for row in rows:
        data = {f"data_{k}": v for k, v in row.data.items()}
        cells = "".join(c.render(col) for c, col in zip(row.cells, columns, strict=True))
        body.append(f"<tr{attrs(**data)}>{cells}</tr>")
    cap = f"<caption>{inline(caption)}</caption>" if caption else ""
    return (
        f'<div class="scroll"><table class="board"{attrs(data_board=board)}>{cap}'
        f"<thead><tr>{''.join(heads)}</tr></thead><tbody>\n"
        + "\n".join(body)
        + "\n</tbody></table></div>"
    )


def page(title: str, body: str, root: str, site: str) -> str:
    """A whole page: ``root`` is the relative path to the site's top ('' or '../')."""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="{GENERATOR}">
<title>{e(title)}</title>
<link rel="stylesheet" href="{root}assets/site.css">
</head>
<body>
<header class="top"><a href="{root}index.html">{e(site)}</a>
<span>pe-bench leaderboard</span></header>
<main>
{body}
</main>
<footer>Made by <code>pe-bench-report --site</code> from the run records alone; every number on
these pages is a record's field or computed from records.</footer>
<div id="tip" role="tooltip" hidden></div>
<script src="{root}assets/site.js"></script>
</body>
</html>
"""


def section(anchor: str, title: str, *parts: str) -> str:
    return f'<section id="{e(anchor)}">\n<h2>{e(title)}</h2>\n' + "\n".join(parts) + "\n</section>"


def paragraph(text: str, cls: str | None = None) -> str:
    return f"<p{attrs(class_=cls)}>{inline(text)}</p>"


def bullets(items: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{inline(item)}</li>" for item in items) + "</ul>"


@dataclass(frozen=True)
class Sources:
    """Where a site's pages link the report's CSV tables (``tables``) and the run folders
    (``runs``): paths relative to the site's top, so the links resolve while the site stays
    where it was written beside its results (docs/site/zoo and results/zoo); ``csv``: the
    tables that exist, by name without ``.csv``."""

    tables: str = ""
    runs: str = ""
    csv: frozenset[str] = frozenset()

    def links(self, names: tuple[str, ...] | list[str], root: str = "") -> str:
        """A line of links to the tables ``names`` that exist ('' if none)."""
        found = [name for name in names if name in self.csv]
        if not found:
            return ""
        items = " · ".join(
            f'<a href="{e(root + self.tables)}/{e(name)}.csv">{e(name)}.csv</a>' for name in found
        )
        return f'<p class="data">CSV: {items}</p>'

    def records(self, folder: str, root: str = "") -> str:
        """A link to the records file of the run folder ``folder`` (relative to the runs)."""
        path = f"{self.runs}/{folder}" if folder not in ("", ".") else self.runs
        return f'<a href="{e(root + path)}/records.jsonl">{e(folder)}</a>'
