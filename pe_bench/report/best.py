"""Which cell of a table column is best, and which cells the seeds do not separate from it:
the marks the LaTeX tables (bold, underlined) and the leaderboard site share.

A cell is *best* when its mean is the column's lowest (highest for accuracies), unless every
cell of the column has that mean (nothing stands out, so nothing is marked); a cell is
*tied* with the best when the paired test over seeds (``aggregate.paired_differences``) was
run on the pair (two seeds or more) and does not separate them. With one seed nothing is
tested, so nothing is marked tied.
"""

from __future__ import annotations

import pandas as pd

BEST, TIED = "best", "tied"


def not_separated(pairs: pd.DataFrame, column: str = "eval_len") -> set[tuple]:
    """(column value, label, label) of every tested pair the seeds do not separate, both
    orders."""
    tested = pairs[(pairs["n"] >= 2) & ~pairs["separated"].astype(bool)]
    found = set()
    for pair in tested.itertuples():
        at = getattr(pair, column) if column else None
        found |= {(at, pair.label_a, pair.label_b), (at, pair.label_b, pair.label_a)}
    return found


def column_marks(
    means: pd.DataFrame,
    pairs: pd.DataFrame,
    higher_is_better: bool = False,
    column: str = "eval_len",
) -> dict[tuple[str, object], str]:
    """(label, column) -> ``BEST`` or ``TIED`` for a table of ``means`` (labels x columns);
    ``pairs`` are the paired differences of the same numbers (``column`` names the field that
    holds the table's column; None when the table has one column, e.g. the scores)."""
    ties = not_separated(pairs, column) if len(pairs) else set()
    marks: dict[tuple[str, object], str] = {}
    for col in means.columns:
        values = means[col].dropna()
        if values.empty:
            continue
        top = values.max() if higher_is_better else values.min()
        bests = list(values.index[values == top])
        if len(bests) == len(values) > 1:  # every label alike: no cell stands out
            continue
        key = col if column else None
        for lab in values.index:
            if lab in bests:
                marks[(lab, col)] = BEST
            elif any((key, lab, b) in ties for b in bests):
                marks[(lab, col)] = TIED
    return marks


def value_marks(
    stats: pd.DataFrame, pairs: pd.DataFrame, higher_is_better: bool = False
) -> dict[tuple[str, object], str]:
    """``column_marks`` of a ``seed_stats`` table (label x eval length)."""
    means = stats[stats["n"] > 0].pivot(index="label", columns="eval_len", values="mean")
    return column_marks(means, pairs, higher_is_better)


def score_marks(scores: pd.DataFrame, pairs: pd.DataFrame) -> dict[str, str]:
    """Label -> ``BEST`` or ``TIED`` of the extrapolation scores (lower is better), with
    ``aggregate.score_differences`` as the pairs."""
    means = scores.set_index("label")[["score"]]
    marks = column_marks(means, pairs, column="")
    return {lab: mark for (lab, _), mark in marks.items()}


def legend(marks: dict, what: str = "mean of each column", higher_is_better: bool = False) -> str:
    """What the marks mean, in a sentence for a table's note ('' when nothing is marked)."""
    if not marks:
        return ""
    best = "highest" if higher_is_better else "lowest"
    text = f"Bold: the {best} {what}"
    if TIED in marks.values():
        text += (
            "; underlined: not separated from it by the seeds (the 95% t-interval of the "
            "paired difference over seeds includes 0)"
        )
    return text + "."
