"""The report's "Context use" section: the context-use probes' records (``pe_bench.run.probes``)
as tables, figures and what each measure means.

- **Context gain** and **retrieval gain**: per (label, eval length or distance), one seed shows
  the record's own mean and 95% CI (over windows, or over snippets); several seeds show the
  mean over seeds and the 95% t-interval over them (``stats.t_interval``).
- **No signal**: the copy probe has signal for a label when, at the shortest distance, its
  retrieval gain is at least ``SIGNAL_BITS`` and its CI excludes 0. Where no label has signal,
  the section says so instead of letting the table read as a ranking.
- **Attention**: mean distance and entropy per layer, mean over seeds.

Like the rest of the report, the output depends only on the records (fixed formats, sorted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pe_bench.records import PROBES
from pe_bench.report import aggregate, figures, latex
from pe_bench.report.markdown import markdown_table, write_csv
from pe_bench.report.styles import Style
from pe_bench.stats import t_interval

SIGNAL_BITS = 0.05  # the least retrieval gain (bits/token) that counts as a signal
GAIN_COLUMNS = ["label", "x", "n", "mean", "ci_low", "ci_high", "over", "targets"]


@dataclass
class ContextUse:
    """The probe tables (``context_gain``, ``retrieval``, ``attention``) and figure PNGs."""

    train_len: int
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: dict[str, Path] = field(default_factory=dict)
    mixed: list[str] = field(default_factory=list)  # probes with records of several settings


def probe_records(records: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """The ok probe records of the runs and labels of ``df`` (the prepared perplexity
    records: its labels, settings and ``--schemes`` choice carry over)."""
    if "mode" not in records:
        return pd.DataFrame()
    probes = records[records["mode"].isin(PROBES)]
    if "status" in probes:
        probes = probes[probes["status"].fillna("ok") == "ok"]
    labels = df[["run_id", "variant", "label"]].drop_duplicates()
    return probes.drop(columns="label", errors="ignore").merge(labels, on=["run_id", "variant"])


def context_use(records: pd.DataFrame, df: pd.DataFrame) -> ContextUse | None:
    """The section's tables from every record under the report's folder; None without probes."""
    probes = probe_records(records, df)
    if probes.empty:
        return None
    use = ContextUse(int(df["train_len"].dropna().iloc[0]))
    order = aggregate.label_order(df)
    for probe in PROBES:
        rows = probes[probes["mode"] == probe]
        if rows.empty:
            continue
        if rows["probe_hash"].nunique() > 1:
            use.mixed.append(probe)
            continue
        if probe == "attention":
            use.tables[probe] = attention_table(rows, order)
        else:
            x = "distance" if probe == "retrieval" else "eval_len"
            over = "snippets" if probe == "retrieval" else "windows"
            use.tables[probe] = gain_table(rows, order, x, over)
            if probe == "retrieval":
                use.tables["copy_acc"] = accuracy_table(rows, order)
    return use


def gain_table(rows: pd.DataFrame, order: list[str], x: str, over: str) -> pd.DataFrame:
    """Per (label, ``x``): mean gain and 95% CI, over ``over`` for one seed (the record's own)
    or over seeds; ``targets`` per run."""
    cells = []
    for lab in [lab for lab in order if lab in set(rows["label"])]:
        for value, at in rows[rows["label"] == lab].groupby(x):
            if len(at) == 1:
                r = at.iloc[0]
                stats, how = (1, r["gain_bits"], r["gain_ci_low"], r["gain_ci_high"]), over
            else:
                stats, how = t_interval(at["gain_bits"].astype(float)), "seeds"
            cells.append([lab, int(value), *stats, how, int(at["targets"].iloc[0])])
    return pd.DataFrame(cells, columns=GAIN_COLUMNS).rename(columns={"x": x})


def accuracy_table(rows: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Per (label, distance): exact-match copy accuracy with and without the copy source,
    mean over seeds."""
    rows = rows.astype({"distance": int})
    table = rows.groupby(["label", "distance"], as_index=False)[["copy_acc", "control_acc"]].mean()
    return sort_labels(table, order, "distance")


def attention_table(rows: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Per (label, eval length, layer): mean attention distance and entropy over seeds."""
    long = rows[["label", "eval_len", "mean_distance", "entropy"]].explode(
        ["mean_distance", "entropy"]
    )
    long = long.assign(layer=long.groupby(level=0).cumcount() + 1)
    long = long.astype({"mean_distance": float, "entropy": float, "eval_len": int})
    table = long.groupby(["label", "eval_len", "layer"], as_index=False)[
        ["mean_distance", "entropy"]
    ].mean()
    return sort_labels(table, order, "eval_len", "layer")


def sort_labels(table: pd.DataFrame, order: list[str], *by: str) -> pd.DataFrame:
    rank = table["label"].map({lab: i for i, lab in enumerate(order)})
    return table.assign(rank=rank).sort_values(["rank", *by]).drop(columns="rank")


def no_signal(retrieval: pd.DataFrame) -> tuple[int, list[str], list[str]]:
    """(shortest distance, labels with signal there, labels without): signal is a gain of at
    least ``SIGNAL_BITS`` whose CI excludes 0."""
    shortest = int(retrieval["distance"].min())
    at = retrieval[retrieval["distance"] == shortest]
    signal = (at["mean"] >= SIGNAL_BITS) & (at["ci_low"] > 0)
    return shortest, list(at.loc[signal, "label"]), list(at.loc[~signal, "label"])


# ---- markdown -------------------------------------------------------------------------------


def gain_markdown(table: pd.DataFrame, x: str) -> str:
    """Label x ``x`` table of ``+mean [low, high]`` cells (bits per token)."""
    columns = sorted(table[x].unique())
    rows = []
    for lab, cells in table.groupby("label", sort=False):
        by = {int(c[x]): c for _, c in cells.iterrows()}
        rows.append([lab, *(gain_cell(by[c]) if c in by else "–" for c in columns)])
    return markdown_table(["scheme", *map(str, columns)], rows, "l" + "r" * len(columns))


def gain_cell(cell: pd.Series) -> str:
    text = f"{cell['mean']:+.3f}"
    if not (math.isnan(cell["ci_low"]) or math.isnan(cell["ci_high"])):
        text += f" [{cell['ci_low']:+.3f}, {cell['ci_high']:+.3f}]"
    return text


def how_markdown(table: pd.DataFrame, unit: str) -> str:
    """How the cells' CIs were made: over seeds, or over a run's windows or snippets."""
    ways = sorted(set(table["over"]))
    targets = sorted(set(table["targets"]))
    per = ", ".join(map(str, targets))
    over = " or ".join(
        "seeds (n = runs)" if w == "seeds" else f"the run's {w} (one seed)" for w in ways
    )
    return f"Mean [95% CI over {over}], {per} scored {unit} per run and cell."


def accuracy_markdown(table: pd.DataFrame) -> str:
    columns = sorted(table["distance"].unique())
    rows = []
    for lab, cells in table.groupby("label", sort=False):
        by = {int(c.distance): c for c in cells.itertuples()}
        rows.append(
            [lab]
            + [
                f"{by[c].copy_acc:.2f} / {by[c].control_acc:.2f}" if c in by else "–"
                for c in columns
            ]
        )
    return markdown_table(["scheme", *map(str, columns)], rows, "l" + "r" * len(columns))


def attention_markdown(table: pd.DataFrame) -> str:
    """Mean distance (tokens) / entropy (nats) per layer at the longest eval length."""
    longest = int(table["eval_len"].max())
    at = table[table["eval_len"] == longest]
    layers = sorted(at["layer"].unique())
    rows = []
    for lab, cells in at.groupby("label", sort=False):
        by = {int(c.layer): c for c in cells.itertuples()}
        rows.append([lab, *(f"{by[k].mean_distance:.1f} / {by[k].entropy:.2f}" for k in layers)])
    header = ["scheme", *(f"layer {k}" for k in layers)]
    return markdown_table(header, rows, "l" + "r" * len(layers))


def markdown(use: ContextUse | None, out: Path) -> list[str]:
    """The "Context use" section of report.md (nothing when there are no probe records)."""
    if use is None:
        return []
    lines = [
        "## Context use",
        "",
        "Perplexity at long lengths rewards a model for ignoring distant context: one that "
        f"looks at its last {use.train_len} tokens only extrapolates perfectly. These probes "
        "ask whether the context is used (`pe_bench/run/probes.py`; switched by `eval.probes`).",
        "",
    ]
    lines += context_markdown(use)
    lines += retrieval_markdown(use)
    lines += attention_section(use)
    for probe in use.mixed:
        lines += [
            f"`{probe}`: the records hold several settings of this probe (`probe_hash`), "
            "which are not averaged; rerun the runs with one setting of `eval.*`.",
            "",
        ]
    for key, png in use.figures.items():
        rel = png.relative_to(out).as_posix()
        pdf = rel.removesuffix(".png") + ".pdf"
        lines += [f"![{CAPTIONS[key]}]({rel})", "", f"{CAPTIONS[key]} ([PDF]({pdf})).", ""]
    return lines


CAPTIONS = {
    "context_gain": "Context gain vs evaluation length",
    "retrieval": "Retrieval gain and copy accuracy vs distance",
    "attention": "Attention distance and entropy per layer vs evaluation length",
}


def context_markdown(use: ContextUse) -> list[str]:
    table = use.tables.get("context_gain")
    if table is None:
        return []
    L = use.train_len
    return [
        "### Context gain",
        "",
        f"For targets past the training length (window offsets >= {L}) in windows of W > {L} "
        f"tokens: the loss with the whole window as context minus the loss of the same targets "
        f"with only their last {L} tokens as context, in bits per token. Negative: the model "
        "uses the context beyond its training length; zero: it ignores it (and its "
        "perplexity stays flat for that reason alone); positive: the extra context hurts. "
        f"For an eval-time variant the truncated forwards run at {L} tokens, where PI and "
        "NTK scale by 1: the gain says whether the variant at W beats cutting the context "
        f"to {L}. {how_markdown(table, 'targets')}",
        "",
        gain_markdown(table, "eval_len"),
        "",
    ]


def retrieval_markdown(use: ContextUse) -> list[str]:
    table = use.tables.get("retrieval")
    if table is None:
        return []
    shortest, signal, none = no_signal(table)
    where = f"D = {shortest}" + (
        f" (< L_train = {use.train_len})" if shortest < use.train_len else ""
    )
    if not signal:
        verdict = (
            f"**No signal.** At the shortest distance, {where}, no label's retrieval gain is "
            f"both at least {SIGNAL_BITS} bits and separated from 0 by its 95% CI: these models "
            "do not copy a repeated snippet even within their training length, so this probe "
            "cannot compare their use of distant context, and the differences in the table "
            "are noise, not a ranking."
        )
    else:
        verdict = f"Signal at {where} (gain >= {SIGNAL_BITS} bits, CI excluding 0): " + ", ".join(
            signal
        )
        if none:
            verdict += "; no signal (their numbers are noise): " + ", ".join(none)
        verdict += "."
    return [
        "### Retrieval at distance (copy probe)",
        "",
        "A 16-token test snippet S appears twice, D filler tokens apart (filler, S, D tokens "
        "of filler, S); the control replaces the first S by S's own tokens in a random order, "
        "so nothing can be copied but the same tokens are in context (with another snippet "
        "instead, having S's tokens nearby lowers the loss without any copying). Retrieval "
        "gain = the control's loss minus the copy's on tokens 3 to 16 of the second S, in "
        "bits per token: positive when the model retrieves the earlier copy across D tokens, "
        "0 when it does not. Copy accuracy: the share of snippets whose every scored token is "
        f"the model's top prediction. {how_markdown(table, 'tokens')}",
        "",
        verdict,
        "",
        gain_markdown(table, "distance"),
        "",
        "Copy accuracy with / without the copy source:",
        "",
        accuracy_markdown(use.tables["copy_acc"]),
        "",
    ]


def attention_section(use: ContextUse) -> list[str]:
    table = use.tables.get("attention")
    if table is None:
        return []
    longest = int(table["eval_len"].max())
    return [
        "### Attention",
        "",
        "Per layer, averaged over heads and every query of a few windows: the mean attention "
        "distance sum_j a_ij (i - j) in tokens, and the attention entropy -sum_j a_ij ln a_ij "
        "in nats (uniform attention over i + 1 keys: distance i / 2, entropy ln(i + 1); one "
        "key: 0 and 0). Weights recomputed from each layer's queries and keys with the "
        "scheme's own hooks. A model that keeps its distance and entropy as the window grows "
        "attends locally; one whose entropy keeps growing spreads its attention over more "
        f"tokens than it was trained on. At L = {longest}, distance / entropy:",
        "",
        attention_markdown(table),
        "",
    ]


# ---- files ----------------------------------------------------------------------------------


def write(use: ContextUse | None, out: Path, style: dict[str, Style]) -> list[Path]:
    """Write the section's tables (CSV and LaTeX) and figures into ``out``'s tables/ and
    figures/; returns the LaTeX tables' paths."""
    if use is None:
        return []
    for name, table in use.tables.items():
        write_csv(out / "tables" / f"{name}.csv", table)
    written = write_latex(use, out / "tables")
    with figures.theme():
        if "context_gain" in use.tables:
            fig = gain_figure(use.tables["context_gain"], style, "eval_len", use.train_len)
            use.figures["context_gain"] = figures.save(fig, out / "figures", "context_gain")
        if "retrieval" in use.tables:
            fig = retrieval_figure(use, style)
            use.figures["retrieval"] = figures.save(fig, out / "figures", "retrieval")
        if "attention" in use.tables:
            fig = attention_figure(use.tables["attention"], style, use.train_len)
            use.figures["attention"] = figures.save(fig, out / "figures", "attention")
    return written


def write_latex(use: ContextUse, folder: Path) -> list[Path]:
    """tables/<probe>.tex of each probe table the section shows."""
    tables, L = use.tables, use.train_len
    found = []
    if "context_gain" in tables:
        title = (
            f"Context gain (bits per token): the loss of targets past {L} with the whole window "
            f"as context minus with only their last {L} tokens; negative: the context is used."
        )
        text = gain_markdown(tables["context_gain"], "eval_len")
        found.append(("context_gain", text, title, how_markdown(tables["context_gain"], "targets")))
    if "retrieval" in tables:
        title = "Retrieval gain (bits per token) of a repeated snippet at each distance D."
        text = gain_markdown(tables["retrieval"], "distance")
        found.append(("retrieval", text, title, how_markdown(tables["retrieval"], "tokens")))
        title = "Copy accuracy with / without the copy source at each distance D."
        found.append(("copy_acc", accuracy_markdown(tables["copy_acc"]), title, ""))
    if "attention" in tables:
        longest = int(tables["attention"]["eval_len"].max())
        title = f"Mean attention distance (tokens) / entropy (nats) per layer at L = {longest}."
        found.append(("attention", attention_markdown(tables["attention"]), title, ""))
    return [latex.write(folder, name, text, title, [note]) for name, text, title, note in found]


def _gain_lines(ax, table: pd.DataFrame, style: dict[str, Style], x: str) -> None:
    for lab, line in table.groupby("label", sort=False):
        ax.plot(line[x], line["mean"], label=lab, markersize=5, **style[lab].line())
        ok = line.dropna(subset=["ci_low", "ci_high"])
        if len(ok):
            ax.fill_between(
                ok[x], ok["ci_low"], ok["ci_high"], color=style[lab].color, alpha=0.15, lw=0
            )
    ax.axhline(0, color="0.35", linewidth=1, zorder=0)
    figures.log2_lengths(ax, sorted(int(v) for v in table[x].unique()))


def gain_figure(table: pd.DataFrame, style: dict[str, Style], x: str, train_len: int) -> Figure:
    """Context gain vs eval length, a line per label with its 95% CI band."""
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.subplots()
    _gain_lines(ax, table, style, x)
    ax.set_xlabel("evaluation length W (tokens, log scale)")
    ax.set_ylabel("bits/token (< 0: the context helps)")
    ax.set_title(f"Context gain: whole window minus last {train_len} tokens")
    figures.legend(fig, ax, style)
    return fig


def retrieval_figure(use: ContextUse, style: dict[str, Style]) -> Figure:
    """Retrieval gain (left) and copy accuracy (right) vs distance, a line per label."""
    fig = Figure(figsize=(9.5, 3.8), layout="constrained")
    gain_ax, acc_ax = fig.subplots(1, 2)
    _gain_lines(gain_ax, use.tables["retrieval"], style, "distance")
    accuracy = use.tables["copy_acc"]
    for lab, line in accuracy.groupby("label", sort=False):
        acc_ax.plot(
            line["distance"], line["copy_acc"], label=lab, markersize=5, **style[lab].line()
        )
    figures.log2_lengths(acc_ax, sorted(int(v) for v in accuracy["distance"].unique()))
    acc_ax.set_ylim(-0.05, 1.05)
    for ax in (gain_ax, acc_ax):
        figures.train_line(ax, use.train_len)
        ax.set_xlabel("distance D (tokens, log scale)")
    gain_ax.set_ylabel("bits/token (> 0: retrieves)")
    gain_ax.set_title("Retrieval gain")
    acc_ax.set_ylabel("exact-match copy accuracy")
    acc_ax.set_title("Copy accuracy")
    figures.legend(fig, [gain_ax, acc_ax], style)
    return fig


def attention_figure(table: pd.DataFrame, style: dict[str, Style], train_len: int) -> Figure:
    """Mean attention distance (top) and entropy (bottom) vs eval length, a panel per layer,
    with uniform attention's values as a grey reference."""
    layers = sorted(table["layer"].unique())
    lengths = sorted(int(n) for n in table["eval_len"].unique())
    fig = Figure(figsize=(2.9 * len(layers) + 1.6, 5.6), layout="constrained")
    axes = fig.subplots(2, len(layers), sharex=True, sharey="row", squeeze=False)
    grid = np.array(lengths, dtype=float)
    uniform = {
        "mean_distance": (grid - 1) / 4,  # mean over queries i of i / 2
        "entropy": np.array([np.log(np.arange(1, n + 1)).mean() for n in lengths]),
    }
    for col, layer in enumerate(layers):
        panel = table[table["layer"] == layer]
        for row, metric in enumerate(("mean_distance", "entropy")):
            ax = axes[row, col]
            ax.plot(grid, uniform[metric], color="0.6", linestyle=":", label="uniform attention")
            for lab, line in panel.groupby("label", sort=False):
                ax.plot(
                    line["eval_len"], line[metric], label=lab, markersize=4, **style[lab].line()
                )
            figures.log2_lengths(ax, lengths)
            figures.train_line(ax, train_len)
            if row == 0:
                ax.set_title(f"layer {layer}")
                ax.set_yscale("log", base=2)
                ax.yaxis.set_major_formatter(figures.PLAIN)
            else:
                ax.set_xlabel("evaluation length (tokens)")
    axes[0, 0].set_ylabel("mean distance (tokens)")
    axes[1, 0].set_ylabel("entropy (nats)")
    fig.suptitle("Attention per layer vs evaluation length (dotted grey: uniform attention)")
    figures.legend(fig, axes, {**style, "uniform attention": Style("0.6", "", ":")})
    return fig
