"""The cost table on the site (``report.cost``'s table, sortable and filtered like the
leaderboard) and the cost columns shown beside the leaderboard's numbers."""

from __future__ import annotations

import pandas as pd

from pe_bench.report import cost
from pe_bench.report.site.boards import Label
from pe_bench.report.site.html import Cell, Column, Row, table

HEADS = {column: head for column, head, _, _ in cost.RUN_COSTS}


def better(column: str) -> str:
    """Which way a cost column is better: fewer parameters and megabytes, more tokens/s."""
    return "low" if "params" in column or "mem" in column else "high"


def show(column: str, value: float) -> str:
    return cost.count(value) if "params" in column else cost.rate(value)


def cost_table(costs: pd.DataFrame, info: dict[str, Label], key: str) -> str:
    """Every cost column the records carry, one row per label (and task)."""
    keyed = [k for k in ("task", "label") if k in costs]
    values = [c for c in costs.columns if c not in (*keyed, "n")]
    columns = [Column("task", "text")] if "task" in keyed else []
    columns += [Column("scheme", "text"), Column("n", "")]
    for c in values:
        head = HEADS.get(c, f"eval {c.removeprefix(cost.EVAL_PREFIX)}")
        columns.append(Column(head, best=better(c)))
    rows = []
    for _, row in costs.iterrows():
        lab = info[row["label"]]
        cells = [Cell(row["task"], row["task"])] if "task" in keyed else []
        cells += [Cell(lab.name, lab.name), Cell(str(row["n"]))]
        cells += [Cell(show(c, row[c]), row[c]) for c in values]
        rows.append(Row(cells, {"label": lab.name, "family": lab.family, "kind": lab.kind}))
    return table(columns, rows, key)


def beside(costs: pd.DataFrame, lengths: list[int]) -> list[tuple[Column, dict[str, Cell]]]:
    """The cost columns the leaderboard shows beside its numbers: the scheme's parameters,
    training and longest-length evaluation throughput, peak memory (where recorded)."""
    longest = f"{cost.EVAL_PREFIX}{max(lengths)}"
    wanted = [
        ("pe_params", "PE params"),
        ("train_tokens_per_s", "train tok/s"),
        (longest, f"eval tok/s {max(lengths)}"),
        ("peak_mem_mb", "peak MB"),
    ]
    columns = []
    for key, head in wanted:
        if key not in costs:
            continue
        cells = {
            lab: Cell(show(key, v), v) for lab, v in zip(costs["label"], costs[key], strict=True)
        }
        column = Column(head, best=better(key), title="from the cost table below")
        columns.append((column, cells))
    return columns
