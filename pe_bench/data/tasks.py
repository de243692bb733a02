"""Synthetic length-generalization tasks: does a scheme still solve a task on longer inputs?

Perplexity at long lengths rewards ignoring distant context; a task with one right answer
that depends on distant tokens does not. Each task here generates instances of a chosen
input length; a model is trained on instances of every length up to ``train.seq_len`` and
evaluated on instances of 1x, 2x, 4x ... that length, as Kazemnejad et al. (2023,
https://arxiv.org/abs/2305.19466) and Ruoss et al. (2023, https://arxiv.org/abs/2305.16843) do.

- **Loss only on answer tokens**: targets that are not part of the answer are ``IGNORE``.
- **Scoring**: per-sequence exact match (every answer token's argmax right) and per-token
  accuracy, both teacher-forced. Copy's, reverse's and addition's answers end with ``EOS``,
  which is scored like their other tokens, so exact match under teacher forcing equals exact
  match of greedy decoding to EOS, as McGill-NLP/length-generalization scores (if every token
  and EOS is right given the right prefix, greedy decoding writes that prefix and stops
  there; an answer that stops early or runs on fails); per-token accuracy is the
  teacher-forced one. Each task's ``headline`` metric is the one its paper reports: exact
  match, or token accuracy for flip-flop (the share of reads right) and associative recall
  (the share of queries right).
- **Determinism**: an instance depends only on its generator's seed. Training instances come
  from the training generator (``train.seed``, as the data order of an LM run); evaluation
  instances of length L from a generator seeded by ``eval_seed(L)`` and validation ones by
  ``VALID_SEED``: fixed seeds drawn once, disjoint from any training seed, the same for every
  scheme and seed, so scores are paired.

Tokens are ids below 256 (the byte models' vocabulary): ``PAD``, ``BOS``, ``SEP`` and ``EOS``,
then each task's own symbols (a model trains on one task, so the tasks' ranges may overlap).
Every instance starts with ``BOS``, which counts in its input length. An instance is the
model's input and a target at each input position (``IGNORE`` where nothing is scored): a
target is usually the next input token, but not in associative recall, whose answers are
never read.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import typing
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import torch
from torch import Tensor

from pe_bench.config import Range, check_value
from pe_bench.errors import UserError

IGNORE = -100  # F.cross_entropy's ignore_index: targets outside the answer
PAD, BOS, SEP = 0, 1, 2  # every instance starts with BOS (NoPE counts positions from it)
WRITE, READ, IGNORE_OP, BIT0 = 3, 4, 5, 6  # flip-flop: instructions, then bits 0 and 1 (6, 7)
EOS = 8  # copy, reverse and addition: the answer's end, scored like its other tokens
SYMBOLS = 16  # copy and reverse draw from SYMBOLS .. SYMBOLS + alphabet - 1 (alphabet <= 240)
KEYS, N_KEYS = 16, 120  # associative recall: keys 16..135
VALUES, N_VALUES = 136, 120  # and values 136..255 (Zoology: two halves of the vocabulary)
DIGITS, PLUS, EQUALS = 16, 26, 27  # addition: digits 0-9 are 16..25
GENERATOR_VERSION = 2  # bump when a generation rule changes: it changes every task's hash
VALID_SEED = 0x5EED_0001_0000  # above any seed a user types; eval seeds are higher still
EVAL_SEED = 0x5EED_0002_0000


def eval_seed(length: int) -> int:
    """The seed of the evaluation instances of input length ``length``."""
    return EVAL_SEED + length


@dataclass(frozen=True)
class Instance:
    """One instance: the model's ``inputs`` and, at each input position, the token it is
    scored on there (``targets``; ``IGNORE`` where it is not scored)."""

    inputs: list[int]
    targets: list[int]

    @classmethod
    def sequence(cls, tokens: list[int], answer: list[bool]) -> Instance:
        """A sequence read left to right: the model reads ``tokens[:-1]`` and is scored on
        ``tokens[i]`` (predicted from ``tokens[:i]``) where ``answer[i]``."""
        targets = [t if a else IGNORE for t, a in zip(tokens[1:], answer[1:], strict=True)]
        return cls(tokens[:-1], targets)

    @property
    def input_len(self) -> int:
        return len(self.inputs)

    @property
    def answers(self) -> list[int]:
        """The scored tokens, in order."""
        return [t for t in self.targets if t != IGNORE]


class Task(ABC):
    """A task: ``make(length, g)`` is the largest instance whose input has at most ``length``
    tokens (exactly ``length`` where the task's shape allows), drawn from ``g``. ``headline``
    is the metric its paper reports and the report ranks it by; ``ends_with_eos``: the
    answer ends with a scored ``EOS``."""

    name: ClassVar[str]
    min_length: int  # the shortest input an instance can have (an option may set it)
    headline: ClassVar[str] = "exact_match"
    ends_with_eos: ClassVar[bool] = False

    @classmethod
    def options(cls) -> dict[str, Option]:
        """The task's options: its constructor's keyword-only parameters, each with its type
        hint (``Annotated[int, Range(...)]`` for a range) and default. A new option is one more
        parameter: the data config accepts and checks it, and it keys the task's data
        (``task_key``)."""
        hints = typing.get_type_hints(cls.__init__, include_extras=True)
        params = inspect.signature(cls.__init__).parameters.values()
        return {
            p.name: Option(hints[p.name], p.default) for p in params if p.kind is p.KEYWORD_ONLY
        }

    @abstractmethod
    def make(self, length: int, g: torch.Generator) -> Instance: ...

    def check_length(self, length: int, where: str) -> None:
        if length < self.min_length:
            raise UserError(
                f"{where}={length}: task {self.name} needs inputs of at least "
                f"{self.min_length} tokens; allowed: >= {self.min_length}"
            )


@dataclass(frozen=True)
class Option:
    """A task option: its type hint (with its range) and its default."""

    hint: Any
    default: Any


TASKS: dict[str, type[Task]] = {}  # data.task -> its class, in the order they were registered


def register_task(cls: type[Task]) -> type[Task]:
    """Register task ``cls`` under its ``name`` (``data.task=<name>``)."""
    if cls.name in TASKS:
        raise ValueError(f"task name {cls.name!r} is registered already by {TASKS[cls.name]}")
    TASKS[cls.name] = cls
    return cls


def _randint(high: int, n: int, g: torch.Generator) -> list[int]:
    return torch.randint(0, high, (n,), generator=g).tolist()


@register_task
class Copy(Task):
    """Copy (Kazemnejad et al. 2023's *Copy*; Ruoss et al. 2023's *duplicate string*).

    ``BOS x_1 .. x_n SEP x_1 .. x_n EOS`` with ``x_i`` uniform over ``alphabet`` symbols; the
    answer is the second ``x`` and ``EOS`` (``n + 1`` scored tokens: exact match needs the
    answer to stop where it should, as greedy decoding to EOS does). Input length ``2n + 2``:
    ``n = (length - 2) // 2``.
    """

    name, min_length = "copy", 4
    ends_with_eos = True  # reverse inherits it

    def __init__(self, *, alphabet: Annotated[int, Range(ge=2, le=240)] = 64) -> None:
        self.alphabet = alphabet

    def body(self, x: list[int]) -> list[int]:
        return x

    def make(self, length: int, g: torch.Generator) -> Instance:
        n = (length - 2) // 2
        x = [SYMBOLS + s for s in _randint(self.alphabet, n, g)]
        tokens = [BOS, *x, SEP, *self.body(x), EOS]
        return Instance.sequence(tokens, [False] * (n + 2) + [True] * (n + 1))


@register_task
class Reverse(Copy):
    """Reverse (Kazemnejad et al. 2023's *Reverse*; Ruoss et al. 2023's *reverse string*).

    ``BOS x_1 .. x_n SEP x_n .. x_1 EOS``: copy's input, the answer reversed.
    """

    name = "reverse"

    def body(self, x: list[int]) -> list[int]:
        return x[::-1]


@register_task
class AssocRecall(Task):
    """Multi-query associative recall (MQAR) as Zoology generates it (Arora et al. 2023,
    https://arxiv.org/abs/2312.04927; HazyResearch/zoology ``multiquery_ar``).

    ``BOS k_1 v_1 .. k_n v_n``, then a query region: ``n = num_kv_pairs`` distinct keys (of
    120 symbols) with distinct values (of 120 others), then each key asked exactly once, at a
    pair slot of the region drawn by Zoology's power law (slot ``g`` with weight
    ``(g + 1)^(power_a - 1)``, without replacement, the first pair's key drawn first); every
    other token of the region, the one after each query included, is a random key or value
    symbol that is none of this instance's. The model is scored at each query on its key's
    value, which it never reads there: each value appears once in the input, in its pair.
    The number of pairs is the same at every length, so a longer input is a longer query
    region (queries farther from their pairs, among more distractors): length
    generalisation measures recall at distances never trained on, under the same memory
    load. Input length ``length``; its region has ``length - 1 - 2n >= 2n`` tokens.
    """

    name, headline = "assoc_recall", "token_acc"  # Zoology scores the share of queries right

    def __init__(
        self,
        *,
        num_kv_pairs: Annotated[int, Range(ge=1, le=64)] = 4,
        power_a: Annotated[float, Range(gt=0, le=1)] = 0.01,  # Zoology's gap law (1: uniform)
    ) -> None:
        self.pairs, self.power_a = num_kv_pairs, power_a
        self.min_length = 4 * num_kv_pairs + 1

    def make(self, length: int, g: torch.Generator) -> Instance:
        n, region = self.pairs, length - 1 - 2 * self.pairs
        keys = (torch.randperm(N_KEYS, generator=g)[:n] + KEYS).tolist()
        values = (torch.randperm(N_VALUES, generator=g)[:n] + VALUES).tolist()
        slots = self.slots(region // 2, g)
        free = torch.ones(N_KEYS + N_VALUES, dtype=torch.bool)
        free[[k - KEYS for k in keys + values]] = False
        others = (free.nonzero().squeeze(1) + KEYS).tolist()
        queries = [others[i] for i in _randint(len(others), region, g)]
        targets = [IGNORE] * (2 * n + 1 + region)
        for key, value, slot in zip(keys, values, slots, strict=True):
            queries[2 * slot] = key
            targets[2 * n + 1 + 2 * slot] = value
        pairs = [t for pair in zip(keys, values, strict=True) for t in pair]
        return Instance([BOS, *pairs, *queries], targets)

    def law(self, slots: int) -> Tensor:
        """Zoology's power law over ``slots`` pair slots: ``p(g) ~ (g + 1)^(power_a - 1)``."""
        return _power_law(slots, self.power_a)

    def slots(self, slots: int, g: torch.Generator) -> list[int]:
        """``num_kv_pairs`` distinct slots of ``slots``, drawn one after another by the law,
        as ``np.random.choice(replace=False, p=law)`` draws them: the order of an exponential
        race (``-log(u) / p``, ascending) is that of successive draws without replacement."""
        race = -torch.rand(slots, generator=g, dtype=torch.float64).log() / self.law(slots)
        return race.argsort()[: self.pairs].tolist()


@functools.lru_cache(maxsize=64)
def _power_law(slots: int, power_a: float) -> Tensor:
    weights = torch.arange(1, slots + 1, dtype=torch.float64) ** (power_a - 1)
    return weights / weights.sum()


@register_task
class FlipFlop(Task):
    """Flip-flop language modelling (Liu et al. 2023, https://arxiv.org/abs/2306.00946), FFL(p).

    ``m`` instruction-bit pairs: the first instruction is write, the last read, the others are
    ignore with probability ``ignore_prob`` (the paper's p_i = 0.8) and write or read with
    (1 - p_i) / 2 each. The bit after write or ignore is uniform; the bit after read is the
    bit of the latest write, and is the answer (the paper scores each read: its headline is
    the share of read bits right, token accuracy here). ``BOS`` first: input length ``2m``,
    so ``m = length // 2``.
    """

    name, min_length, headline = "flip_flop", 4, "token_acc"

    def __init__(self, *, ignore_prob: Annotated[float, Range(ge=0, lt=1)] = 0.8) -> None:
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
        return Instance.sequence(tokens, answer)

    @staticmethod
    def instruction(i: int, m: int, u: float, half: float) -> int:
        """The ``i``-th of ``m`` instructions for a uniform draw ``u``."""
        if i == 0:
            return WRITE
        if i == m - 1:
            return READ
        return WRITE if u < half else READ if u < 2 * half else IGNORE_OP


@register_task
class Addition(Task):
    """Addition (Kazemnejad et al. 2023's *Addition*, after Nye et al. 2021; no scratchpad),
    operand lengths mixed as McGill-NLP/length-generalization's ``make_addition_dataset.py``
    mixes them.

    ``BOS a PLUS b EQUALS s_0 .. s_m EOS``: numbers most significant digit first, the longer
    operand of ``m`` digits, the digit counts of (a, b) uniform over McGill's bins whose longer
    count is ``m`` (the shorter from min(4, m) to m: its ``train_min`` is 4), each number
    uniform over its digit count's range (``[10^(d-1), 10^d)``, ``[0, 10)`` for one digit);
    then the sum as ``m + 1`` digits (a leading 0 where it has ``m``) and ``EOS``, which are
    the answer. Input length at most ``3m + 4`` (both operands of ``m`` digits), so
    ``m = (length - 4) // 3``: an instance of length L has its longer operand as long as L
    allows, and a test length needs only one operand past the training range, as McGill's
    test split does. The paper writes the sum without the leading 0.
    """

    name, min_length = "addition", 7
    ends_with_eos = True
    SHORTEST = 4  # McGill's train_min: the shorter operand's fewest digits (m permitting)

    def make(self, length: int, g: torch.Generator) -> Instance:
        m = (length - 4) // 3
        low = min(self.SHORTEST, m)
        bins = [(m, k) for k in range(low, m + 1)] + [(k, m) for k in range(low, m)]
        digits_a, digits_b = bins[_randint(len(bins), 1, g)[0]]
        a, b = self.number(digits_a, g), self.number(digits_b, g)
        question = [*self.digits(f"{a}"), PLUS, *self.digits(f"{b}"), EQUALS]
        total = [*self.digits(f"{a + b:0{m + 1}d}"), EOS]
        tokens = [BOS, *question, *total]
        return Instance.sequence(tokens, [False] * (len(question) + 1) + [True] * len(total))

    @staticmethod
    def digits(text: str) -> list[int]:
        return [DIGITS + int(d) for d in text]

    @staticmethod
    def number(n: int, g: torch.Generator) -> int:
        """A uniform ``n``-digit number: its first digit 1-9 (0-9 for one digit), then 0-9."""
        first = _randint(10 if n == 1 else 9, 1, g)[0] + (n > 1)
        return int("".join(map(str, [first, *_randint(10, n - 1, g)])))


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
        over [min_length, seq_len] (addition's: the length its longer operand fills), padded
        after its end (a causal model never sees padding before a token); targets outside the
        answer are ``IGNORE``."""
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
        x[row, : inst.input_len] = torch.tensor(inst.inputs)
        y[row, : inst.input_len] = torch.tensor(inst.targets)
    return x, y


def task_options() -> dict[str, Option]:
    """Every registered task's options (``Task.options``), by name: a ``data=task`` config holds
    them all (conf/data/task.yaml), whichever task it picks."""
    found: dict[str, Option] = {}
    for cls in TASKS.values():
        found.update({k: v for k, v in cls.options().items() if k not in found})
    return found


def check_task_options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The value of every task option (``task_options``) in ``cfg``, checked against its type
    and range (``data.<option>`` named in the error), its default where ``cfg`` has none."""
    return {
        name: option.default
        if cfg.get(name) is None
        else check_value(cfg[name], option.hint, f"data.{name}")
        for name, option in task_options().items()
    }


def build_task(cfg: Mapping[str, Any]) -> Task:
    """The task ``cfg["task"]`` names, with its options from ``cfg`` (checked)."""
    name = cfg.get("task")
    if name not in TASKS:
        raise UserError(f"data.task={name!r} is not a task; allowed: {', '.join(TASKS)}")
    options = check_task_options(cfg)
    return TASKS[name](**{k: options[k] for k in TASKS[name].options()})


def task_key(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What keys a task's data (``TaskData.sha``): its name, the generators' version and every
    task option's value (``task_options``, each task's constructor: an option added to a task
    is keyed without a list to edit; every task's key holds them all, as its config does)."""
    return {"task": cfg["task"], **check_task_options(cfg), "version": GENERATOR_VERSION}


def load_task(cfg: Mapping[str, Any]) -> TaskData:
    """The ``TaskData`` of a ``data=task`` config (``task`` and the task options)."""
    task = build_task(cfg)
    text = json.dumps(task_key(cfg), sort_keys=True)
    return TaskData(task, f"task:{task.name}", hashlib.sha256(text.encode()).hexdigest())
