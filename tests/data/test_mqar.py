"""Associative recall is MQAR as Zoology generates it (HazyResearch/zoology,
``zoology/data/multiquery_ar.py``): each key asked exactly once, no answer visible in the input
but in its pair, query slots drawn by Zoology's power law without replacement, keys and values
from separate vocabularies with distinct values, and the same number of pairs at every length."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pe_bench.data.tasks import BOS, IGNORE, KEYS, N_KEYS, N_VALUES, VALUES, AssocRecall, load_task
from pe_bench.errors import UserError


def draw(task: AssocRecall, length: int, seed: int = 0):
    return task.make(length, torch.Generator().manual_seed(seed))


def parts(inst, pairs: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """Keys, values, the query region and its targets."""
    context = inst.inputs[1 : 2 * pairs + 1]
    return context[0::2], context[1::2], inst.inputs[2 * pairs + 1 :], inst.targets[2 * pairs + 1 :]


@pytest.mark.parametrize(("pairs", "length"), [(1, 5), (4, 17), (4, 64), (8, 257), (16, 1024)])
def test_each_key_is_asked_once_and_answered_with_its_value(pairs, length):
    for seed in range(5):
        inst = draw(AssocRecall(num_kv_pairs=pairs), length, seed)
        keys, values, region, targets = parts(inst, pairs)
        assert inst.inputs[0] == BOS and inst.input_len == length
        assert len(set(keys)) == pairs == len(set(values))  # distinct keys, distinct values
        assert all(KEYS <= k < KEYS + N_KEYS for k in keys)
        assert all(VALUES <= v < VALUES + N_VALUES for v in values)  # separate vocabularies
        table = dict(zip(keys, values, strict=True))
        asked = [(i, t) for i, t in enumerate(region) if t in table]
        assert sorted(t for _, t in asked) == sorted(keys)  # each key asked exactly once
        for i, key in asked:
            assert i % 2 == 0 and targets[i] == table[key]  # at a pair slot, scored on its value
        assert sum(t != IGNORE for t in inst.targets) == pairs  # scored at the queries only


@pytest.mark.parametrize(("pairs", "length"), [(4, 17), (4, 64), (8, 512), (2, 2048)])
def test_no_answer_is_visible_in_the_input_but_in_its_pair(pairs, length):
    """The old generator asked keys with replacement and wrote each answer after its query:
    36% of queries repeated one whose answer sat 8-60 tokens back."""
    for seed in range(5):
        inst = draw(AssocRecall(num_kv_pairs=pairs), length, seed)
        keys, values, region, targets = parts(inst, pairs)
        for value in values:
            assert inst.inputs.count(value) == 1  # in its pair, nowhere else
        assert not set(region) & set(values)  # not after its query: a random token is there
        distractors = [t for i, t in enumerate(region) if targets[i] == IGNORE]
        assert not set(distractors) & set(keys)  # random tokens are none of this instance's
        assert all(KEYS <= t < VALUES + N_VALUES for t in distractors)


def test_query_slots_follow_zoologys_power_law():
    """One pair: the slot's distribution is the law itself, p(g) ~ (g + 1)^(a - 1)."""
    task, slots, n = AssocRecall(num_kv_pairs=1, power_a=0.01), 30, 10_000
    law = task.law(slots).numpy()
    reference = 0.01 * np.arange(1, slots + 1) ** (0.01 - 1)  # multiquery_ar's p
    np.testing.assert_allclose(law, reference / reference.sum(), rtol=1e-12)
    g = torch.Generator().manual_seed(0)
    found = np.bincount([task.slots(slots, g)[0] for _ in range(n)], minlength=slots)
    assert np.abs(found / n - law).max() < 4 * np.sqrt(law.max() / n)


def test_slots_are_drawn_without_replacement_in_numpys_order():
    """Several pairs: the slot of each pair (in context order) has the distribution of
    ``np.random.choice(replace=False, p=law)``, which multiquery_ar uses: the first pair's
    query tends to come first."""
    task, slots, n = AssocRecall(num_kv_pairs=4), 28, 4000
    law, g = task.law(slots).numpy(), torch.Generator().manual_seed(0)
    ours = np.array([task.slots(slots, g) for _ in range(n)])
    rng = np.random.default_rng(0)
    theirs = np.array([rng.choice(slots, size=4, replace=False, p=law) for _ in range(n)])
    assert (np.sort(ours, axis=1)[:, :-1] < np.sort(ours, axis=1)[:, 1:]).all()  # distinct
    spread = theirs.std(axis=0) / np.sqrt(n)
    assert (np.abs(ours.mean(axis=0) - theirs.mean(axis=0)) < 5 * spread).all()
    assert ours.mean(axis=0)[0] < ours.mean(axis=0)[-1]


def test_longer_inputs_keep_the_pairs_and_lengthen_the_query_region():
    task = AssocRecall(num_kv_pairs=4)
    short, long = draw(task, 32), draw(task, 512)
    assert len(short.answers) == 4 == len(long.answers)
    far = [
        max(i for i, t in enumerate(draw(task, 512, s).targets) if t != IGNORE) for s in range(50)
    ]
    assert max(far) > 32  # queries reach past the training length


def test_the_task_hash_and_the_shortest_input_follow_the_pairs():
    base = {"task": "assoc_recall", "num_kv_pairs": 4, "power_a": 0.01}
    sha = load_task(base).sha
    assert load_task({**base, "num_kv_pairs": 8}).sha != sha
    assert load_task({**base, "power_a": 1.0}).sha != sha
    task = load_task({**base, "num_kv_pairs": 8}).task
    assert task.min_length == 33
    with pytest.raises(UserError, match="train.seq_len=32: task assoc_recall needs inputs of"):
        task.check_length(32, "train.seq_len")
