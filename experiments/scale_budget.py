"""What a scale ladder costs, rung by rung, from each rung's model FLOPs.

    python experiments/scale_budget.py experiment=scale_gpu --vocab 50257
    python experiments/scale_budget.py experiment=scale_gpu --vocab 50257 --measured g124m=375000
    python experiments/scale_budget.py experiment=scale --peak 7e10 --mfu 0.5   # this CPU

Composes the experiment as ``pe-bench`` would, applies each rung of its sweep (``conf/rung``),
builds the rung's model on the meta device (no memory, no weights) and prints a markdown table:
parameters, training FLOPs per token (6 N + 12 n_layers d_model s, as
``experiments/bench_throughput.py`` measures utilisation), the FLOPs and hours of one scheme's
training, and of the whole rung (labels x seeds). A rung's hours come from the throughput you
measured at its shape (``--measured RUNG=TOKENS_PER_S``, e.g. bench_throughput's train tok/s;
results/gpu/README.md has g124m's on an H200) or, where none is given, from a peak (``--peak``,
FLOP/s; default an H100's 989e12 dense bf16) times a model FLOP utilisation (``--mfu``): an
assumption the table names (small models reach far less: measure). Evaluation (1x-16x on the
eval tokens) is under 2% of training at these budgets and left out.
"""

from __future__ import annotations

import argparse

import torch
from hydra import compose, initialize_config_module
from omegaconf import DictConfig, OmegaConf

from pe_bench.conformance.cost import matmul_params, train_flops_per_token
from pe_bench.model.gpt import ModelConfig, build_model
from pe_bench.report.markdown import markdown_table

SEEDS = 3


def rungs_of(overrides: list[str]) -> tuple[list[str], list[str], DictConfig]:
    """The experiment's rungs and labels (its sweep's ``rung`` and ``pe`` values) and its config."""
    with initialize_config_module(version_base="1.3", config_module="pe_bench.conf"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    params = cfg.hydra.sweeper.get("params") or {}
    if "rung" not in params:
        raise SystemExit(f"{' '.join(overrides)}: no rung sweep (hydra.sweeper.params.rung)")
    return str(params["rung"]).split(","), str(params.get("pe", "rope")).split(","), cfg


def rung_cost(overrides: list[str], rung: str, vocab: int) -> dict[str, float]:
    """The model and training budget of one rung."""
    with initialize_config_module(version_base="1.3", config_module="pe_bench.conf"):
        cfg = compose("config", overrides=[*overrides, f"rung={rung}"])
    model_cfg = ModelConfig(**{**OmegaConf.to_container(cfg.model), "vocab_size": vocab})
    with torch.device("meta"):
        model = build_model(model_cfg, {"name": "nope"}, cfg.train.seq_len, 0)
    n = matmul_params(model)
    per_token = train_flops_per_token(n, model_cfg.num_layers, model_cfg.d_model, cfg.train.seq_len)
    tokens = cfg.train.steps * cfg.train.batch_size * cfg.train.seq_len
    return {
        "params": model.num_params()["params"],
        "matmul": n,
        "seq_len": cfg.train.seq_len,
        "tokens": tokens,
        "flop_token": per_token,
        "flop": per_token * tokens,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "overrides", nargs="+", help="pe-bench overrides, e.g. experiment=scale_gpu"
    )
    parser.add_argument("--vocab", type=int, default=256, help="the tokenizer's vocabulary size")
    parser.add_argument("--peak", type=float, default=989e12, help="peak FLOP/s (H100 bf16)")
    parser.add_argument("--mfu", type=float, default=0.4, help="model FLOP utilisation assumed")
    parser.add_argument(
        "--measured",
        action="append",
        default=[],
        metavar="RUNG=TOKENS_PER_S",
        help="training throughput measured at a rung's shape (repeatable)",
    )
    args = parser.parse_args(argv)
    rungs, labels, _ = rungs_of(args.overrides)
    measured = measured_rates(args.measured, rungs)
    rows, total = [], 0.0
    for rung in rungs:
        cost = rung_cost(args.overrides, rung, args.vocab)
        seconds = (
            cost["tokens"] / measured[rung]
            if rung in measured
            else cost["flop"] / (args.peak * args.mfu)
        )
        rung_hours = seconds * len(labels) * SEEDS / 3600
        total += rung_hours
        params, matmul, tokens = (f"{cost[k] / 1e6:.1f}M" for k in ("params", "matmul", "tokens"))
        flops = (f"{cost['flop_token'] / 1e9:.3f}", f"{cost['flop']:.2e}")
        hours = (f"{seconds / 3600:.2f}", f"{rung_hours:.1f}")
        rows.append([rung, params, matmul, str(cost["seq_len"]), tokens, *flops, *hours])
    header = ["rung", "params", "matmul params", "L_train", "train tokens", "GFLOP/token"]
    header += ["FLOP/scheme", "h/scheme", f"h/rung ({len(labels)} labels x {SEEDS} seeds)"]
    print(markdown_table(header, rows, "lrrrrrrrr"))
    how = [f"{rung} at a measured {rate:.3g} tokens/s" for rung, rate in measured.items()]
    if len(measured) < len(rungs):
        how.append(
            f"{'the others' if measured else 'every rung'} at {args.mfu:.0%} of"
            f" {args.peak:.3g} FLOP/s (assumed, not measured)"
        )
    print(f"\nhours: {'; '.join(how)}; the whole ladder: {total:.1f} h")


def measured_rates(pairs: list[str], rungs: list[str]) -> dict[str, float]:
    """``RUNG=TOKENS_PER_S`` pairs, each naming a rung of the sweep."""
    rates = {}
    for pair in pairs:
        rung, _, rate = pair.partition("=")
        try:
            rates[rung] = float(rate)
        except ValueError:
            raise SystemExit(f"--measured {pair!r}: expected RUNG=TOKENS_PER_S") from None
        if rung not in rungs or rates[rung] <= 0:
            raise SystemExit(f"--measured {pair!r}: rung one of {', '.join(rungs)}, rate > 0")
    return rates


if __name__ == "__main__":
    main()
