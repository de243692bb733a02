"""The scale ladders: experiment=scale's rungs change one thing each and its quick rung is the
quick suite's run; experiment=scale_gpu composes, its first rung trains on the CPU, and
experiments/scale_budget.py prices each rung from its FLOPs."""

from __future__ import annotations

import importlib.util
import sysconfig
from pathlib import Path

import pytest

from pe_bench.run.plan import plan
from tests.helpers import compose, pe_bench

ROOT = Path(__file__).parents[2]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rungs(experiment: str) -> list[str]:
    return str(compose(f"experiment={experiment}", hydra=True).hydra.sweeper.params.rung).split(",")


def test_each_cpu_rung_trains_the_same_tokens_and_changes_one_thing():
    quick = compose("experiment=scale", "rung=quick", "pe=rope")
    assert rungs("scale") == ["d64", "quick", "d256", "L32", "L128"]
    for rung in rungs("scale"):
        cfg = compose("experiment=scale", f"rung={rung}", "pe=rope")
        assert cfg.train.batch_size * cfg.train.seq_len == 2048  # tokens per step
        assert cfg.train.steps == 600 and cfg.eval.factors == [1, 2, 4, 8, 16]
        assert cfg.model.d_model // cfg.model.num_heads == 32  # head_dim as the quick model
        changed = {
            key
            for key in ("d_model", "num_layers", "seq_len")
            if (cfg.model.get(key) or cfg.train.get(key))
            != (quick.model.get(key) or quick.train.get(key))
        }
        assert len(changed) <= 1, (rung, changed)


def test_the_quick_rung_is_the_quick_suites_run():
    for pe in ("rope", "alibi", "learned"):
        ladder = plan(compose("experiment=scale", "rung=quick", f"pe={pe}"))
        assert ladder.run_id == plan(compose("experiment=quick", f"pe={pe}")).run_id


def test_the_width_rungs_span_16x_in_non_embedding_parameters():
    budget = load_script("scale_budget")
    small, wide = (budget.rung_cost(["experiment=scale"], r, 256) for r in ("d64", "d256"))
    embed = {r: 2 * 256 * d for r, d in (("d64", 64), ("d256", 256))}  # untied in and out
    ratio = (wide["params"] - embed["d256"]) / (small["params"] - embed["d64"])
    assert ratio == pytest.approx(16, rel=0.01)


def test_the_budget_is_the_flops_of_each_rungs_model(capsys):
    budget = load_script("scale_budget")
    cost = budget.rung_cost(["experiment=scale_gpu"], "g354m", 50257)
    assert 350e6 < cost["params"] < 360e6  # GPT-2 medium's shape, its vocabulary tied
    assert cost["flop_token"] == 6 * cost["matmul"] + 12 * 24 * 1024 * 512
    assert cost["flop"] == cost["flop_token"] * 20000 * 32 * 512
    budget.main(["experiment=scale_gpu", "--vocab", "50257", "--measured", "g11m=1e6"])
    table = capsys.readouterr().out
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in table.splitlines()[2:6]]
    assert [row[0] for row in rows] == rungs("scale_gpu")
    assert rows[0][7] == "0.09"  # 327.68M tokens at a measured 1M tokens/s
    assert rows[3][7] == f"{cost['flop'] / (989e12 * 0.4) / 3600:.2f}"  # the assumed 40% MFU
    assert "g11m at a measured 1e+06 tokens/s; the others at 40%" in table
    with pytest.raises(SystemExit, match="rung one of g11m"):
        budget.main(["experiment=scale_gpu", "--measured", "g1b=1e6"])


@pytest.mark.slow  # a few steps of the 11M-parameter rung (with a BPE of its own) on the CPU
def test_the_first_gpu_rung_runs_a_few_steps_on_the_cpu(tmp_path):
    text = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:40]
    files = {}
    for i, split in enumerate(("train", "validation", "test")):
        path = tmp_path / f"{split}.txt"
        path.write_text("\n".join(p.read_text(errors="ignore") for p in text[i::3]))
        files[split] = str(path)
    data = "{" + ",".join(f"{k}:'{v}'" for k, v in files.items()) + "}"
    result = pe_bench(
        "experiment=scale_gpu",
        "rung=g11m",
        "pe=rope",
        "data.name=text",
        f"data.data_files={data}",
        "data.splits={train:train,valid:validation,test:test}",
        "data.tokenizer=bpe",
        "data.vocab_size=512",
        "train.steps=3",
        "train.batch_size=2",
        "train.warmup_steps=1",
        "train.val_every=0",
        "train.ckpt_every=0",
        "eval.factors=[1,2]",
        "eval.tokens=2048",
        "eval.probes=[]",
        "report=false",
        out=tmp_path / "out",
        env={"HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (records,) = (tmp_path / "out" / "scale_gpu").rglob("records.jsonl")
    text = records.read_text()
    assert '"d_model": 192' in text and '"num_layers": 4' in text and '"train_len": 512' in text
    assert '"eval_len": 1024' in text
