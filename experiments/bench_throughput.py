"""Throughput benchmark: training and evaluation tokens/s per scheme, model FLOPs utilisation
against a matmul peak measured in the same run, and x-transformers side by side.

    pip install -e ".[bench]"
    python experiments/bench_throughput.py                       # d_model 256, the MFU target
    python experiments/bench_throughput.py --d-model 128 --layers 4 --heads 4 --seq-len 64
    python experiments/bench_throughput.py --schemes alibi,t5 --seq-len 128 --eval-factor 64 \
        --no-x-transformers --eval-attention flex     # 8192-token evaluation through FlexAttention

``--profile`` adds where a CPU training step's time goes (torch.profiler, self time per op): matmul
kernels, fused attention kernels, the optimizer step, and everything else; for both libraries.
Prints a table and writes a CSV (``--out``). Every number is the best of ``--repeats`` timed
windows (the fairest estimate on a shared machine); both libraries train the same shape on the
same batches with AdamW, gradient clipping and fp32 on CPU (bf16 autocast on GPU).

FLOPs per token (PaLM appendix B): training 6 N + 12 n_layers d_model s, evaluation
2 N + 4 n_layers d_model s, with N the non-embedding parameters (the output head included).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from pe_bench.conformance.cost import (
    eval_flops_per_token,
    matmul_params,
    train_flops_per_token,
)
from pe_bench.conformance.cost import timed as timed_window
from pe_bench.files import atomic_write_text
from pe_bench.model.gpt import ModelConfig, build_model
from pe_bench.provenance import provenance
from pe_bench.run.train import autocast

# Our scheme -> x-transformers Decoder keyword arguments for the same scheme.
XT_SCHEMES = {
    "nope": {},
    "learned": {},  # x-transformers' default absolute positional embedding
    "rope": {"rotary_pos_emb": True},
    "alibi": {"alibi_pos_bias": True},
    "t5": {"rel_pos_bias": True},
}


def matmul_peak(device: torch.device, repeats: int) -> float:
    """Best fp32 (bf16 on GPU) matmul GFLOP/s over a few square sizes on this machine now."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    best = 0.0
    for n in (512, 1024, 2048):
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        best = max(best, 2 * n**3 / timed(lambda a=a, b=b: a @ b, device, repeats, 5) / 1e9)
    return best


def timed(step: Callable[[], object], device: torch.device, repeats: int, iters: int) -> float:
    """Seconds per call of ``step``: the best of ``repeats`` windows of ``iters`` calls."""
    step()  # warm-up (allocations, first-call kernels)
    return min(timed_window(step, device, iters) for _ in range(repeats))


# Self-time op categories of a training-step profile (the first match wins); the optimizer is
# timed as a whole (its record function includes its ops: on CPU AdamW runs a per-parameter loop
# of plain element-wise ops); "other" is everything left (norms, activations, embeddings, loss).
PROFILE_CATEGORIES = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
    "attention": ("aten::_scaled_dot_product", "aten::_flash_attention", "aten::_efficient"),
}
OPTIMIZER_STEP = "Optimizer.step#"
STEP_PARTS = (*PROFILE_CATEGORIES, "optimizer", "other")


def profile_step(step: Callable[[], object], iters: int) -> dict[str, float]:
    """Milliseconds per call of ``step`` by op category (CPU time), and their total."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            step()
    ms = dict.fromkeys(STEP_PARTS, 0.0)
    total = 0.0
    for event in prof.key_averages():
        total += event.self_cpu_time_total / 1e3 / iters
        if event.key.startswith(OPTIMIZER_STEP):
            ms["optimizer"] += event.cpu_time_total / 1e3 / iters
            continue
        for category, prefixes in PROFILE_CATEGORIES.items():
            if event.key.startswith(prefixes):
                ms[category] += event.self_cpu_time_total / 1e3 / iters
                break
    ms["other"] = total - ms["matmul"] - ms["attention"] - ms["optimizer"]
    ms["total"] = total
    return ms


def pe_bench_model(scheme: str, args: argparse.Namespace) -> nn.Module:
    cfg = ModelConfig(d_model=args.d_model, num_layers=args.layers, num_heads=args.heads)
    return build_model(cfg, {"name": scheme}, args.seq_len, seed=0)


def x_transformers_model(scheme: str, args: argparse.Namespace) -> nn.Module:
    from x_transformers import Decoder, TransformerWrapper

    kwargs = XT_SCHEMES[scheme]
    return TransformerWrapper(
        num_tokens=256,
        max_seq_len=args.seq_len * args.eval_factor if scheme == "learned" else args.seq_len,
        use_abs_pos_emb=scheme == "learned",
        attn_layers=Decoder(
            dim=args.d_model,
            depth=args.layers,
            heads=args.heads,
            attn_dim_head=args.d_model // args.heads,  # the same shape as ours
            ff_mult=4,
            attn_flash="rel_pos_bias" not in kwargs,  # its T5 bias refuses the flash path
            **kwargs,
        ),
    )


def measure(
    library: str, scheme: str, args: argparse.Namespace, device: torch.device
) -> dict[str, float]:
    """Training and evaluation tokens/s of one library's model for one scheme."""
    torch.manual_seed(0)
    model = (pe_bench_model if library == "pe-bench" else x_transformers_model)(scheme, args)
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (args.batch, args.seq_len + 1), generator=generator).to(device)
    inputs, targets = x[:, :-1], x[:, 1:]

    def logits_of(idx: torch.Tensor) -> torch.Tensor:
        return model(idx)

    def train_step() -> None:
        with autocast(device):
            logits = logits_of(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    train_s = timed(train_step, device, args.repeats, args.steps)
    profiled = profile_step(train_step, args.steps) if args.profile else {}
    eval_len = args.seq_len * args.eval_factor
    eval_batch = max(1, args.eval_tokens // eval_len)
    window = torch.randint(0, 256, (eval_batch, eval_len), generator=generator).to(device)
    model.eval()
    if library == "pe-bench":
        model.cfg.attention = args.eval_attention
    with torch.no_grad(), autocast(device):
        eval_s = timed(lambda: logits_of(window), device, args.repeats, max(1, args.steps // 4))

    n = matmul_params(model)
    train_flops = train_flops_per_token(n, args.layers, args.d_model, args.seq_len)
    eval_flops = eval_flops_per_token(n, args.layers, args.d_model, eval_len)
    return {
        "train_tok_s": args.batch * args.seq_len / train_s,
        "eval_tok_s": eval_batch * eval_len / eval_s,
        "train_gflop_s": args.batch * args.seq_len * train_flops / train_s / 1e9,
        "eval_gflop_s": eval_batch * eval_len * eval_flops / eval_s / 1e9,
        "params": n,
        **{f"step_ms_{category}": ms for category, ms in profiled.items()},
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line: the model shape, the schemes, and how long and how often to time."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schemes", default="nope,learned,sinusoidal,t5,xl,rope,alibi")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--eval-factor", type=int, default=8, help="eval length / seq-len")
    parser.add_argument("--eval-tokens", type=int, default=8192, help="tokens per eval forward")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per window")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows (best is kept)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--eval-attention",
        choices=["sdpa", "flex"],
        default="sdpa",
        help="pe-bench's attention for evaluation (model.attention); training always uses sdpa",
    )
    parser.add_argument("--no-x-transformers", action="store_true")
    parser.add_argument(
        "--profile", action="store_true", help="also print where a CPU training step's time goes"
    )
    parser.add_argument("--out", type=Path, default=Path("bench_throughput.csv"))
    return parser


def main(argv: list[str] | None = None) -> None:
    """Time every scheme (and x-transformers' twin of it), a line each, then write the CSV."""
    parser = build_parser()
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.profile and device.type != "cpu":
        parser.error("--profile breaks down CPU steps; use --device cpu")
    peak = matmul_peak(device, args.repeats)
    compare = not args.no_x_transformers
    if compare:
        try:
            import x_transformers  # noqa: F401
        except ImportError:
            sys.exit('x-transformers is not installed: pip install -e ".[bench]"')
    print(
        f"device {device}, {torch.get_num_threads()} threads, matmul peak {peak:.1f} GFLOP/s; "
        f"d_model {args.d_model}, {args.layers} layers, {args.heads} heads, "
        f"L {args.seq_len}, batch {args.batch}, "
        f"eval L {args.seq_len * args.eval_factor} ({args.eval_attention})"
    )

    rows = []
    for scheme in args.schemes.split(","):
        # The peak is re-measured before every scheme and the best so far kept: a peak taken
        # while something else ran would inflate every MFU after it.
        peak = max(peak, matmul_peak(device, args.repeats))
        row = scheme_row(scheme, args, device, peak, compare)
        rows.append(row)
        print(format_row(row), flush=True)
    write_table(rows, args, device, compare)
    print(f"wrote {args.out}")


def scheme_row(
    scheme: str, args: argparse.Namespace, device: torch.device, peak: float, compare: bool
) -> dict:
    """One scheme's row: our rates and MFU against ``peak``, and with ``compare`` (where
    x-transformers has the scheme) its rates and our speedup over them."""
    ours = measure("pe-bench", scheme, args, device)
    row = {
        "scheme": scheme,
        **{f"ours_{k}": v for k, v in ours.items()},
        "ours_train_mfu": ours["train_gflop_s"] / peak,
        "ours_eval_mfu": ours["eval_gflop_s"] / peak,
        "peak_gflop_s": peak,
    }
    if compare and scheme in XT_SCHEMES:
        theirs = measure("x-transformers", scheme, args, device)
        row.update({f"xt_{k}": v for k, v in theirs.items()})
        row["train_speedup"] = ours["train_tok_s"] / theirs["train_tok_s"]
        row["eval_speedup"] = ours["eval_tok_s"] / theirs["eval_tok_s"]
    return row


def write_table(
    rows: list[dict], args: argparse.Namespace, device: torch.device, compare: bool
) -> None:
    """The rows as a CSV at ``args.out``, with provenance on every row: the CSV alone says
    what ran, where and on which code."""
    setup = {
        **provenance(device),
        "threads": torch.get_num_threads(),
        "x_transformers": version("x-transformers") if compare else None,
        # "device" is provenance's (cpu/cuda, with "hardware" beside it), not the raw argument
        **{k: v for k, v in vars(args).items() if k not in ("out", "schemes", "device")},
    }
    table = pd.DataFrame([{**row, **setup} for row in rows])
    atomic_write_text(args.out, table.to_csv(index=False))


def format_row(row: dict) -> str:
    text = (
        f"{row['scheme']:>10}: train {row['ours_train_tok_s']:>8.0f} tok/s "
        f"(MFU {row['ours_train_mfu']:.0%}), eval {row['ours_eval_tok_s']:>8.0f} tok/s "
        f"(MFU {row['ours_eval_mfu']:.0%})"
    )
    with contextlib.suppress(KeyError):
        text += (
            f" | x-transformers train {row['xt_train_tok_s']:>8.0f} tok/s, eval "
            f"{row['xt_eval_tok_s']:>8.0f} tok/s | ours/theirs train "
            f"{row['train_speedup']:.2f}x, eval {row['eval_speedup']:.2f}x"
        )
    for library, prefix in (("ours", "ours_"), ("x-transformers", "xt_")):
        if f"{prefix}step_ms_total" in row:
            parts = ", ".join(
                f"{category} {row[f'{prefix}step_ms_{category}']:.1f}" for category in STEP_PARTS
            )
            text += f"\n{'':>12}{library} step profile (ms): {parts}; total "
            text += f"{row[f'{prefix}step_ms_total']:.1f}"
    return text


if __name__ == "__main__":
    main()
