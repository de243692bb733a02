"""The report's passkey section: accuracy per label and prompt length with Wilson intervals,
and the depth x length heatmap (records of ``pe_bench.pretrained.passkey``)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pe_bench.files import atomic_write_text
from pe_bench.records import PASSKEY_MODE
from pe_bench.report import aggregate, figures, latex
from pe_bench.report.markdown import markdown_table, write_csv
from pe_bench.stats import wilson


def passkey_rows(records: pd.DataFrame) -> pd.DataFrame:
    """The ok passkey records of ``records``, labelled as the report labels them."""
    if "mode" not in records:
        return pd.DataFrame()
    rows = records[records["mode"] == PASSKEY_MODE]
    if "status" in rows:
        rows = rows[rows["status"].fillna("ok") == "ok"]
    return rows.assign(label=aggregate.label(rows)) if len(rows) else pd.DataFrame()


def accuracy_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (label, length): trials, accuracy and its 95% Wilson interval, over every trial of
    the label's records at that length (seeds or slices pooled)."""
    cells = []
    for (lab, length), at in rows.groupby(["label", "eval_len"]):
        correct = [c for trial in at["correct"] for c in trial]
        low, high = wilson(sum(correct), len(correct))
        cells.append([lab, int(length), len(correct), sum(correct) / len(correct), low, high])
    table = pd.DataFrame(cells, columns=["label", "eval_len", "trials", "acc", "ci_low", "ci_high"])
    return _in_order(table, rows, "eval_len")


def depth_table(rows: pd.DataFrame, bins: int) -> pd.DataFrame:
    """Per (label, length, depth bin): trials and accuracy, the depth x length figure's cells."""
    trials = rows[["label", "eval_len", "depth", "correct"]].explode(["depth", "correct"])
    trials = trials.astype({"depth": float, "correct": float, "eval_len": int})
    edges = np.linspace(0, 1, bins + 1)
    trials = trials.assign(bin=np.clip(np.digitize(trials["depth"], edges) - 1, 0, bins - 1))
    table = trials.groupby(["label", "eval_len", "bin"], as_index=False).agg(
        trials=("correct", "size"), acc=("correct", "mean")
    )
    table = table.assign(depth_low=edges[table["bin"]], depth_high=edges[table["bin"] + 1])
    return _in_order(table.drop(columns="bin"), rows, "eval_len", "depth_low")


def _in_order(table: pd.DataFrame, rows: pd.DataFrame, *by: str) -> pd.DataFrame:
    order = {lab: i for i, lab in enumerate(aggregate.label_order(rows))}
    ranked = table.assign(rank=table["label"].map(order))
    return ranked.sort_values(["rank", *by]).drop(columns="rank").reset_index(drop=True)


def accuracy_markdown(table: pd.DataFrame, train_len: int) -> str:
    """Accuracy [95% interval] per label (rows) and target length (columns)."""
    lengths = sorted(table["eval_len"].unique())
    header = ["label", *[f"{n} ({n / train_len:g}x)" for n in lengths]]
    rows = []
    for lab, at in table.groupby("label", sort=False):
        cells = {
            int(r.eval_len): f"{r.acc:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]"
            for r in at.itertuples()
        }
        rows.append([lab, *[cells.get(n, "") for n in lengths]])
    return markdown_table(header, rows, "l" + "r" * len(lengths))


def depth_figure(
    table: pd.DataFrame,
    train_len: int,
    title: str | None = None,
    bins: int = 5,
    counted: bool = True,
) -> Figure:
    """One heatmap per label: accuracy by depth (rows, every one of ``bins``) and target
    length (columns), one colour bar, each cell annotated with its keys found of its trials
    (``counted``; else its score, RULER's recall); a blank cell had no trial (depths are
    drawn at random), and the footnote says so."""
    import seaborn as sns

    labels = list(dict.fromkeys(table["label"]))
    cols = min(4, len(labels))
    grid_rows = math.ceil(len(labels) / cols)
    lengths = sorted(table["eval_len"].unique())
    fig = Figure(
        figsize=(1.6 + cols * (0.62 * len(lengths) + 1.3), 1.0 + grid_rows * 2.5),
        layout="constrained",
    )
    axes = np.atleast_1d(fig.subplots(grid_rows, cols, squeeze=False)).ravel()
    depths = [f"{lo:.1f}-{hi:.1f}" for lo, hi in itertools.pairwise(np.linspace(0, 1, bins + 1))]
    base = _base_label(labels)
    for ax, lab in zip(axes, labels, strict=False):
        grid, found = _depth_grid(table[table["label"] == lab], depths, lengths, counted)
        sns.heatmap(
            grid, ax=ax, vmin=0, vmax=1, cmap="viridis", annot=found, fmt="", cbar=False,
            linewidths=0.5, linecolor="white",
        )  # fmt: skip
        ax.set_title(_panel_title(lab, base), fontsize="medium")
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("key depth")
        ax.tick_params(axis="y", rotation=0)
        ax.grid(False)  # a blank cell is blank
    for ax in axes[len(labels) :]:
        ax.set_visible(False)
    shown = list(axes[: len(labels)])
    fig.colorbar(axes[0].collections[0], ax=shown, label="score (share found)", shrink=0.8)
    model = f"{base}: " if base else ""
    fig.suptitle(
        title or f"{model}passkey accuracy by depth and length (pretraining context {train_len})"
    )
    cell = "found / trials" if counted else "the mean score of its trials"
    figures.footnote(
        fig, f"Each cell: {cell} at that depth and length; blank: no trial there (each "
        "trial's depth is drawn at random)."
    )  # fmt: skip
    return fig


def _depth_grid(
    cells: pd.DataFrame, depths: list[str], lengths: list[int], counted: bool
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A label's accuracy by depth bin and length, and each cell's "found/trials" (or its
    score, not ``counted``; '' where no trial fell)."""
    pairs = zip(cells["depth_low"], cells["depth_high"], strict=True)
    counts = zip(cells["acc"], cells["trials"], strict=True)
    cells = cells.assign(
        depth=[f"{lo:.1f}-{hi:.1f}" for lo, hi in pairs],
        found=[f"{round(a * n)}/{n}" if counted else f"{a:.2f}" for a, n in counts],
    )
    grid = cells.pivot(index="depth", columns="eval_len", values="acc")
    found = cells.pivot(index="depth", columns="eval_len", values="found")
    grid, found = (t.reindex(index=depths, columns=lengths) for t in (grid, found))
    return grid, found.fillna("")


def _base_label(labels: list[str]) -> str:
    """The label the others extend (``model`` of ``model+variant``), if one does."""
    first = labels[0]
    return first if all(lab == first or lab.startswith(f"{first}+") for lab in labels) else ""


def _panel_title(label: str, base: str) -> str:
    """A panel's title: the variant alone where the suptitle names the model (a long model
    name ran past its panel: "+self_extenc")."""
    if not base:
        return label
    return "as pretrained" if label == base else label.removeprefix(base)


def section(records: pd.DataFrame, out: Path, bins: int = 5) -> list[str]:
    """The report's passkey section (writes tables/passkey*.csv|.md and figures/passkey.*):
    markdown lines, none without passkey records."""
    rows = passkey_rows(records)
    if rows.empty:
        return []
    train_len = int(rows["train_len"].iloc[0])
    table = accuracy_table(rows)
    depths = depth_table(rows, bins)
    text = accuracy_markdown(table, train_len)
    write_csv(out / "tables" / "passkey.csv", table)
    write_csv(out / "tables" / "passkey_depth.csv", depths)
    atomic_write_text(out / "tables" / "passkey.md", text + "\n")
    title = (
        "Passkey retrieval accuracy [95% Wilson interval] by target prompt length in tokens "
        f"(x the pretraining context {train_len})."
    )
    latex.write(out / "tables", "passkey", text, title)
    with figures.theme():
        png = figures.save(depth_figure(depths, train_len, bins=bins), out / "figures", "passkey")
    tokens = rows["prompt_tokens"].explode().astype(int)
    return [
        "## Passkey retrieval",
        "",
        "Mohtashami & Jaggi (2023), as in landmark-attention's `run_test.py` and YaRN's "
        "`eval/passkey.py`: a key from 1 to 50000 in filler text at a random depth, greedy "
        "decoding, exact match on the first integer. Accuracy over trials with its 95% Wilson "
        f"interval; columns are target prompt lengths in tokens (x the pretraining context "
        f"{train_len}); prompts have {tokens.min()} to {tokens.max()} tokens, and every label "
        "answers the same prompts.",
        "",
        text,
        "",
        f"![passkey accuracy by depth and length]({png.relative_to(out).as_posix()})",
        "",
    ]
