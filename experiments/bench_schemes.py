"""Every label of the zoo timed side by side in one process: the trained schemes of
``experiment=zoo``, the eval-time variants of its rope run and its fine-tune (DroPE), at the
quick suite's shape.

    OMP_NUM_THREADS=1 python experiments/bench_schemes.py       # results/bench/schemes_cpu.*
    python experiments/bench_schemes.py --labels rope,fox --repeats 1 --out /tmp/bench

For each label: training tokens/s (a step of 32 x 64 tokens: AdamW, clipping; not for an
eval-time variant), evaluation tokens/s at 1024 tokens (8 windows: one forward pass of the
suite's 8192 tokens, ``eval.batch_tokens``) and at 8192 tokens (one window), every draw of a
scheme whose evaluation positions are random (``eval_draws``: randomized RoPE scores its tokens
4 times); the ratio of its time per token to rope's, model FLOPs utilisation against a matmul
peak measured in the same run, the peak tensor memory of a step or pass, and the FLOPs of an
evaluation pass counted by ``torch.utils.flop_counter`` (matrix products and SDPA: what a
scheme's own matrix products add, DAPE's MLP over every (i, j) above all).

Side by side: the labels are timed round-robin, ``--repeats`` rounds after a warm-up, and the
best of each kept, so that a shared machine slows them alike; report ratios to rope from the
same run, not absolute rates from different runs.

Model FLOPs (PaLM appendix B, as ``bench_throughput.py``): training 6 N + 12 n_layers d_model s
per token, evaluation 2 N + 4 n_layers d_model s, with N the non-embedding parameters; a scheme's
own work is not in them (its MFU is lower by what it adds). Peak memory: the largest sum of the
tensors a step or pass creates that are alive at once (``LiveTensors`` on the CPU: tensors
only, whatever the allocator keeps; the CUDA allocator's peak on a GPU): activations,
temporaries and gradients, not the parameters and optimizer state that were there before.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import weakref
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from pe_bench.conformance.cost import (
    eval_flops_per_token,
    eval_pass,
    matmul_params,
    timed,
    train_flops_per_token,
    train_step,
)
from pe_bench.errors import UserError
from pe_bench.files import atomic_write_text
from pe_bench.model.attention import attention_path
from pe_bench.model.gpt import GPT, ModelConfig, build_model
from pe_bench.provenance import provenance

sys.path.insert(0, str(Path(__file__).parent))
from bench_throughput import matmul_peak

EVAL_LENGTHS = (1024, 8192)


def zoo_labels() -> tuple[dict[str, dict], dict]:
    """Every label of ``experiment=zoo`` with its pe config (a variant's as ``rope+<key>``, a
    fine-tune's as ``rope:<key>``, as their records are labelled), in the sweep's order, and the
    model config, composed from ``conf/`` as pe-bench does."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(version_base="1.3", config_module="pe_bench.conf"):
            zoo = compose("config", overrides=["experiment=zoo"], return_hydra_config=True)
            names = str(zoo.hydra.sweeper.params.pe).split(",")
            labels = {}
            for name in names:
                cfg = compose("config", overrides=["experiment=zoo", f"pe={name}"])
                labels[name] = OmegaConf.to_container(cfg.pe, resolve=True)
            for key, pe in OmegaConf.to_container(zoo.eval.variants, resolve=True).items():
                labels[f"rope+{key}"] = pe
            for key, finetune in OmegaConf.to_container(zoo.finetunes, resolve=True).items():
                labels[f"rope:{key}"] = finetune["pe"]
            model = OmegaConf.to_container(zoo.model, resolve=True)
    finally:
        GlobalHydra.instance().clear()
    return labels, model


class LiveTensors(TorchDispatchMode):
    """The bytes of the tensors created under it and still alive, and their peak: each new
    storage counts from the op that returns it until it is freed (a view or an in-place op
    adds nothing; what a kernel allocates inside itself is not seen)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.seen = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and not tensor.is_meta:
                self.add(tensor.untyped_storage())
        return out

    def add(self, storage: torch.UntypedStorage) -> None:
        if storage in self.seen:
            return
        self.seen[storage] = size = storage.nbytes()
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self.free, size)

    def free(self, size: int) -> None:
        self.live -= size


def peak_memory_mb(step: Callable[[], object], device: torch.device) -> float:
    """Peak memory of the tensors one call of ``step`` creates, MB: the CUDA allocator's
    peak on a GPU (less what was allocated before), ``LiveTensors`` on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    with LiveTensors() as tracker:
        step()
    return tracker.peak / 2**20


def counted_gflop(step: Callable[[], object]) -> float:
    """GFLOPs of one call of ``step`` as ``FlopCounterMode`` counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return counter.get_total_flops() / 1e9


def build(labels: dict[str, dict], model_cfg: dict, args: argparse.Namespace) -> dict[str, GPT]:
    """A model per label (seed 0), on the device."""
    cfg = ModelConfig(**model_cfg)
    return {
        label: build_model(cfg, pe, args.train_len, seed=0).to(args.device)
        for label, pe in labels.items()
    }


def refusals(models: dict[str, GPT], lengths: list[int]) -> dict[tuple[str, str], str]:
    """(label, ``eval<L>``) -> why the scheme's config refuses that length, as a run would
    (``check_length``: a table of positions, randomized positions' range, leaky ReRoPE's k)."""
    refused = {}
    for label, model in models.items():
        for length in lengths:
            try:
                model.pe.check_length(length)
            except UserError as error:
                refused[(label, f"eval{length}")] = str(error)
    return refused


def steps_of(models: dict[str, GPT], args: argparse.Namespace) -> dict[tuple[str, str], Callable]:
    """(label, what) -> the call to time: ``train`` (trained schemes and fine-tunes: a
    fine-tune's steps are training steps with its scheme), ``eval<L>`` (the lengths its config
    serves)."""
    steps = {}
    refused = refusals(models, args.eval_lengths)
    for label, model in models.items():
        if "+" not in label:  # an eval-time variant is never trained; a fine-tune (DroPE) is
            steps[(label, "train")] = train_step(model, args.batch, args.train_len, args.device)
        for length in args.eval_lengths:
            if (label, f"eval{length}") not in refused:
                batch = max(1, args.eval_tokens // length)
                steps[(label, f"eval{length}")] = eval_pass(model, batch, length, args.device)
    return steps


def side_by_side(steps: dict, args: argparse.Namespace) -> dict[tuple[str, str], float]:
    """Seconds per call of every step: a warm-up, then ``args.repeats`` round-robin rounds,
    the best kept; progress on stderr."""
    best = dict.fromkeys(steps, float("inf"))
    for round_ in range(args.repeats + 1):
        for key, step in steps.items():
            seconds = timed(step, args.device, args.train_steps if key[1] == "train" else 1)
            if round_:  # round 0 warms up (first-call kernels, FlexAttention's compilation)
                best[key] = min(best[key], seconds)
        print(f"round {round_} of {args.repeats} done", file=sys.stderr, flush=True)
    return best


def rows_of(models: dict[str, GPT], steps: dict, best: dict, peak: float, args) -> list[dict]:
    """One row per label: rates, ratios to rope, MFU, peak memory, counted FLOPs."""
    rows = []
    for label, model in models.items():
        n, layers, width = matmul_params(model), model.cfg.num_layers, model.cfg.d_model
        draws = model.pe.eval_draws
        row = {"label": label, "path": attention_path(model.pe), "eval_draws": draws}
        for (owner, what), step in steps.items():
            if owner != label:
                continue
            seconds, rope = best[(label, what)], best[("rope", what)]
            if what == "train":
                tokens = args.batch * args.train_len * args.train_steps
                flop = tokens * train_flops_per_token(n, layers, width, args.train_len)
                seconds, rope = seconds * args.train_steps, rope * args.train_steps
            else:
                length = int(what.removeprefix("eval"))
                tokens = max(1, args.eval_tokens // length) * length
                flop = draws * tokens * eval_flops_per_token(n, layers, width, length)
                row[f"{what}_gflop"] = counted_gflop(step)
            row[f"{what}_tok_s"] = tokens / seconds
            row[f"{what}_x_rope"] = seconds / rope
            row[f"{what}_mfu"] = flop / seconds / 1e9 / peak
            row[f"{what}_peak_mb"] = peak_memory_mb(step, args.device)
        rows.append(row)
    return rows


def machine(device: torch.device) -> dict:
    """What the numbers depend on: provenance, the CPU's model and kernels, threads."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        **provenance(device),
        "cpu_model": cpu,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }


COLUMNS = {  # markdown column -> (row key, format)
    "train tok/s": ("train_tok_s", "{:,.0f}"),
    "train x rope": ("train_x_rope", "{:.2f}"),
    "train MB": ("train_peak_mb", "{:,.0f}"),
    "eval 1k tok/s": ("eval1024_tok_s", "{:,.0f}"),
    "eval 1k x rope": ("eval1024_x_rope", "{:.2f}"),
    "eval 1k MFU": ("eval1024_mfu", "{:.0%}"),
    "eval 1k MB": ("eval1024_peak_mb", "{:,.0f}"),
    "eval 1k GFLOP": ("eval1024_gflop", "{:,.1f}"),
    "eval 8k tok/s": ("eval8192_tok_s", "{:,.0f}"),
    "eval 8k x rope": ("eval8192_x_rope", "{:.2f}"),
    "eval 8k MB": ("eval8192_peak_mb", "{:,.0f}"),
}


def markdown(rows: list[dict], refused: dict[tuple[str, str], str]) -> str:
    """The rows as a markdown table (a missing value: an eval-time variant's training, or a
    length the scheme's config refuses, said below the table)."""
    head = ["label", "path", *COLUMNS]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join([":--"] * 2 + ["--:"] * len(COLUMNS)) + "|",
    ]
    for row in rows:
        cells = [row["label"], row["path"]]
        for key, fmt in COLUMNS.values():
            cells.append(fmt.format(row[key]) if key in row and pd.notna(row[key]) else "")
        lines.append("| " + " | ".join(cells) + " |")
    if refused:
        lines += ["", "Not evaluated: lengths the zoo's config of the scheme refuses.", ""]
        lines += [
            f"- {label} at {what[4:]} tokens: {why}" for (label, what), why in refused.items()
        ]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labels", help="comma-separated labels (default: every zoo label)")
    parser.add_argument("--train-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--train-steps", type=int, default=5, help="steps per timed window")
    parser.add_argument("--eval-lengths", default="1024,8192")
    parser.add_argument("--eval-tokens", type=int, default=8192, help="tokens per eval pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (best is kept)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    return parser


def main(argv: list[str] | None = None) -> None:
    """Time every label side by side, then write ``schemes_<device>.csv`` and ``.md``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.device = torch.device(args.device)
    args.eval_lengths = [int(x) for x in args.eval_lengths.split(",")]
    labels, model_cfg = zoo_labels()
    if args.labels:
        wanted = ["rope", *[x for x in args.labels.split(",") if x != "rope"]]
        unknown = sorted(set(wanted) - set(labels))
        if unknown:
            parser.error(f"unknown labels {', '.join(unknown)}; the zoo has {', '.join(labels)}")
        labels = {label: labels[label] for label in wanted}
    peak = matmul_peak(args.device, args.repeats)
    models = build(labels, model_cfg, args)
    steps = steps_of(models, args)
    best = side_by_side(steps, args)
    peak = max(peak, matmul_peak(args.device, args.repeats))  # the best seen, before and after
    rows = rows_of(models, steps, best, peak, args)
    refused = refusals(models, args.eval_lengths)
    for row in rows:  # the CSV says why a length is missing
        for (label, what), why in refused.items():
            if label == row["label"]:
                row[f"{what}_refused"] = why
    setup = {**machine(args.device), "peak_gflop_s": peak, "train_len": args.train_len}
    setup |= {"batch": args.batch, "eval_tokens": args.eval_tokens, "repeats": args.repeats}
    name = f"schemes_{args.device.type}"
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        args.out / f"{name}.csv", pd.DataFrame([r | setup for r in rows]).to_csv(index=False)
    )
    caption = (
        f"{setup['date']}, git {setup['git_sha'][:7]}, torch {setup['torch']}, "
        f"{setup['cpu_model'] if args.device.type == 'cpu' else setup['hardware']} "
        f"({setup['cpu_capability']}), {setup['threads']} thread(s), matmul peak "
        f"{peak:.0f} GFLOP/s; model {model_cfg['d_model']} x {model_cfg['num_layers']} layers\n\n"
    )
    table = caption + markdown(rows, refused)
    atomic_write_text(args.out / f"{name}.md", table)
    print(table)


if __name__ == "__main__":
    main()
