"""CUDA (bf16 autocast) against CPU (fp32) records of the same runs: seed 0 of a CPU folder and a
GPU folder trained on the same corpus (corpus_sha checked), perplexity per scheme and length.

    python experiments/gpu/compare_cpu.py results/quick results/gpu/quick_cuda
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from pe_bench.records import load_records


def records(folder: Path) -> pd.DataFrame:
    df = load_records(folder)
    df = df[(df["seed"] == 0) & (df["status"] == "ok")]
    df["label"] = df["scheme"] + df["variant"].map(lambda v: "" if v == "none" else f"+{v}")
    return df


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cpu", type=Path)
    parser.add_argument("gpu", type=Path)
    args = parser.parse_args(argv)
    cpu, gpu = records(args.cpu), records(args.gpu)
    shas = set(cpu["corpus_sha"]) | set(gpu["corpus_sha"])
    if len(shas) != 1:
        raise SystemExit(f"the folders score different corpora: {sorted(s[:12] for s in shas)}")
    keys = ["label", "eval_len", "mode"]
    both = cpu.merge(gpu, on=keys, suffixes=("_cpu", "_gpu"))
    both["ratio"] = both["ppl_gpu"] / both["ppl_cpu"]
    print(
        f"{args.gpu} ({gpu['hardware'].iloc[0]}, torch {gpu['torch'].iloc[0]}) over {args.cpu}"
        f" ({cpu['hardware'].iloc[0]}, torch {cpu['torch'].iloc[0]}), seed 0, corpus"
        f" {shas.pop()[:12]}: perplexity ratio GPU / CPU"
    )
    plain = both[both["mode"] == "nonoverlap"]
    table = plain.pivot_table(index="label", columns="eval_len", values="ratio")
    print(table.to_markdown(floatfmt=".3f"))
    far = plain[plain["eval_len"] == plain["eval_len"].max()]
    print(
        f"median |log ratio|: {np.log(both['ratio']).abs().median():.4f} over {len(both)} cells,"
        f" {np.log(far['ratio']).abs().median():.4f} at the longest length (nonoverlap windows)"
    )


if __name__ == "__main__":
    main()
