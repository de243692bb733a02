"""Paired differences between labels over seeds, and the ranks they allow: the tables that
say which schemes the seeds separate (``aggregate.pairwise`` computes them)."""

from __future__ import annotations

import pandas as pd

from pe_bench.report import aggregate, metrics
from pe_bench.report.inputs import Report
from pe_bench.report.markdown import markdown_table, replicate


def pairwise_tables(
    df: pd.DataFrame, stats: dict[str, pd.DataFrame], metric: str
) -> dict[str, pd.DataFrame]:
    """The paired differences of every two labels at every length (of the metric ``metric``'s
    spec pairs on: NLL for perplexity, where differences add up), and the ranks they allow."""
    spec = metrics.spec(metric)
    pairs = aggregate.paired_differences(df, spec.paired)
    means = stats[spec.paired].pivot(index="label", columns="eval_len", values="mean")
    means = means.reindex(list(dict.fromkeys(stats[spec.paired]["label"])))
    ranks = aggregate.separable_ranks(pairs, means, spec.higher_is_better)
    return {"pairwise": pairs, "ranks": ranks}


def ranks_markdown(ranks: pd.DataFrame) -> str:
    rows = [
        [str(lab), *("–" if pd.isna(r) else str(r) for r in ranks.loc[lab])] for lab in ranks.index
    ]
    header = ["scheme", *(str(n) for n in ranks.columns)]
    return markdown_table(header, rows, "l" + "r" * len(ranks.columns))


def pairwise_markdown(report: Report) -> list[str]:
    """The section saying which differences between schemes the seeds support."""
    pairs, metric = report.tables["pairwise"], metrics.spec(report.options.metric).paired
    n = int(pairs["n"].max()) if len(pairs) else 0
    replicates = replicate(report.frame)
    unit = replicates.name
    if n < 2:
        how = (
            f"With one {unit} per scheme no difference can be told from {unit} noise, so every "
            f"scheme shares rank 1; run {replicates.more} for this view."
        )
    else:
        separated = int(pairs["separated"].sum())
        how = (
            f"Rank at each length = 1 + the number of schemes separated from it and better: "
            f"two schemes are separated when the 95% t-interval of their {metric} difference, "
            f"paired over {unit}s ({replicates.paired}), excludes 0. Schemes the {unit}s "
            f"cannot tell apart share a rank. {separated} of {len(pairs)} pairs are separated "
            f"(up to n = {n} {unit}s per pair; every pair in `tables/pairwise.csv`). Each pair "
            f"is tested alone, uncorrected for the {len(pairs)} comparisons: about 1 in 20 pairs "
            "with no true difference is separated by chance."
        )
    return [
        f"## Which differences the {unit}s support",
        "",
        how,
        "",
        ranks_markdown(report.tables["ranks"]),
        "",
    ]
