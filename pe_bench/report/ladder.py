"""The report of a scale ladder: the same labels trained at several model sizes and training
lengths (``experiment=scale``'s rungs, ``conf/rung``), each rung a protocol of its own.

A folder whose records differ only in width, depth or training length is a ladder (``rungs``);
nothing in ``run/`` knows it: a rung is a group of records. Each rung is analysed exactly as a
one-protocol report is (``aggregate``: seed intervals, paired differences, extrapolation
scores), then the rungs are set side by side:

- the 16x/1x perplexity ratio and the NLL at 16x of each label at each rung, with their 95%
  t-intervals over seeds (the ratio per seed is exp(NLL at 16x - NLL at 1x), so its mean is
  the geometric mean over seeds, as perplexity is averaged everywhere else);
- the ranking by extrapolation score at every rung, Kendall's tau between every two rungs, and
  which pairs of labels the seeds separate at each rung (paired over seeds);
- whether each claim the README draws from the quick suite holds at each rung (``claims``).

Figures: the ratio and the NLL at 16x against parameters (the rungs that share the most common
training length) and against the training length (the rungs that share the most common model).
"""

from __future__ import annotations

import math
import os
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import pyplot as plt
from scipy import stats as scipy_stats

from pe_bench.files import atomic_write_text
from pe_bench.report import aggregate, claims, figures, latex
from pe_bench.report.inputs import Options, Report, commands, report_lock
from pe_bench.report.markdown import cpu_kinds, markdown_table, write_csv
from pe_bench.report.rungs import RungResult, analyse, split_rungs
from pe_bench.report.sections import value_markdown
from pe_bench.report.styles import styles
from pe_bench.stats import t_interval

FAR = 16  # the eval factor the ladder compares at (16x the rung's training length)


def far_table(results: list[RungResult]) -> pd.DataFrame:
    """Per label and rung: the ratio of perplexity at 16x to 1x and the NLL at 16x, each with
    n, mean and 95% t-interval over seeds (the ratio's interval is exp of the NLL
    difference's, the geometric mean over seeds)."""
    rows = []
    for res in results:
        near, far = res.rung.train_len, res.factor_len(FAR)
        wide = res.per_seed()
        if near not in wide or far not in wide:
            continue
        for lab in aggregate.label_order(res.frame):
            if lab not in wide.index.get_level_values("label"):
                continue
            seeds = wide.loc[lab]
            n, *diff = t_interval(seeds[far] - seeds[near])
            _, *nll = t_interval(seeds[far])
            ratio = [math.exp(x) if math.isfinite(x) else math.nan for x in diff]
            rows.append([lab, res.rung.name, res.rung.params, res.rung.train_len, n, *ratio, *nll])
    columns = ["label", "rung", "params", "train_len", "n", "ratio", "ratio_low", "ratio_high"]
    return pd.DataFrame(rows, columns=[*columns, "nll", "nll_low", "nll_high"])


def rank_table(results: list[RungResult]) -> pd.DataFrame:
    """Label x rung: the rank by extrapolation score (1 = lowest mean NLL over the grid)."""
    columns = {r.rung.name: r.scores.set_index("label")["rank"] for r in results}
    order = aggregate.label_order(pd.concat([r.frame for r in results]))
    return pd.DataFrame(columns).reindex(order)


def kendall_table(results: list[RungResult]) -> pd.DataFrame:
    """Rung x rung: Kendall's tau-b between the two rungs' extrapolation scores over the labels
    both have (1: the same order; NaN with fewer than 3 labels in common)."""
    scores = {r.rung.name: r.scores.set_index("label")["score"] for r in results}
    names = list(scores)
    tau = pd.DataFrame(index=names, columns=names, dtype=float)
    for a in names:
        for b in names:
            both = pd.concat([scores[a], scores[b]], axis=1, join="inner").dropna()
            value = scipy_stats.kendalltau(both.iloc[:, 0], both.iloc[:, 1]).statistic
            tau.loc[a, b] = value if len(both) >= 3 else math.nan
    return tau


def separation_table(results: list[RungResult]) -> pd.DataFrame:
    """Pair x rung: which label of each pair has the better (lower) extrapolation score where
    the seeds separate the two (``a < b`` or ``a > b``), ``·`` where they do not, ``–`` where a
    rung lacks one of them or has under 2 seeds."""
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for res in results:
        for row in res.score_pairs.itertuples():
            mark = "–" if row.n < 2 else "·"
            if row.separated:
                mark = "<" if row.mean_diff < 0 else ">"
            cells.setdefault((row.label_a, row.label_b), {})[res.rung.name] = mark
    table = pd.DataFrame.from_dict(cells, orient="index")
    table.index = [f"{a} vs {b}" for a, b in table.index]
    return table.reindex(columns=[r.rung.name for r in results]).fillna("–")


def axis_rungs(results: list[RungResult]) -> tuple[list[RungResult], list[RungResult]]:
    """The size axis (the rungs at the most common training length, by parameters) and the
    length axis (the rungs of the most common model, by training length)."""
    lengths = pd.Series([r.rung.train_len for r in results]).mode().iloc[0]
    models = pd.Series([(r.rung.d_model, r.rung.num_layers) for r in results]).mode().iloc[0]
    size = sorted((r for r in results if r.rung.train_len == lengths), key=lambda r: r.rung.params)
    length = sorted(
        (r for r in results if (r.rung.d_model, r.rung.num_layers) == models),
        key=lambda r: r.rung.train_len,
    )
    return size, length


def ladder_figure(far: pd.DataFrame, rungs: list[RungResult], x: str, title: str) -> plt.Figure:
    """Two panels against ``x`` (``params`` or ``train_len``): the 16x/1x perplexity ratio and
    the NLL at 16x, one line per label with its 95% interval over seeds as error bars."""
    names = [r.rung.name for r in rungs]
    data = far[far["rung"].isin(names)]
    labels = [lab for lab in dict.fromkeys(far["label"]) if lab in set(data["label"])]
    style = styles(labels)
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.6), layout="constrained")
    panels = (("ratio", f"perplexity at {FAR}x / at 1x"), ("nll", f"NLL at {FAR}x (nats/token)"))
    for ax, (column, ylabel) in zip(axes, panels, strict=True):
        for lab in labels:
            line = data[data["label"] == lab].sort_values(x)
            err = np.vstack(
                [line[column] - line[f"{column}_low"], line[f"{column}_high"] - line[column]]
            )
            yerr = np.nan_to_num(err)
            ax.errorbar(line[x], line[column], yerr=yerr, label=lab, capsize=2, **style[lab].line())
        ax.set_xscale("log", base=2 if x == "train_len" else 10)
        ticks = sorted(data[x].unique())
        ax.set_xticks(ticks, [_tick(v, x) for v in ticks])
        ax.minorticks_off()
        ax.set_xlabel("parameters" if x == "params" else "training length (tokens)")
        ax.set_ylabel(ylabel)
    axes[0].set_yscale("log")
    axes[0].yaxis.set_major_formatter(figures.PLAIN)
    axes[0].yaxis.set_minor_formatter(figures.PLAIN)
    fig.suptitle(title, fontsize="medium")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right upper", frameon=False)
    return fig


def _tick(value: float, x: str) -> str:
    return f"{value / 1e6:.2g}M" if x == "params" else str(int(value))


def build_ladder(
    root: Path, out: Path, records: pd.DataFrame, options: Options, echo: bool = True
) -> Report:
    """Tables, figures and report.md of a ladder folder from its perplexity ``records``."""
    results = [analyse(rung, group, options) for rung, group in split_rungs(records)]
    far = far_table(results)
    tables = {
        "scale_far": far,
        "scale_rank": rank_table(results),
        "scale_kendall": kendall_table(results),
        "scale_separated": separation_table(results),
        "scale_claims": claims.claim_table(results),
    }
    prepared = pd.concat([r.frame for r in results])  # labelled, as the site reads them
    report = Report(out / "report.md", options, tables=tables, frame=prepared, records=records)
    with report_lock(out):
        for name, table in tables.items():
            keep_index = name != "scale_far"
            write_csv(out / "tables" / f"{name}.csv", table.reset_index() if keep_index else table)
        texts = ladder_markdown(root, out, records, results, tables, options)
        report.latex = [
            latex.write(out / "tables", "scale_ratio", texts["ratio"], RATIO_CAPTION),
            latex.write(out / "tables", "scale_rank", texts["rank"], RANK_CAPTION),
        ]
        size, length = axis_rungs(results)
        axes = ((size, "params", "scale_params"), (length, "train_len", "scale_length"))
        with figures.theme():
            for rungs, x, name in axes:
                if len(rungs) > 1:
                    fig = ladder_figure(far, rungs, x, _axis_title(rungs, x))
                    report.figures[name] = figures.save(fig, out / "figures", name)
                    plt.close(fig)
        atomic_write_text(report.path, texts["report"])
    if echo:
        print(f"perplexity at {FAR}x over 1x, per rung:\n{texts['ratio']}")
        print(f"\nreport: {report.path.resolve()}")
    return report


RATIO_CAPTION = (
    f"Perplexity at {FAR}x the training length divided by at 1x, per label and rung: geometric "
    "mean over seeds [95% t-interval]."
)
RANK_CAPTION = "Rank by extrapolation score (mean NLL over 1x-16x) at each rung; 1 is best."


def _axis_title(rungs: list[RungResult], x: str) -> str:
    if x == "params":
        return f"Model size at L_train = {rungs[0].rung.train_len}"
    r = rungs[0].rung
    return f"Training length at d_model = {r.d_model}, {r.num_layers} layers"


def interval(mean: float, low: float, high: float, fmt: str) -> str:
    if not math.isfinite(mean):
        return "–"
    text = fmt.format(mean)
    return text + (f" [{fmt.format(low)}, {fmt.format(high)}]" if math.isfinite(low) else "")


def far_markdown(far: pd.DataFrame, results: list[RungResult], column: str, fmt: str) -> str:
    names = [r.rung.name for r in results]
    rows = []
    for lab, cells in far.groupby("label", sort=False):
        by_rung = cells.set_index("rung")
        row = [lab]
        for name in names:
            if name not in by_rung.index:
                row.append("–")
                continue
            c = by_rung.loc[name]
            row.append(interval(c[column], c[f"{column}_low"], c[f"{column}_high"], fmt))
        rows.append(row)
    return markdown_table(["scheme", *names], rows, "l" + "r" * len(names))


def frame_markdown(table: pd.DataFrame, first: str, fmt: str = "{}") -> str:
    """A small label x column table as markdown (NaN as –)."""
    rows = [
        [str(idx), *("–" if pd.isna(v) else fmt.format(v) for v in row)]
        for idx, row in table.iterrows()
    ]
    header = [first, *map(str, table.columns)]
    return markdown_table(header, rows, "l" + "r" * len(table.columns))


def rungs_markdown(results: list[RungResult]) -> str:
    rows = []
    for res in results:
        r, seeds = res.rung, res.frame.drop_duplicates(["label", "seed"])
        per_label = seeds.groupby("label")["seed"].nunique()
        hardware = ", ".join(sorted(res.frame["hardware"].dropna().unique()))
        hardware += f": {cpu_kinds(res.frame)}" if cpu_kinds(res.frame) else ""
        low, high = per_label.min(), per_label.max()
        seeds_text = str(low) if low == high else f"{low}-{high}"
        rows.append(
            [
                r.name,
                str(r.d_model),
                str(r.num_layers),
                f"{r.params:,}",
                str(r.train_len),
                seeds_text,
                hardware,
            ]
        )
    header = ["rung", "d_model", "layers", "parameters", "L_train", "seeds", "hardware"]
    return markdown_table(header, rows, "lrrrrrl")


INTRO = (
    "The same labels at {rungs} rungs (model size and training length), each scored at 1x-16x "
    "of its own training length on the same test tokens. Every number is a mean over seeds "
    "with its 95% t-interval; two labels are *separated* at a rung when the t-interval of "
    "their difference, paired over seeds, excludes 0 (each pair tested alone, uncorrected)."
)


def ladder_markdown(
    root: Path,
    out: Path,
    records: pd.DataFrame,
    results: list[RungResult],
    tables: dict[str, pd.DataFrame],
    options: Options,
) -> dict[str, str]:
    """The texts of the ladder report: its two LaTeX tables' markdown and report.md."""
    far = tables["scale_far"]
    size, length = axis_rungs(results)
    ratio = far_markdown(far, results, "ratio", "{:.2f}")
    rank = frame_markdown(tables["scale_rank"], "scheme")
    lines = [
        f"# Scale ladder report: {root.resolve().name}",
        "",
        INTRO.format(rungs=len(results)),
        "",
        "## Rungs",
        "",
        rungs_markdown(results),
        "",
        "## Whether the quick suite's claims hold at each rung",
        "",
        *claims.claims_markdown(tables["scale_claims"]),
        f"## Perplexity at {FAR}x over 1x",
        "",
        ratio,
        "",
        f"## NLL at {FAR}x (nats/token)",
        "",
        far_markdown(far, results, "nll", "{:.3f}"),
        "",
        "## Ranking by extrapolation score",
        "",
        "Rank 1 is the lowest mean NLL over the rung's eval lengths (`tables/scale_rank.csv`).",
        "",
        rank,
        "",
        "Kendall's tau-b between the rungs' extrapolation scores (1: the same order):",
        "",
        frame_markdown(tables["scale_kendall"], "rung", "{:.2f}"),
        "",
        "## Which pairs the seeds separate, by extrapolation score",
        "",
        "`a < b`: a has the lower (better) score and the seeds separate them; `·`: not "
        "separated; `–`: not measured at that rung.",
        "",
        frame_markdown(tables["scale_separated"], "pair"),
        "",
        "## Figures",
        "",
        *_figure_lines(size, length),
        *_per_rung_markdown(results),
        *reproduce_markdown(root, out, records, options),
    ]
    return {"ratio": ratio, "rank": rank, "report": "\n".join(lines)}


def reproduce_markdown(root: Path, out: Path, records: pd.DataFrame, options: Options) -> list[str]:
    """The commands that made the records, then the one that makes this report from them."""
    args = ["pe-bench-report", os.path.relpath(root, out), "--mode", str(records["mode"].iloc[0])]
    args += ["--schemes", *options.schemes] if options.schemes else []
    return [
        "## Reproduce",
        "",
        "Train and evaluate (writes the records), then make this report from them:",
        "",
        "```bash",
        *(
            commands(root)
            or ["# unknown: no multirun.yaml or .hydra/overrides.yaml by the records"]
        ),
        shlex.join(args) + "  # run in this report's folder",
        "```",
        "",
    ]


def _figure_lines(size: list[RungResult], length: list[RungResult]) -> list[str]:
    lines = []
    if len(size) > 1:
        lines += ["![against parameters](figures/scale_params.png)", ""]
    if len(length) > 1:
        lines += ["![against the training length](figures/scale_length.png)", ""]
    return lines


def _per_rung_markdown(results: list[RungResult]) -> list[str]:
    """Each rung's NLL table by eval length (the rung's own report's main table)."""
    lines = ["## Each rung's NLL by eval length", ""]
    for res in results:
        lines += [f"### {res.rung.name}", "", value_markdown(res.nll, "nll"), ""]
    return lines
