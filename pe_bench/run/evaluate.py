"""Long-context evaluation: the protocol users trust or don't.

- Every length scores the same tokens: the first N targets of the test split (N a multiple of
  the longest length), each target once.
- ``nonoverlap``: windows of L tokens back to back; every token is scored with the context
  from its own window's start (the ALiBi paper's main table). When L does not divide N (the
  ALiBi paper's lengths 512, 1012, 2512, ... do not divide each other), the r = N mod L targets
  left over are scored by one more window of L tokens that ends at the stream's end, scoring
  only its last r: every forward pass is a window of exactly L tokens, so the number measures
  the model at length L, and no target is scored twice.
- ``sliding`` with stride S: windows of L tokens every S tokens; the first window scores all
  its tokens, each later one only its last S (fewer at the very end). S = L equals
  ``nonoverlap``; S = 1 gives every token L - 1 tokens of context.
- Means are token-weighted; per-position sums give the loss at each offset in the window.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from pe_bench.config import Range, check_fields
from pe_bench.data.tasks import IGNORE, TaskData
from pe_bench.errors import UserError
from pe_bench.model.gpt import GPT
from pe_bench.positions import PositionScheme
from pe_bench.provenance import peak_memory_mb, reset_peak_memory
from pe_bench.records import MODES, PROBES, RECORD_KEY, TASK_MODE, make_record
from pe_bench.run.train import autocast, swap_scheme

log = logging.getLogger(__name__)

AT_LEAST_1 = Range(ge=1)


@dataclass
class EvalConfig:
    factors: list[Annotated[float, Range(gt=0)]] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    lengths: list[Annotated[int, AT_LEAST_1]] | None = None  # default: factors x train length
    modes: list[str] = field(default_factory=lambda: ["nonoverlap"])
    stride: Annotated[int, AT_LEAST_1] | None = None  # sliding stride; default: train length
    tokens: Annotated[int, AT_LEAST_1] = 65536  # targets scored at every length
    # truncate (model=hf): documents per test slice, each the longest length's tokens; null:
    # eval.tokens // the longest length
    documents: Annotated[int, AT_LEAST_1] | None = None
    batch_tokens: Annotated[int, AT_LEAST_1] = 8192  # tokens per forward pass
    variants: dict[str, Any] | None = None  # eval-time variants: key -> pe config (null: none)
    # Context-use probes after perplexity (pe_bench/run/probes.py) and their sizes.
    probes: list[str] = field(default_factory=lambda: list(PROBES))
    context_windows: Annotated[int, Range(ge=2)] = 8  # windows per eval length (CI over them)
    context_targets: Annotated[int, AT_LEAST_1] = 8  # targets scored per window
    retrieval_snippets: Annotated[int, Range(ge=2)] = 8  # snippets per distance (CI over them)
    retrieval_distances: list[Annotated[int, AT_LEAST_1]] | None = None  # null: L/2 .. 16 L
    attention_windows: Annotated[int, AT_LEAST_1] = 2  # windows per eval length

    def __post_init__(self) -> None:
        for mode in self.modes:
            if mode not in MODES:
                raise UserError(f"unknown eval mode {mode!r}; allowed: {', '.join(MODES)}")
        for length in self.lengths or []:  # the messages tests pin for a config built in Python
            if length < 1:
                raise UserError(f"eval length {length} must be >= 1")
        for factor in self.factors:
            if factor <= 0:
                raise UserError(f"eval factor {factor:g} must be > 0")
        check_fields(self, "eval")
        if not self.lengths and not self.factors:
            raise UserError(
                "eval.factors=[] gives no eval length; allowed: one factor or more, e.g. "
                "eval.factors=[1,2,4], or eval.lengths=[<tokens>, ...]"
            )
        for i, factor in enumerate(self.factors):
            if not math.isfinite(factor):
                raise UserError(f"eval.factors[{i}] must be a finite number > 0, got {factor}")
        for probe in self.probes:
            if probe not in PROBES:
                raise UserError(f"unknown eval probe {probe!r}; allowed: {', '.join(PROBES)}")

    def eval_lengths(self, train_len: int) -> list[int]:
        """Sorted distinct eval lengths for a model trained at ``train_len``."""
        lengths = self.lengths or [round(f * train_len) for f in self.factors]
        if min(lengths) < 1:
            raise UserError(f"eval lengths {lengths} must all be >= 1")
        return sorted(set(lengths))

    def n_targets(self, lengths: list[int]) -> int:
        """eval.tokens rounded down to a multiple of the longest length (same tokens for all)."""
        longest = max(lengths)
        if self.tokens < longest:
            raise UserError(f"eval.tokens={self.tokens} is below the longest eval length {longest}")
        return self.tokens - self.tokens % longest

    def stride_for(self, mode: str, length: int, train_len: int) -> int:
        """A window's step (sliding), or the targets each window scores (tail)."""
        if mode in ("nonoverlap", "truncate", TASK_MODE):
            return length
        stride = self.stride or train_len
        if stride > length:
            raise UserError(f"eval.stride={stride} is longer than the eval window {length}")
        return stride


@dataclass(frozen=True)
class Window:
    start: int  # first input token of the window in the stream
    score_from: int  # offset in the window of the first scored target


@dataclass
class EvalResult:
    nll_sum: float  # nats, summed over scored targets
    tokens: int  # scored targets
    position_sum: Tensor  # [L] nats summed per offset in the window
    position_count: Tensor  # [L] scored targets per offset

    @property
    def nll(self) -> float:
        return self.nll_sum / self.tokens

    def record(self, fields: dict[str, Any], bytes_per_token: float, **cost: Any) -> dict[str, Any]:
        """An ok perplexity record: NLL, perplexity and bits per byte (``bytes_per_token`` of
        exactly the scored targets), then the costs."""
        return make_record(fields, {}, "ok", self.nll, bytes_per_token, **cost)

    def position_loss(self) -> list[float | None]:
        """Mean loss at each offset in the window; None where nothing was scored."""
        counts = self.position_count.tolist()
        means = (self.position_sum / self.position_count.clamp(min=1)).tolist()
        return [m if c else None for m, c in zip(means, counts, strict=True)]

    @classmethod
    def pooled(cls, results: list[EvalResult]) -> EvalResult:
        """Several scorings of the same targets (draws of random positions) as one: means are
        over every draw's targets, so the NLL is the mean of the draws' NLLs."""
        return cls(
            sum(r.nll_sum for r in results),
            sum(r.tokens for r in results),
            sum(r.position_sum for r in results),
            sum(r.position_count for r in results),
        )


def windows(n_targets: int, length: int, mode: str, stride: int | None = None) -> list[Window]:
    """The windows that score each of ``n_targets`` targets exactly once."""
    if length < 1 or n_targets < length:
        raise UserError(f"eval length {length} must be >= 1 and <= the {n_targets} eval tokens")
    if mode == "nonoverlap":
        spans = [Window(start, 0) for start in range(0, n_targets - length + 1, length)]
        left = n_targets % length
        if left:  # the tail: a full window ending at the stream's end, scoring its last `left`
            spans.append(Window(n_targets - length, length - left))
        return spans
    if mode != "sliding":
        raise UserError(f"unknown eval mode {mode!r}; allowed: {', '.join(MODES)}")
    if stride is None or not 1 <= stride <= length:
        raise UserError(f"eval stride {stride} must be between 1 and the window length {length}")
    spans, end = [Window(0, 0)], length
    while end < n_targets:
        new_end = min(end + stride, n_targets)
        spans.append(Window(new_end - length, length - (new_end - end)))
        end = new_end
    return spans


def _batches(spans: list[Window], size: int) -> Iterator[list[Window]]:
    for i in range(0, len(spans), size):
        yield spans[i : i + size]


@torch.no_grad()
def score(
    model: GPT,
    stream: Tensor,
    length: int,
    mode: str = "nonoverlap",
    stride: int | None = None,
    batch_tokens: int = 8192,
    device: torch.device | None = None,
    desc: str | None = None,
) -> EvalResult:
    """Score the ``len(stream) - 1`` targets of ``stream`` with windows of ``length`` tokens.

    ``desc`` names a progress bar over the windows (shown on a terminal only).
    """
    device = device or next(model.parameters()).device
    spans = windows(len(stream) - 1, length, mode, stride)
    offsets = torch.arange(length)
    position_sum = torch.zeros(length, dtype=torch.float64)
    position_count = torch.zeros(length, dtype=torch.long)
    model.eval()
    size = max(1, batch_tokens // length)
    batches = tqdm(
        _batches(spans, size),
        total=math.ceil(len(spans) / size),
        desc=desc,
        disable=None if desc else True,
        leave=False,
        dynamic_ncols=True,
    )
    for batch in batches:
        starts = torch.tensor([w.start for w in batch])
        index = starts.unsqueeze(1) + offsets  # [b, L]
        x, y = stream[index].to(device), stream[index + 1].to(device)
        with autocast(device):
            logits = model(x)
        nll = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none").cpu()  # [b, L]
        scored = offsets >= torch.tensor([w.score_from for w in batch]).unsqueeze(1)  # [b, L]
        position_sum += (nll.double() * scored).sum(0)
        position_count += scored.sum(0)
    tokens = int(position_count.sum())
    if tokens != len(stream) - 1:  # the protocol's invariant: every target exactly once
        raise RuntimeError(f"scored {tokens} targets, expected {len(stream) - 1}")
    return EvalResult(float(position_sum.sum()), tokens, position_sum, position_count)


@contextlib.contextmanager
def scheme_swapped(model: GPT, scheme: PositionScheme | None):
    """Evaluate ``model`` with ``scheme`` in place of its own (eval-time variants), carrying
    over the trained scheme's parameters, and put the original back afterwards; ``None``
    keeps the model's own."""
    if scheme is None:
        yield model
        return
    original = swap_scheme(model, scheme)
    try:
        yield model
    finally:
        model.pe = original


@dataclass(frozen=True)
class EvalTask:
    """One record to compute: a scheme (the model's own or a variant) at one length and mode,
    over ``tokens`` scored targets (instances of a synthetic task, trials of passkey)."""

    variant: str  # "none" for the model's own scheme, else the key in eval.variants
    variant_hash: str  # hash of the variant's config ("" for none): a changed variant recomputes
    scheme: PositionScheme | None  # evaluated in place of the model's own; None: the model's own
    eval_len: int
    mode: str
    stride: int
    tokens: int
    probe_hash: str = ""  # a probe's (or passkey's) settings: changed settings recompute
    # the key of the variant's code (``positions.scheme_key``; "" for none): a record of
    # other code is stale (``RunStore``); not part of the record's key
    variant_source: str = ""

    def key(self) -> tuple:
        """The record key's values (``RECORD_KEY``)."""
        return (self.variant, self.variant_hash, self.eval_len, self.mode, self.stride, self.tokens)

    def fields(self) -> dict[str, Any]:
        """The record's key fields, with the probe's settings hash, the variant's code key and
        the variant's caveat where it has them (a variant's caveat takes the place of its
        trained scheme's on its records: the built-in variants apply to rope, which has
        none)."""
        extra = {"probe_hash": self.probe_hash} if self.probe_hash else {}
        if self.variant_source:
            extra["variant_source"] = self.variant_source
        if self.scheme is not None and self.scheme.caveat:
            extra["caveat"] = self.scheme.caveat
        return dict(zip(RECORD_KEY, self.key(), strict=True)) | extra


def eval_tasks(
    schemes: Iterable[tuple[str, str, PositionScheme | None, str]],
    lengths: list[int],
    cfg: EvalConfig,
    train_len: int,
    tokens: int,
    modes: list[str] | None = None,
) -> list[EvalTask]:
    """Every (variant, length, mode) of ``schemes`` (variant key, variant hash, scheme, key of
    the variant's code), in ``modes`` (default ``cfg.modes``), each over ``tokens`` targets."""
    tasks = []
    for variant, variant_hash, scheme, source in schemes:
        for length in lengths:
            for mode in modes or cfg.modes:
                stride = cfg.stride_for(mode, length, train_len)
                task = EvalTask(variant, variant_hash, scheme, length, mode, stride, tokens)
                tasks.append(dataclasses.replace(task, variant_source=source))
    return tasks


@dataclass
class Scored:
    """The outcome of one ``EvalTask``: its result, or why there is none."""

    task: EvalTask
    label: str  # e.g. rope+pi:ft
    result: Any = None  # an EvalResult, or a synthetic task's TaskScore
    skipped: str = ""  # the reason there is no result
    time_s: float = 0.0
    peak_mem_mb: float = 0.0
    draw_nll: list[float] = field(default_factory=list)  # per draw of random positions


@dataclass
class TaskScore:
    """A synthetic task's evaluation at one length (``pe_bench.data.tasks``): teacher-forced counts
    over the answer tokens of its instances."""

    solved: int  # instances whose every answer token's argmax is right (exact match)
    instances: int
    right: int  # answer tokens whose argmax is right
    answer_tokens: int
    nll_sum: float  # nats, summed over answer tokens

    @property
    def exact_match(self) -> float:
        return self.solved / self.instances

    @property
    def token_acc(self) -> float:
        return self.right / self.answer_tokens

    @property
    def nll(self) -> float:
        return self.nll_sum / self.answer_tokens

    def record(self, fields: dict[str, Any], **cost: Any) -> dict[str, Any]:
        """An ok task record: exact match and token accuracy over the answer tokens."""
        numbers = {
            "instances": self.instances,
            "answer_tokens": self.answer_tokens,
            "exact_match": self.exact_match,
            "token_acc": self.token_acc,
            "answer_nll": self.nll,
        }
        return {**fields, "status": "ok", **numbers, **cost}

    @classmethod
    def pooled(cls, results: list[TaskScore]) -> TaskScore:
        """Draws of random positions over the same instances as one: rates over every draw."""
        return cls(*(sum(getattr(r, f.name) for r in results) for f in fields(cls)))


@torch.no_grad()
def score_instances(
    model: GPT, inputs: Tensor, targets: Tensor, batch_tokens: int, device: torch.device
) -> TaskScore:
    """Teacher-forced scores of instances ``[n, L]`` whose targets are ``IGNORE`` outside the
    answer: every instance must have at least one answer token."""
    model.eval()
    size = max(1, batch_tokens // inputs.shape[1])
    solved = right = answer_tokens = 0
    nll_sum = 0.0
    for i in range(0, len(inputs), size):
        x, y = inputs[i : i + size].to(device), targets[i : i + size].to(device)
        with autocast(device):
            logits = model(x)
        loss = F.cross_entropy(
            logits.float().transpose(1, 2), y, ignore_index=IGNORE, reduction="none"
        )
        scored = y != IGNORE
        hits = (logits.argmax(-1) == y) & scored
        solved += int((hits.sum(1) == scored.sum(1)).sum())
        right += int(hits.sum())
        answer_tokens += int(scored.sum())
        nll_sum += float(loss.double().sum())
    return TaskScore(solved, len(inputs), right, answer_tokens, nll_sum)


def task_scorer(data: TaskData, instances: int, batch_tokens: int, device: torch.device) -> Scorer:
    """A scorer of a synthetic task: ``instances`` evaluation instances at the task's length."""

    def score_task(model: GPT, task: EvalTask, desc: str) -> TaskScore:
        inputs, targets = data.eval_instances(instances, task.eval_len)
        return score_instances(model, inputs, targets, batch_tokens, device)

    return score_task


Scorer = Callable[[GPT, "EvalTask", str], Any]  # (model, task, progress label) -> a result


def lm_scorer(stream: Tensor, batch_tokens: int, device: torch.device) -> Scorer:
    """A scorer of perplexity tasks: ``score`` on ``stream`` at the task's length and mode."""

    def score_task(model: GPT, task: EvalTask, desc: str) -> EvalResult:
        return score(
            model, stream, task.eval_len, task.mode, task.stride, batch_tokens, device, desc
        )

    return score_task


def evaluate_tasks(
    model: GPT,
    tasks: list[EvalTask],
    scorer: Scorer,
    device: torch.device,
    scheme_name: str,
    suffix: str = "",
) -> Iterator[Scored]:
    """Score each task with ``model`` (a variant swapped in for its own scheme), one at a time,
    with ``scorer`` (``lm_scorer``, or ``tasks.task_scorer`` for a synthetic task): the
    result pools the draws of random positions (its class's ``pooled``).

    A length that does not fit in memory is skipped with the reason; the others go on. Labels
    are ``<scheme_name>[+<variant>]<suffix>`` (a fine-tune's suffix is ``:<key>``).
    """
    for task in tasks:
        variant = "" if task.variant == "none" else f"+{task.variant}"
        name = scheme_name + variant + suffix
        start = time.perf_counter()
        reset_peak_memory(device)
        try:
            with scheme_swapped(model, task.scheme):
                draws = score_draws(model, task, name, scorer)
        except OUT_OF_MEMORY as err:
            if not is_out_of_memory(err):
                raise
            reason = f"out of memory at L={task.eval_len}: {str(err).splitlines()[0][:200]}"
            log.error("%s: %s; recorded as skipped", name, reason)
            yield Scored(task, name, skipped=reason)
            continue
        elapsed = round(time.perf_counter() - start, 3)
        peak = round(peak_memory_mb(device), 1)
        pooled = type(draws[0]).pooled(draws)
        yield Scored(task, name, pooled, "", elapsed, peak, [r.nll for r in draws])


def score_draws(model: GPT, task: EvalTask, name: str, scorer: Scorer) -> list[Any]:
    """``task`` scored once per draw of the model's scheme's evaluation positions (once for a
    scheme whose positions are not random), each draw seeded by its index."""
    results = []
    for draw in range(model.pe.eval_draws):
        model.pe.seed_eval_positions(draw)
        drawn = f" draw {draw + 1}/{model.pe.eval_draws}" if model.pe.eval_draws > 1 else ""
        results.append(scorer(model, task, f"eval {name} L={task.eval_len}{drawn}"))
    return results


# What running out of memory raises: CUDA's OutOfMemoryError, Python's MemoryError, and on CPU
# a plain RuntimeError from the allocator (torch 2.13: "DefaultCPUAllocator: can't allocate
# memory"), the one case that only its message tells apart.
OUT_OF_MEMORY = (torch.OutOfMemoryError, MemoryError, RuntimeError)


def is_out_of_memory(err: BaseException) -> bool:
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    return "DefaultCPUAllocator: can't allocate memory" in str(err)
