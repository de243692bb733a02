"""Training: schedule, seeds, and that a tiny model actually learns."""

from __future__ import annotations

import pytest
import torch

from pe_bench.data.corpus import Corpus
from pe_bench.errors import UserError
from pe_bench.run.train import FinetuneConfig, TrainConfig, finetune, fit, lr_at, validation_loss
from tests.helpers import tiny_model


def test_warmup_then_cosine_to_floor():
    cfg = TrainConfig(lr=1.0, warmup_steps=10, steps=110, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)  # halfway through the cosine
    assert lr_at(110, cfg) == pytest.approx(0.1)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 110))


def test_finetune_trains_at_factor_times_the_length_with_the_same_tokens_per_step():
    train = TrainConfig(seq_len=64, batch_size=32, steps=800, lr=2e-3, weight_decay=0.1, seed=3)
    tune = FinetuneConfig(factor=4, steps=100, lr=2e-4, warmup_steps=20).train_config(train)
    assert (tune.seq_len, tune.batch_size, tune.steps) == (256, 8, 100)  # 32 x 64 = 8 x 256
    assert (tune.lr, tune.warmup_steps, tune.weight_decay) == (2e-4, 20, 0.0)
    assert (tune.seed, tune.grad_clip, tune.beta2) == (3, train.grad_clip, train.beta2)
    assert FinetuneConfig(factor=2, batch_size=5).train_config(train).batch_size == 5
    with pytest.raises(UserError, match="finetune factor must be >= 1, got 0.5"):
        FinetuneConfig(factor=0.5)


def test_bad_train_values():
    with pytest.raises(UserError, match="train.steps must be >= 1, got 0"):
        TrainConfig(steps=0)
    with pytest.raises(UserError, match="train.lr must be > 0"):
        TrainConfig(lr=-1)


def repetitive_corpus() -> Corpus:
    data = torch.tensor(list(b"abcdefgh" * 400), dtype=torch.uint8)
    return Corpus(name="abc", sha="x", splits={"train": data, "valid": data, "test": data})


def pattern_config(**changes) -> TrainConfig:
    """60 steps at a high learning rate: enough for a tiny model to learn ``abcdefgh``."""
    return TrainConfig(
        seq_len=16,
        batch_size=8,
        steps=60,
        lr=1e-2,
        warmup_steps=5,
        log_every=10,
        val_every=0,
        val_batches=1,
        **changes,
    )


def test_tiny_model_learns_a_repeating_pattern():
    model = tiny_model("rope")
    cfg = pattern_config()
    corpus = repetitive_corpus()
    assert validation_loss(model, corpus, cfg, torch.device("cpu")) > 4.0  # ~ln 256 untrained
    result = fit(model, corpus, cfg, torch.device("cpu"))
    assert result.final_val_loss < 0.5


def test_same_seed_same_result():
    cfg = TrainConfig(seq_len=16, batch_size=4, steps=5, log_every=5, val_batches=1)
    losses = [
        fit(tiny_model("alibi"), repetitive_corpus(), cfg, torch.device("cpu")).final_loss
        for _ in range(2)
    ]
    assert losses[0] == losses[1]


def test_finetune_trains_a_copy_with_its_scheme_and_leaves_the_model_alone():
    model = tiny_model("rope")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pi = tiny_model("pi").pe
    cfg = TrainConfig(seq_len=32, batch_size=4, steps=3, log_every=3, val_batches=1)
    tuned, result = finetune(model, pi, repetitive_corpus(), cfg, torch.device("cpu"))
    assert tuned.pe is pi and model.pe is not pi
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not torch.equal(tuned.head.weight, model.head.weight)  # the copy trained
    assert [p["step"] for p in result.curve] == [3]


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@CUDA
@pytest.mark.parametrize("compile", [False, True])
def test_cuda_bf16_training_learns(compile):
    """On GPU training runs in bf16 autocast (optionally compiled) and still learns."""
    cfg = pattern_config(compile=compile)
    result = fit(tiny_model("rope"), repetitive_corpus(), cfg, torch.device("cuda"))
    assert result.final_val_loss < 0.5


@CUDA
def test_cuda_run_records_the_gpu(tmp_path, tiny_config):
    from pe_bench.cli import bench

    rows = bench.run(tiny_config("pe=alibi", "train.device=cuda"), tmp_path)
    assert {r["device"] for r in rows} == {"cuda"} and all(r["nll"] > 0 for r in rows)
