"""The numbers of a report: records in, seed statistics, ratios and extrapolation scores out.

Pure pandas, no files and no plotting, so that every number a report shows can be checked
against a hand computation (``tests/report/test_aggregate.py``).

- **Seeds.** Each (label, eval length) cell is the mean over seeds with a 95% confidence
  interval from the t-distribution (``mean ± t(0.975, n-1) · sd / sqrt(n)``; none when n = 1);
  for the rates of synthetic tasks (exact match, token accuracy) the interval is clipped to
  [0, 1], which a t-interval of a few seeds can overshoot.
  NLL and bits per byte are averaged as they are. Perplexity is averaged in log space: the cell
  is ``exp(mean NLL)`` (the geometric mean over seeds) with ``exp`` of the NLL interval, so that
  the perplexity, bits-per-byte and NLL tables of one report always agree with each other.
- **Ratio** to the baseline length (the training length unless chosen): cell / cell at baseline.
- **Extrapolation score**: mean log-perplexity (NLL, nats/token) over the eval lengths every
  label has (log-spaced by default: 1x, 2x, 4x ...), per run, then mean and CI over seeds;
  rank 1 is the lowest score.
- **Diverged runs** (records with ``status: diverged``) have no numbers: they are left out of
  means and scores, counted per label, and listed by ``diverged_runs`` so that the report shows
  them.
- **Skipped evaluations** (``status: skipped``, e.g. out of memory at a length) have no number
  either; ``skipped_evaluations`` lists them with their reason so that the report shows why.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from pe_bench.errors import UserError
from pe_bench.report import metrics
from pe_bench.stats import log_buckets, t_interval

# What "one protocol" means: records compared in one report must share these fields, because
# a difference in any of them (other data, other eval tokens, another training length, model
# size or budget) changes the numbers for reasons other than the position scheme.
PROTOCOL = (
    "corpus",
    "corpus_sha",
    "train_len",
    "tokens",
    "d_model",
    "num_layers",
    "train_steps",
    "train_tokens",
)

# Canonical row order: the classic schemes, eval-time variants right after their base scheme,
# then any other scheme or variant in alphabetical order.
SCHEME_ORDER = ("nope", "sinusoidal", "learned", "t5", "xl", "rope", "alibi")
VARIANT_ORDER = ("none", "pi", "ntk")


def finetunes(df: pd.DataFrame) -> pd.Series:
    """The fine-tune of each record's model: ``none`` for a model as trained."""
    if "finetune" not in df:
        return pd.Series("none", index=df.index)
    return df["finetune"].fillna("none")


def with_finetune(names: pd.Series, finetune: pd.Series) -> pd.Series:
    """``names`` with ``:finetune`` appended where the model is fine-tuned (not ``none``)."""
    return names.where(finetune == "none", names + ":" + finetune)


def label(df: pd.DataFrame) -> pd.Series:
    """Display name of each record: the scheme with its non-default options in brackets
    (``p_rope(p=0.25)``, from the record's ``pe_options``), ``+variant`` for eval-time variants
    and ``:finetune`` for a fine-tuned model (e.g. ``rope:pi``)."""
    options = df["pe_options"].fillna("") if "pe_options" in df else pd.Series("", index=df.index)
    scheme = df["scheme"].where(options == "", df["scheme"] + "(" + options + ")")
    lab = scheme.where(df["variant"] == "none", scheme + "+" + df["variant"])
    return with_finetune(lab, finetunes(df))


def swept_setting(folder: str) -> str:
    """The overrides a job folder's name holds besides the scheme and the seed (``pe=nope,
    train.lr=0.001`` -> ``train.lr=0.001``): what sets its run apart in a sweep."""
    name = folder.rsplit("/", 1)[-1]
    parts = [] if name == "default" else name.split(",")
    return ",".join(p for p in parts if not p.startswith(("pe=", "train.seed=")))


def tell_settings_apart(df: pd.DataFrame) -> pd.DataFrame:
    """Label runs of one label and seed that differ in config (a sweep over ``train.lr``, say)
    with the setting their folder names hold, e.g. ``nope [train.lr=0.001]``: they are
    separate rows, never seeds of one. Column ``setting`` ('' elsewhere) keeps it."""
    setting = pd.Series("", index=df.index)
    if "folder" in df:
        runs = df.drop_duplicates(["label", "run_id"])
        per_seed = runs.groupby(["label", "seed"], dropna=False)["run_id"].nunique()
        clashing = per_seed[per_seed > 1].index.get_level_values("label")
        setting = df["folder"].map(swept_setting).where(df["label"].isin(clashing), "")
    return df.assign(setting=setting, label=with_setting(df["label"], setting))


def with_setting(names: pd.Series, setting: pd.Series) -> pd.Series:
    """``names`` with `` [setting]`` appended where there is one."""
    return names.where(setting == "", names + " [" + setting + "]")


def order_key(scheme: str, variant: str = "none", finetune: str = "none") -> tuple:
    """Sort key of a (scheme, variant, fine-tune) in the canonical row order: the trained
    model's rows first, fine-tuned models after them in alphabetical order."""
    s = SCHEME_ORDER.index(scheme) if scheme in SCHEME_ORDER else len(SCHEME_ORDER)
    v = VARIANT_ORDER.index(variant) if variant in VARIANT_ORDER else len(VARIANT_ORDER)
    return (s, scheme, finetune != "none", finetune, v, variant)


def label_order(df: pd.DataFrame) -> list[str]:
    """The labels of ``df`` in canonical order."""
    keys = df[["label", "scheme", "variant"]].assign(finetune=finetunes(df)).drop_duplicates()
    rows = sorted(keys.itertuples(), key=lambda r: order_key(r.scheme, r.variant, r.finetune))
    return [row.label for row in rows]


def prepare(df: pd.DataFrame, mode: str | None = None, schemes: Iterable[str] = ()) -> pd.DataFrame:
    """Records of one eval mode (and the chosen schemes or labels), checked to be comparable.

    ``mode`` None picks nonoverlap when present.
    """
    df = tell_settings_apart(df.assign(label=label(df)))
    if "status" not in df:
        df = df.assign(status="ok")
    df = df.assign(status=df["status"].fillna("ok"))
    modes = sorted(df["mode"].unique())
    if mode is None:
        mode = "nonoverlap" if "nonoverlap" in modes else modes[0]
    if mode not in modes:
        raise UserError(f"no records with mode {mode!r}; the records have {', '.join(modes)}")
    df = df[df["mode"] == mode]
    wanted = list(schemes)
    if wanted:
        known = label_order(df)
        unknown = [w for w in wanted if w not in known and w not in set(df["scheme"])]
        if unknown:
            raise UserError(
                f"no records of {', '.join(unknown)}; the records have {', '.join(known)}"
            )
        df = df[df["scheme"].isin(wanted) | df["label"].isin(wanted)]
    check_protocol(df)
    return df.reset_index(drop=True)


def check_protocol(df: pd.DataFrame) -> None:
    """Refuse records that cannot share a table: another protocol, or two runs as one seed."""
    for field in PROTOCOL:
        if field not in df:
            continue
        values = df.dropna(subset=[field]).groupby(field)["label"].unique()
        if len(values) > 1:
            found = "; ".join(f"{v} ({', '.join(sorted(labels))})" for v, labels in values.items())
            raise UserError(
                f"records disagree on {field}: {found}; one report compares runs under one "
                f"protocol (same {', '.join(PROTOCOL)}): report their folders separately "
                "or pick with --schemes"
            )
    scored = df.dropna(subset=["eval_len"])
    strides = scored.groupby("eval_len")["stride"].nunique()
    if (strides > 1).any():
        raise UserError(
            f"records disagree on the stride at eval length {int(strides.idxmax())}: "
            "report runs with different eval.stride separately"
        )
    runs = df.drop_duplicates(["label", "run_id"])
    seeds = runs.groupby(["label", "seed"])["run_id"].unique()
    for (lab, seed), run_ids in seeds.items():
        if len(run_ids) > 1:
            raise UserError(
                f"{lab} has {len(run_ids)} runs with seed {seed} ({', '.join(sorted(run_ids))}): "
                "runs of different configs would be averaged as seeds; report their folders "
                "separately or pick with --schemes"
            )
    cells = scored.groupby(["label", "run_id", "eval_len"]).size()
    if (cells > 1).any():
        lab, run_id, length = cells.idxmax()
        raise UserError(
            f"run {run_id} has {cells.max()} records of {lab} at eval length {length}: "
            "is the same run stored twice under the results folder?"
        )


def seed_stats(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One row per (label, eval length), every pair present (n = 0 where a label has no
    number): n, mean, ci_low, ci_high of ``metric`` over seeds, and the label's diverged runs."""
    spec = metrics.spec(metric)
    diverged = diverged_runs(df).groupby("label").size()
    scored = df.dropna(subset=["eval_len"]).astype({"eval_len": int})
    rows = []
    for lab in label_order(df):
        for length in sorted(scored["eval_len"].unique()):
            values = scored.loc[(scored["label"] == lab) & (scored["eval_len"] == length), metric]
            if spec.over_seeds == metrics.GEOMETRIC:  # the statistics of the logs, mapped back
                n, *logs = t_interval(np.log(values.astype(float)))
                mean, low, high = (math.exp(x) for x in logs)
            else:
                n, mean, low, high = t_interval(values.astype(float))
            if spec.bounds:  # a rate: its interval is clipped to [0, 1]
                low, high = (float(np.clip(x, *spec.bounds)) for x in (low, high))  # NaN stays
            rows.append([lab, int(length), n, mean, low, high, int(diverged.get(lab, 0))])
    columns = ["label", "eval_len", "n", "mean", "ci_low", "ci_high", "diverged"]
    return pd.DataFrame(rows, columns=columns)


def ratio_table(stats_df: pd.DataFrame, baseline: int) -> pd.DataFrame:
    """Label x eval length: each mean divided by the same label's mean at ``baseline``."""
    means = stats_df.pivot(index="label", columns="eval_len", values="mean")
    if baseline not in means.columns:
        lengths = ", ".join(str(n) for n in means.columns)
        raise UserError(
            f"baseline length {baseline} is not an eval length; the records have {lengths}"
        )
    labels = list(dict.fromkeys(stats_df["label"]))
    return means.div(means[baseline], axis=0).reindex(labels)


def score_grid(df: pd.DataFrame) -> list[int]:
    """The eval lengths that every label with numbers has: the grid the scores average over."""
    finite = df[np.isfinite(df["nll"].astype(float))]
    sets = [set(g["eval_len"].astype(int)) for _, g in finite.groupby("label")]
    return sorted(set.intersection(*sets)) if sets else []


SCORE_DIGITS = 3  # decimals of a printed extrapolation score


def run_scores(df: pd.DataFrame) -> pd.DataFrame:
    """Each run's extrapolation score: its mean NLL over the score grid (NaN for a run missing
    a grid length). Columns: label, scheme, variant, finetune, seed, run_id, score."""
    grid = score_grid(df)
    cells = df[df["eval_len"].isin(grid)].assign(finetune=finetunes(df))
    keys = ["label", "scheme", "variant", "finetune", "seed", "run_id"]
    counts = cells.groupby(keys)["nll"].agg(["count", "mean"]).reset_index()
    score = counts["mean"].where(counts["count"] == len(grid))
    return counts[keys].assign(score=score)


def extrapolation_scores(df: pd.DataFrame) -> pd.DataFrame:
    """Per label: mean NLL over the score grid for each run, then n, mean, CI over runs and the
    rank (1 = best; scores equal to ``SCORE_DIGITS`` decimals share one; labels without a
    score get none)."""
    runs = run_scores(df)
    rows = []
    for lab in label_order(df):
        n, mean, low, high = t_interval(runs.loc[runs["label"] == lab, "score"])
        rows.append({"label": lab, "n": n, "score": mean, "ci_low": low, "ci_high": high})
    scores = pd.DataFrame(rows, columns=["label", "n", "score", "ci_low", "ci_high"])
    # Ranked at the precision the report shows: scores that print alike share a rank.
    ranks = scores["score"].round(SCORE_DIGITS).rank(method="min").astype("Int64")
    scores.insert(0, "rank", ranks)
    return scores


def score_differences(df: pd.DataFrame) -> pd.DataFrame:
    """``paired_differences`` of the runs' extrapolation scores (``run_scores``): every pair
    of labels, paired over seeds; ``eval_len`` is 0 (the score covers the whole grid)."""
    runs = run_scores(df).dropna(subset=["score"])
    return paired_differences(runs.assign(status="ok", eval_len=0), "score")


def paired_differences(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Every pair of labels (a before b in label order) at every eval length: ``metric`` of a
    minus b, paired over the seeds both have (one seed: the same data order, trunk
    initialisation and test tokens), with n, mean and 95% t-interval; ``separated`` when the
    interval excludes 0 (never with fewer than 2 seeds)."""
    ok = df[df["status"] == "ok"].dropna(subset=[metric, "eval_len"])
    wide = ok.pivot_table(index=["eval_len", "seed"], columns="label", values=metric)
    labels = [lab for lab in label_order(df) if lab in wide.columns]
    rows = []
    for length, cells in wide.groupby(level="eval_len"):
        for i, a in enumerate(labels):
            for b in labels[i + 1 :]:
                n, mean, low, high = t_interval(cells[a] - cells[b])
                separated = n >= 2 and (high < 0 or low > 0)
                rows.append([a, b, int(length), n, mean, low, high, separated])
    columns = ["label_a", "label_b", "eval_len", "n", "mean_diff", "ci_low", "ci_high"]
    return pd.DataFrame(rows, columns=[*columns, "separated"])


def separable_ranks(
    pairs: pd.DataFrame, means: pd.DataFrame, higher_is_better: bool = False
) -> pd.DataFrame:
    """Label x eval length (``means``' shape, a label's mean per length): 1 + the number of
    labels separated from it and better (lower, or higher for accuracies), so that labels the
    seeds cannot tell apart share a rank (ranks 1, 1, 3: the first two are tied); none where a
    label has no number."""
    ranks = pd.DataFrame(1, index=means.index, columns=means.columns).astype("Int64")
    for pair in pairs[pairs["separated"]].itertuples():
        worse = pair.label_a if (pair.mean_diff > 0) != higher_is_better else pair.label_b
        ranks.loc[worse, pair.eval_len] += 1
    return ranks.mask(means.isna())


def diverged_runs(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (label, run) that diverged: label, seed, run_id, diverged_step."""
    columns = ["label", "seed", "run_id", "diverged_step"]
    bad = df[df["status"] == "diverged"]
    if "diverged_step" not in bad:
        bad = bad.assign(diverged_step=math.nan)
    return bad.drop_duplicates(["label", "run_id"])[columns].reset_index(drop=True)


def skipped_evaluations(df: pd.DataFrame) -> pd.DataFrame:
    """One row per record that was skipped (e.g. out of memory at a length), with its reason:
    label, seed, run_id, eval_len, reason; in label order, then by eval length and seed."""
    columns = ["label", "seed", "run_id", "eval_len", "reason"]
    skipped = df[df["status"] == "skipped"]
    if "reason" not in skipped:
        skipped = skipped.assign(reason=None)
    skipped = skipped.assign(reason=skipped["reason"].fillna("no reason recorded"))
    order = {lab: i for i, lab in enumerate(label_order(df))}
    skipped = skipped.assign(order=skipped["label"].map(order))
    skipped = skipped.sort_values(["order", "eval_len", "seed"], kind="stable")
    return skipped[columns].reset_index(drop=True)


def caveats(df: pd.DataFrame) -> dict[str, str]:
    """Label -> the protocol caveat its records carry (schemes that depart from their paper),
    in label order; labels without one are left out."""
    if "caveat" not in df:
        return {}
    noted = df.dropna(subset=["caveat"]).drop_duplicates("label")
    found = dict(zip(noted["label"], noted["caveat"], strict=True))
    return {lab: found[lab] for lab in label_order(df) if found.get(lab)}


def position_loss(positions: pd.DataFrame, df: pd.DataFrame, per_octave: int = 4) -> pd.DataFrame:
    """Mean loss by position inside the window, per (label, eval length), for the runs of
    ``df``: each run's loss averaged over log-spaced buckets of positions (1 = the first token
    of a window), then the mean over runs with its 95% t-interval (the seeds' spread; NaN
    bounds for one run). Columns: label, eval_len, position (mean position of the bucket), n,
    loss, ci_low, ci_high."""
    columns = ["label", "eval_len", "position", "n", "loss", "ci_low", "ci_high"]
    if positions.empty:
        return pd.DataFrame(columns=columns)
    keys = ["run_id", "variant", "eval_len", "mode"]
    runs = df.dropna(subset=["eval_len"]).astype({"eval_len": int})[[*keys, "label"]]
    positions = positions.drop(columns="label", errors="ignore")
    positions = positions.merge(runs.drop_duplicates(), on=keys)
    rows = []
    for lab in label_order(df):
        for length, cell in positions[positions["label"] == lab].groupby("eval_len"):
            # [runs, positions]; an offset that no target was scored at is null (sliding mode)
            loss = np.array([[np.nan if x is None else x for x in run] for run in cell["loss"]])
            for lo, hi in itertools.pairwise(log_buckets(int(length), per_octave)):
                block = loss[:, lo - 1 : hi - 1]  # [runs, the bucket's positions]
                has = np.isfinite(block)
                runs_with = has.any(axis=1)
                if runs_with.any():
                    sums, counts = np.where(has, block, 0).sum(axis=1), has.sum(axis=1)
                    n, mean, low, high = t_interval(sums[runs_with] / counts[runs_with])
                    position = np.arange(lo, hi)[has.any(axis=0)].mean()
                    rows.append([lab, int(length), position, n, mean, low, high])
    return pd.DataFrame(rows, columns=columns)


def position_intervals(positions: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """Loss by bucket of positions with a 95% t-interval over windows, per (label, eval
    length), from the rows that keep each window's loss by bucket (``window_loss``: the
    truncate mode's documents, ``pretrained.truncate``), pooled over the runs of ``df``; the
    buckets are ``log_buckets``'s. Columns: label, eval_len, position (the bucket's mean
    position), windows, loss, ci_low, ci_high; empty without such rows."""
    columns = ["label", "eval_len", "position", "windows", "loss", "ci_low", "ci_high"]
    if positions.empty or "window_loss" not in positions:
        return pd.DataFrame(columns=columns)
    keys = ["run_id", "variant", "eval_len", "mode"]
    runs = df.dropna(subset=["eval_len"]).astype({"eval_len": int})[[*keys, "label"]]
    kept = positions.dropna(subset=["window_loss"]).drop(columns="label", errors="ignore")
    kept = kept.merge(runs.drop_duplicates(), on=keys)
    rows = []
    for lab in label_order(df):
        for length, cell in kept[kept["label"] == lab].groupby("eval_len"):
            windows = [w for run in cell["window_loss"] for w in run]  # [windows][buckets]
            edges = log_buckets(int(length))
            for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
                values = [w[i] for w in windows if w[i] is not None]
                if values:
                    n, mean, low, high = t_interval(values)
                    rows.append([lab, int(length), np.arange(lo, hi).mean(), n, mean, low, high])
    return pd.DataFrame(rows, columns=columns)


def training_curves(curve: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """Training and validation loss by step per trained (or fine-tuned) model of ``df``, mean
    and 95% CI over seeds. Columns: label (the scheme, or ``scheme:finetune`` for a fine-tuning
    at its longer length), split (train or valid), step, n, mean, ci_low, ci_high."""
    columns = ["label", "split", "step", "n", "mean", "ci_low", "ci_high"]
    if curve.empty:
        return pd.DataFrame(columns=columns)
    tuned = finetunes(df)
    setting = df["setting"] if "setting" in df else pd.Series("", index=df.index)
    models = df[["run_id", "scheme"]].assign(
        finetune=tuned, label=with_setting(with_finetune(df["scheme"], tuned), setting)
    )
    curve = curve.merge(models.drop_duplicates(), on="run_id")
    keys = curve[["label", "scheme", "finetune"]].drop_duplicates()
    order = [
        k.label
        for k in sorted(keys.itertuples(), key=lambda k: order_key(k.scheme, "none", k.finetune))
    ]
    rows = []
    for split, column in (("train", "loss"), ("valid", "val_loss")):
        if column not in curve:
            continue
        for lab in order:
            points = curve[curve["label"] == lab].dropna(subset=[column])
            for step, at in points.groupby("step"):
                rows.append([lab, split, int(step), *t_interval(at[column].astype(float))])
    return pd.DataFrame(rows, columns=columns)


def reciprocal_ranks(
    df: pd.DataFrame,
    metrics: Mapping[str, str] | None = None,
    tie_order: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Kazemnejad et al. (2023)'s summary over synthetic tasks: for each task and seed, each
    label's metric (``metrics[task]``, exact match where not named) averaged over the eval
    lengths beyond the training length (the paper pools its test lengths, each as many
    instances), labels ranked (1 = highest), and 1/rank averaged over every (task, seed).
    Ties share the better rank; with ``tie_order`` they are broken by it instead, as the
    paper's notebook does (``rank(method="first")`` over its rows: a label earlier in
    ``tie_order`` ranks ahead, labels not in it after those, in label order). A point
    ranking, as the paper's: which differences the seeds support is in each task's pairwise
    table. Columns: label, the mean rank in each task, mrr, n (the (task, seed) cells);
    labels in label order."""
    beyond = df[df["eval_len"] > df["train_len"]]
    metric = beyond["task"].map(lambda task: (metrics or {}).get(task, "exact_match"))
    value = pd.Series(np.nan, index=beyond.index)
    for name in metric.unique():
        value[metric == name] = beyond.loc[metric == name, name]
    cells = beyond.assign(value=value).dropna(subset=["value"])
    cells = cells.groupby(["task", "seed", "label"])["value"].mean()
    if tie_order is None:
        ranks = cells.groupby(level=["task", "seed"]).rank(ascending=False, method="min")
    else:
        ranks = first_ranks(cells, [*tie_order, *label_order(df)])
    table = ranks.groupby(level=["label", "task"]).mean().unstack("task")
    by_label = (1 / ranks).groupby(level="label")
    table = table.assign(mrr=by_label.mean(), n=by_label.size())
    order = [lab for lab in label_order(df) if lab in table.index]
    return table.reindex(order).rename_axis("label").reset_index()


def first_ranks(cells: pd.Series, order: list[str]) -> pd.Series:
    """Ranks 1..k of ``cells`` (indexed by task, seed, label) within each (task, seed),
    highest first, ties broken by ``order`` (the earlier label ranks ahead)."""
    position = {label: i for i, label in reversed(list(enumerate(order)))}
    frame = cells.rename("value").reset_index()
    frame["position"] = frame["label"].map(position)
    frame = frame.sort_values(["task", "seed", "value", "position"], ascending=[1, 1, 0, 1])
    frame["rank"] = frame.groupby(["task", "seed"]).cumcount() + 1.0
    return frame.set_index(["task", "seed", "label"])["rank"].reindex(cells.index)
