"""Synthetic tasks: each generation rule as its docstring states it, determinism, disjoint
evaluation seeds, answer-only targets, scoring, and a task run end to end to its report."""

from __future__ import annotations

import re

import pandas as pd
import pytest
import torch
from torch import nn

from pe_bench import cli
from pe_bench.data.tasks import (
    BIT0,
    BOS,
    DIGITS,
    EQUALS,
    IGNORE,
    KEYS,
    PLUS,
    READ,
    SEP,
    TASKS,
    VALUES,
    WRITE,
    Addition,
    AssocRecall,
    Copy,
    FlipFlop,
    Reverse,
    batch,
    build_task,
    load_task,
)
from pe_bench.errors import UserError
from pe_bench.report import aggregate
from pe_bench.report.build import build_report
from pe_bench.run.evaluate import TaskScore, score_instances

from .helpers import record, write_runs

LENGTHS = [4, 5, 16, 31, 64, 257]


def draw(task, length: int, seed: int = 0):
    return task.make(length, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(TASKS))
@pytest.mark.parametrize("length", LENGTHS)
def test_instances_fit_their_length_start_with_bos_and_have_an_answer(name, length):
    task = build_task({"task": name})
    length = max(length, task.min_length)
    inst = draw(task, length)
    assert length - 3 < inst.input_len <= length  # as long as the shape allows (steps of <= 3)
    assert inst.tokens[0] == BOS and len(inst.answer) == len(inst.tokens)
    assert any(inst.answer) and not inst.answer[0]
    assert all(0 <= t < 256 for t in inst.tokens)


@pytest.mark.parametrize("length", LENGTHS)
def test_copy_and_reverse_answer_the_string_before_sep(length):
    copy, rev = draw(Copy(), length), draw(Reverse(), length)
    n = (length - 1) // 2
    x = copy.tokens[1 : n + 1]
    assert copy.tokens == [BOS, *x, SEP, *x] and rev.tokens == [BOS, *x, SEP, *x[::-1]]
    assert copy.answer == [False] * (n + 2) + [True] * n == rev.answer
    assert all(16 <= t < 16 + 64 for t in x)


@pytest.mark.parametrize("length", LENGTHS)
def test_flip_flop_reads_the_latest_write(length):
    inst = draw(FlipFlop(), length)
    ops, bits = inst.tokens[1::2], [t - BIT0 for t in inst.tokens[2::2]]
    assert ops[0] == WRITE and ops[-1] == READ and set(bits) <= {0, 1}
    memory = None
    for i, (op, bit) in enumerate(zip(ops, bits, strict=True)):
        if op == WRITE:
            memory = bit
        assert inst.answer[2 + 2 * i] == (op == READ)
        if op == READ:
            assert bit == memory


def test_flip_flop_ignores_with_its_probability():
    inst = draw(FlipFlop(ignore_prob=0.8), 20_000)
    ops = inst.tokens[1::2]
    share = {op: ops.count(op) / len(ops) for op in set(ops)}
    assert share[WRITE] == pytest.approx(0.1, abs=0.01) and share[READ] == pytest.approx(
        0.1, abs=0.01
    )


@pytest.mark.parametrize("length", LENGTHS)
def test_assoc_recall_answers_each_query_with_its_keys_value(length):
    inst = draw(AssocRecall(), length)
    pairs = list(zip(inst.tokens[1::2], inst.tokens[2::2], strict=True))
    n = min(128, max(1, len(pairs) // 2))
    table = dict(pairs[:n])
    assert len(table) == n  # distinct keys
    assert all(KEYS <= k < KEYS + 128 and VALUES <= v < 256 for k, v in pairs)
    for i, (key, value) in enumerate(pairs[n:]):
        assert table[key] == value and inst.answer[2 * (n + i) + 2]
    assert sum(inst.answer) == len(pairs) - n


@pytest.mark.parametrize("length", [6, 9, 27, 90])
def test_addition_answers_the_sum_with_its_leading_zero(length):
    inst = draw(Addition(), length)
    n = (length - 3) // 3
    text = "".join(
        "+" if t == PLUS else "=" if t == EQUALS else str(t - DIGITS) for t in inst.tokens[1:]
    )
    a, b, total = text.replace("+", " ").replace("=", " ").split()
    assert len(a) == len(b) == n and len(total) == n + 1 and int(a) + int(b) == int(total)
    assert (n == 1 or a[0] != "0") and inst.answer == [False] * (2 * n + 3) + [True] * (n + 1)


@pytest.mark.parametrize("name", list(TASKS))
def test_instances_depend_on_the_seed_alone(name):
    task = build_task({"task": name})
    assert draw(task, 64, 3) == draw(task, 64, 3)
    assert draw(task, 64, 3) != draw(task, 64, 4)


def test_evaluation_instances_are_fixed_and_not_the_training_ones():
    data = load_task({"task": "copy"})
    x, _y = data.eval_instances(8, 32)
    assert torch.equal(x, data.eval_instances(8, 32)[0])  # every scheme and seed: the same
    assert not torch.equal(x, data.eval_instances(8, 64)[0][:, :32])  # each length its own
    for seed in range(4):  # the training generator of seeds 0-3 never draws them
        train_x, _ = data.train_batch(64, 32, torch.Generator().manual_seed(seed))
        assert not any(torch.equal(row, train_x[i]) for row in x for i in range(64))


def test_batches_pad_after_the_instance_and_target_only_the_answer():
    inst = draw(Copy(), 7)  # 7 input tokens, padded to 10
    x, y = batch([inst], 10)
    assert x[0].tolist() == [*inst.tokens[:-1], 0, 0, 0]
    answers = [t if a else IGNORE for t, a in zip(inst.tokens[1:], inst.answer[1:], strict=True)]
    assert y[0].tolist() == answers + [IGNORE] * 3


def test_training_lengths_cover_every_length_up_to_the_training_length():
    data = load_task({"task": "flip_flop"})
    x, _ = data.train_batch(512, 16, torch.Generator().manual_seed(0))
    lengths = set(((x != 0).sum(1)).tolist())  # PAD is 0, no task token is
    assert lengths == {4, 6, 8, 10, 12, 14, 16}  # flip-flop's inputs are even


class Oracle(nn.Module):
    """Predicts ``answers`` (``[n, L]``, IGNORE where unscored) except where ``wrong``."""

    def __init__(self, answers: torch.Tensor, wrong: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.answers, self.wrong, self.seen = answers, wrong, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = slice(self.seen, self.seen + len(x))
        self.seen += len(x)
        target = self.answers[rows].clamp(min=0)
        target = torch.where(self.wrong[rows], (target + 1) % 256, target)
        return nn.functional.one_hot(target, 256).float() * 10


def test_exact_match_needs_every_answer_token_and_token_accuracy_counts_each():
    data = load_task({"task": "copy"})
    x, y = data.eval_instances(6, 21)  # 10 answer tokens each
    wrong = torch.zeros_like(y, dtype=torch.bool)
    wrong[0, -1] = wrong[1, -1] = wrong[1, -2] = True  # instance 0: 1 wrong, instance 1: 2
    score = score_instances(Oracle(y, wrong), x, y, batch_tokens=42, device=torch.device("cpu"))
    assert (score.solved, score.instances) == (4, 6)
    assert (score.right, score.answer_tokens) == (57, 60)
    assert score.exact_match == pytest.approx(4 / 6) and score.token_acc == pytest.approx(0.95)


def test_draws_pool_into_rates_over_every_draw():
    pooled = TaskScore.pooled([TaskScore(1, 4, 10, 20, 2.0), TaskScore(3, 4, 20, 20, 4.0)])
    assert pooled.exact_match == 0.5 and pooled.token_acc == 0.75 and pooled.nll == 0.15


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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["data.task=sorting"], "data.task='sorting' is not a task; allowed: copy, reverse"),
        (["train.seq_len=3", "data.task=flip_flop"], "train.seq_len=3: task flip_flop needs"),
        (["data.alphabet=300"], "data.alphabet must be >= 2 and <= 240, got 300"),
    ],
)
def test_bad_task_settings_are_one_line(tmp_path, tiny_config, args, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace("[", r"\[")):
        cli.run(tiny_config("data=task", *args), tmp_path)


def test_a_task_run_records_accuracy_resumes_and_reports(tmp_path, tiny_config):
    cfg = tiny_config("data=task", "data.task=flip_flop", "data.eval_instances=8", "pe=rope")
    records = cli.run(cfg, tmp_path / "run")
    ok = [r for r in records if r["status"] == "ok"]
    assert {r["mode"] for r in records} == {"task"} and len(ok) == 9  # rope, pi, ntk x 3
    assert all(r["task"] == "flip_flop" and r["tokens"] == 8 == r["instances"] for r in ok)
    assert all(0 <= r["exact_match"] <= r["token_acc"] <= 1 for r in ok)
    assert cli.run(cfg, tmp_path / "run") == records  # all there: nothing computed again
    report = build_report(tmp_path, echo=False)
    text = report.path.read_text()
    assert "# Synthetic task report" in text and "## flip_flop" in text and "MRR" in text
    assert "bits per byte" not in text.lower()
    assert set(report.figures) == {"exact_match", "token_acc"}


def test_a_report_refuses_to_mix_tasks_with_perplexity(tmp_path, tiny_config):
    cli.run(tiny_config("data=task", "data.eval_instances=4", "pe=nope"), tmp_path / "task")
    cli.run(tiny_config("pe=nope"), tmp_path / "text")
    with pytest.raises(UserError, match="mixes synthetic-task records .* with perplexity"):
        build_report(tmp_path, echo=False)


@pytest.mark.slow
def test_kazemnejad_mini_shrunk_compares_its_order_with_the_paper(tmp_path):
    from tests.helpers import assert_regenerates, pe_bench

    shrunk = ["train.steps=3", "train.batch_size=4", "train.warmup_steps=1", "model=smoke"]
    proc = pe_bench(
        "experiment=kazemnejad_paper_mini", *shrunk, "data.eval_instances=4", out=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "kazemnejad_paper_mini"
    text = (folder / "report.md").read_text()
    assert "## Compared with Kazemnejad et al. (2023), Figure 1" in text
    for task in ("copy", "reverse", "addition"):
        assert f"## {task}" in text
    compared = pd.read_csv(folder / "tables" / "compare.csv")
    assert set(compared["label"]) == {"nope", "t5", "alibi", "rope", "sinusoidal"}
    assert "--compare published/kazemnejad_paper" in text
    assert_regenerates(folder, tmp_path / "regenerated")


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
