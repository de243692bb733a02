"""Figures of a report, drawn from the aggregated tables (``pe_bench.report.aggregate``) only.

Every label keeps one style (colour, marker, line style) in every figure
(``pe_bench.report.styles``).

Figures are bare ``matplotlib.figure.Figure`` objects (no pyplot state, no display needed) and
are saved without dates or software versions in their metadata, so that regenerating a report
from the same records gives the same files.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, ScalarFormatter

from pe_bench.files import atomic_write
from pe_bench.report.metrics import spec
from pe_bench.report.styles import MAX_LINES, Style

PLAIN = FuncFormatter(lambda x, _: f"{x:g}")  # tick labels 1, 4, 0.5 instead of 2^0, 10^-1
PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None}


@contextlib.contextmanager
def theme() -> Iterator[None]:
    """seaborn's paper look, for figures made (and saved) inside the block; legend lines long
    enough to show their dash (two cycles of "-." at the default 2 font sizes showed one)."""
    with (
        sns.axes_style("ticks", {"axes.grid": True, "grid.color": ".9"}),
        sns.plotting_context("paper", font_scale=1.1),
        mpl.rc_context({"legend.handlelength": 3.5}),
    ):
        yield


LENGTH_LABELS = 8  # the most lengths a panel's x axis labels


def save(fig: Figure, folder: Path, name: str) -> Path:
    """Write ``name``.png and ``name``.pdf into ``folder``; returns the PNG's path.

    Each file replaces the old one whole (``atomic_write``), so a report killed or failing
    mid-figure leaves the previous figure, never a truncated one.
    """
    png, pdf = folder / f"{name}.png", folder / f"{name}.pdf"
    atomic_write(png, lambda f: fig.savefig(f, format="png", dpi=200, metadata=PNG_METADATA))
    atomic_write(pdf, lambda f: fig.savefig(f, format="pdf", metadata=PDF_METADATA))
    return png


def log2_lengths(ax, lengths: list[int]) -> None:
    """A log2 x axis with a tick at each length, labelled at most ``LENGTH_LABELS`` of them
    from the first on (21 labels of a task's lengths, 42 to 82, ran into each other)."""
    ax.set_xscale("log", base=2)
    step = math.ceil(len(lengths) / LENGTH_LABELS)
    ax.set_xticks(lengths, [str(n) if i % step == 0 else "" for i, n in enumerate(lengths)])
    ax.xaxis.set_minor_formatter(NullFormatter())


def train_line(ax, train_len: int) -> None:
    """A dotted vertical line at the training length."""
    ax.axvline(train_len, color="0.35", linestyle=(0, (1, 2)), linewidth=1, zorder=0)


def legend(fig: Figure, axes, style: dict[str, Style]) -> None:
    """One legend for all panels, outside on the right, labels in the style's (canonical) order,
    in as many columns as the figure's height needs."""
    handles = {}
    for ax in np.ravel(axes):
        for handle, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, handle)
    order = [lab for lab in style if lab in handles]
    font = FontProperties(size=mpl.rcParams["legend.fontsize"]).get_size_in_points()
    row = font * (1 + mpl.rcParams["legend.labelspacing"]) * 1.1  # with a margin
    rows = max(1, int((fig.get_figheight() * 72 - 2 * font) // row))
    ncols = math.ceil(len(order) / rows)
    if ncols > 1:  # more columns than one: the figure grows by them, so the panels keep their size
        column = (0.55 * max(map(len, order)) + 4) * font / 72  # inches: label, swatch, gap
        fig.set_figwidth(fig.get_figwidth() + (ncols - 1) * column)
    fig.legend(
        [handles[lab] for lab in order],
        order,
        loc="outside right upper",
        frameon=False,
        ncols=ncols,
    )


def footnote(fig: Figure, note: str) -> None:
    """A line of small text under the figure (a supxlabel, so the layout makes room for it)."""
    if note:
        fig.supxlabel(note, x=0.01, ha="left", fontsize="small", color="0.3")


def _ci_band(ax, line: pd.DataFrame, x: str, color: str) -> None:
    """The 95% CI (``ci_low`` to ``ci_high``) of a line as a faint band, where some point of
    it has more than one seed (``n`` > 1)."""
    if (line["n"] > 1).any():
        ax.fill_between(
            line[x], line["ci_low"], line["ci_high"], color=color, alpha=0.15, linewidth=0
        )


# Drawn faintly in every family's panel that lacks them, as landmarks to read the others by.
LANDMARKS = ("nope", "rope", "alibi")


def length_figure(
    stats: pd.DataFrame,
    style: dict[str, Style],
    metric: str,
    train_len: int,
    note: str = "",
    families: dict[str, str] | None = None,
) -> Figure:
    """``metric`` vs eval length, one line per label, 95% CI bands where n > 1. With more
    than ``MAX_LINES`` labels and their ``families`` (label -> family), one panel per family
    with its own legend, and the ``LANDMARKS`` drawn faintly in the panels without them."""
    stats = stats[stats["n"] > 0]
    labels = list(dict.fromkeys(stats["label"]))
    if families is None or len(labels) <= MAX_LINES:
        fig = Figure(figsize=(7.5, 4.2), layout="constrained")
        ax = fig.subplots()
        _length_lines(ax, stats, style, metric, train_len)
        ax.set_title(f"{spec(metric).title} vs evaluation length (trained at {train_len} tokens)")
        legend(fig, ax, style)
        footnote(fig, note)
        return fig
    groups = _groups(labels, families)
    ncols = min(2, len(groups))
    nrows = math.ceil(len(groups) / ncols)
    fig = Figure(figsize=(6.4 * ncols, 3.5 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False).ravel()
    for ax, (family, members) in zip(axes, groups.items(), strict=False):
        for lab in [m for m in LANDMARKS if m in labels and m not in members]:
            cell = stats[stats["label"] == lab]
            ax.plot(cell["eval_len"], cell["mean"], color="0.75", linewidth=1, zorder=0)
            ax.annotate(  # above the line's end, inside the panel: the legend is beside it
                lab,
                (cell["eval_len"].iloc[-1], cell["mean"].iloc[-1]),
                fontsize=7,
                color="0.6",
                xytext=(-2, 3),
                textcoords="offset points",
                ha="right",
                va="bottom",
            )
        _length_lines(ax, stats[stats["label"].isin(members)], style, metric, train_len)
        ax.set_title(family)
        _side_legend(ax)
    for ax in axes[len(groups) :]:
        ax.set_visible(False)
    fig.suptitle(
        f"{spec(metric).title} vs evaluation length (trained at {train_len} tokens), by family; "
        f"grey: {', '.join(m for m in LANDMARKS if m in labels)}"
    )
    footnote(fig, note)
    return fig


def _groups(labels: list[str], families: dict[str, str] | None) -> dict[str, list[str]]:
    """The labels by panel: by family where they are more than ``MAX_LINES`` (one panel,
    named '', otherwise)."""
    if families is None or len(labels) <= MAX_LINES:
        return {"": labels}
    groups: dict[str, list[str]] = {}
    for lab in labels:
        groups.setdefault(families.get(lab, "other"), []).append(lab)
    return groups


def _side_legend(ax) -> None:
    """A panel's own legend beside it, outside the data (inside, it hid lines and the
    training-length label)."""
    ax.legend(
        loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize="x-small",
        frameon=False,
    )  # fmt: skip


def _length_lines(ax, stats: pd.DataFrame, style: dict[str, Style], metric: str, train_len: int):
    """The lines (with CI bands) of ``stats``' labels on ``ax``, its log2 length axis, the
    training length and the metric's y axis."""
    for lab, cell in stats.groupby("label", sort=False):
        ax.plot(cell["eval_len"], cell["mean"], label=lab, markersize=5, **style[lab].line())
        _ci_band(ax, cell, "eval_len", style[lab].color)
    log2_lengths(ax, sorted(stats["eval_len"].unique()))
    train_line(ax, train_len)
    ax.annotate(
        "training length",
        (train_len, 1),
        xycoords=("data", "axes fraction"),
        xytext=(3, -3),
        textcoords="offset points",
        va="top",
        fontsize="small",
        color="0.35",
    )
    log = spec(metric).log_axis
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("evaluation length (tokens, log scale)")
    ax.set_ylabel(spec(metric).axis + (" (log scale)" if log else ""))


def task_figure(
    stats: dict[str, pd.DataFrame],
    style: dict[str, Style],
    metric: str,
    train_len: dict[str, int],
) -> Figure:
    """A synthetic-task ``metric`` (an accuracy, 0 to 1) vs eval length: one panel per task
    (``stats`` maps each to its ``seed_stats`` rows, ``train_len`` to its training length),
    one line per label, 95% CI bands."""
    fig = Figure(figsize=(3.4 * len(stats) + 1.5, 3.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(stats), sharey=True))
    for ax, (task, table) in zip(axes, stats.items(), strict=True):
        for lab, cell in table[table["n"] > 0].groupby("label", sort=False):
            ax.plot(cell["eval_len"], cell["mean"], label=lab, markersize=4, **style[lab].line())
            _ci_band(ax, cell, "eval_len", style[lab].color)
        log2_lengths(ax, sorted(table["eval_len"].unique()))
        train_line(ax, train_len[task])
        if spec(metric).bounds:
            low, high = spec(metric).bounds
            ax.set_ylim(low - 0.03 * (high - low), high + 0.03 * (high - low))
        ax.set_title(task)
        ax.set_xlabel("input length (tokens)")
    axes[0].set_ylabel(spec(metric).axis)
    legend(fig, axes, style)
    return fig


def position_figure(
    positions: pd.DataFrame,
    style: dict[str, Style],
    train_len: int,
    note: str = "",
    bands: pd.DataFrame | None = None,
    title: str = "Loss by position inside the window",
    families: dict[str, str] | None = None,
) -> Figure:
    """Mean loss vs position inside the window: a column per eval length, a line per label
    with its 95% interval over seeds (``positions``' ci_low and ci_high, where n > 1) or, with
    ``bands`` (``aggregate.position_intervals``), over windows. With more than ``MAX_LINES``
    labels and their ``families``, a row of panels per family, each row with its legend."""
    lengths = sorted(positions["eval_len"].unique())
    groups = _groups(list(dict.fromkeys(positions["label"])), families)
    nrows, ncols = len(groups), len(lengths)
    fig = Figure(figsize=(2.9 * ncols + 2.0, 2.5 * nrows + 0.7), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False)
    for row, (family, members) in zip(axes, groups.items(), strict=True):
        for ax, length in zip(row, lengths, strict=True):
            panel = positions[(positions["eval_len"] == length) & positions["label"].isin(members)]
            for lab, line in panel.groupby("label", sort=False):
                _position_line(ax, line, style[lab], _band(bands, length, lab))
            _window_axis(ax, int(length), train_len)
            ax.set_title(f"windows of {length} tokens", fontsize="medium")
        loss = "loss (nats/token)"
        row[0].set_ylabel(f"{family}\n{loss}" if family else loss)
        _side_legend(row[-1])
    fig.suptitle(
        f"{title} (dotted line: training length {train_len}; bands: 95% interval)", wrap=True
    )
    footnote(fig, note)
    return fig


def _band(bands: pd.DataFrame | None, length: int, lab: str) -> pd.DataFrame | None:
    """A label's interval over windows at one length, if ``bands`` has one."""
    if bands is None or bands.empty:
        return None
    band = bands[(bands["eval_len"] == length) & (bands["label"] == lab)]
    return band if len(band) else None


def _position_line(ax, line: pd.DataFrame, style: Style, band: pd.DataFrame | None) -> None:
    """One label's loss by position, with its interval over seeds (or over windows) shaded."""
    ax.plot(
        line["position"], line["loss"], label=line["label"].iloc[0], markevery=0.1,
        markersize=3.5, linewidth=1.1, **style.line(),
    )  # fmt: skip
    if band is not None:
        ax.fill_between(
            band["position"], band["ci_low"], band["ci_high"], alpha=0.2, color=style.color,
            linewidth=0,
        )  # fmt: skip
    elif "ci_low" in line:  # the seeds' interval, where a point has more than one
        _ci_band(ax, line, "position", style.color)


def _window_axis(ax, length: int, train_len: int) -> None:
    """A log2 axis of positions 1 to ``length``, ticks on powers of two with the window's end
    always labelled (at most 6 labels), and the training length's line inside it."""
    ax.set_xscale("log", base=2)
    powers = [2**k for k in range(int(math.log2(length)) + 1)]
    ends = [length] if powers[-1] != length else []
    ticks = (powers + ends)[::-1][:: math.ceil(len(powers + ends) / 6)][::-1]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(1, length)
    if train_len < length:
        train_line(ax, train_len)
    ax.set_xlabel("position in window")


def curve_figure(curves: pd.DataFrame, style: dict[str, Style], note: str = "") -> Figure:
    """Training and validation loss vs step, a line per trained scheme (mean over seeds)."""
    splits = [s for s in ("train", "valid") if s in set(curves["split"])]
    fig = Figure(figsize=(4.2 * len(splits) + 1.6, 3.6), layout="constrained")
    axes = fig.subplots(1, len(splits), sharex=True, sharey=True, squeeze=False).ravel()
    for ax, split in zip(axes, splits, strict=True):
        for lab, line in curves[curves["split"] == split].groupby("label", sort=False):
            ax.plot(
                line["step"],
                line["mean"],
                label=lab,
                markevery=0.1 if split == "train" else 1,
                markersize=4,
                linewidth=1.2,
                **style[lab].line(),
            )
            _ci_band(ax, line, "step", style[lab].color)
        ax.set_title("training loss" if split == "train" else "validation loss")
        ax.set_xlabel("training step")
    axes[0].set_ylabel("loss (nats/token)")
    fig.suptitle("Training curves")
    legend(fig, axes, style)
    footnote(fig, note)
    return fig


def ratio_heatmap(ratio: pd.DataFrame, metric: str, baseline: int, note: str = "") -> Figure:
    """The ratio table as a heatmap: white at 1, log colour scale, each cell annotated."""
    finite = ratio.to_numpy(dtype=float)
    finite = finite[np.isfinite(finite)]
    span = max(1.05, float(np.max(finite)), 1 / float(np.min(finite))) if finite.size else 2.0
    fig = Figure(
        figsize=(1.6 + 0.85 * ratio.shape[1] + 1.2, 0.9 + 0.38 * ratio.shape[0]),
        layout="constrained",
    )
    ax = fig.subplots()
    norm = LogNorm(1 / span, span)
    ticks = [t for t in (1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8, 16, 32, 64) if norm.vmin <= t <= span]
    sns.heatmap(
        ratio,
        ax=ax,
        annot=True,
        fmt=".2f",
        cmap="vlag",
        norm=norm,
        linewidths=0.5,
        linecolor="white",
        cbar_kws={"label": f"ratio to L = {baseline} (log scale)", "ticks": ticks},
    )
    colorbar = ax.collections[0].colorbar
    colorbar.ax.yaxis.set_major_formatter(PLAIN)
    colorbar.ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("")
    ax.tick_params(axis="y", rotation=0)
    ax.set_title(f"{spec(metric).title} relative to L = {baseline}")
    footnote(fig, note)
    return fig
