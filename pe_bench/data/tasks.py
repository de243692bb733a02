"""Synthetic length-generalization tasks: does a scheme still solve a task on longer inputs?

Perplexity at long lengths rewards ignoring distant context; a task with one right answer
that depends on distant tokens does not. Each task here generates instances of a chosen
input length; a model is trained on instances of every length up to ``train.seq_len`` and
evaluated on instances of 1x, 2x, 4x ... that length, as Kazemnejad et al. (2023,
https://arxiv.org/abs/2305.19466) and Ruoss et al. (2023, https://arxiv.org/abs/2305.16843) do.

- **Loss only on answer tokens**: targets that are not part of the answer are ``IGNORE``.
- **Scoring**: per-sequence exact match (every answer token's argmax right) and per-token
  accuracy, both teacher-forced. Exact match under teacher forcing equals exact match of greedy
  decoding (if every token is right given the right prefix, greedy decoding writes that
  prefix); per-token accuracy is the teacher-forced one.
- **Determinism**: an instance depends only on its generator's seed. Training instances come
  from the training generator (``train.seed``, as the data order of an LM run); evaluation
  instances of length L from a generator seeded by ``eval_seed(L)`` and validation ones by
  ``VALID_SEED``: fixed seeds drawn once, disjoint from any training seed, the same for every
  scheme and seed, so scores are paired.

Tokens are ids below 256 (the byte models' vocabulary): ``PAD``, ``BOS`` and ``SEP``, then
each task's own symbols (a model trains on one task, so the tasks' ranges may overlap). Every
instance starts with ``BOS``, which counts in its input length.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from pe_bench.errors import UserError

IGNORE = -100  # F.cross_entropy's ignore_index: targets outside the answer
PAD, BOS, SEP = 0, 1, 2  # every instance starts with BOS (NoPE counts positions from it)
WRITE, READ, IGNORE_OP, BIT0 = 3, 4, 5, 6  # flip-flop: instructions, then bits 0 and 1 (6, 7)
SYMBOLS = 16  # copy and reverse draw from SYMBOLS .. SYMBOLS + alphabet - 1 (alphabet <= 240)
KEYS, N_KEYS = 64, 128  # associative recall: keys 64..191
VALUES, N_VALUES = 192, 64  # and values 192..255
DIGITS, PLUS, EQUALS = 16, 26, 27  # addition: digits 0-9 are 16..25
GENERATOR_VERSION = 1  # bump when a generation rule changes: it changes every task's hash
VALID_SEED = 0x5EED_0001_0000  # above any seed a user types; eval seeds are higher still
EVAL_SEED = 0x5EED_0002_0000


def eval_seed(length: int) -> int:
    """The seed of the evaluation instances of input length ``length``."""
    return EVAL_SEED + length


@dataclass(frozen=True)
class Instance:
    """One instance: ``tokens`` (ids) and ``answer`` (True where ``tokens[i]`` is an answer
    token, predicted from ``tokens[:i]``). The model's input is ``tokens[:-1]``."""

    tokens: list[int]
    answer: list[bool]

    @property
    def input_len(self) -> int:
        return len(self.tokens) - 1


class Task(ABC):
    """A task: ``make(length, g)`` is the largest instance whose input has at most ``length``
    tokens (exactly ``length`` where the task's shape allows), drawn from ``g``."""

    name: ClassVar[str]
    min_length: ClassVar[int]

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Task:
        """The task with the options its constructor names (``alphabet``, ``ignore_prob``)
        taken from a ``data=task`` config, which ``data.DataConfig`` has checked."""
        params = inspect.signature(cls.__init__).parameters.values()
        names = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
        return cls(**{name: cfg[name] for name in names if cfg.get(name) is not None})

    @abstractmethod
    def make(self, length: int, g: torch.Generator) -> Instance: ...

    def check_length(self, length: int, where: str) -> None:
        if length < self.min_length:
            raise UserError(
                f"{where}={length}: task {self.name} needs inputs of at least "
                f"{self.min_length} tokens; allowed: >= {self.min_length}"
            )


def _randint(high: int, n: int, g: torch.Generator) -> list[int]:
    return torch.randint(0, high, (n,), generator=g).tolist()


class Copy(Task):
    """Copy (Kazemnejad et al. 2023's *Copy*; Ruoss et al. 2023's *duplicate string*).

    ``BOS x_1 .. x_n SEP x_1 .. x_n`` with ``x_i`` uniform over ``alphabet`` symbols; the
    answer is the second ``x`` (``n`` tokens). Input length ``2n + 1``: ``n = (length-1)//2``.
    """

    name, min_length = "copy", 3

    def __init__(self, *, alphabet: int = 64) -> None:
        self.alphabet = alphabet

    def body(self, x: list[int]) -> list[int]:
        return x

    def make(self, length: int, g: torch.Generator) -> Instance:
        n = (length - 1) // 2
        x = [SYMBOLS + s for s in _randint(self.alphabet, n, g)]
        return Instance([BOS, *x, SEP, *self.body(x)], [False] * (n + 2) + [True] * n)


class Reverse(Copy):
    """Reverse (Kazemnejad et al. 2023's *Reverse*; Ruoss et al. 2023's *reverse string*).

    ``BOS x_1 .. x_n SEP x_n .. x_1``: copy's input, the answer reversed.
    """

    name = "reverse"

    def body(self, x: list[int]) -> list[int]:
        return x[::-1]


class AssocRecall(Task):
    """Multi-query associative recall (MQAR; Arora et al. 2023, Zoology,
    https://arxiv.org/abs/2312.04927; Ba et al. 2016).

    ``BOS k_1 v_1 .. k_n v_n q_1 a_1 .. q_m a_m``: ``n`` key-value pairs (distinct keys from
    128, values uniform over 64), then ``m`` queries, each a key drawn uniformly from the
    ``n`` with its value as the answer. Input length ``2n + 2m``: ``n = m = length // 4`` (one
    more query when ``length // 2`` is odd), and beyond 128 pairs every further token pair is
    a query.
    """

    name, min_length = "assoc_recall", 4

    def make(self, length: int, g: torch.Generator) -> Instance:
        total = length // 2  # token pairs
        n = min(N_KEYS, max(1, total // 2))
        keys = (torch.randperm(N_KEYS, generator=g)[:n] + KEYS).tolist()
        values = [VALUES + v for v in _randint(N_VALUES, n, g)]
        asked = _randint(n, total - n, g)
        tokens = [BOS, *(t for k, v in zip(keys, values, strict=True) for t in (k, v))]
        tokens += [t for i in asked for t in (keys[i], values[i])]
        answer = [False] * (2 * n + 1) + [False, True] * len(asked)
        return Instance(tokens, answer)


class FlipFlop(Task):
    """Flip-flop language modelling (Liu et al. 2023, https://arxiv.org/abs/2306.00946), FFL(p).

    ``m`` instruction-bit pairs: the first instruction is write, the last read, the others are
    ignore with probability ``ignore_prob`` (the paper's p_i = 0.8) and write or read with
    (1 - p_i) / 2 each. The bit after write or ignore is uniform; the bit after read is the
    bit of the latest write, and is the answer. ``BOS`` first: input length ``2m``, so
    ``m = length // 2``.
    """

    name, min_length = "flip_flop", 4

    def __init__(self, *, ignore_prob: float = 0.8) -> None:
        self.ignore_prob = ignore_prob

    def make(self, length: int, g: torch.Generator) -> Instance:
        m = length // 2
        draws = torch.rand(m, generator=g).tolist()
        bits = _randint(2, m, g)
        half = (1 - self.ignore_prob) / 2
        tokens, answer, memory = [BOS], [False], 0
        for i, (u, bit) in enumerate(zip(draws, bits, strict=True)):
            op = self.instruction(i, m, u, half)
            if op == WRITE:
                memory = bit
            tokens += [op, BIT0 + (memory if op == READ else bit)]
            answer += [False, op == READ]
        return Instance(tokens, answer)

    @staticmethod
    def instruction(i: int, m: int, u: float, half: float) -> int:
        """The ``i``-th of ``m`` instructions for a uniform draw ``u``."""
        if i == 0:
            return WRITE
        if i == m - 1:
            return READ
        return WRITE if u < half else READ if u < 2 * half else IGNORE_OP


class Addition(Task):
    """Addition (Kazemnejad et al. 2023's *Addition*, after Nye et al. 2021; no scratchpad).

    ``BOS a_1 .. a_n PLUS b_1 .. b_n EQUALS s_0 s_1 .. s_n``: two ``n``-digit numbers, most
    significant digit first and uniform over ``[10^(n-1), 10^n)`` (``[0, 10)`` for one digit),
    then their sum as ``n + 1`` digits (a leading 0 where it has ``n``), which is the answer.
    Input length ``3n + 3``: ``n = (length - 3) // 3``. The paper counts lengths in digits per
    operand (trained up to 8, tested at 9-16) and writes the sum without the leading 0.
    """

    name, min_length = "addition", 6

    def make(self, length: int, g: torch.Generator) -> Instance:
        n = (length - 3) // 3
        a, b = (self.number(n, g) for _ in "ab")
        digits = [DIGITS + int(d) for d in f"{a}"] + [PLUS] + [DIGITS + int(d) for d in f"{b}"]
        total = [DIGITS + int(d) for d in f"{a + b:0{n + 1}d}"]
        return Instance([BOS, *digits, EQUALS, *total], [False] * (2 * n + 3) + [True] * (n + 1))

    @staticmethod
    def number(n: int, g: torch.Generator) -> int:
        """A uniform ``n``-digit number: its first digit 1-9 (0-9 for one digit), then 0-9."""
        first = _randint(10 if n == 1 else 9, 1, g)[0] + (n > 1)
        return int("".join(map(str, [first, *_randint(10, n - 1, g)])))


TASKS: dict[str, type[Task]] = {t.name: t for t in (Copy, Reverse, AssocRecall, FlipFlop, Addition)}


@dataclass(frozen=True)
class TaskData:
    """A task as a data source: training batches of instances of every length up to the
    training length, fixed validation instances, and evaluation instances per length.
    ``name`` and ``sha`` play the corpus's part in records (``sha`` hashes every setting that
    changes an instance, and the generator's version)."""

    task: Task
    name: str
    sha: str

    def describe(self) -> str:
        return f"task {self.task.name} (sha {self.sha[:12]})"

    def train_batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """Inputs and targets ``[b, seq_len]``: one instance per row, its input length uniform
        over [min_length, seq_len], padded after its end (a causal model never sees padding
        before a token); targets outside the answer are ``IGNORE``."""
        lengths = torch.randint(
            self.task.min_length, seq_len + 1, (batch_size,), generator=generator
        )
        return batch([self.task.make(n, generator) for n in lengths.tolist()], seq_len)

    def valid_windows(self, n_windows: int, seq_len: int) -> tuple[Tensor, Tensor]:
        """``n_windows`` fixed validation instances of input length ``seq_len``."""
        g = torch.Generator().manual_seed(VALID_SEED + seq_len)
        return batch([self.task.make(seq_len, g) for _ in range(n_windows)], seq_len)

    def eval_instances(self, n: int, length: int) -> tuple[Tensor, Tensor]:
        """The ``n`` evaluation instances of input length ``length`` (the same for every
        scheme, seed and run)."""
        g = torch.Generator().manual_seed(eval_seed(length))
        return batch([self.task.make(length, g) for _ in range(n)], length)


def batch(instances: list[Instance], seq_len: int) -> tuple[Tensor, Tensor]:
    """Instances as model inputs and targets ``[b, seq_len]``, padded with ``PAD`` inputs and
    ``IGNORE`` targets; targets are the answer tokens only."""
    x = torch.full((len(instances), seq_len), PAD, dtype=torch.long)
    y = torch.full((len(instances), seq_len), IGNORE, dtype=torch.long)
    for row, inst in enumerate(instances):
        n = inst.input_len
        x[row, :n] = torch.tensor(inst.tokens[:-1])
        targets = torch.tensor(inst.tokens[1:])
        y[row, :n] = torch.where(torch.tensor(inst.answer[1:]), targets, IGNORE)
    return x, y


def build_task(cfg: Mapping[str, Any]) -> Task:
    """The task a ``data=task`` config names, with its options."""
    name = cfg.get("task")
    if name not in TASKS:
        raise UserError(f"data.task={name!r} is not a task; allowed: {', '.join(TASKS)}")
    return TASKS[name].from_config(cfg)


def load_task(cfg: Mapping[str, Any]) -> TaskData:
    """The ``TaskData`` of a ``data=task`` config."""
    task = build_task(cfg)
    settings = {k: cfg.get(k) for k in ("task", "alphabet", "ignore_prob")}
    text = json.dumps({**settings, "version": GENERATOR_VERSION}, sort_keys=True)
    return TaskData(task, f"task:{task.name}", hashlib.sha256(text.encode()).hexdigest())
