"""Score trained checkpoints with this tree's code, as JSON lines: run it from two trees (two
virtual environments) on the same job folders to see that a change of code keeps the numbers.

    OMP_NUM_THREADS=1 python experiments/score_checkpoints.py OUT/pe=fox OUT/pe=cope ... \
        --lengths 1024,8192 --tokens 16384 [--variants rerope,self_extend] > scores.jsonl

Each job folder's ``config.yaml`` names the scheme, model and data; its ``checkpoint.pt`` holds
the trained weights. Every length scores the first ``--tokens`` test targets with
non-overlapping windows (``run.evaluate.score``); ``--variants`` also scores the eval-time
variants of a rope checkpoint (from ``eval.variants`` of its config). Prints one line per
(folder, variant, length): the NLL in nats and the seconds it took.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from pe_bench.data.corpus import eval_stream, load_corpus
from pe_bench.model.gpt import ModelConfig, build_model
from pe_bench.run.evaluate import score


def scored(folder: Path, variant: str | None, lengths: list[int], tokens: int) -> list[dict]:
    """The NLL of the folder's checkpoint (with ``variant``'s scheme swapped in) per length."""
    cfg = OmegaConf.load(folder / "config.yaml")
    pe = OmegaConf.to_container(cfg.pe if variant is None else cfg.eval.variants[variant])
    model_cfg = {k: v for k, v in OmegaConf.to_container(cfg.model).items() if k != "name"}
    model = build_model(ModelConfig(**model_cfg), pe, cfg.train.seq_len, seed=0)
    state = torch.load(folder / "checkpoint.pt", map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"], strict=variant is None)
    corpus = load_corpus(OmegaConf.to_container(cfg.data, resolve=True))
    stream = eval_stream(corpus, tokens)
    rows = []
    for length in lengths:
        start = time.perf_counter()
        result = score(model, stream, length, batch_tokens=8192)
        seconds = time.perf_counter() - start
        rows.append(
            {
                "folder": folder.name,
                "variant": variant,
                "length": length,
                "nll": result.nll,
                "seconds": round(seconds, 2),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--lengths", default="1024,8192")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--variants", default="", help="eval-time variants of a rope folder")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    for folder in args.folders:
        cfg = OmegaConf.load(folder / "config.yaml")
        variants = [None]
        if cfg.pe.name == "rope" and args.variants:
            variants += args.variants.split(",")
        for variant in variants:
            for row in scored(folder, variant, lengths, args.tokens):
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
