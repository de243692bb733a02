"""The site's loss-by-position section: for the truncate mode's records (documents cut to the
window, every position scored: the papers' protocol, ``pretrained.truncate``), each label's
loss by bucket of positions inside the window with its 95% t-interval over documents
(``protocols.truncate_positions``), a panel per evaluation length, as report.md's figure."""

from __future__ import annotations

import math

import pandas as pd

from pe_bench.report.site import svg
from pe_bench.report.site.boards import panel_figure
from pe_bench.report.site.html import paragraph, section
from pe_bench.report.styles import styles

TEXT = (
    "The papers' perplexity protocol (documents truncated to the window, every position "
    "scored, as YaRN's Table 6 and PI's Table 1): the loss at each position inside the window, "
    "averaged over log-spaced buckets of positions, with its 95% t-interval over the documents "
    "(each a window). The dotted line is the training length: positions past it are the "
    "extrapolation."
)
MAX_TICKS = 8


def position_ticks(length: int) -> list[int]:
    """The x axis's ticks for windows of ``length`` tokens: powers of two from 1, every
    other one where more than ``MAX_TICKS`` would crowd it, and ``length`` itself last."""
    top = int(math.log2(length))
    step = math.ceil((top + 1) / MAX_TICKS)
    found = [2**k for k in range(0, top + 1, step)]
    return found if found[-1] == length else [*found, length]


def position_section(bands: pd.DataFrame, train_len: int) -> str:
    """The section, or '' without truncate records."""
    if bands.empty:
        return ""
    order = list(dict.fromkeys(bands["label"]))
    style = styles(order)
    parts = []
    for length, cell in bands.groupby("eval_len", sort=True):
        lines = []
        for lab in order:
            line = cell[cell["label"] == lab]
            points = [
                svg.Point(p.position, p.loss, p.ci_low, p.ci_high, tip(lab, int(length), p))
                for p in line.itertuples()
            ]
            lines.append(svg.Series(lab, style[lab].color, style[lab].linestyle, points))
        picture = svg.panel(
            lines,
            position_ticks(int(length)),
            train_len,
            "position in the window (tokens, log2 scale)",
            "loss (nats/token)",
        )
        parts.append(panel_figure(f"windows of {int(length)} tokens", picture, order, style))
    return section(
        "positions",
        "Loss by position",
        paragraph(TEXT),
        '<div class="panels">' + "\n".join(parts) + "</div>",
    )


def tip(lab: str, length: int, bucket) -> str:
    """What a point's hover shows: the bucket's mean position, loss [interval], documents."""
    text = f"{lab} · window {length}, position ≈ {bucket.position:.0f}: {bucket.loss:.3f}"
    if not (pd.isna(bucket.ci_low) or pd.isna(bucket.ci_high)):
        text += f" [{bucket.ci_low:.3f}, {bucket.ci_high:.3f}]"
    return text + f" over {int(bucket.windows)} documents"
