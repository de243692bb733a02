"""Aggregation numbers on hand-made records, against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from pe_bench.errors import UserError
from pe_bench.positions import options_label
from pe_bench.report import aggregate
from pe_bench.stats import log_buckets
from tests.helpers import diverged, prepared, record, three_seeds

T_975_2 = 4.302652729911275  # t-distribution, 97.5th percentile, 2 degrees of freedom (table)
HALF = T_975_2 * 0.2 / math.sqrt(3)  # 95% half-width of three values with sd 0.2


def cell(stats: pd.DataFrame, label: str, length: int) -> pd.Series:
    return stats.set_index(["label", "eval_len"]).loc[(label, length)]


def test_nll_and_bpb_are_means_with_t_intervals():
    df = prepared(three_seeds())
    nll = cell(aggregate.seed_stats(df, "nll"), "alibi", 16)
    assert nll["n"] == 3
    assert nll["mean"] == pytest.approx(1.2)
    assert nll["ci_low"] == pytest.approx(1.2 - HALF)
    assert nll["ci_high"] == pytest.approx(1.2 + HALF)
    bpb = cell(aggregate.seed_stats(df, "bpb"), "alibi", 16)
    assert bpb["mean"] == pytest.approx(1.2 / math.log(2))
    assert bpb["ci_high"] == pytest.approx((1.2 + HALF) / math.log(2))


def test_perplexity_is_the_geometric_mean_over_seeds():
    ppl = cell(aggregate.seed_stats(prepared(three_seeds()), "ppl"), "alibi", 16)
    assert ppl["mean"] == pytest.approx(math.exp(1.2))
    assert ppl["mean"] < np.mean(np.exp([1.0, 1.2, 1.4]))  # not the arithmetic mean
    assert ppl["ci_low"] == pytest.approx(math.exp(1.2 - HALF))
    assert ppl["ci_high"] == pytest.approx(math.exp(1.2 + HALF))


def test_one_seed_has_no_interval():
    rope = cell(aggregate.seed_stats(prepared(three_seeds()), "bpb"), "rope", 16)
    assert rope["n"] == 1
    assert rope["mean"] == pytest.approx(0.9 / math.log(2))
    assert math.isnan(rope["ci_low"]) and math.isnan(rope["ci_high"])


def test_ratio_to_the_baseline_length():
    df = prepared(three_seeds())
    ppl = aggregate.ratio_table(aggregate.seed_stats(df, "ppl"), baseline=16)
    assert ppl.loc["alibi", 16] == pytest.approx(1.0)
    assert ppl.loc["alibi", 32] == pytest.approx(math.exp(1.5 - 1.2))
    assert ppl.loc["rope", 32] == pytest.approx(math.exp(2.0 - 0.9))
    bpb = aggregate.ratio_table(aggregate.seed_stats(df, "bpb"), baseline=32)
    assert bpb.loc["alibi", 16] == pytest.approx(1.2 / 1.5)
    with pytest.raises(UserError, match="baseline length 24 is not an eval length"):
        aggregate.ratio_table(aggregate.seed_stats(df, "bpb"), baseline=24)


def test_extrapolation_score_and_rank():
    scores = aggregate.extrapolation_scores(prepared(three_seeds())).set_index("label")
    # per alibi run: (1.0+1.3)/2, (1.2+1.5)/2, (1.4+1.7)/2 = 1.15, 1.35, 1.55 (sd 0.2)
    assert scores.loc["alibi", "score"] == pytest.approx(1.35)
    assert scores.loc["alibi", "ci_low"] == pytest.approx(1.35 - HALF)
    assert scores.loc["rope", "score"] == pytest.approx((0.9 + 2.0) / 2)
    assert scores.loc["alibi", "rank"] == 1 and scores.loc["rope", "rank"] == 2


def test_score_averages_only_over_lengths_every_label_has():
    rows = [*three_seeds(), record("alibi", 0, 64, 9.0), record("alibi", 1, 64, 9.0)]
    df = prepared(rows)
    assert aggregate.score_grid(df) == [16, 32]
    assert aggregate.extrapolation_scores(df).set_index("label").loc["alibi", "score"] == (
        pytest.approx(1.35)
    )


def test_diverged_runs_are_counted_and_left_out():
    rows = [
        *three_seeds(),
        *diverged("alibi", 3, step=7),
        *diverged("xl", 0, step=40),
    ]
    df = prepared(rows)
    stats = aggregate.seed_stats(df, "nll")
    alibi = cell(stats, "alibi", 16)
    assert (alibi["n"], alibi["diverged"]) == (3, 1)
    assert alibi["mean"] == pytest.approx(1.2)
    xl = cell(stats, "xl", 32)
    assert (xl["n"], xl["diverged"]) == (0, 1)
    assert math.isnan(xl["mean"])
    scores = aggregate.extrapolation_scores(df).set_index("label")
    assert scores.loc["alibi", "score"] == pytest.approx(1.35)
    assert pd.isna(scores.loc["xl", "rank"])
    runs = aggregate.diverged_runs(df)
    assert runs[["label", "seed", "diverged_step"]].values.tolist() == [
        ["alibi", 3, 7],
        ["xl", 0, 40],
    ]


def test_canonical_order_puts_variants_after_their_scheme():
    names = ["fire", "alibi", "rope+yarn", "rope", "kerple_log", "nope", "rope+ntk", "rope+pi"]
    rows = []
    for name in names:
        scheme, _, variant = name.partition("+")
        rows.append(record(scheme, 0, 16, 1.0, variant=variant or "none", run_id=scheme))
    df = prepared(rows)
    assert aggregate.label_order(df) == [
        "nope",
        "rope",
        "rope+pi",
        "rope+ntk",
        "rope+yarn",
        "alibi",
        "fire",
        "kerple_log",
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"corpus_sha": "ffffff"},
            r"records disagree on corpus_sha: c17d74 \(alibi\); ffffff \(rope\)",
        ),
        ({"corpus": "wikitext"}, "records disagree on corpus"),
        ({"train_len": 32}, "records disagree on train_len"),
        ({"tokens": 512}, "records disagree on tokens"),
        ({"train_steps": 10}, "records disagree on train_steps"),
    ],
)
def test_mixed_protocols_are_refused(change, message):
    rows = [r if r["scheme"] == "alibi" else {**r, **change} for r in three_seeds()]
    with pytest.raises(UserError, match=message):
        prepared(rows)


def test_two_runs_with_one_seed_are_not_averaged_as_seeds():
    rows = [*three_seeds(), record("rope", 0, 16, 1.0, run_id="rope-other")]
    with pytest.raises(UserError, match=r"rope has 2 runs with seed 0 \(rope-0, rope-other\)"):
        prepared(rows)


def test_the_same_run_twice_is_refused():
    rows = [*three_seeds(), record("rope", 0, 16, 0.9)]
    with pytest.raises(UserError, match="run rope-0 has 2 records of rope at eval length 16"):
        prepared(rows)


def test_mode_and_scheme_selection():
    rows = [*three_seeds(), record("rope", 0, 16, 0.8, mode="sliding", stride=4)]
    assert set(prepared(rows)["mode"]) == {"nonoverlap"}
    assert set(prepared(rows, mode="sliding")["nll"]) == {0.8}
    assert set(prepared(rows, schemes=["rope"])["label"]) == {"rope"}
    with pytest.raises(UserError, match="no records of t5; the records have rope, alibi"):
        prepared(rows, schemes=["t5"])
    with pytest.raises(UserError, match="no records with mode 'sliding'"):
        prepared(three_seeds(), mode="sliding")


def test_position_loss_averages_runs_then_log_buckets():
    rows = [record("rope", seed, 8, 1.0) for seed in (0, 1)]
    positions = pd.DataFrame(
        [
            {"run_id": "rope-0", "scheme": "rope", "variant": "none", "eval_len": 8,
             "mode": "nonoverlap", "loss": [4.0, 3.0, 2.0, 2.0, 1.0, 1.0, 1.0, None]},
            {"run_id": "rope-1", "scheme": "rope", "variant": "none", "eval_len": 8,
             "mode": "nonoverlap", "loss": [2.0, 1.0, 4.0, 2.0, 3.0, 1.0, 1.0, None]},
        ]
    )  # fmt: skip
    assert log_buckets(8, per_octave=1).tolist() == [1, 2, 4, 8, 9]
    curve = aggregate.position_loss(positions, prepared(rows), per_octave=1)
    # run means at positions 1..7: 3, 2, 3, 2, 2, 1, 1; position 8 was never scored
    assert curve[["position", "loss"]].values.tolist() == [[1, 3.0], [2.5, 2.5], [5.5, 1.5]]
    # each run's bucket means (position 1: 4 and 2; 4..7: 1.25 and 1.75), a t-interval over runs
    assert curve["n"].tolist() == [2, 2, 2]
    t = 12.706204736  # t(0.975, 1 degree of freedom)
    assert curve["ci_high"].iloc[0] == pytest.approx(3.0 + t * 1.0)
    assert curve["ci_low"].iloc[2] == pytest.approx(1.5 - t * 0.25)


def test_training_curves_mean_over_seeds():
    rows = [record("rope", seed, 16, 1.0) for seed in (0, 1, 2)]
    curve = pd.DataFrame(
        [{"run_id": f"rope-{s}", "step": 10, "loss": 2.0 + 0.2 * s} for s in (0, 1, 2)]
        + [{"run_id": "rope-0", "step": 20, "loss": 1.5, "val_loss": 1.6}]
    )
    out = aggregate.training_curves(curve, prepared(rows)).set_index(["split", "step"])
    assert out.loc[("train", 10), "n"] == 3
    assert out.loc[("train", 10), "mean"] == pytest.approx(2.2)
    assert out.loc[("train", 10), "ci_high"] == pytest.approx(2.2 + HALF)
    assert out.loc[("valid", 20), "mean"] == pytest.approx(1.6)
    assert ("valid", 10) not in out.index


def test_skipped_evaluations_keep_their_reason():
    skipped = {"status": "skipped", "nll": None, "ppl": None, "bpb": None}
    rows = [
        *three_seeds(),
        {**record("rope", 0, 64, 0.0, reason="out of memory at L=64: no room"), **skipped},
        {**record("alibi", 1, 64, 0.0), **skipped},  # an older record without a reason
    ]
    df = prepared(rows)
    assert aggregate.skipped_evaluations(df).values.tolist() == [
        ["rope", 0, "rope-0", 64, "out of memory at L=64: no room"],
        ["alibi", 1, "alibi-1", 64, "no reason recorded"],
    ]
    stats = aggregate.seed_stats(df, "nll")
    assert stats.loc[stats["eval_len"] == 64, "n"].tolist() == [0, 0]
    assert aggregate.skipped_evaluations(prepared(three_seeds())).empty


def seeded(scheme: str, nlls: list[float], length: int = 16) -> list[dict]:
    return [record(scheme, seed, length, nll) for seed, nll in enumerate(nlls)]


def test_paired_differences_and_the_ranks_they_allow():
    """alibi beats rope by 0.5 at every seed: separated. t5 is about alibi's level but the
    difference flips sign between seeds: not separated, so alibi and t5 share rank 1, and
    rope, separated from both, is ranked 3."""
    rows = [
        *seeded("t5", [1.05, 1.0, 1.35]),
        *seeded("rope", [1.5, 1.6, 1.7]),
        *seeded("alibi", [1.0, 1.1, 1.2]),
    ]
    df = prepared(rows)
    pairs = aggregate.paired_differences(df, "nll").set_index(["label_a", "label_b"])
    rope_alibi = pairs.loc[("rope", "alibi")]
    assert rope_alibi["n"] == 3 and rope_alibi["mean_diff"] == pytest.approx(0.5)
    assert rope_alibi["ci_low"] == pytest.approx(0.5) and rope_alibi["separated"]
    t5_alibi = pairs.loc[("t5", "alibi")]
    assert t5_alibi["mean_diff"] == pytest.approx(0.1 / 3) and not t5_alibi["separated"]
    assert pairs.loc[("t5", "rope"), "separated"]  # 0.45, 0.6, 0.35 apart: every seed
    means = aggregate.seed_stats(df, "nll").pivot(index="label", columns="eval_len", values="mean")
    ranks = aggregate.separable_ranks(pairs.reset_index(), means)
    assert ranks[16].to_dict() == {"alibi": 1, "rope": 3, "t5": 1}


def test_one_seed_separates_nothing():
    df = prepared([*seeded("rope", [1.5]), *seeded("alibi", [1.0])])
    pairs = aggregate.paired_differences(df, "nll")
    assert pairs["n"].tolist() == [1] and not pairs["separated"].any()


def test_differences_are_paired_by_seed():
    """Seed 1 of one scheme is never compared with seed 0 of another: only shared seeds."""
    df = prepared([*seeded("rope", [1.5, 9.0]), *seeded("alibi", [1.0])])
    (pair,) = aggregate.paired_differences(df, "nll").itertuples()
    assert pair.n == 1 and pair.mean_diff == pytest.approx(0.5)


def test_labels_carry_non_default_options():
    """Two runs of one scheme with other options are two rows, named by what differs
    (issue 17: p_rope at p=0.75 and 0.25 could not share a report)."""
    rows = [
        record("rope", 0, 16, 1.0),
        record("rope", 0, 16, 1.1, run_id="rope-base", pe_options="base=500"),
        record("rope", 0, 16, 1.2, run_id="rope-base-pi", pe_options="base=500", variant="pi"),
    ]
    df = prepared(rows)
    assert list(df["label"]) == ["rope", "rope(base=500)", "rope(base=500)+pi"]


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        ({"name": "rope", "base": 10000}, ""),  # the default, written as an int
        ({"name": "rope", "base": 500000.0}, "base=500000"),
        ({"name": "kerple_log"}, ""),
        ({"name": "learned", "max_positions": 512, "plugin": None}, "max_positions=512"),
        ({"name": "bipe", "separators": [10], "table_size": None}, ""),  # YAML's list: default
        ({"name": "bipe", "separators": [10, 46]}, "separators=[10,46]"),
    ],
)
def test_options_label(cfg, expected):
    assert options_label(cfg) == expected
