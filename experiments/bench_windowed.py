"""Time one attention layer of a pretrained model's shape under each windowed variant
(pe_bench/pretrained/windowed.py) against SDPA's causal attention, on random q, k and v.

    OMP_NUM_THREADS=1 python experiments/bench_windowed.py --lengths 8192,16384 \
        [--variants self_extend,dca,streaming_llm,lm_infinite,string] [--device cuda]

SmolLM2-135M's shape by default (9 heads of 64, 3 KV heads, context 8192, base 100000). Prints
one line per (variant, length): seconds of the best of ``--repeats`` runs, and of the first,
which also plans the blocks (once per forward pass, for all its layers).
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from pe_bench.positions import ModelDims, build_scheme
from pe_bench.pretrained import windowed


def seconds(run, repeats: int, device: str) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def bench(args: argparse.Namespace, length: int) -> None:
    """Print SDPA's and each variant's seconds at ``length`` tokens."""
    dims = ModelDims(args.heads * args.head_dim, args.heads, args.head_dim, 1, args.context)
    layer = SimpleNamespace(layer_idx=0)
    groups = args.heads // args.kv_heads
    q = torch.randn(1, args.heads, length, args.head_dim, device=args.device)
    k = torch.randn(1, args.kv_heads, length, args.head_dim, device=args.device)
    v = torch.randn(1, args.kv_heads, length, args.head_dim, device=args.device)
    keys, values = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    sdpa = lambda: F.scaled_dot_product_attention(q, keys, values, is_causal=True)  # noqa: E731
    seconds(sdpa, 1, args.device)  # warm-up
    took = seconds(sdpa, args.repeats, args.device)
    print(f"sdpa {length}: {took:.2f} s")
    for name in args.variants.split(","):
        scheme = build_scheme({"name": name, "base": args.base}, dims).to(args.device)
        windowed.plan.cache_clear()  # a forward pass plans once for all its layers

        def attend(scheme=scheme):
            windowed.windowed_attention(layer, q, k, v, None, scheme, args.head_dim**-0.5)

        first = seconds(attend, 1, args.device)
        took = seconds(attend, args.repeats, args.device)
        print(f"{name} {length}: {took:.2f} s ({first:.2f} s planning too)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="8192,16384")
    parser.add_argument("--variants", default="self_extend,dca,streaming_llm,lm_infinite,string")
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--base", type=float, default=100000.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    where = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"{where}, threads {torch.get_num_threads()}, {torch.backends.cpu.get_cpu_capability()}")
    with torch.no_grad():
        for length in (int(n) for n in args.lengths.split(",")):
            bench(args, length)


if __name__ == "__main__":
    main()
