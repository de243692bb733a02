"""Markdown and CSV building blocks shared by every report section: number formats, tables,
captions and the values the protocol makes the same in every record."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from pe_bench.files import atomic_write_text
from pe_bench.report import metrics

SKIPPED = "‡"  # marks a table cell with a skipped evaluation (its reason is in report.md)


SKIPPED_NOTE = (
    f"{SKIPPED} skipped evaluations (no number): the reasons are under Skipped evaluations"
)


def write_csv(path: Path, table: pd.DataFrame) -> None:
    """A CSV with fixed float formatting (6 significant digits) and no index."""
    text = table.to_csv(index=False, float_format="%.6g", lineterminator="\n")
    atomic_write_text(path, text)


def markdown_table(header: list[str], rows: list[list[str]], align: str) -> str:
    """A GitHub pipe table, columns padded to equal width; ``align`` has l or r per column."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    columns = list(zip(widths, align, strict=True))

    def line(cells: list[str]) -> str:
        padded = [
            c.ljust(w) if a == "l" else c.rjust(w) for c, (w, a) in zip(cells, columns, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rules = [":" + "-" * (w + 1) if a == "l" else "-" * (w + 1) + ":" for w, a in columns]
    return "\n".join([line(header), "|" + "|".join(rules) + "|", *map(line, rows)])


def typical_n(stats: pd.DataFrame) -> int:
    """The most common number of seeds per cell, the larger on ties (cells that differ show
    their own n)."""
    counts = Counter(stats.loc[stats["n"] > 0, "n"])
    return max(counts, key=lambda n: (counts[n], n)) if counts else 0


class Replicate(NamedTuple):
    """What a report's intervals are over, in the words its sentences use."""

    name: str  # "seed"; plural with an s
    length: str  # what L is: "trained at L = ..."
    more: str  # how to run more of them
    paired: str  # what two schemes share in one of them


SEED = Replicate(
    "seed",
    "trained at",
    "seeds (e.g. `train.seed=0,1,2`)",
    "the same seed: the same data order, trunk initialisation and test tokens",
)
TEST_SLICE = Replicate(
    "test slice",
    "context",
    "more test slices (e.g. `model.test_slices=4`)",
    "the same slice: the same documents, the same model",
)


def all_pretrained(df: pd.DataFrame) -> bool:
    """Whether every record is a pretrained model's (``model=hf``)."""
    return "pretrained" in df and bool(df["pretrained"].fillna(False).astype(bool).all())


def replicate(df: pd.DataFrame) -> Replicate:
    """What a table's intervals are over: the seeds of trained models, the test slices
    (documents) a pretrained model is evaluated on."""
    return TEST_SLICE if all_pretrained(df) else SEED


def caption(stats: pd.DataFrame, metric: str, df: pd.DataFrame) -> str:
    """How the cells of a value table were computed, in one line."""
    n, unit = typical_n(stats), replicate(df)
    geometric = metrics.spec(metric).over_seeds == metrics.GEOMETRIC
    how = f"{'geometric mean' if geometric else 'mean'} over {unit.name}s"
    ci = " with [95% CI] from the t-distribution" if n > 1 else ""
    return (
        f"{unit.length} L = {shared_value(df, 'train_len')} tokens, {shared_value(df, 'mode')} "
        f"windows, {how}{ci}, n = {n} {unit.name}{'s' if n != 1 else ''} per cell"
    )


def format_value(value: object) -> str:
    """A value as report text: integral floats without '.0', missing values as '–'."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "–"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def shared_value(df: pd.DataFrame, column: str) -> str:
    """The value of a column that the protocol makes the same in every record, as report text
    ('unknown' when absent)."""
    values = df[column].dropna() if column in df else []
    return format_value(values.iloc[0]) if len(values) else "unknown"


def shared_count(df: pd.DataFrame, column: str) -> str:
    """Like ``shared_value``, with thousands separators for a whole number."""
    value = shared_value(df, column)
    return f"{int(value):,}" if value.isdigit() else value


def distinct(df: pd.DataFrame, column: str) -> str:
    """The distinct values of a column, sorted and comma-separated ('unknown' when absent)."""
    values = sorted({format_value(v) for v in df[column].dropna()}) if column in df else []
    return ", ".join(values) or "unknown"


def one_cell(text: object) -> str:
    """``text`` fit for a table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def cpu_kinds(df: pd.DataFrame) -> str:
    """The CPUs the records name, each with the ATen kernels it ran (``AMD EPYC (AVX2)``),
    and how many records name none (made before records carried ``cpu_model``); '' when no
    record names one, so that a report of older records reads as it did."""
    if "cpu_model" not in df or df["cpu_model"].isna().all():
        return ""
    named = df.dropna(subset=["cpu_model"])
    kernels = named.get("cpu_capability", pd.Series(None, index=named.index, dtype=object))
    kinds = sorted(
        f"{model} ({'kernels unknown' if pd.isna(kernel) else kernel})"
        for model, kernel in set(zip(named["cpu_model"], kernels, strict=True))
    )
    text = ", ".join(kinds)
    if len(named) < len(df):
        text += f" for {len(named):,} of {len(df):,} records; the others name no CPU"
    return text


def count(n: int, noun: str) -> str:
    """``1 trained model``, ``3 trained models``: ``n`` and ``noun``, plural but for one."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
