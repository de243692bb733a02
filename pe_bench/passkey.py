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
import math
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure
from torch import nn

from pe_bench import aggregate, plots
from pe_bench.config import Range, check_fields, config_hash, from_node
from pe_bench.errors import UserError
from pe_bench.evaluate import OUT_OF_MEMORY, EvalTask, is_out_of_memory
from pe_bench.results import atomic_write_text
from pe_bench.train import autocast

if TYPE_CHECKING:
    from pe_bench.hf import HFRun, RopeSpec, Variant

log = logging.getLogger(__name__)

MODE = "passkey"  # the mode of its records
VERSION = 1  # bump when the method changes: stored records are recomputed
TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there."
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
QUESTION = "What is the pass key? The pass key is"
KEYS = (1, 50000)  # the key is drawn from this range, both ends included
Z95 = 1.959963984540054  # the 97.5% normal quantile


@dataclass
class PasskeyConfig:
    """``model.passkey`` in ``conf/model/hf.yaml``."""

    factors: list[Annotated[float, Range(gt=0)]] = field(default_factory=lambda: [0.5, 1, 2, 4])
    lengths: list[Annotated[int, Range(ge=1)]] | None = None  # tokens; default: factors x L
    trials: Annotated[int, Range(ge=1)] = 10  # prompts per length (the CI is over them)
    depth_bins: Annotated[int, Range(ge=1)] = 5  # rows of the depth x length figure
    max_new_tokens: Annotated[int, Range(ge=1)] = 10  # as the originals
    seed: int = 0

    def __post_init__(self) -> None:
        check_fields(self, "model.passkey")

    def prompt_lengths(self, train_len: int) -> list[int]:
        """Sorted distinct target lengths in tokens."""
        return sorted(set(self.lengths or [round(f * train_len) for f in self.factors]))


def parse_config(node: dict[str, Any] | None) -> PasskeyConfig | None:
    """``model.passkey`` (null: no passkey test)."""
    return None if node is None else from_node(PasskeyConfig, node, "model.passkey")


def settings_hash(cfg: PasskeyConfig) -> str:
    """What a passkey record's numbers depend on besides the model, variant and length."""
    settings = asdict(cfg)
    for key in ("factors", "lengths", "depth_bins"):  # which lengths, and the figure: not the test
        settings.pop(key)
    return config_hash({**settings, "version": VERSION})


def tasks(
    cfg: PasskeyConfig, schemes: list[tuple[str, str, Any]], train_len: int
) -> list[EvalTask]:
    """One task per (variant, target length); ``stride`` is the length (one prompt each)."""
    return [
        EvalTask(variant, digest, scheme, length, MODE, length)
        for variant, digest, scheme in schemes
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


def wilson(hits: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a proportion ``hits / n`` (never outside [0, 1])."""
    p = hits / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def run(
    model: nn.Module,
    tokenizer: Any,
    todo: list[EvalTask],
    variants: dict[str, Variant],
    spec: RopeSpec,
    job: HFRun,
    cfg: PasskeyConfig,
) -> Iterator[dict[str, Any]]:
    """The record of each task: every trial's prompt answered greedily by the model with the
    task's variant (skipped, with the reason, when a length does not fit in memory)."""
    from pe_bench.hf import rope_variant

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
        label = job.short_name + ("" if variant is None else f"+{variant.key}")
        key = {**task.fields(cfg.trials), "probe_hash": settings_hash(cfg)}
        start = time.perf_counter()
        answers, impl = [], "none"
        try:
            for prompt in prompts[length]:
                with rope_variant(
                    model, variant, spec, len(prompt.ids), job.model.rope_impl
                ) as impl:
                    answers.append(
                        first_integer(greedy(model, prompt.ids, cfg.max_new_tokens, decode))
                    )
        except OUT_OF_MEMORY as err:
            if not is_out_of_memory(err):
                raise
            reason = f"out of memory at L={length}: {str(err).splitlines()[0][:200]}"
            log.error("%s passkey: %s; recorded as skipped", label, reason)
            yield {**key, "status": "skipped", "reason": reason}
            continue
        correct = [int(a == p.key) for a, p in zip(answers, prompts[length], strict=True)]
        low, high = wilson(sum(correct), len(correct))
        acc = sum(correct) / len(correct)
        log.info("%s passkey L=%d: %d/%d right", label, length, sum(correct), len(correct))
        yield {
            **key,
            "status": "ok",
            "passkey_acc": acc,
            "ci_low": low,
            "ci_high": high,
            "trials": len(correct),
            "correct": correct,
            "depth": [p.depth for p in prompts[length]],
            "prompt_tokens": [len(p.ids) for p in prompts[length]],
            "key": [p.key for p in prompts[length]],
            "answer": answers,
            "rope_impl": impl,
            "time_s": round(time.perf_counter() - start, 3),
        }


# ---- the report's section ----------------------------------------------------------------------


def passkey_rows(records: pd.DataFrame) -> pd.DataFrame:
    """The ok passkey records of ``records``, labelled as the report labels them."""
    if "mode" not in records:
        return pd.DataFrame()
    rows = records[records["mode"] == MODE]
    if "status" in rows:
        rows = rows[rows["status"].fillna("ok") == "ok"]
    return rows.assign(label=aggregate.label(rows)) if len(rows) else pd.DataFrame()


def accuracy_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (label, length): trials, accuracy and its 95% Wilson interval, over every trial of
    the label's records at that length (seeds or slices pooled)."""
    cells = []
    for (lab, length), at in rows.groupby(["label", "eval_len"]):
        correct = [c for trial in at["correct"] for c in trial]
        low, high = wilson(sum(correct), len(correct))
        cells.append([lab, int(length), len(correct), sum(correct) / len(correct), low, high])
    table = pd.DataFrame(cells, columns=["label", "eval_len", "trials", "acc", "ci_low", "ci_high"])
    return _in_order(table, rows, "eval_len")


def depth_table(rows: pd.DataFrame, bins: int) -> pd.DataFrame:
    """Per (label, length, depth bin): trials and accuracy, the depth x length figure's cells."""
    trials = rows[["label", "eval_len", "depth", "correct"]].explode(["depth", "correct"])
    trials = trials.astype({"depth": float, "correct": float, "eval_len": int})
    edges = np.linspace(0, 1, bins + 1)
    trials = trials.assign(bin=np.clip(np.digitize(trials["depth"], edges) - 1, 0, bins - 1))
    table = trials.groupby(["label", "eval_len", "bin"], as_index=False).agg(
        trials=("correct", "size"), acc=("correct", "mean")
    )
    table = table.assign(depth_low=edges[table["bin"]], depth_high=edges[table["bin"] + 1])
    return _in_order(table.drop(columns="bin"), rows, "eval_len", "depth_low")


def _in_order(table: pd.DataFrame, rows: pd.DataFrame, *by: str) -> pd.DataFrame:
    order = {lab: i for i, lab in enumerate(aggregate.label_order(rows))}
    ranked = table.assign(rank=table["label"].map(order))
    return ranked.sort_values(["rank", *by]).drop(columns="rank").reset_index(drop=True)


def accuracy_markdown(table: pd.DataFrame, train_len: int) -> str:
    """Accuracy [95% interval] per label (rows) and target length (columns)."""
    from pe_bench.report import markdown_table

    lengths = sorted(table["eval_len"].unique())
    header = ["label", *[f"{n} ({n / train_len:g}x)" for n in lengths]]
    rows = []
    for lab, at in table.groupby("label", sort=False):
        cells = {
            int(r.eval_len): f"{r.acc:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]"
            for r in at.itertuples()
        }
        rows.append([lab, *[cells.get(n, "") for n in lengths]])
    return markdown_table(header, rows, "l" + "r" * len(lengths))


def depth_figure(table: pd.DataFrame, train_len: int) -> Figure:
    """One heatmap per label: accuracy by depth (rows) and target length (columns)."""
    import seaborn as sns

    labels = list(dict.fromkeys(table["label"]))
    cols = min(3, len(labels))
    grid_rows = math.ceil(len(labels) / cols)
    lengths = sorted(table["eval_len"].unique())
    fig = Figure(
        figsize=(1.2 + cols * (0.55 * len(lengths) + 1.2), 0.6 + grid_rows * 2.4),
        layout="constrained",
    )
    axes = np.atleast_1d(fig.subplots(grid_rows, cols, squeeze=False)).ravel()
    for ax, lab in zip(axes, labels, strict=False):
        cells = table[table["label"] == lab].assign(
            depth=lambda t: [
                f"{lo:.1f}-{hi:.1f}" for lo, hi in zip(t["depth_low"], t["depth_high"], strict=True)
            ]
        )
        grid = cells.pivot(index="depth", columns="eval_len", values="acc").reindex(columns=lengths)
        sns.heatmap(grid, ax=ax, vmin=0, vmax=1, cmap="viridis", annot=True, fmt=".1f", cbar=False)
        ax.set_title(lab)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("key depth")
        ax.tick_params(axis="y", rotation=0)
    for ax in axes[len(labels) :]:
        ax.set_visible(False)
    fig.suptitle(f"Passkey accuracy by depth and length (pretraining context {train_len})")
    return fig


def section(records: pd.DataFrame, out: Path, bins: int = 5) -> list[str]:
    """The report's passkey section (writes tables/passkey*.csv|.md and figures/passkey.*):
    markdown lines, none without passkey records."""
    from pe_bench.report import write_csv

    rows = passkey_rows(records)
    if rows.empty:
        return []
    train_len = int(rows["train_len"].iloc[0])
    table = accuracy_table(rows)
    depths = depth_table(rows, bins)
    text = accuracy_markdown(table, train_len)
    write_csv(out / "tables" / "passkey.csv", table)
    write_csv(out / "tables" / "passkey_depth.csv", depths)
    atomic_write_text(out / "tables" / "passkey.md", text + "\n")
    with plots.theme():
        png = plots.save(depth_figure(depths, train_len), out / "figures", "passkey")
    tokens = rows["prompt_tokens"].explode().astype(int)
    return [
        "## Passkey retrieval",
        "",
        "Mohtashami & Jaggi (2023), as in landmark-attention's `run_test.py` and YaRN's "
        "`eval/passkey.py`: a key from 1 to 50000 in filler text at a random depth, greedy "
        "decoding, exact match on the first integer. Accuracy over trials with its 95% Wilson "
        f"interval; columns are target prompt lengths in tokens (x the pretraining context "
        f"{train_len}); prompts have {tokens.min()} to {tokens.max()} tokens, and every label "
        "answers the same prompts.",
        "",
        text,
        "",
        f"![passkey accuracy by depth and length]({png.relative_to(out).as_posix()})",
        "",
    ]
