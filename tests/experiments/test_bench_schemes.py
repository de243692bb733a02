"""experiments/bench_schemes.py on toy lengths: every zoo label is there, each rate comes with
its ratio to rope from the same run, and the table carries its provenance."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

SCRIPT = Path(__file__).parents[2] / "experiments" / "bench_schemes.py"
ZOO = Path(__file__).parents[2] / "conf" / "experiment" / "zoo.yaml"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_schemes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench_throughput", None)


@pytest.mark.slow  # 14 s: hydra composes the zoo's configs
def test_the_labels_are_the_zoo_s(bench):
    """conf/experiment/zoo.yaml is the one list: its sweep's schemes in its order, each with
    its own pe config, then rope+<key> for RoPE and each eval-time variant it adds, then
    rope:<key> for each fine-tune (DroPE: the scheme it recalibrates with)."""
    labels, model = bench.zoo_labels()
    zoo = OmegaConf.load(ZOO)
    sweep = zoo.hydra.sweeper.params.pe.split(",")
    trained = [label for label in labels if "+" not in label and ":" not in label]
    assert labels["rope:drope"]["name"] == "drope" and list(labels)[-1] == "rope:drope"
    assert trained == sweep and trained[:2] == ["nope", "sinusoidal"]
    assert all(labels[name]["name"] == name for name in trained)
    added = [key.rpartition(".")[2] for entry in zoo.defaults for key in entry if "@eval" in key]
    assert {f"rope+{key}" for key in added} <= set(list(labels)[len(trained) :])
    assert labels["rope+rerope"]["name"] == "rerope" and labels["rope+pi"]["name"] == "pi"
    assert (model["d_model"], model["num_layers"], model["num_heads"]) == (128, 4, 4)


@pytest.mark.slow  # 25 s: the zoo's configs, then a toy run
def test_toy_run_writes_rates_ratios_memory_and_provenance(bench, tmp_path, capsys):
    args = "--labels fox,stickbreaking,rope+pi --train-len 8 --batch 2 --train-steps 1"
    bench.main(
        [
            *args.split(),
            "--eval-lengths",
            "16,32",
            "--eval-tokens",
            "64",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    rows = pd.read_csv(tmp_path / "schemes_cpu.csv").set_index("label")
    assert list(rows.index) == ["rope", "fox", "stickbreaking", "rope+pi"]
    assert rows.loc["rope", ["train_x_rope", "eval16_x_rope", "eval32_x_rope"]].tolist() == [
        1,
        1,
        1,
    ]
    assert pd.isna(rows.loc["rope+pi", "train_tok_s"])  # an eval-time variant is not trained
    assert rows.loc["fox", "path"] == "key_bias" and rows.loc["stickbreaking", "path"] == "explicit"
    assert (rows[["eval32_tok_s", "eval32_peak_mb", "eval32_gflop", "eval32_mfu"]] > 0).all().all()
    assert rows["cpu_capability"].iloc[0] == torch.backends.cpu.get_cpu_capability()
    assert rows["git_sha"].notna().all() and (rows["threads"] >= 1).all()
    table = (tmp_path / "schemes_cpu.md").read_text()
    assert (
        "| stickbreaking | explicit |" in table
        and table == capsys.readouterr().out.rstrip("\n") + "\n"
    )


@pytest.mark.slow
def test_live_tensors_count_what_a_call_keeps_alive_at_once(bench):
    with bench.LiveTensors() as tracker:
        a = torch.zeros(1000)  # 4000 bytes
        b = torch.zeros(500)  # 2000 more: 6000 at once
        del a
        c = b.view(5, 100)  # a view adds nothing
        d = torch.zeros(250)  # 1000 after a was freed: 3000 live
    assert tracker.peak == 6000 and tracker.live == 3000
    del b, c, d


@pytest.mark.slow
def test_a_length_the_scheme_refuses_is_left_out_and_said(bench):
    """randomized RoPE draws positions from [0, 32 x L_train): a longer window is refused as a
    run refuses it (it crashed the benchmark in apply_rotary), and the table says why."""
    from argparse import Namespace

    from pe_bench.model.gpt import ModelConfig, build_model

    cfg = ModelConfig(d_model=16, num_layers=1, num_heads=2, mlp_ratio=1)
    models = {
        name: build_model(cfg, {"name": name}, 8, seed=0) for name in ("rope", "randomized_rope")
    }
    args = Namespace(
        train_len=8, batch=2, eval_lengths=[16, 512], eval_tokens=512, device=torch.device("cpu")
    )
    steps = bench.steps_of(models, args)
    assert ("randomized_rope", "eval16") in steps and ("rope", "eval512") in steps
    assert ("randomized_rope", "eval512") not in steps
    refused = bench.refusals(models, args.eval_lengths)
    assert list(refused) == [("randomized_rope", "eval512")]
    text = bench.markdown([{"label": "randomized_rope", "path": "causal"}], refused)
    assert (
        "- randomized_rope at 512 tokens: scheme 'randomized_rope' cannot serve length 512: "
        "it has 256 positions (raise pe.max_len)" in text
    )
