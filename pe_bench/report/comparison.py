"""The report's comparison with a published table (``report.compare``): its section of
report.md, the perplexity, ratio and rank-order grids at matched lengths, and their LaTeX
tables."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from pe_bench.records import TAIL_MODE, TRUNCATE_MODE
from pe_bench.report import compare, latex, protocols
from pe_bench.report.markdown import all_pretrained, markdown_table, shared_value


def comparison_markdown(comparison: compare.Comparison, df: pd.DataFrame) -> list[str]:
    """The report's section that puts the run next to a published table."""
    pub, cells = comparison.published, comparison.cells
    cite, setup = pub.citation, pub.setup
    lengths, heads = comparison_lengths(cells)
    mode, stride = comparison.mode or shared_value(df, "mode"), comparison.stride
    protocol = (
        "documents truncated to the window, every position scored"
        if setup["protocol"] == TRUNCATE_MODE
        else f"{setup['protocol']} windows"
        + (f" (stride {setup['stride']})" if setup["stride"] else "")
    )
    ours = {
        TAIL_MODE: f"tail windows (each scoring its last {stride} tokens)",
        TRUNCATE_MODE: "documents truncated to the window, every position scored",
        "sliding": f"sliding windows (stride {stride})",
    }.get(mode, f"{mode} windows")
    differs = (
        f" The paper evaluates with {protocol}, this run with {ours}."
        if setup["protocol"] != mode
        else ""
    )
    if all_pretrained(df):
        differs += (
            f" The labels of the pretrained `{shared_value(df, 'scheme')}` are read as a RoPE "
            "model's: `rope` is the model as pretrained, `rope+<variant>` its eval-time variant."
        )
    return [
        f"## Comparison with {pub.cite()}",
        "",
        f"{', '.join(cite['authors'])}: *{cite['title']}*, {cite['venue']}, arXiv:{cite['arxiv']}, "
        f"{cite['table']} (p. {cite['page']}): {setup['corpus']}; {setup['model']}; trained at "
        f"L = {pub.train_len}, {protocol}, {setup['unit']}. Numbers read from: "
        f"{cite['read_from']}",
        "",
        f"This run: trained at L = {shared_value(df, 'train_len')} on "
        f"`{shared_value(df, 'corpus')}`, {ours}, {protocols.perplexity_unit(df)}. Eval lengths "
        "are matched by their ratio to the training length (column heads: ratio, the paper's "
        "length / this run's). Absolute numbers differ with model size, data and unit "
        f"({protocols.unit_note(df)}), so the comparison is about the direction of each ratio "
        f"and the rank order of the schemes.{differs}",
        "",
        "Perplexity, the paper's / this run's:",
        "",
        comparison_grid(cells, lengths, heads, paper_and_ours_value),
        "",
        "Ratio to the training-length value, the paper's / this run's:",
        "",
        comparison_grid(cells, lengths, heads, paper_and_ours_ratio),
        "",
        "Rank order at each length (best first) and how many scheme pairs both order the same "
        "way; Kendall tau = (same - reversed) / pairs, 1 when the orders agree. Pairs with a "
        "tie or a paper's bound (>) that leaves the order open are not counted.",
        "",
        rank_order_markdown(comparison.orders, heads),
        "",
        *(f"- {sentence}" for sentence in comparison.sentences()),
        "",
    ]


def comparison_lengths(cells: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The matched lengths of a comparison (one row each, by ratio) and their column heads:
    ratio, the paper's length / this run's."""
    lengths = cells.drop_duplicates("ratio_len").sort_values("ratio_len")
    heads = [f"{r.ratio_len:.1f}x ({r.paper_len} / {r.eval_len})" for r in lengths.itertuples()]
    return lengths, heads


def comparison_latex(
    comparison: compare.Comparison, folder: Path, stem: str = "compare"
) -> list[Path]:
    """tables/<stem>_{ppl,ratio,order}.tex: the comparison's three tables."""
    cells, cite = comparison.cells, comparison.published.cite()
    lengths, heads = comparison_lengths(cells)
    return [
        latex.write(
            folder,
            f"{stem}_ppl",
            comparison_grid(cells, lengths, heads, paper_and_ours_value),
            f"Perplexity, {cite} / this run, at matched ratios to the training length.",
        ),
        latex.write(
            folder,
            f"{stem}_ratio",
            comparison_grid(cells, lengths, heads, paper_and_ours_ratio),
            f"Ratio to the training-length value, {cite} / this run.",
        ),
        latex.write(
            folder,
            f"{stem}_order",
            rank_order_markdown(comparison.orders, heads),
            f"Rank order at each matched length (best first), {cite} and this run; Kendall "
            "tau = (same - reversed) / pairs.",
        ),
    ]


def comparison_grid(
    cells: pd.DataFrame, lengths: pd.DataFrame, heads: list[str], fmt: Callable[[Any], str]
) -> str:
    """A table of the compared schemes x matched lengths, each cell ``fmt`` of a row of
    ``cells`` ('–' where the paper has no number at that length)."""
    rows = []
    for (name, label), at in cells.groupby(["paper_name", "label"], sort=False):
        by_len = {r.ratio_len: r for r in at.itertuples()}
        row = [label, name]
        for r in lengths.itertuples():
            cell = by_len.get(r.ratio_len)
            row.append(fmt(cell) if cell is not None else "–")
        rows.append(row)
    return markdown_table(["scheme", "in the paper", *heads], rows, "ll" + "r" * len(heads))


def paper_and_ours_value(cell: Any) -> str:
    """``paper / ours`` perplexity of a compared cell; a paper's bound as ``>value``."""
    paper = f">{cell.paper:g}" if cell.paper_bound else f"{cell.paper:.2f}"
    return f"{paper} / {'–' if pd.isna(cell.ours) else f'{cell.ours:.2f}'}"


def paper_and_ours_ratio(cell: Any) -> str:
    """``paper / ours`` ratio to the training-length value of a compared cell."""
    paper = "–" if pd.isna(cell.paper_ratio) else compare.times(cell.paper_ratio, cell.paper_bound)
    ours = "–" if pd.isna(cell.ours_ratio) else compare.times(cell.ours_ratio)
    return f"{paper} / {ours}"


def rank_order_markdown(orders: pd.DataFrame, heads: list[str]) -> str:
    """Both rank orders per matched length, the pairs ordered the same way and Kendall tau."""
    rows = []
    for o, head in zip(orders.itertuples(), heads, strict=True):
        pairs = o.agree + o.disagree
        tau = "–" if pd.isna(o.tau) else f"{o.tau:+.2f}"
        same = f"{o.agree} of {pairs}" if pairs else "–"
        rows.append([head, ", ".join(o.paper_order), ", ".join(o.ours_order), same, tau])
    header = ["length", "the paper", "this run", "pairs in the same order", "Kendall tau"]
    return markdown_table(header, rows, "lllrr")
