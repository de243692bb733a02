"""The report's RoPE-base section (``experiment=rope_base``): where each base's perplexity
breaks, beside what Liu et al. 2023 and Men et al. 2024 predict (``rope_theory``).

A report whose trained RoPE labels differ only in ``pe.base`` (two bases or more: the labels
``rope(base=100)``, ``rope`` for the default 10,000, ...) is a base sweep; nothing in
``run/`` knows it.

**Measured break.** Per run, d(L) = NLL(L) - NLL(L_train) (nats per token; paired over seeds,
as the ratio table is). A base breaks at the first evaluation length past L_train where the
mean of d over seeds exceeds ``BREAK_NATS``; each seed's own break (its d alone past the
threshold) is shown beside it, and d's 95% t-interval over seeds at the break. A base that
never breaks on the grid is "beyond" its longest length: the grid caps what is measured.

**Predictions**, on the same grid: Liu's bound T_extra (``rope_theory.extrapolation_limit``,
the model's head dimension and L_train) predicts a break at the first evaluation length past
it; Men's bound (``rope_theory.supported_length``) is the longest context the base supports,
a necessary condition for using that context, not a prediction of perplexity: a base whose
perplexity holds past it is what Men et al. call a superficial long context (retrieval, not
perplexity, shows it).
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from pe_bench.files import atomic_write_text
from pe_bench.positions.rotary import RoPE
from pe_bench.report import aggregate, figures, latex, rope_theory
from pe_bench.report.markdown import markdown_table, write_csv
from pe_bench.stats import t_interval

BREAK_NATS = 0.1  # a rise of NLL over L_train's that counts as breaking: perplexity x 1.105
MEN_LIMIT = 1 << 22  # the longest context Men's bound is searched to
DEFAULT_BASE = inspect.signature(RoPE.__init__).parameters["base"].default


def rope_bases(df: pd.DataFrame) -> pd.Series:
    """Base by label, ascending, of ``df``'s trained RoPE labels whose only option is the base
    (``pe_options`` ``base=<b>``, or none: the default); other labels are left out."""
    options = df["pe_options"].fillna("") if "pe_options" in df else pd.Series("", index=df.index)
    rope = (
        (df["scheme"] == "rope")
        & (df["variant"] == "none")
        & (aggregate.finetunes(df) == "none")
        & options.str.fullmatch(r"(base=[^,]+)?")
    )
    given = options[rope].str.removeprefix("base=")
    bases = given.where(given != "", str(DEFAULT_BASE)).astype(float)
    return (
        pd.Series(bases.values, index=df.loc[rope, "label"]).groupby(level=0).first().sort_values()
    )


def is_base_sweep(df: pd.DataFrame) -> bool:
    """Whether ``df`` holds trained RoPE labels of two bases or more."""
    return rope_bases(df).nunique() > 1


def head_dim(root: Path, df: pd.DataFrame) -> int | None:
    """The head dimension (d_model / num_heads) of the runs of ``df``, from each job folder's
    config.yaml (records carry d_model, not the heads); None unless every folder has one and
    all agree."""
    dims = set()
    for folder in df["folder"].unique():
        path = root / folder / "config.yaml"
        if not path.exists():
            return None
        model = OmegaConf.load(path).model
        dims.add(int(model.d_model) // int(model.num_heads))
    return dims.pop() if len(dims) == 1 else None


def rises(df: pd.DataFrame, train_len: int) -> pd.DataFrame:
    """d(L) = NLL(L) - NLL(train_len) per (label, seed) and evaluation length past train_len
    (ok records only; a run without its train_len record has none)."""
    ok = df[df["status"] == "ok"].dropna(subset=["nll", "eval_len"])
    wide = ok.pivot_table(index=["label", "seed"], columns="eval_len", values="nll")
    if train_len not in wide:
        return pd.DataFrame()
    past = [n for n in wide.columns if n > train_len]
    return wide[past].sub(wide[train_len], axis=0).dropna(how="all")


def first_past(values: pd.Series, threshold: float) -> int | None:
    """The first length (index, ascending) whose value exceeds ``threshold``; None if none."""
    over = values[values > threshold]
    return int(over.index[0]) if len(over) else None


def grid_break(limit: float, lengths: list[int]) -> int | None:
    """The first of ``lengths`` past ``limit``: where a bound predicts the grid sees a break."""
    return next((n for n in sorted(lengths) if n > limit), None)


def break_table(df: pd.DataFrame, train_len: int, dim: int | None) -> pd.DataFrame:
    """One row per base: seeds, the measured break (``measured``: of the mean over seeds) with
    d's interval there (at the longest length where there is none), each seed's break, Liu's
    d_extra and T_extra with the grid length past it, Men's supported length (None/NaN
    without a head dimension); lengths are ints or None (beyond the grid)."""
    bases, d = rope_bases(df), rises(df, train_len)
    lengths = sorted(int(n) for n in d.columns)
    rows = []
    for lab, base in bases.items():
        if lab not in d.index.get_level_values("label"):
            continue
        seeds = d.loc[lab]
        measured = first_past(seeds.mean(), BREAK_NATS)
        n, mean, low, high = t_interval(seeds[measured] if measured else seeds[lengths[-1]])
        per_seed = [first_past(row, BREAK_NATS) for _, row in seeds.iterrows()]
        row = {"base": base, "label": lab, "n": n, "measured": measured, "rise": mean}
        row |= {"rise_low": low, "rise_high": high, "seed_breaks": per_seed}
        rows.append(row | predictions(base, train_len, dim, lengths))
    table = pd.DataFrame(rows)
    for column in ("measured", "d_extra", "liu_break", "men_length"):  # None stays None
        table[column] = pd.Series([row[column] for row in rows], dtype=object)
    return table


def predictions(base: float, train_len: int, dim: int | None, lengths: list[int]) -> dict:
    """Liu's and Men's numbers for ``base`` (NaN/None without a head dimension)."""
    if dim is None:
        return {"d_extra": None, "t_extra": math.nan, "liu_break": None, "men_length": None}
    limit = rope_theory.extrapolation_limit(dim, train_len, base)
    return {
        "d_extra": rope_theory.critical_dimension(dim, train_len, base),
        "t_extra": limit,
        "liu_break": grid_break(limit, lengths),
        "men_length": rope_theory.supported_length(base, dim, MEN_LIMIT),
    }


def base_text(base: float) -> str:
    """A base as the section writes it: 1,000,000 rather than 1e+06."""
    return f"{base:,.0f}" if base == int(base) else f"{base:g}"


def at_length(length: int | None, longest: int) -> str:
    """A break length as the table shows it: the length, or beyond the grid's longest."""
    return f"beyond {longest}" if length is None else str(length)


def liu_sentence(row: pd.Series, longest: int) -> str:
    """Where the measured break agrees with Liu et al.'s predicted one and where not."""
    measured, predicted = row["measured"], row["liu_break"]
    if math.isinf(row["t_extra"]):
        bound = (
            f"Liu: d_extra = {row['d_extra']} >= d, every dimension turns through a whole period "
            "within L_train, so no bound is predicted"
        )
    else:
        bound = f"Liu: T_extra = {row['t_extra']:.0f} tokens (d_extra = {row['d_extra']})"
        bound += f", a break predicted at {at_length(predicted, longest)}"
    if measured == predicted:
        seen = f"no break up to {longest}" if measured is None else f"the break at {measured}"
        return f"{bound}; agrees ({seen})."
    if measured is None:
        return f"{bound}; disagrees: perplexity holds to {longest}."
    if predicted is None or measured < predicted:
        return f"{bound}; disagrees: it breaks earlier, at {measured}."
    return f"{bound}; disagrees: it breaks later, at {measured}."


def men_sentence(row: pd.Series, train_len: int, lengths: list[int]) -> str:
    """Where the measured break agrees with Men et al.'s bound and where not: the bound says
    which contexts a base can use, so perplexity that holds only within it is consistent
    (necessary, not sufficient), and perplexity holding past it (the last of the evaluation
    ``lengths`` before the break) is the superficial context they describe."""
    measured, supported = row["measured"], row["men_length"]
    bound = f"Men: B(m) >= 0 up to {at_length(supported, MEN_LIMIT)} tokens"
    if supported is not None and supported < train_len:
        bound += f", fewer than L_train = {train_len}"
    held = lengths[-1] if measured is None else max(n for n in lengths if n < measured)
    if supported is None or held <= supported:
        return f"{bound}; consistent: perplexity holds to {held}, within the bound."
    return (
        f"{bound}; perplexity holds to {held}, past the bound: the bound does not predict "
        "perplexity (Men et al.'s superficial long context; retrieval, not scored here, would "
        "test it)."
    )


def markdown(table: pd.DataFrame, longest: int) -> str:
    """The section's table: one row per base."""
    header = ["base", "seeds", "break (mean)", "each seed", "rise at break [95% CI]"]
    header += ["Liu d_extra", "Liu T_extra", "Liu break", "Men supported"]
    rows = []
    for r in table.itertuples():
        rise = f"{r.rise:.3f} [{r.rise_low:.3f}, {r.rise_high:.3f}]" if r.n > 1 else f"{r.rise:.3f}"
        limit = "none" if math.isinf(r.t_extra) else f"{r.t_extra:.0f}"
        rows.append([
            base_text(r.base), str(r.n), at_length(r.measured, longest),
            ", ".join(at_length(b, longest) for b in r.seed_breaks), rise,
            "" if r.d_extra is None else str(r.d_extra), "" if r.d_extra is None else limit,
            "" if r.d_extra is None else at_length(r.liu_break, longest),
            "" if r.d_extra is None else at_length(r.men_length, MEN_LIMIT),
        ])  # fmt: skip
    return markdown_table(header, rows, "lrrlrrrrr")


def figure(nll: pd.DataFrame, table: pd.DataFrame, train_len: int) -> Figure:
    """Left: NLL vs evaluation length per base (mean over seeds, 95% band). Right: against
    the base, the measured break, each seed's, Liu's T_extra and Men's supported length."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    colors = sns.color_palette("viridis", len(table))
    lengths = sorted(int(n) for n in nll["eval_len"].unique())
    for r, color in zip(table.itertuples(), colors, strict=True):
        cell = nll[nll["label"] == r.label]
        left.plot(cell["eval_len"], cell["mean"], marker="o", color=color, label=base_text(r.base))
        if (cell["n"] > 1).any():
            band = (cell["eval_len"], cell["ci_low"], cell["ci_high"])
            left.fill_between(*band, color=color, alpha=0.15, linewidth=0)
    left.set_xscale("log", base=2)
    left.set_xticks(lengths, [str(n) for n in lengths])
    left.axvline(train_len, color="0.35", linestyle=(0, (1, 2)), linewidth=1)
    left.set(xlabel="evaluation length (tokens, log scale)", ylabel="NLL (nats/token)")
    left.set_title("NLL vs evaluation length, per base")
    left.legend(title="base", fontsize="small", frameon=False)
    break_panel(right, table, lengths)
    figures.footnote(
        fig, f"Break: the first length where the mean over seeds of NLL(L) - NLL({train_len}) "
        f"exceeds {BREAK_NATS} nats; at the top: beyond {lengths[-1]}, the longest length scored."
    )  # fmt: skip
    return fig


def break_panel(ax, table: pd.DataFrame, lengths: list[int]) -> None:
    """Lengths against the base (log-log): the measured break (filled; open at the top where
    it is beyond the grid), each seed's (dots), Liu's T_extra and Men's supported length."""
    top = 2 * lengths[-1]  # where "beyond the grid" is drawn
    for n in lengths:
        ax.axhline(n, color="0.9", linewidth=0.8, zorder=0)
    seeds = [(r.base, top if b is None else b) for r in table.itertuples() for b in r.seed_breaks]
    ax.scatter(*zip(*seeds, strict=True), s=14, color="0.5", label="each seed's break", zorder=2)
    measured = table.dropna(subset=["measured"])
    ax.plot(measured["base"], measured["measured"], "o", color="C0", label="measured break")
    beyond = table[table["measured"].isna()]
    ax.plot(beyond["base"], [top] * len(beyond), "^", mfc="none", color="C0", label="beyond grid")
    finite = table[np.isfinite(table["t_extra"].astype(float))]
    ax.plot(finite["base"], finite["t_extra"], "s--", color="C1", label="Liu T_extra")
    men = table.dropna(subset=["men_length"])
    ax.plot(men["base"], men["men_length"], "D:", color="C2", label="Men: supported context")
    ax.axhline(lengths[-1], color="0.5", linestyle=(0, (4, 2)), linewidth=0.8, zorder=0)
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)
    highest = max([top, *finite["t_extra"], *men["men_length"]])
    ax.set_ylim(top=2 * highest)
    ax.set(xlabel="RoPE base (log scale)", ylabel="tokens (log scale)")
    ax.set_title("Breaking length: measured and predicted")
    ax.legend(fontsize="small", frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def section(root: Path, out: Path, df: pd.DataFrame) -> list[str]:
    """The report's RoPE-base section (writes tables/rope_base.csv|.md|.tex and
    figures/rope_base.*): markdown lines, none unless ``df`` is a base sweep."""
    if not is_base_sweep(df):
        return []
    train_len = int(df["train_len"].dropna().iloc[0])
    runs = df[df["label"].isin(rope_bases(df).index)]
    dim = head_dim(root, runs)
    table = break_table(df, train_len, dim)
    lengths = sorted(int(n) for n in df["eval_len"].dropna().unique())
    longest = lengths[-1]
    text = markdown(table, longest)
    breaks = [";".join(at_length(b, longest) for b in seeds) for seeds in table["seed_breaks"]]
    write_csv(out / "tables" / "rope_base.csv", table.assign(seed_breaks=breaks))
    atomic_write_text(out / "tables" / "rope_base.md", text + "\n")
    title = (
        f"RoPE's base: where NLL first rises over {BREAK_NATS} nats above L = {train_len}'s, "
        "beside the breaks Liu et al. 2023 and Men et al. 2024 predict."
    )
    latex.write(out / "tables", "rope_base", text, title)
    with figures.theme():
        nll = aggregate.seed_stats(runs, "nll")
        png = figures.save(figure(nll, table, train_len), out / "figures", "rope_base")
    return [
        *intro(train_len, dim, longest),
        text,
        "",
        *(sentences(table, train_len, lengths) if dim else []),
        f"![NLL vs length per base; the breaks]({png.relative_to(out).as_posix()})",
        "",
    ]


def sentences(table: pd.DataFrame, train_len: int, lengths: list[int]) -> list[str]:
    """One line per base: where its break agrees with each prediction and where not."""
    lines = [
        f"- **base {base_text(r.base)}**: {liu_sentence(r, lengths[-1])} "
        f"{men_sentence(r, train_len, lengths)}"
        for _, r in table.iterrows()
    ]
    return [*lines, ""]


def intro(train_len: int, dim: int | None, longest: int) -> list[str]:
    """The section's heading and what its columns mean."""
    head = f"head dimension d = {dim}" if dim else "head dimension unknown (no config.yaml)"
    return [
        "## RoPE's base",
        "",
        f"The trained RoPE models differ only in their base ({head}, L_train = {train_len}). "
        f"**Break**: the first evaluation length where the mean over seeds of NLL(L) - "
        f"NLL({train_len}) exceeds {BREAK_NATS} nats (perplexity x {math.exp(BREAK_NATS):.3f}); "
        "each seed's own break beside it, and the rise's 95% t-interval over seeds at the break "
        f'(at {longest} where there is none); "beyond {longest}": no break on the grid. '
        "**Liu** (Liu et al. 2023, eqs. 13 and 16b, for a model trained from scratch at the "
        "base): the critical dimension d_extra = 2 ceil((d/2) log_base(L_train / 2 pi)) and the "
        "bound T_extra = 2 pi base^(d_extra/d), so a break at the first length past T_extra "
        "(none where d_extra >= d). **Men** (Men et al. 2024, Appendix E's B(m) = sum_i "
        "cos(m theta_i)): the longest context with B(m) >= 0 at every distance below it, the "
        "context the base can use at most.",
        "",
    ]
