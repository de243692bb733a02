"""The site's length curves as inline SVG: one panel of lines over a log2 length axis, each
point carrying the text a hover shows (``site.js``), the 95% interval as a faint band.

Plain SVG written here rather than a plotting library's JavaScript: the page then needs no
script to show the figure (the script only adds hover), stays a few kilobytes, and opens from
the file system with no network (docs/outputs.md says why in full).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pe_bench.report.site.html import attrs, e

WIDTH, HEIGHT = 440, 280
LEFT, RIGHT, TOP, BOTTOM = 52, 14, 14, 42
DASHES = {"-": None, "--": "6 3", ":": "1.5 3", "-.": "6 3 1.5 3"}


@dataclass
class Point:
    x: float  # the evaluation length
    y: float  # the mean
    low: float = math.nan
    high: float = math.nan
    tip: str = ""  # what a hover shows


@dataclass
class Series:
    label: str
    color: str
    dash: str = "-"
    points: list[Point] = field(default_factory=list)
    faint: bool = False  # a landmark drawn in grey, without points


def swatch(color: str, dash: str) -> str:
    """A legend entry's line: its colour and its dash, as the curve draws it (a block of
    colour showed neither dash nor which of two same-coloured lines it was)."""
    pattern = attrs(stroke_dasharray=DASHES.get(dash))
    return (
        f'<svg class="sw" viewBox="0 0 30 8" width="30" height="8" aria-hidden="true">'
        f'<line x1="1" y1="4" x2="29" y2="4" stroke="{e(color)}" stroke-width="2.2"{pattern}/>'
        "</svg>"
    )


def ticks(low: float, high: float, log: bool) -> list[float]:
    """Tick values for an axis from ``low`` to ``high``: 1-2-5 steps on a log axis, a step of
    1, 2, 2.5 or 5 times a power of ten on a linear one (4 to 8 ticks)."""
    if log:
        found = []
        for k in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
            found += [m * 10**k for m in (1, 2, 5) if low <= m * 10**k <= high]
        return found if len(found) >= 2 else [low, high]
    span = high - low or 1.0
    for step in sorted(m * 10**k for k in range(-4, 8) for m in (1, 2, 2.5, 5)):
        if span / step <= 7:
            start = math.ceil(low / step) * step
            count = math.floor((high - start) / step + 1e-9) + 1
            return [round(start + i * step, 10) for i in range(count)]
    return [low, high]


def y_range(values: list[float], log: bool, bounds: tuple[float, float] | None) -> tuple:
    """The y axis's (low, high): ``bounds`` when given (accuracies: 0 to 1), else the values
    with a margin (on a log axis, a ratio)."""
    if bounds:
        return bounds
    low, high = min(values), max(values)
    if log:
        return low / 1.08, high * 1.08
    pad = (high - low) * 0.06 or abs(high) * 0.1 or 1.0
    return low - pad, high + pad


class Frame:
    """Maps lengths (log2) and values (log or linear) to the panel's pixels."""

    def __init__(self, lengths: list[int], low: float, high: float, log: bool) -> None:
        self.x0, self.x1 = math.log2(min(lengths)), math.log2(max(lengths))
        self.low, self.high, self.log = low, high, log

    def x(self, length: float) -> float:
        span = (self.x1 - self.x0) or 1.0
        return LEFT + (math.log2(length) - self.x0) / span * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        f = math.log if self.log else float
        share = (f(value) - f(self.low)) / ((f(self.high) - f(self.low)) or 1.0)
        return TOP + (1 - share) * (HEIGHT - TOP - BOTTOM)


def fmt(value: float) -> str:
    return f"{value:.1f}"


def axes(frame: Frame, lengths: list[int], train_len: int, x_label: str, y_label: str) -> str:
    """Grid, tick labels, the training length's dotted line and the axis titles."""
    parts = []
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    for value in ticks(frame.low, frame.high, frame.log):
        y = fmt(frame.y(value))
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{right}" y1="{y}" y2="{y}"/>')
        parts.append(
            f'<text class="tick" x="{LEFT - 5}" y="{y}" dy="0.32em" text-anchor="end">'
            f"{value:g}</text>"
        )
    for length in lengths:
        x = fmt(frame.x(length))
        parts.append(
            f'<text class="tick" x="{x}" y="{bottom + 14}" text-anchor="middle">{length}</text>'
        )
    if min(lengths) <= train_len <= max(lengths):
        x = fmt(frame.x(train_len))
        parts.append(f'<line class="train" x1="{x}" x2="{x}" y1="{TOP}" y2="{bottom}"/>')
    parts.append(
        f'<rect class="box" x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{bottom - TOP}"/>'
    )
    parts.append(
        f'<text class="axis" x="{(LEFT + right) / 2:.1f}" y="{HEIGHT - 6}" '
        f'text-anchor="middle">{e(x_label)}</text>'
    )
    middle = (TOP + bottom) / 2
    parts.append(
        f'<text class="axis" x="12" y="{middle:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 12 {middle:.1f})">{e(y_label)}</text>'
    )
    return "\n".join(parts)


def series_svg(series: Series, frame: Frame) -> str:
    """One line: its band (where points have an interval), the line and its hover points."""
    points = [p for p in series.points if not math.isnan(p.y)]
    if not points:
        return ""
    line = " ".join(f"{fmt(frame.x(p.x))},{fmt(frame.y(p.y))}" for p in points)
    if series.faint:
        end = points[-1]
        x, y = fmt(frame.x(end.x) - 3), fmt(frame.y(end.y) - 4)
        name = f'<text class="landmark-label" x="{x}" y="{y}" text-anchor="end">{e(series.label)}'
        name += "</text>"
        return f'<polyline class="landmark" points="{line}"/>{name}'
    parts = [f'<g class="series"{attrs(data_label=series.label)} style="--c:{series.color}">']
    banded = [p for p in points if not (math.isnan(p.low) or math.isnan(p.high))]
    if len(banded) > 1:
        upper = [f"{fmt(frame.x(p.x))},{fmt(frame.y(p.high))}" for p in banded]
        lower = [f"{fmt(frame.x(p.x))},{fmt(frame.y(p.low))}" for p in reversed(banded)]
        parts.append(f'<polygon class="band" points="{" ".join(upper + lower)}"/>')
    dash = DASHES.get(series.dash)
    parts.append(f'<polyline class="line" points="{line}"{attrs(stroke_dasharray=dash)}/>')
    for p in points:
        x, y = fmt(frame.x(p.x)), fmt(frame.y(p.y))
        parts.append(f'<circle class="pt" cx="{x}" cy="{y}" r="4"{attrs(data_tip=p.tip)}/>')
    parts.append("</g>")
    return "\n".join(parts)


def panel(
    series: list[Series],
    lengths: list[int],
    train_len: int,
    x_label: str,
    y_label: str,
    log: bool = False,
    bounds: tuple[float, float] | None = None,
) -> str:
    """One panel as an ``<svg>`` element (landmarks first, under the lines)."""
    values = [
        v for s in series for p in s.points for v in (p.y, p.low, p.high) if not math.isnan(v)
    ]
    if log:
        values = [v for v in values if v > 0]
    low, high = y_range(values or [0.0, 1.0], log, bounds)
    frame = Frame(lengths, low, high, log)
    ordered = [s for s in series if s.faint] + [s for s in series if not s.faint]
    body = "\n".join(filter(None, (series_svg(s, frame) for s in ordered)))
    return (
        f'<svg class="curve" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{e(y_label)} vs {e(x_label)}">\n'
        f"{axes(frame, lengths, train_len, x_label, y_label)}\n{body}\n</svg>"
    )
