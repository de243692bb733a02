"""Synthetic tasks: each generation rule as its docstring states it, determinism, disjoint
evaluation seeds, answer-only targets, scoring, and a task run end to end (tests/report/
test_tasks.py holds the task report)."""

from __future__ import annotations

from typing import Annotated

import pandas as pd
import pytest
import torch
from torch import nn

from pe_bench.cli import bench
from pe_bench.config import Range
from pe_bench.data import tasks
from pe_bench.data.config import DataConfig
from pe_bench.data.tasks import (
    BIT0,
    BOS,
    DIGITS,
    EOS,
    EQUALS,
    GENERATOR_VERSION,
    IGNORE,
    PLUS,
    READ,
    SEP,
    TASKS,
    WRITE,
    Addition,
    AssocRecall,
    Copy,
    FlipFlop,
    Reverse,
    batch,
    build_task,
    load_task,
    task_key,
    task_options,
)
from pe_bench.errors import UserError
from pe_bench.report.build import build_report
from pe_bench.run.evaluate import TaskScore, score_instances
from tests.helpers import compose

LENGTHS = [4, 5, 16, 31, 64, 257]


def draw(task, length: int, seed: int = 0):
    return task.make(length, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(TASKS))
@pytest.mark.parametrize("length", LENGTHS)
def test_instances_fit_their_length_start_with_bos_and_have_an_answer(name, length):
    task = build_task({"task": name})
    length = max(length, task.min_length)
    inst = draw(task, length)
    assert inst.input_len <= length and len(inst.targets) == inst.input_len
    if name != "addition":  # addition's shorter operand may leave the input shorter
        assert length - 2 < inst.input_len  # as long as the shape allows (steps of <= 2)
    assert inst.inputs[0] == BOS and inst.targets[0] == IGNORE and inst.answers
    assert all(0 <= t < 256 for t in inst.inputs + inst.answers)


@pytest.mark.parametrize("name", list(TASKS))
def test_a_task_says_whether_its_answer_ends_with_eos(name):
    """``ends_with_eos`` decides whether a report explains scoring EOS: it must be the data's."""
    task = TASKS[name]()
    assert (draw(task, 40).answers[-1] == EOS) is task.ends_with_eos
    assert task.ends_with_eos is (name in ("copy", "reverse", "addition"))


@pytest.mark.parametrize("length", LENGTHS)
def test_copy_and_reverse_answer_the_string_then_eos(length):
    copy, rev = draw(Copy(), length), draw(Reverse(), length)
    n = (length - 2) // 2
    x = copy.inputs[1 : n + 1]
    assert copy.inputs == [BOS, *x, SEP, *x] and rev.inputs == [BOS, *x, SEP, *x[::-1]]
    assert copy.answers == [*x, EOS] and rev.answers == [*x[::-1], EOS]
    assert copy.targets[: n + 1] == [IGNORE] * (n + 1) == rev.targets[: n + 1]
    assert copy.targets[-1] == EOS  # read after the last symbol: stopping there is scored
    assert all(16 <= t < 16 + 64 for t in x)


@pytest.mark.parametrize("length", LENGTHS)
def test_flip_flop_reads_the_latest_write(length):
    inst = draw(FlipFlop(), length)
    tokens = [*inst.inputs, inst.targets[-1]]  # the last read's bit is a target only
    ops, bits = tokens[1::2], [t - BIT0 for t in tokens[2::2]]
    assert ops[0] == WRITE and ops[-1] == READ and set(bits) <= {0, 1}
    memory = None
    for i, (op, bit) in enumerate(zip(ops, bits, strict=True)):
        if op == WRITE:
            memory = bit
        assert (inst.targets[1 + 2 * i] != IGNORE) == (op == READ)
        if op == READ:
            assert bit == memory and inst.targets[1 + 2 * i] == BIT0 + bit


def test_flip_flop_ignores_with_its_probability():
    inst = draw(FlipFlop(ignore_prob=0.8), 20_000)
    ops = inst.inputs[1::2]
    share = {op: ops.count(op) / len(ops) for op in set(ops)}
    assert share[WRITE] == pytest.approx(0.1, abs=0.01) and share[READ] == pytest.approx(
        0.1, abs=0.01
    )


def addition_parts(inst) -> tuple[str, str, str]:
    """a, b and the answer (without EOS) of an addition instance, as digit strings."""
    symbols = {PLUS: "+", EQUALS: "="}
    text = "".join(symbols.get(t, str(t - DIGITS)) for t in inst.inputs[1:])
    a, b = text.split("=")[0].split("+")
    assert inst.answers[-1] == EOS
    return a, b, "".join(str(t - DIGITS) for t in inst.answers[:-1])


@pytest.mark.parametrize("length", [7, 9, 28, 31, 52])
def test_addition_answers_the_sum_with_its_leading_zero_then_eos(length):
    m = (length - 4) // 3
    for seed in range(20):
        inst = draw(Addition(), length, seed)
        a, b, total = addition_parts(inst)
        assert max(len(a), len(b)) == m and len(total) == m + 1 and int(a) + int(b) == int(total)
        assert all(len(d) == 1 or d[0] != "0" for d in (a, b))
        assert inst.targets[-len(total) - 1 :] == inst.answers  # the answer ends the input


def test_addition_mixes_operand_lengths_as_mcgills_bins():
    """McGill-NLP/length-generalization's make_addition_dataset.py (train_min 4): training
    bins (a, b) in [4, 8]^2; test bins with one operand of 9-16 digits and the other of 4-16.
    Grouped by the longer operand (the eval length), every bin is drawn, uniformly."""
    seen = {}
    for m in range(9, 17):
        for seed in range(400):
            a, b, _ = addition_parts(draw(Addition(), 3 * m + 4, seed))
            seen[len(a), len(b)] = seen.get((len(a), len(b)), 0) + 1
    test_bins = {(a, b) for a in range(4, 17) for b in range(4, 17) if max(a, b) >= 9}
    assert set(seen) == test_bins
    twelve = [n for (a, b), n in seen.items() if max(a, b) == 12]
    assert len(twelve) == 17 and min(twelve) > 400 / 17 / 2  # uniform over its 17 bins
    train = {tuple(map(len, addition_parts(draw(Addition(), 28, s))[:2])) for s in range(300)}
    assert train == {(a, b) for a in range(4, 9) for b in range(4, 9) if max(a, b) == 8}


def test_instances_pin_each_generation_rule():
    """Reference instances (seed 0): a change here changes every task record; bump
    GENERATOR_VERSION with it."""
    assert GENERATOR_VERSION == 2
    assert draw(Copy(), 8).inputs == [1, 60, 63, 69, 2, 60, 63, 69]
    assert draw(Reverse(), 8).answers == [69, 63, 60, EOS]
    assert draw(FlipFlop(), 8).inputs == [1, 3, 7, 5, 7, 3, 7, 4]
    addition = [1, 17, 19, 16, 26, 24, 25, 23, 27, 17, 16, 18, 23]  # 130 + 897 = 1027
    assert draw(Addition(), 13).inputs == addition
    recall = draw(AssocRecall(num_kv_pairs=2), 13)
    assert recall.inputs == [1, 60, 250, 20, 148, 20, 199, 223, 171, 60, 174, 95, 80]
    assert recall.answers == [148, 250]


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
    inst = draw(Copy(), 7)  # 6 input tokens, padded to 10
    x, y = batch([inst], 10)
    assert x[0].tolist() == [*inst.inputs, 0, 0, 0, 0]
    assert y[0].tolist() == [IGNORE] * 3 + inst.answers + [IGNORE] * 4


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
    x, y = data.eval_instances(6, 22)  # 10 symbols and EOS: 11 answer tokens each
    assert (y[:, -1] == EOS).all()  # the last input's target: the answer stops there
    wrong = torch.zeros_like(y, dtype=torch.bool)
    wrong[0, -1] = True  # instance 0: every symbol right, but it runs on past the answer
    wrong[1, -2] = wrong[1, -3] = True  # instance 1: 2 symbols wrong
    score = score_instances(Oracle(y, wrong), x, y, batch_tokens=44, device=torch.device("cpu"))
    assert (score.solved, score.instances) == (4, 6)
    assert (score.right, score.answer_tokens) == (63, 66)
    assert score.exact_match == pytest.approx(4 / 6) and score.token_acc == pytest.approx(63 / 66)


def test_draws_pool_into_rates_over_every_draw():
    pooled = TaskScore.pooled([TaskScore(1, 4, 10, 20, 2.0), TaskScore(3, 4, 20, 20, 4.0)])
    assert pooled.exact_match == 0.5 and pooled.token_acc == 0.75 and pooled.nll == 0.15


@pytest.mark.slow
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
        bench.run(tiny_config("data=task", *args), tmp_path)


def test_a_task_run_records_accuracy_resumes_and_reports(tmp_path, tiny_config):
    cfg = tiny_config("data=task", "data.task=flip_flop", "data.eval_instances=8", "pe=rope")
    records = bench.run(cfg, tmp_path / "run")
    ok = [r for r in records if r["status"] == "ok"]
    assert {r["mode"] for r in records} == {"task"} and len(ok) == 9  # rope, pi, ntk x 3
    assert all(r["task"] == "flip_flop" and r["tokens"] == 8 == r["instances"] for r in ok)
    assert all(0 <= r["exact_match"] <= r["token_acc"] <= 1 for r in ok)
    assert bench.run(cfg, tmp_path / "run") == records  # all there: nothing computed again
    report = build_report(tmp_path, echo=False)
    text = report.path.read_text()
    assert "# Synthetic task report" in text and "## flip_flop" in text and "MRR" in text
    assert "bits per byte" not in text.lower()
    assert set(report.figures) == {"exact_match", "token_acc"}


@pytest.mark.slow
def test_a_report_refuses_to_mix_tasks_with_perplexity(tmp_path, tiny_config):
    bench.run(tiny_config("data=task", "data.eval_instances=4", "pe=nope"), tmp_path / "task")
    bench.run(tiny_config("pe=nope"), tmp_path / "text")
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


@pytest.mark.slow
@pytest.mark.parametrize(
    ("split", "train", "test"),
    [("copy", 20, range(21, 41)), ("reverse", 20, range(21, 41)), ("addition", 8, range(9, 17))],
)
def test_kazemnejad_splits_pool_every_test_length_the_paper_pools(split, train, test):
    """McGill-NLP/length-generalization's cmc_tr20_ts40, mc_tr20_ts40 and len_tr8_ts16: trained
    up to 20 symbols (8 digits), tested on every length of 21-40 symbols (9-16 digits) alike."""
    cfg = compose(f"task=kazemnejad_{split}", "data=task")
    task, lengths = build_task(cfg.data), list(cfg.eval.lengths)

    def size(length: int) -> int:  # symbols, or the longer operand's digits
        inst = draw(task, length)
        return len(inst.answers) - 1 - (split == "addition")

    assert lengths[0] == cfg.train.seq_len and size(cfg.train.seq_len) == train
    assert [size(n) for n in lengths[1:]] == list(test)


# corpus_sha of the committed task records (results/tasks_quick, mqar_cpu and
# kazemnejad_paper_mini): the key of each task's data under conf/data/task.yaml's options
COMMITTED_SHAS = {
    "copy": "cf72661356b53ba4e8db3b0c906eb7a0d41b4a27584d563c4551765144a134ca",
    "reverse": "47dd4405fb7ce6f14d6740c293c2f2e61614b82bb46673af62b5f08823db123f",
    "flip_flop": "3a4f6c8555b6856891c115cd4a631e69e88fb2203d0d0732b6216546d5f9dbc6",
    "assoc_recall": "670549e9a3df3b6f2005e14873387d26edaa900ca36906e1270f903b9f33e39b",
    "addition": "09ab147bc2cce70d05d9d2a44e89dd723bf447e1eeb7b413d2841560d8101be8",
}


@pytest.mark.parametrize("name", sorted(COMMITTED_SHAS))
def test_the_committed_task_keys_are_unchanged(name):
    data = DataConfig.parse(compose("data=task", f"data.task={name}").data)
    assert load_task(data.task_config()).sha == COMMITTED_SHAS[name]


CHANGED = {"alphabet": 10, "ignore_prob": 0.5, "num_kv_pairs": 8, "power_a": 1.0}


@pytest.mark.parametrize("option", sorted(CHANGED))
def test_a_changed_task_option_changes_the_key(option):
    assert set(CHANGED) == set(task_options())  # every option is tried
    base = {"task": "copy"}
    assert load_task({**base, option: CHANGED[option]}).sha != load_task(base).sha


class Stutter(Copy):
    """Copy with each symbol of the answer written ``repeat`` times: a task with one option
    more than copy, declared as its constructor's parameter and nowhere else."""

    name = "stutter"

    def __init__(
        self,
        *,
        alphabet: Annotated[int, Range(ge=2, le=240)] = 64,
        repeat: Annotated[int, Range(ge=1, le=4)] = 1,
    ) -> None:
        super().__init__(alphabet=alphabet)
        self.repeat = repeat

    def body(self, x: list[int]) -> list[int]:
        return [s for s in x for _ in range(self.repeat)]


def test_an_option_added_to_a_task_is_typed_checked_and_keyed(monkeypatch):
    monkeypatch.setattr(tasks, "TASKS", dict(tasks.TASKS))
    tasks.register_task(Stutter)
    config = {"source": "task", "task": "stutter", "repeat": 3}
    data = DataConfig.parse(config)
    assert data.task_options["repeat"] == 3 and build_task(data.task_config()).repeat == 3
    assert task_key(data.task_config())["repeat"] == 3
    keys = {repeat: load_task({"task": "stutter", "repeat": repeat}).sha for repeat in (1, 2)}
    assert keys[1] != keys[2]
    assert load_task({"task": "stutter"}).sha == keys[1]  # its default, as given
    with pytest.raises(UserError, match=r"data.repeat must be >= 1 and <= 4, got 9"):
        DataConfig.parse({**config, "repeat": 9})
