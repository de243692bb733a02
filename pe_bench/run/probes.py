"""Context-use probes: does a model *use* the context past its training length?

Perplexity at long lengths rewards a model for ignoring distant context: one that attends only
to its last L_train tokens extrapolates perfectly. These measures ask the question directly, on
every trained LM, eval-time variant (swapped in as for perplexity) and fine-tune, in the same
job, after perplexity (``eval.probes``; sizes under ``eval.*``, see ``EvalConfig``):

- ``context_gain`` (per eval length W > L_train): for targets at window offsets p >= L_train
  (p + 1 tokens of context), the loss with the whole window as context minus the loss of the
  same targets with only the last L_train tokens ``[p - L_train + 1 .. p]`` as context (one
  forward of L_train tokens per target), in bits per token, 95% CI over windows. Negative: the
  extra context helps; zero: it is ignored; positive: it hurts. An eval-time variant that
  scales with the context length (PI, NTK with s = W / L_train) runs the truncated forwards at
  L_train, i.e. as the trained rope: the gain says whether the variant at W beats simply
  truncating the context. L_train is the trained model's ``train.seq_len``, for fine-tuned
  models too, so that every label is asked about the same targets.
- ``retrieval`` (per distance D): a copy probe. A sequence is ``filler (P) + S + filler (D) +
  S`` with S a snippet of ``SNIPPET`` test tokens; the control replaces the first S by S',
  S's tokens in another order, so nothing can be copied (``copy_case`` says why S' keeps
  S's tokens). Retrieval gain = loss(control) - loss(copy) on tokens
  ``SKIP + 1 .. SNIPPET`` of the second S, in bits per token (positive: the model retrieves),
  95% CI over snippets; copy accuracy: the fraction of snippets whose every scored token is
  the argmax (teacher-forced). The same snippets and fillers at every distance and for every
  model (a fixed seed), so labels and distances are paired.
- ``attention`` (per eval length): mean attention distance sum_j a_ij (i - j) and attention
  entropy -sum_j a_ij ln a_ij per layer, averaged over heads and every query of a few windows.
  The weights are recomputed from each layer's own input with the scheme's hooks
  (``run.attention_weights``: ``transform_qk``, then the scheme's logits and weights by query
  chunks, its ``modify_logits`` and ``attention_weights`` included, as the model attends),
  since the fused kernels do not return them; a scheme that attends itself (``attend``)
  gives them as its output for the identity as values.

Each measurement is a record keyed like the perplexity records (``RECORD_KEY``) with ``mode``
the probe's name and ``eval_len`` the length of the sequences it runs (for ``retrieval`` P +
2 SNIPPET + D, with ``distance`` D), so a job folder caches, resumes and supersedes them as it
does perplexity records. Each record carries ``probe_hash``, a hash of the probe's settings:
the store drops records of another hash (``RunStore(probes=...)``), so a changed setting is
recomputed. Windows are spread evenly over the eval stream; a model with random evaluation
positions is probed with its first draw.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from pe_bench.config import config_hash
from pe_bench.errors import UserError
from pe_bench.model.gpt import GPT
from pe_bench.records import make_record
from pe_bench.run.attention_weights import observed_attention
from pe_bench.run.evaluate import (
    MODES,
    OUT_OF_MEMORY,
    EvalConfig,
    EvalTask,
    is_out_of_memory,
    scheme_swapped,
)
from pe_bench.run.train import autocast
from pe_bench.stats import t_interval

log = logging.getLogger(__name__)

SNIPPET = 16  # tokens of a copy-probe snippet
SKIP = 2  # its first tokens in the second occurrence, not scored: they point at the source
RETRIEVAL_SEED = 0  # the snippets and fillers: the same for every model, so labels pair
# Bump a probe's version when its method changes, so that stored records are recomputed.
VERSIONS = {"context_gain": 1, "retrieval": 1, "attention": 1}
LN2 = math.log(2)


@dataclass(frozen=True)
class ProbeTask(EvalTask):
    """One probe record to compute: ``mode`` is the probe, ``eval_len`` the sequence length."""

    count: int = 0  # windows (context_gain, attention) or snippets (retrieval)
    per_window: int = 0  # context_gain: targets scored per window
    context_len: int = 0  # context_gain: L_train, the truncated context
    distance: int = 0  # retrieval: D, the filler between the two occurrences


def probe_settings(cfg: EvalConfig) -> dict[str, dict[str, Any]]:
    """What each probe's numbers depend on besides the model, the length and the eval tokens."""
    return {
        "context_gain": {"windows": cfg.context_windows, "targets": cfg.context_targets},
        "retrieval": {"snippets": cfg.retrieval_snippets, "seed": RETRIEVAL_SEED}
        | {"snippet": SNIPPET, "skip": SKIP},
        "attention": {"windows": cfg.attention_windows},
    }


def probe_hashes(cfg: EvalConfig) -> dict[str, str]:
    """Probe name -> hash of its settings and method version, for the probes switched on."""
    settings = probe_settings(cfg)
    return {p: config_hash({**settings[p], "version": VERSIONS[p]}) for p in cfg.probes}


def probe_tasks(tasks: list[EvalTask], cfg: EvalConfig, train_len: int) -> list[ProbeTask]:
    """The probe tasks of every scheme (own or variant) that has perplexity tasks in ``tasks``
    (text LMs: none for a synthetic task's records), at their eval lengths."""
    text = [t for t in tasks if t.mode in MODES and not isinstance(t, ProbeTask)]
    if not text:
        return []
    lengths = sorted({t.eval_len for t in text})
    hashes = probe_hashes(cfg)
    shapes = {probe: probe_shapes(probe, cfg, lengths, train_len) for probe in cfg.probes}
    return [
        ProbeTask(
            task.variant,
            task.variant_hash,
            task.scheme,
            mode=probe,
            stride=shape["eval_len"],  # one sequence per measurement, no sliding
            tokens=task.tokens,
            probe_hash=hashes[probe],
            variant_source=task.variant_source,
            **shape,
        )
        for task in {(t.variant, t.variant_hash): t for t in text}.values()
        for probe in cfg.probes
        for shape in shapes[probe]
    ]


def probe_shapes(
    probe: str, cfg: EvalConfig, lengths: list[int], train_len: int
) -> list[dict[str, int]]:
    """The ``ProbeTask`` fields of each measurement of ``probe`` for a model evaluated at
    ``lengths``: context gain at the lengths past L_train, retrieval at each distance,
    attention at every length."""
    if probe == "context_gain":
        sizes = {"count": cfg.context_windows, "per_window": cfg.context_targets}
        return [
            {"eval_len": n, "context_len": train_len, **sizes} for n in lengths if n > train_len
        ]
    if probe == "retrieval":
        return [
            {"eval_len": copy_length(d), "count": cfg.retrieval_snippets, "distance": d}
            for d in retrieval_distances(cfg, train_len, max(lengths))
        ]
    return [{"eval_len": n, "count": cfg.attention_windows} for n in lengths]


def copy_length(distance: int) -> int:
    """Tokens of a copy-probe sequence: filler P = SNIPPET, S, D filler tokens, S."""
    return 3 * SNIPPET + distance


def retrieval_distances(cfg: EvalConfig, train_len: int, longest: int) -> list[int]:
    """The copy probe's distances D: ``eval.retrieval_distances``, or L_train/2, L_train, 2
    L_train ... 16 L_train, each capped so that a sequence fits in the longest eval length
    (a scheme is only asked to serve lengths it was checked for)."""
    most = longest - copy_length(0)
    if cfg.retrieval_distances is not None:
        for d in cfg.retrieval_distances:
            if d > most:
                raise UserError(
                    f"eval.retrieval_distances: {d} needs sequences of {copy_length(d)} tokens, "
                    f"more than the longest eval length {longest}; allowed: 1 to {most}"
                )
        return sorted(set(cfg.retrieval_distances))
    wanted = [max(1, train_len * 2**k // 2) for k in range(6)]  # L/2 .. 16 L
    return sorted({min(d, most) for d in wanted if min(d, most) >= 1})


# ---- running the probes ---------------------------------------------------------------------


@dataclass
class Measured:
    """The outcome of one ``ProbeTask``: its numbers, or why there are none."""

    task: ProbeTask
    label: str
    values: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""
    time_s: float = 0.0

    def record(self, fields: dict[str, Any]) -> dict[str, Any]:
        """An ok probe record: the probe's numbers, then its time."""
        return make_record(fields, self.task.fields(), "ok", **self.values, time_s=self.time_s)

    def summary(self) -> str:
        """The headline numbers, for the log."""
        v = self.values
        if "gain_bits" in v and "distance" in v:
            gain, acc = v["gain_bits"], v["copy_acc"]
            return f"D={v['distance']}: retrieval gain {gain:+.3f} bits, copy accuracy {acc:.2f}"
        if "gain_bits" in v:
            return f"context gain {v['gain_bits']:+.4f} bits/token ({v['targets']} targets)"
        distance = ", ".join(f"{d:.1f}" for d in v["mean_distance"])
        return f"mean attention distance per layer {distance}"


def run_probes(
    model: GPT,
    tasks: list[ProbeTask],
    stream: Tensor,
    test: Tensor,
    batch_tokens: int,
    device: torch.device,
    scheme_name: str,
    suffix: str = "",
) -> Iterator[Measured]:
    """Measure each task with ``model`` (a variant swapped in as for perplexity), one at a
    time, on the eval ``stream`` (windows) or the whole ``test`` split (copy-probe snippets and
    fillers); a task that runs out of memory is skipped with the reason and the others go on."""
    measure = {"context_gain": context_gain, "retrieval": retrieval, "attention": attention}
    model.eval()
    for task in tasks:
        variant = "" if task.variant == "none" else f"+{task.variant}"
        name = scheme_name + variant + suffix
        start = time.perf_counter()
        try:
            with scheme_swapped(model, task.scheme), torch.no_grad():
                model.pe.seed_eval_positions(0)
                text = test if task.mode == "retrieval" else stream
                values = measure[task.mode](model, text, task, batch_tokens, device)
        except OUT_OF_MEMORY as err:
            if not is_out_of_memory(err):
                raise
            reason = f"out of memory at L={task.eval_len}: {str(err).splitlines()[0][:200]}"
            log.error("%s %s: %s; recorded as skipped", name, task.mode, reason)
            yield Measured(task, name, skipped=reason)
            continue
        yield Measured(task, name, values, "", round(time.perf_counter() - start, 3))


def token_nll(model: GPT, x: Tensor, device: torch.device) -> tuple[Tensor, Tensor]:
    """Next-token loss (nats) and argmax of each position of ``x`` ``[b, s]`` but the last:
    ``[b, s - 1]`` each, on the CPU."""
    x = x.to(device)
    with autocast(device):
        logits = model(x[:, :-1]).float()
    nll = F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
    return nll.cpu(), logits.argmax(-1).cpu()


def batched_nll(model: GPT, rows: Tensor, batch_tokens: int, device: torch.device) -> Tensor:
    """``token_nll`` of every row of ``rows`` ``[n, s]``, ``batch_tokens // s`` rows at a time."""
    size = max(1, batch_tokens // rows.shape[1])
    return torch.cat(
        [token_nll(model, rows[i : i + size], device)[0] for i in range(0, len(rows), size)]
    )


def spread(n: int, total: int) -> list[int]:
    """``min(n, total)`` distinct indices in [0, total), evenly spaced from first to last."""
    n = min(n, total)
    return [i * (total - 1) // (n - 1) for i in range(n)] if n > 1 else [0] * n


def window_starts(stream: Tensor, length: int, n: int) -> list[int]:
    """Starts of ``n`` windows of ``length`` tokens (and their targets) spread over ``stream``."""
    return [i * length for i in spread(n, (len(stream) - 1) // length)]


def context_offsets(length: int, context_len: int, n: int) -> list[int]:
    """``n`` window offsets p in [context_len, length), evenly spaced (all when fewer)."""
    span = length - context_len
    return [context_len + i * span // min(n, span) for i in range(min(n, span))]


def context_gain(
    model: GPT, stream: Tensor, task: ProbeTask, batch_tokens: int, device: torch.device
) -> dict[str, Any]:
    """Full-window minus last-L_train-tokens loss of the targets at offsets >= L_train."""
    length, context = task.eval_len, task.context_len
    starts = window_starts(stream, length, task.count)
    offsets = torch.tensor(context_offsets(length, context, task.per_window))
    windows = torch.stack([stream[s : s + length + 1] for s in starts])  # inputs and targets
    full = batched_nll(model, windows, batch_tokens, device)[:, offsets]  # [w, t]
    # the target after offset p with the L_train tokens p - L_train + 1 .. p as its context
    ends = torch.tensor(starts).unsqueeze(1) + offsets  # [w, t]: the stream index of p
    index = ends.reshape(-1, 1) + torch.arange(-context + 1, 2)  # [w t, L_train + 1]
    truncated = batched_nll(model, stream[index], batch_tokens, device)[:, -1].view_as(full)
    per_window = ((full - truncated).double().mean(1) / LN2).tolist()
    _, gain, low, high = t_interval(per_window)
    return {
        "windows": len(starts),
        "targets": full.numel(),
        "context_len": context,
        "gain_bits": gain,
        "gain_ci_low": low,
        "gain_ci_high": high,
        "full_bits": float(full.double().mean()) / LN2,
        "truncated_bits": float(truncated.double().mean()) / LN2,
    }


@dataclass(frozen=True)
class CopyCase:
    """The copy probe's sequences at one distance: ``copy`` (S, filler, S) and ``control``
    (S', filler, S), ``[snippets, P + 2 SNIPPET + D]``, and the positions scored in both."""

    copy: Tensor
    control: Tensor
    scored: Tensor  # indices of the scored tokens: the second S's tokens SKIP + 1 .. SNIPPET


def snippet_starts(stream: Tensor, n: int, generator: torch.Generator) -> list[int]:
    """Starts of ``n`` non-overlapping snippets drawn at random, each with at least SNIPPET / 2
    distinct tokens (a run of spaces would be predictable with or without its copy)."""
    starts: list[int] = []
    for start in torch.randint(len(stream) - SNIPPET, (64 * n,), generator=generator).tolist():
        if any(abs(start - other) < SNIPPET for other in starts):
            continue
        if len(set(stream[start : start + SNIPPET].tolist())) >= SNIPPET // 2:
            starts.append(start)
            if len(starts) == n:
                return starts
    raise UserError(f"the test split has too few distinct snippets for {n} copy-probe snippets")


def copy_case(stream: Tensor, snippets: int, distance: int) -> CopyCase:
    """The sequences of the copy probe at ``distance`` from the token ``stream`` (the test
    split): snippet i is S, its S' is S's tokens in a random order, and filler i is text from
    a random start (read cyclically); the same at every distance.

    S' keeps S's tokens so that the control differs from the copy only in their order: with
    another snippet as S', merely having S's tokens in context (a unigram cache) lowers the
    loss of the second S, which the quick suite's models show at D = 32 as 0.04 to 0.18 bits
    that a shuffled S' removes (to within +-0.03): that is not retrieval."""
    generator = torch.Generator().manual_seed(RETRIEVAL_SEED)
    starts = torch.tensor(snippet_starts(stream, snippets, generator))
    fill_from = torch.randint(len(stream), (snippets, 1), generator=generator)
    source = stream[starts.unsqueeze(1) + torch.arange(SNIPPET)]  # [n, SNIPPET]
    other = torch.stack([shuffled(s, generator) for s in source])
    filler = stream[(fill_from + torch.arange(SNIPPET + distance)) % len(stream)]
    before, between = filler[:, :SNIPPET], filler[:, SNIPPET:]
    copy = torch.cat([before, source, between, source], dim=1).long()
    control = torch.cat([before, other, between, source], dim=1).long()
    second = 2 * SNIPPET + distance
    return CopyCase(copy, control, torch.arange(second + SKIP, second + SNIPPET))


def shuffled(snippet: Tensor, generator: torch.Generator) -> Tensor:
    """``snippet``'s tokens in a random order other than its own."""
    while True:
        other = snippet[torch.randperm(len(snippet), generator=generator)]
        if not torch.equal(other, snippet):
            return other


def retrieval(
    model: GPT, test: Tensor, task: ProbeTask, batch_tokens: int, device: torch.device
) -> dict[str, Any]:
    """Loss without minus with a copy source at distance D, and exact-match copy accuracy,
    on snippets and fillers from the ``test`` split."""
    case = copy_case(test, task.count, task.distance)
    rows = torch.cat([case.copy, case.control])
    size = max(1, batch_tokens // rows.shape[1])
    nll, hit = [], []
    for i in range(0, len(rows), size):
        loss, argmax = token_nll(model, rows[i : i + size], device)
        at = case.scored - 1  # the prediction of token j is made at j - 1
        nll.append(loss[:, at])
        hit.append((argmax[:, at] == rows[i : i + size, case.scored]).all(1))
    nll_all, exact = torch.cat(nll).double() / LN2, torch.cat(hit).double()
    copy, control = nll_all[: task.count].mean(1), nll_all[task.count :].mean(1)
    _, gain, low, high = t_interval((control - copy).tolist())
    return {
        "distance": task.distance,
        "snippets": task.count,
        "targets": task.count * (SNIPPET - SKIP),
        "gain_bits": gain,
        "gain_ci_low": low,
        "gain_ci_high": high,
        "copy_bits": float(copy.mean()),
        "control_bits": float(control.mean()),
        "copy_acc": float(exact[: task.count].mean()),
        "control_acc": float(exact[task.count :].mean()),
    }


def attention(
    model: GPT, stream: Tensor, task: ProbeTask, batch_tokens: int, device: torch.device
) -> dict[str, Any]:
    """Mean attention distance and entropy (nats) per layer over a few windows of one length."""
    length = task.eval_len
    starts = window_starts(stream, length, task.count)
    windows = torch.stack([stream[s : s + length] for s in starts])
    size = max(1, batch_tokens // length)
    with observed_attention(model) as sums:
        for i in range(0, len(windows), size):
            with autocast(device):
                model(windows[i : i + size].to(device))
    return {
        "windows": len(starts),
        "targets": len(starts) * length,
        "mean_distance": [d / n for d, n in zip(sums.distance, sums.queries, strict=True)],
        "entropy": [e / n for e, n in zip(sums.entropy, sums.queries, strict=True)],
    }
