"""RULER's tasks (``pretrained.ruler``) on a pretrained model and each RoPE variant: the
prompts of each (task, length), greedy answers, records.

- **Length in tokens.** As RULER's ``max_seq_length``, a target length L counts the prompt's
  tokens (with the tokenizer's special tokens) and the task's tokens to generate; the haystack
  is the largest (binary search over its units) whose first trial's prompt fits, and a trial
  that does not fit drops units as RULER's ``incremental`` does. ``model.ruler.factors`` x the
  pretraining context, or ``model.ruler.lengths``.
- **Pairing.** Keys, values, depths and haystack of a (task, length) come from
  ``ruler.seed``, the task and the length only: every variant answers the same prompts.
- **Frequencies.** A variant's RoPE is set for the target length L (``rope_variant``) for all
  of a length's trials and their generated tokens.
- **Prefix sharing.** A length's prompts are answered in sorted order of their tokens, each
  reusing the KV cache of the one before up to the tokens they share (the task's head and the
  haystack up to the first needle), cut back with ``DynamicCache.crop``: exact for every method
  whose keys and values at a position depend only on the tokens up to it and the length L
  (``shares_prefix``), and only that prefix's forward pass is saved. HF's ``dynamic`` rope
  type rescales with the sequence it sees, so it is answered without sharing.
- **Decoding.** Greedy, at most the task's tokens to generate (or ``ruler.max_new_tokens``),
  stopped at EOS or once every expected string is in the output (more tokens cannot lower a
  recall).

Each (variant, task, length) is one record with ``mode: ruler:<task>``: RULER's score (mean
recall over the trials) with a 95% Wilson interval (the trials as n and the summed recalls as
successes: exact for one expected string per trial; a trial, not a string, is the unit), and per
trial its recall, depth, prompt tokens, expected strings and answer.
"""

from __future__ import annotations

import importlib.metadata
import logging
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from pe_bench.config import config_hash
from pe_bench.errors import UserError
from pe_bench.positions.fingerprint import normalised_source
from pe_bench.pretrained import ruler
from pe_bench.pretrained.passkey import cache_keyword
from pe_bench.pretrained.rope import RopeSpec, Variant, rope_variant, uses_hf
from pe_bench.records import RULER_MODE
from pe_bench.run.config import RulerConfig
from pe_bench.run.evaluate import OUT_OF_MEMORY, EvalTask, is_out_of_memory
from pe_bench.run.train import autocast
from pe_bench.stats import wilson

log = logging.getLogger(__name__)

STEP = {"noise": 25, "needle": 25, "essay": 50, "vt": 5, "cwe": 10, "fwe": 10}  # RULER's steps
EXAMPLE_TOKENS = 500  # vt's worked example: RULER fits it to 500 tokens


def mode(task: str) -> str:
    return f"{RULER_MODE}:{task}"


def settings_hash(cfg: RulerConfig, task: str) -> str:
    """What a record's numbers depend on besides the model, variant and length: the task, its
    settings, the sampling, the word lists' version and the code of the tasks and their
    answering (both modules' syntax trees, ``fingerprint.normalised_source``), so editing
    either recomputes RULER's records and no other."""
    settings = asdict(cfg)
    for key in ("tasks", "factors", "lengths", "depth_bins", "variants"):  # which, not how
        settings.pop(key)
    words = importlib.metadata.version("wonderwords")
    code = [normalised_source(module) for module in (ruler, sys.modules[__name__])]
    spec = asdict(ruler.TASKS[task])
    return config_hash({**settings, "task": spec, "words": words, "code": code})


def tasks(
    cfg: RulerConfig, schemes: list[tuple[str, str, Any, str]], train_len: int
) -> list[EvalTask]:
    """One task per (variant, RULER task, target length) of ``schemes`` (the model and
    ``cfg.variants`` of them, all where it is null); ``tokens`` is the trials."""
    for name in cfg.tasks:
        if name not in ruler.TASKS:
            raise UserError(
                f"model.ruler.tasks: unknown task {name!r}; allowed: {', '.join(ruler.TASKS)}"
            )
    if cfg.variants is not None:
        known = [variant for variant, *_ in schemes]
        unknown = [v for v in cfg.variants if v not in known]
        if unknown:
            raise UserError(
                f"model.ruler.variants: {unknown[0]!r} is not in eval.variants; allowed: "
                f"{', '.join(known[1:]) or 'none'}"
            )
        schemes = [s for s in schemes if s[0] == "none" or s[0] in cfg.variants]
    return [
        EvalTask(
            variant,
            digest,
            scheme,
            length,
            mode(name),
            length,
            cfg.trials,
            settings_hash(cfg, name),
            source,
        )
        for variant, digest, scheme, source in schemes
        for name in cfg.tasks
        for length in cfg.prompt_lengths(train_len)
    ]


# ---- prompts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    ids: list[int]
    expected: list[str]
    depth: float | None


def haystack(task: ruler.Task, name: str, length: int, cfg: RulerConfig, text: str, tokenize):
    """The haystack of a (task, length): RULER's noise, the corpus's lines, or needles drawn
    once from the seed, the task and the length; vt's worked example fitted to 500 tokens."""
    kind = task.args.get("type_haystack", "noise")
    if kind == "essay":
        return ruler.Haystack(kind, length, ruler.corpus_lines(text))
    if kind == "needle":
        rng = random.Random(f"ruler-{cfg.seed}-{name}-{length}-haystack")
        return ruler.Haystack(kind, length, ruler.needle_lines(rng, length // 8, task.args))
    example = 0
    if task.kind == "vt":
        rng = random.Random(f"ruler-{cfg.seed}-{name}-example")
        fits = lambda n: len(tokenize(ruler.vt_text(rng, n, 4, True)[0])) <= EXAMPLE_TOKENS  # noqa: E731
        example = _largest(fits, STEP["vt"], STEP["vt"])
    return ruler.Haystack(kind, length, example=example)


def _largest(fits: Callable[[int], bool], low: int, step: int = 0) -> int:
    """The largest size from ``low`` up for which ``fits`` holds (``low`` where none does):
    doubling, then bisection (a larger haystack never has fewer tokens)."""
    if not fits(low):
        return low
    high = 2 * low
    while fits(high):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def _smallest_drop(fits: Callable[[int], bool], size: int, least: int) -> int:
    """The largest size below ``size`` for which ``fits`` holds (``least`` where none does), by
    bisection: RULER drops its haystack by ``incremental`` units until a sample fits, which
    here would cost a line-haystack hundreds of tokens for a needle a few tokens too long."""
    low, high = least - 1, size
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return max(low, least)


def trials(
    name: str, length: int, cfg: RulerConfig, text: str, tokenize: Callable[[str], list[int]]
) -> list[Trial]:
    """The prompts of task ``name`` at ``length`` tokens: trial t of T from its own seed, its
    first answer's needle at a depth in [t/T, (t+1)/T)."""
    task = ruler.TASKS[name]
    stack = haystack(task, name, length, cfg, text, tokenize)
    generate = ruler.GENERATORS[task.kind]
    budget = length - task.tokens_to_generate
    step = STEP.get(task.kind, STEP[stack.kind])

    def sample(t: int, size: int) -> ruler.Sample:
        rng = random.Random(f"ruler-{cfg.seed}-{name}-{length}-{t}")
        depth = (t + rng.random()) / cfg.trials
        return generate(rng, size, depth, task.args, stack)

    limit = len(stack.lines) if stack.lines else None

    def fits(t: int) -> Callable[[int], bool]:
        def fit(n: int) -> bool:
            return (limit is None or n <= limit) and len(tokenize(sample(t, n).text)) <= budget

        return fit

    # vt: a noise sentence before each statement; cwe: more distinct words than common ones
    least = task.args.get("num_hops", task.args.get("num_cw", 0)) + 1
    size = _largest(fits(0), step if budget > 1000 else least, step)
    out = []
    for t in range(cfg.trials):  # a trial over the budget: the largest haystack below that fits
        used = size if fits(t)(size) else _smallest_drop(fits(t), size, least)
        drawn = sample(t, used)
        ids = tokenize(drawn.text)
        if len(ids) > budget:
            raise UserError(
                f"model.ruler: {name} has {len(ids)} tokens with the least haystack, more than "
                f"the {budget} that a length of {length} leaves; allowed: longer lengths"
            )
        out.append(Trial(ids, drawn.expected, drawn.depth))
    return out


# ---- answering ------------------------------------------------------------------------------


# Variants whose HF rope type rescales with the sequence it is given (HF's
# ``dynamic_rope_update``: dynamic NTK, and LongRoPE's switch from its short to its long factors)
SEQUENCE_DEPENDENT = ("dynamic_ntk", "longrope")


def shares_prefix(variant: Variant | None, impl: str) -> bool:
    """Whether a prompt's keys and values up to a token are the same in every prompt that
    starts with the same tokens: not through HF's rope types that rescale with the sequence
    (``SEQUENCE_DEPENDENT``), nor for a scheme that says so (``prefix_cache = False``)."""
    if variant is None:
        return True
    if uses_hf(variant, impl) and variant.scheme.name in SEQUENCE_DEPENDENT:
        return False
    return getattr(variant.scheme, "prefix_cache", True)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def sharing_order(prompts: list[list[int]]) -> list[int]:
    """The prompts' indexes in an order that shares long prefixes: from the prompt that shares
    most with another, each next the one that shares most with the one before (a length's
    trials share a haystack up to their first needle: deepest needle first)."""
    if not prompts:
        return []
    shared = [[common_prefix(a, b) if a is not b else -1 for b in prompts] for a in prompts]
    order = [max(range(len(prompts)), key=lambda i: max(shared[i]))]
    left = set(range(len(prompts))) - set(order)
    while left:
        order.append(max(sorted(left), key=lambda j: shared[order[-1]][j]))
        left.remove(order[-1])
    return order


@torch.no_grad()
def answer_all(
    model: nn.Module,
    prompts: list[Trial],
    max_new: int,
    decode: Callable[[list[int]], str],
    share: bool,
) -> Iterator[tuple[int, str, int]]:
    """The greedy answer to each prompt, yielded as (index, answer, tokens computed for its
    prompt); in ``sharing_order``, each reusing the cache of the one before up to the tokens
    they share (``share``), always recomputing at least its last token."""
    device = next(model.parameters()).device
    keyword = cache_keyword(model)
    eos = model.config.eos_token_id
    stops = set(eos if isinstance(eos, list) else [eos])
    cache, cached = None, []
    for i in sharing_order([p.ids for p in prompts]):
        ids, expected = prompts[i].ids, prompts[i].expected
        keep = min(common_prefix(cached, ids), len(ids) - 1) if share and cache else 0
        if keep:
            cache.crop(keep - cache.get_seq_length())  # negative: drop that many from the end
        else:
            cache = None
        with autocast(device):
            out = model(
                input_ids=torch.tensor([ids[keep:]], device=device),
                use_cache=True,
                logits_to_keep=1,
                **({keyword: cache} if cache else {}),
            )
        cache, cached, new = getattr(out, keyword), list(ids), []
        for _ in range(max_new):
            token = int(out.logits[0, -1].argmax())
            if token in stops:
                break
            new.append(token)
            if ruler.complete(decode(new), expected):
                break
            with autocast(device):
                out = model(
                    input_ids=torch.tensor([[token]], device=device),
                    use_cache=True,
                    **{keyword: cache},
                )
            cache, cached = getattr(out, keyword), [*cached, token]
        yield i, decode(new), len(ids) - keep


def trials_record(prompts: list[Trial], answers: list[str]) -> dict[str, Any]:
    """An ok record's numbers: RULER's score with its 95% Wilson interval, and each trial's."""
    recalls = [ruler.recall(a, p.expected) for a, p in zip(answers, prompts, strict=True)]
    low, high = wilson(sum(recalls), len(recalls))
    return {
        "status": "ok",
        "ruler_score": sum(recalls) / len(recalls),
        "ci_low": low,
        "ci_high": high,
        "trials": len(recalls),
        "recall": recalls,
        "depth": [p.depth for p in prompts],
        "prompt_tokens": [len(p.ids) for p in prompts],
        "expected": [p.expected for p in prompts],
        "answer": answers,
    }


def _collect(
    found: Iterator[tuple[int, str, int]], answers: list[str], prompts: list[Trial], what: str
) -> int:
    """Put each answer in its trial's place, logging it; the prompt tokens computed."""
    start, computed = time.perf_counter(), 0
    for n, (i, answer, fresh) in enumerate(found, 1):
        answers[i], computed = answer, computed + fresh
        log.info(  # a trial of a long prompt takes minutes on a CPU
            "%s trial %d/%d: recall %.2f (%.0f s so far)", what, n, len(prompts),
            ruler.recall(answer, prompts[i].expected), time.perf_counter() - start,
        )  # fmt: skip
    return computed


def run(
    model: nn.Module,
    tokenizer: Any,
    todo: list[EvalTask],
    variants: dict[str, Variant],
    spec: RopeSpec,
    label: str,
    rope_impl: str,
    cfg: RulerConfig,
    text: str,
) -> Iterator[dict[str, Any]]:
    """The record of each task: every trial answered greedily by the model with the task's
    variant (skipped, with the reason, when a length does not fit in memory)."""

    def tokenize(prompt: str) -> list[int]:
        return tokenizer(prompt)["input_ids"]

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    prompts: dict[tuple[str, int], list[Trial]] = {}
    for task in todo:
        name, length = task.mode.split(":", 1)[1], task.eval_len
        if (name, length) not in prompts:
            prompts[name, length] = trials(name, length, cfg, text, tokenize)
        todo_prompts, variant = prompts[name, length], variants.get(task.variant)
        who = label + ("" if variant is None else f"+{variant.key}")
        most = cfg.max_new_tokens or ruler.TASKS[name].tokens_to_generate
        start, answers = time.perf_counter(), [""] * len(todo_prompts)
        try:
            with rope_variant(model, variant, spec, length, rope_impl) as impl:
                found = answer_all(
                    model, todo_prompts, most, decode, shares_prefix(variant, rope_impl)
                )
                computed = _collect(found, answers, todo_prompts, f"{who} {name} L={length}")
        except OUT_OF_MEMORY as err:
            if not is_out_of_memory(err):
                raise
            reason = f"out of memory at L={length}: {str(err).splitlines()[0][:200]}"
            log.error("%s %s: %s; recorded as skipped", who, name, reason)
            yield {**task.fields(), "task": name, "status": "skipped", "reason": reason}
            continue
        record = trials_record(todo_prompts, answers)
        log.info("%s %s L=%d: score %.2f", who, name, length, record["ruler_score"])
        yield {
            **task.fields(),
            "task": name,
            **record,
            "prefill_tokens": computed,
            "rope_impl": impl,
            "time_s": round(time.perf_counter() - start, 3),
        }
