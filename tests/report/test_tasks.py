"""The report of synthetic-task runs: accuracy intervals, the task report's tables and
sentences, and the mean reciprocal rank over tasks with its comparison to a paper's."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from pe_bench.data.tasks import (
    TASKS,
)
from pe_bench.report import aggregate
from pe_bench.report.build import build_report
from tests.helpers import record, write_runs


def test_reciprocal_ranks_rank_within_each_task_then_average():
    rows = []
    for task, accs in {"copy": (0.9, 0.5, 0.5), "flip_flop": (0.1, 0.8, 0.3)}.items():
        for scheme, acc in zip(("nope", "rope", "alibi"), accs, strict=True):
            for length, value in ((16, 1.0), (32, acc), (64, acc)):
                rows.append(
                    {
                        "task": task,
                        "label": scheme,
                        "scheme": scheme,
                        "variant": "none",
                        "seed": 0,
                        "run_id": f"{scheme}-{task}",
                        "eval_len": length,
                        "train_len": 16,
                        "exact_match": value,
                    }
                )
    table = aggregate.reciprocal_ranks(pd.DataFrame(rows)).set_index("label")
    assert (
        table.loc["nope", "copy"] == 1
        and table.loc["rope", "copy"] == 2 == table.loc["alibi", "copy"]
    )
    assert table["mrr"].to_dict() == pytest.approx(
        {"nope": (1 + 1 / 3) / 2, "rope": (1 / 2 + 1) / 2, "alibi": (1 / 2 + 1 / 2) / 2}
    )


def test_reciprocal_ranks_average_over_tasks_and_seeds():
    rows = [
        {
            "task": "copy",
            "label": lab,
            "scheme": lab,
            "variant": "none",
            "seed": seed,
            "run_id": f"{lab}-{seed}",
            "eval_len": 32,
            "train_len": 16,
            "exact_match": acc,
        }
        for seed, accs in ((0, (0.9, 0.1)), (1, (0.2, 0.3)))
        for lab, acc in zip(("nope", "rope"), accs, strict=True)
    ]
    table = aggregate.reciprocal_ranks(pd.DataFrame(rows)).set_index("label")
    assert table.loc["nope", "copy"] == 1.5 and table.loc["nope", "mrr"] == 0.75
    assert table.loc["rope", "n"] == 2


def test_separable_ranks_put_the_higher_accuracy_first():
    pairs = pd.DataFrame(
        [
            {
                "label_a": "nope",
                "label_b": "rope",
                "eval_len": 16,
                "mean_diff": -0.5,
                "separated": True,
            }
        ]
    )
    means = pd.DataFrame({16: [0.2, 0.7]}, index=["nope", "rope"])
    ranks = aggregate.separable_ranks(pairs, means, higher_is_better=True)
    assert ranks[16].tolist() == [2, 1]


def test_accuracy_intervals_stay_within_0_and_1():
    rows = [
        {
            "label": "rope",
            "scheme": "rope",
            "variant": "none",
            "seed": seed,
            "eval_len": 16,
            "run_id": f"rope-{seed}",
            "status": "ok",
            "exact_match": value,
        }
        for seed, value in enumerate([0.0, 1.0])
    ] + [
        {
            "label": "nope",
            "scheme": "nope",
            "variant": "none",
            "seed": 0,
            "eval_len": 16,
            "run_id": "nope-0",
            "status": "ok",
            "exact_match": 0.5,
        }
    ]
    stats = aggregate.seed_stats(pd.DataFrame(rows), "exact_match").set_index("label")
    assert (stats.loc["rope", "ci_low"], stats.loc["rope", "ci_high"]) == (0.0, 1.0)
    assert pd.isna(stats.loc["nope", "ci_low"])  # one seed: no interval, not a clipped 0


def test_task_report_ranks_token_accuracy_where_exact_match_is_zero_past_the_length(tmp_path):
    """Copy at CPU scale: every scheme solves it at 1x and no instance past it, so exact match
    ties them all; the token accuracies (rope ahead at every seed) must still rank them."""
    copy = {"mode": "task", "task": "copy", "corpus": "task:copy"}
    write_runs(
        tmp_path,
        [
            record(scheme, seed, n, 0.0, **copy, exact_match=float(n == 16), token_acc=token)
            for seed in range(3)
            for scheme, past in (("nope", 0.10), ("rope", 0.40))
            for n, token in ((16, 1.0), (32, past + 0.01 * seed))
        ],
    )
    report = build_report(tmp_path, echo=False)
    assert report.tables["copy_exact_match_ranks"][32].tolist() == [1, 1]
    assert report.tables["copy_token_acc_ranks"][32].tolist() == [2, 1]  # nope, rope
    text = report.path.read_text()
    assert "no scheme solves a single instance" in text
    assert "On copy no scheme solves an instance past the training length" in text
    assert "Rank by token accuracy" in text and "1 of 2 pairs are separated" in text
    assert (tmp_path / "tables" / "copy_token_acc_ranks.csv").exists()
    assert re.search(r"\| scheme +\| task +\| seed", text)  # a run's task in the runs table


def ranking_rows(task: str, scores: dict[str, tuple[float, float]], seed: int = 0) -> list[dict]:
    """One run per scheme: (exact match, token accuracy) at 2x, solved at 1x."""
    return [
        {
            "task": task,
            "label": lab,
            "scheme": lab,
            "variant": "none",
            "seed": seed,
            "run_id": f"{lab}-{task}-{seed}",
            "eval_len": n,
            "train_len": 16,
            "exact_match": 1.0 if n == 16 else exact,
            "token_acc": 1.0 if n == 16 else token,
        }
        for lab, (exact, token) in scores.items()
        for n in (16, 32)
    ]


def ranking_records(task: str, scores: dict[str, tuple[float, float]]) -> list[dict]:
    """``ranking_rows`` as full records of task runs, for a report."""
    return [
        record(
            r["scheme"],
            r["seed"],
            r["eval_len"],
            0.0,
            mode="task",
            corpus=f"task:{task}",
            **{k: r[k] for k in ("task", "exact_match", "token_acc")},
        )
        for r in ranking_rows(task, scores)
    ]


def test_reciprocal_ranks_rank_each_task_by_its_headline_metric():
    """Flip-flop's exact match compounds per-read errors: every scheme 0 at 2x; the share of
    reads right still orders them, and it is flip-flop's headline."""
    rows = ranking_rows("flip_flop", {"nope": (0.0, 0.6), "rope": (0.0, 0.9)})
    by_exact = aggregate.reciprocal_ranks(pd.DataFrame(rows)).set_index("label")
    assert by_exact["flip_flop"].tolist() == [1, 1]
    table = aggregate.reciprocal_ranks(pd.DataFrame(rows), {"flip_flop": "token_acc"})
    assert table.set_index("label")["mrr"].to_dict() == {"nope": 0.5, "rope": 1.0}
    assert TASKS["flip_flop"].headline == "token_acc" == TASKS["assoc_recall"].headline
    assert {TASKS[t].headline for t in ("copy", "reverse", "addition")} == {"exact_match"}


def test_reciprocal_ranks_break_ties_as_the_papers_notebook_does():
    """The notebook ranks with ``rank(method="first")`` over its rows (Rotary, ALiBi, T5,
    sinusoidal, NoPE): a tie goes to the row listed first."""
    order = ["rope", "alibi", "t5", "sinusoidal", "nope"]
    tied = {lab: (0.0, 0.1) for lab in ["nope", "sinusoidal", "t5", "rope", "alibi"]}
    rows = ranking_rows("copy", tied) + ranking_rows("copy", {**tied, "nope": (0.2, 0.3)}, 1)
    df = pd.DataFrame(rows)
    shared = aggregate.reciprocal_ranks(df).set_index("label")["mrr"]
    first = aggregate.reciprocal_ranks(df, tie_order=order).set_index("label")["mrr"]
    assert shared.to_dict() == {
        "nope": 1.0,
        "sinusoidal": 0.75,
        "t5": 0.75,
        "rope": 0.75,
        "alibi": 0.75,
    }
    notebook = {}
    for seed in (0, 1):
        cell = pd.Series({lab: tied[lab][0] for lab in order})
        cell["nope"] = 0.2 if seed else 0.0
        for lab, rank in cell.rank(method="first", ascending=False).items():
            notebook[lab] = notebook.get(lab, 0) + 1 / rank / 2
    assert first.to_dict() == pytest.approx(notebook)
    assert first["rope"] == pytest.approx((1 + 1 / 2) / 2) and first["nope"] == pytest.approx(0.6)


@pytest.mark.slow
def test_the_comparison_shows_both_tie_rules_and_what_the_paper_averages_over(tmp_path):
    from pe_bench.report.inputs import Options

    scores = {"nope": (0.0, 0.2), "t5": (0.0, 0.4), "alibi": (0.1, 0.5), "rope": (0.0, 0.3)}
    scores["sinusoidal"] = (0.0, 0.1)
    write_runs(tmp_path, ranking_records("copy", scores))
    report = build_report(
        tmp_path, options=Options(compare="published/kazemnejad_paper"), echo=False
    )
    table = report.tables["compare"].set_index("label")
    assert table.loc["alibi", "ours"] == 1 and table.loc["nope", "ours"] == 0.5  # shared rank 2
    assert table.loc["rope", "first"] == 0.5 and table.loc["nope", "first"] == 0.2  # rope first
    text = report.path.read_text()
    assert "averages over the paper's 17 task splits and 3 seeds" in text
    assert "this run ranks 1 task (copy) over 1 seed" in text
    assert 'rank(method="first")' in text and "ours, ties as the paper" in text
    assert "The comparison itself uses the shared rank" in text
    assert "greedy decoding to EOS" in text


@pytest.mark.slow
@pytest.mark.parametrize(("task", "says_eos"), [("assoc_recall", False), ("reverse", True)])
def test_the_eos_sentence_is_in_reports_of_tasks_whose_answers_end_with_eos(
    tmp_path, task, says_eos
):
    write_runs(tmp_path, ranking_records(task, {"rope": (0.0, 0.4), "alibi": (0.5, 0.9)}))
    text = build_report(tmp_path, echo=False).path.read_text()
    assert ("greedy decoding to EOS" in text) is says_eos
    assert "predicted right given the right prefix" in text


def test_flip_flops_headline_is_token_accuracy_in_the_report(tmp_path):
    flip = {"mode": "task", "task": "flip_flop", "corpus": "task:flip_flop"}
    write_runs(
        tmp_path,
        [
            record(s, seed, n, 0.0, **flip, exact_match=float(n == 16), token_acc=token)
            for seed in range(2)
            for s, past in (("nope", 0.6), ("rope", 0.9))
            for n, token in ((16, 1.0), (32, past + 0.01 * seed))
        ],
    )
    report = build_report(tmp_path, echo=False)
    section = report.path.read_text().split("## flip_flop")[1]
    assert section.index("Token accuracy (headline") < section.index("Exact match:")
    assert report.tables["mrr"].set_index("label")["flip_flop"].tolist() == [2, 1]
    assert "ranked by token accuracy" in report.path.read_text()
