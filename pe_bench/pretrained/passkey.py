"""Passkey retrieval (Mohtashami & Jaggi 2023) on a pretrained model and each RoPE variant.

The test as epfml/landmark-attention ``llama/run_test.py`` and jquesnelle/yarn
``eval/passkey.py`` write it: the prompt is, joined by newlines, the task description, the
first ``n_prefix`` characters of the filler repeated, the key sentence, the first
``n_filler - n_prefix`` characters of the same filler, and the question; the key is an integer
drawn from 1..50000; the model's greedy continuation (at most ``max_new_tokens`` tokens) is
right when its first integer equals the key.

What pe-bench sets that the originals leave loose:

- **Length in tokens.** For a target length L (``passkey.factors`` x the model's pretraining
  context, or ``passkey.lengths``), the filler is the longest for which the tokenized prompt
  (with the tokenizer's special tokens, as the originals' pipelines encode it) has at most L
  tokens; the record keeps each prompt's count (within a few tokens of L).
- **Depth.** The key sentence sits at depth d = n_prefix / n_filler, drawn at random but
  stratified: trial t of T has d in [t/T, (t+1)/T), so every length covers every depth.
- **Pairing.** The depths and keys of a length come from ``passkey.seed`` and the length only:
  every variant answers the same prompts.
- **Frequencies.** A variant's RoPE is set for the prompt's length and kept for the few
  generated tokens (``hf.rope_variant``).

Each (variant, length) is one record with ``mode: passkey``: accuracy over its trials with a
95% Wilson interval, and per trial the depth, the prompt's tokens, the key and the answer. The
report shows a table (accuracy and interval per label and length) and a depth x length figure.
"""

from __future__ import annotations

import inspect
import logging
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from pe_bench.config import config_hash
from pe_bench.errors import UserError
from pe_bench.pretrained.rope import RopeSpec, Variant, rope_variant
from pe_bench.records import PASSKEY_MODE
from pe_bench.run.config import PasskeyConfig
from pe_bench.run.evaluate import OUT_OF_MEMORY, EvalTask, is_out_of_memory
from pe_bench.run.train import autocast
from pe_bench.stats import wilson

log = logging.getLogger(__name__)

VERSION = 1  # bump when the method changes: stored records are recomputed
TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there."
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
QUESTION = "What is the pass key? The pass key is"
KEYS = (1, 50000)  # the key is drawn from this range, both ends included


def settings_hash(cfg: PasskeyConfig) -> str:
    """What a passkey record's numbers depend on besides the model, variant and length."""
    settings = asdict(cfg)
    for key in ("factors", "lengths", "depth_bins", "variants"):  # which, and the figure: not how
        settings.pop(key)
    return config_hash({**settings, "version": VERSION})


def tasks(
    cfg: PasskeyConfig, schemes: list[tuple[str, str, Any, str]], train_len: int
) -> list[EvalTask]:
    """One task per (variant, target length) of ``schemes`` (as ``eval_tasks`` takes them;
    the model and ``cfg.variants`` of them, all where it is null); ``stride`` is the length
    (one prompt each)."""
    if cfg.variants is not None:
        known = [variant for variant, *_ in schemes]
        unknown = [v for v in cfg.variants if v not in known]
        if unknown:
            raise UserError(
                f"model.passkey.variants: {unknown[0]!r} is not in eval.variants; allowed: "
                f"{', '.join(known[1:]) or 'none'}"
            )
        schemes = [s for s in schemes if s[0] == "none" or s[0] in cfg.variants]
    return [
        EvalTask(
            variant,
            digest,
            scheme,
            length,
            PASSKEY_MODE,
            length,
            cfg.trials,
            settings_hash(cfg),
            source,
        )
        for variant, digest, scheme, source in schemes
        for length in cfg.prompt_lengths(train_len)
    ]


# ---- prompts --------------------------------------------------------------------------------


def key_sentence(key: int) -> str:
    return f"The pass key is {key}. Remember it. {key} is the pass key."


def prompt_text(n_filler: int, depth: float, key: int) -> str:
    """The prompt with ``n_filler`` characters of filler, the key sentence after
    ``round(depth * n_filler)`` of them."""
    n_prefix = round(depth * n_filler)
    filler = " ".join([FILLER] * (n_filler // len(FILLER) + 1))
    return "\n".join(
        [TASK, filler[:n_prefix], key_sentence(key), filler[: n_filler - n_prefix], QUESTION]
    )


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    key: int
    depth: float
    n_filler: int  # characters of filler


def check_lengths(tokenize: Callable[[str], list[int]], lengths: list[int]) -> None:
    """Refuse, before any evaluation, a length shorter than a prompt without filler."""
    least = len(tokenize(prompt_text(0, 0.0, KEYS[1])))
    if lengths and min(lengths) < least:
        raise UserError(
            f"model.passkey: a prompt with no filler has {least} tokens with this tokenizer, "
            f"more than the length {min(lengths)}; allowed: lengths of at least {least}"
        )


def fit_prompt(tokenize: Callable[[str], list[int]], length: int, depth: float, key: int) -> Prompt:
    """The prompt with the most filler whose tokens are at most ``length`` (binary search over
    the filler's characters; more filler never has fewer tokens)."""
    check_lengths(tokenize, [length])
    low, high = 0, 4 * length + 16  # chars: more than any tokenizer's `length` tokens can hold
    while len(tokenize(prompt_text(high, depth, key))) <= length:
        low, high = high, 2 * high
    while high - low > 1:  # tokens(low) <= length < tokens(high)
        middle = (low + high) // 2
        if len(tokenize(prompt_text(middle, depth, key))) <= length:
            low = middle
        else:
            high = middle
    return Prompt(tokenize(prompt_text(low, depth, key)), key, depth, low)


def draws(cfg: PasskeyConfig, length: int) -> list[tuple[float, int]]:
    """(depth, key) of each trial at ``length``: stratified random depths, random keys; from
    the seed and the length alone, so every variant gets the same prompts."""
    rng = random.Random(f"passkey-{cfg.seed}-{length}")
    return [((t + rng.random()) / cfg.trials, rng.randint(*KEYS)) for t in range(cfg.trials)]


def first_integer(text: str) -> int | None:
    """The first run of digits in ``text`` as an integer (the originals' ``re.search(r'\\d+')``),
    or None."""
    found = re.search(r"\d+", text)
    return int(found.group()) if found else None


def answered(text: str) -> bool:
    """Whether generation can stop: the first integer is complete (a non-digit follows it)."""
    return re.search(r"\d+\D", text) is not None


@torch.no_grad()
def greedy(
    model: nn.Module, ids: list[int], max_new: int, decode: Callable[[list[int]], str]
) -> str:
    """The greedy continuation of ``ids`` (KV cache, logits of the last position only), stopped
    at ``max_new`` tokens, at EOS, or once its first integer is complete."""
    device = next(model.parameters()).device
    x = torch.tensor([ids], device=device)
    with autocast(device):  # as perplexity is scored: bf16 on a GPU, float32 on the CPU
        out = model(input_ids=x, use_cache=True, logits_to_keep=1)
    eos, cache = model.config.eos_token_id, cache_keyword(model)
    stops = set(eos if isinstance(eos, list) else [eos])
    new: list[int] = []
    for _ in range(max_new):
        token = int(out.logits[0, -1].argmax())
        if token in stops:
            break
        new.append(token)
        if answered(decode(new)):
            break
        x = torch.tensor([[token]], device=device)
        with autocast(device):
            out = model(input_ids=x, use_cache=True, **{cache: getattr(out, cache)})
    return decode(new)


def cache_keyword(model: nn.Module) -> str:
    """The KV cache's keyword and output field: ``cache`` in recent transformers 5 (which
    deprecates ``past_key_values``), ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def trials_record(prompts: list[Prompt], answers: list[int | None]) -> dict[str, Any]:
    """An ok passkey record's numbers: accuracy over the trials with its 95% Wilson interval,
    and each trial's depth, prompt length, key and answer."""
    correct = [int(a == p.key) for a, p in zip(answers, prompts, strict=True)]
    low, high = wilson(sum(correct), len(correct))
    return {
        "status": "ok",
        "passkey_acc": sum(correct) / len(correct),
        "ci_low": low,
        "ci_high": high,
        "trials": len(correct),
        "correct": correct,
        "depth": [p.depth for p in prompts],
        "prompt_tokens": [len(p.ids) for p in prompts],
        "key": [p.key for p in prompts],
        "answer": answers,
    }


def run(
    model: nn.Module,
    tokenizer: Any,
    todo: list[EvalTask],
    variants: dict[str, Variant],
    spec: RopeSpec,
    name: str,
    rope_impl: str,
    cfg: PasskeyConfig,
) -> Iterator[dict[str, Any]]:
    """The record of each task: every trial's prompt answered greedily by the model with the
    task's variant (skipped, with the reason, when a length does not fit in memory)."""

    def tokenize(text: str) -> list[int]:
        return tokenizer(text)["input_ids"]

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    prompts: dict[int, list[Prompt]] = {}
    for task in todo:
        length = task.eval_len
        if length not in prompts:
            prompts[length] = [fit_prompt(tokenize, length, d, k) for d, k in draws(cfg, length)]
        variant = variants.get(task.variant)
        label = name + ("" if variant is None else f"+{variant.key}")
        key = task.fields()
        start = time.perf_counter()
        answers, impl = [], "none"
        try:
            for n, prompt in enumerate(prompts[length], 1):
                with rope_variant(model, variant, spec, len(prompt.ids), rope_impl) as impl:
                    answers.append(
                        first_integer(greedy(model, prompt.ids, cfg.max_new_tokens, decode))
                    )
                log.info(  # a trial of a long prompt takes minutes on a CPU
                    "%s passkey L=%d trial %d/%d: answer %s, key %d (%.0f s so far)",
                    label,
                    length,
                    n,
                    len(prompts[length]),
                    answers[-1],
                    prompt.key,
                    time.perf_counter() - start,
                )
        except OUT_OF_MEMORY as err:
            if not is_out_of_memory(err):
                raise
            reason = f"out of memory at L={length}: {str(err).splitlines()[0][:200]}"
            log.error("%s passkey: %s; recorded as skipped", label, reason)
            yield {**key, "status": "skipped", "reason": reason}
            continue
        record = trials_record(prompts[length], answers)
        right, trials = sum(record["correct"]), record["trials"]
        log.info("%s passkey L=%d: %d/%d right", label, length, right, trials)
        yield {**key, **record, "rope_impl": impl, "time_s": round(time.perf_counter() - start, 3)}
