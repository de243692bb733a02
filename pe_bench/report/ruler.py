"""The report's RULER section: each task's score per label and prompt length with Wilson
intervals, the mean over tasks, and the NIAH tasks' depth x length heatmap (records of
``pe_bench.pretrained.ruler_eval``), drawn as passkey's (``report.passkey``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pe_bench.files import atomic_write_text
from pe_bench.records import is_ruler
from pe_bench.report import aggregate, figures, latex
from pe_bench.report.markdown import markdown_table, write_csv
from pe_bench.report.passkey import depth_figure, depth_table
from pe_bench.stats import wilson


def ruler_rows(records: pd.DataFrame) -> pd.DataFrame:
    """The ok RULER records of ``records``, labelled as the report labels them."""
    if "mode" not in records:
        return pd.DataFrame()
    rows = records[records["mode"].map(is_ruler)]
    if "status" in rows:
        rows = rows[rows["status"].fillna("ok") == "ok"]
    return rows.assign(label=aggregate.label(rows)) if len(rows) else pd.DataFrame()


def score_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (label, task, length): trials, RULER's score (mean recall) and its 95% Wilson
    interval (trials as n, summed recalls as successes); then per (label, length) the mean
    over the tasks (task ``mean``, as RULER averages), its interval over every trial."""
    cells = []
    order = {name: i for i, name in enumerate(dict.fromkeys(rows["task"]))}  # as the run did
    for (lab, task, length), at in rows.groupby(["label", "task", "eval_len"]):
        recalls = [r for trial in at["recall"] for r in trial]
        cells.append([lab, task, int(length), recalls])
    table = pd.DataFrame(cells, columns=["label", "task", "eval_len", "recall"])
    means = [  # every task has the same trials: the pooled mean is the mean of the tasks'
        [lab, "mean", length, [r for recalls in at["recall"] for r in recalls]]
        for (lab, length), at in table.groupby(["label", "eval_len"])
        if at["task"].nunique() > 1
    ]
    table = pd.concat([table, pd.DataFrame(means, columns=table.columns)], ignore_index=True)
    stats = [(len(r), sum(r) / len(r), *wilson(sum(r), len(r))) for r in table.pop("recall")]
    table[["trials", "score", "ci_low", "ci_high"]] = pd.DataFrame(stats, index=table.index)
    ranks = {lab: i for i, lab in enumerate(aggregate.label_order(rows))}
    table = table.assign(r=table["label"].map(ranks), t=table["task"].map(order).fillna(len(order)))
    return table.sort_values(["r", "t", "eval_len"]).drop(columns=["r", "t"]).reset_index(drop=True)


def score_markdown(table: pd.DataFrame, train_len: int) -> str:
    """Score [95% interval] per label and task (rows) and prompt length (columns)."""
    lengths = sorted(table["eval_len"].unique())
    header = ["label", "task", *[f"{n} ({n / train_len:g}x)" for n in lengths]]
    rows = []
    for (lab, task), at in table.groupby(["label", "task"], sort=False):
        cells = {
            int(r.eval_len): f"{r.score:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]"
            for r in at.itertuples()
        }
        rows.append([lab, task, *[cells.get(n, "") for n in lengths]])
    return markdown_table(header, rows, "ll" + "r" * len(lengths))


def section(records: pd.DataFrame, out: Path, bins: int = 5) -> list[str]:
    """The report's RULER section (writes tables/ruler*.csv|.md|.tex and figures/ruler.*):
    markdown lines, none without RULER records."""
    rows = ruler_rows(records)
    if rows.empty:
        return []
    train_len = int(rows["train_len"].iloc[0])
    table = score_table(rows)
    text = score_markdown(table, train_len)
    write_csv(out / "tables" / "ruler.csv", table)
    atomic_write_text(out / "tables" / "ruler.md", text + "\n")
    title = (
        "RULER score (mean recall of the expected strings) [95% Wilson interval] by target "
        f"length in tokens (x the pretraining context {train_len})."
    )
    latex.write(out / "tables", "ruler", text, title)
    niah = rows[rows["depth"].map(lambda depths: any(d is not None for d in depths))]
    lines = [
        "## RULER",
        "",
        "Hsieh et al. (2024), the synthetic tasks as NVIDIA/RULER's generators write them "
        "(`pe_bench/pretrained/ruler.py` says what differs: the run's corpus as the essay "
        "haystack, stratified depths): greedy decoding, scored as RULER scores (the fraction of "
        "the expected strings found in the output, case-insensitively). Score over trials with "
        "a 95% Wilson interval (trials as n, summed recalls as successes); `mean` is the mean "
        f"over the tasks. Columns are target lengths in tokens, prompt and generated tokens (x "
        f"the pretraining context {train_len}); every label answers the same prompts.",
        "",
        text,
        "",
    ]
    if not niah.empty:
        depths = depth_table(niah.assign(correct=niah["recall"]), bins)
        write_csv(out / "tables" / "ruler_depth.csv", depths)
        with figures.theme():
            fig = depth_figure(
                depths, train_len, f"NIAH recall by depth and length, {niah['task'].nunique()} "
                f"tasks pooled (pretraining context {train_len})", bins, counted=False,
            )  # fmt: skip
            png = figures.save(fig, out / "figures", "ruler")
        lines += [
            f"![RULER NIAH recall by depth and length]({png.relative_to(out).as_posix()})",
            "",
        ]
    return lines
