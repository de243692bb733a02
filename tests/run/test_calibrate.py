"""The evaluation's calibration step (``run/calibrate.py``): schemes with ``calibrate`` are fitted
on the validation split at every evaluation length before scoring, never on test tokens, and
their records say what was fitted."""

from __future__ import annotations

import torch

from pe_bench.cli import bench
from pe_bench.data.corpus import Corpus
from pe_bench.model.gpt import ModelConfig, build_model
from pe_bench.run.calibrate import calibrate_schemes, held_out_loss

TEST_BYTE = 255  # every test token, and no validation token


def corpus(valid_seed: int = 0) -> Corpus:
    """A corpus whose test split is one byte the validation split never holds."""
    g = torch.Generator().manual_seed(valid_seed)
    splits = {
        "train": torch.randint(0, 200, (4000,), generator=g).to(torch.uint8),
        "valid": torch.randint(0, 200, (2000,), generator=g).to(torch.uint8),
        "test": torch.full((2000,), TEST_BYTE, dtype=torch.uint8),
    }
    return Corpus("spy", "sha", splits)


def nope_temp(**options):
    cfg = ModelConfig(d_model=32, num_layers=2, num_heads=4, mlp_ratio=2)
    return build_model(cfg, {"name": "nope_temp", "steps": 4, **options}, 16, 0).eval()


def test_calibration_reads_the_validation_split_and_never_a_test_token(monkeypatch):
    model, data = nope_temp(held_out_tokens=512), corpus()
    seen = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda x, *a: seen.append(x.clone()) or forward(x, *a))
    notes = calibrate_schemes(model, [None], [16, 32], data, batch_tokens=256)
    assert set(notes) == {(id(None), 16), (id(None), 32)} and sorted(model.pe.fitted) == [16, 32]
    windows = torch.cat([x.flatten() for x in seen])
    assert not (windows == TEST_BYTE).any()
    valid = data.splits["valid"].long()
    for x in seen:  # consecutive windows from the split's start, at most 512 tokens of them
        n = x.shape[1]
        starts = {tuple(valid[i : i + n].tolist()) for i in range(0, 512, n)}
        assert all(tuple(row.tolist()) in starts for row in x)
    assert {x.shape[1] for x in seen} == {16, 32}


def test_the_fit_does_not_depend_on_the_test_split_but_on_the_validation_split():
    fitted = []
    for data in (corpus(), corpus(), corpus(valid_seed=1)):
        model = nope_temp()
        if fitted:
            data.splits["test"][:] = 7  # another test split: the same fit
        calibrate_schemes(model, [None], [32], data, batch_tokens=256)
        fitted.append(model.pe.fitted[32])
    assert torch.equal(fitted[0], fitted[1]) and not torch.equal(fitted[0], fitted[2])


def test_held_out_loss_is_the_mean_over_its_windows():
    model, data = nope_temp(), corpus()
    loss = held_out_loss(model, data, 16, 64, batch_tokens=32)()  # 4 windows, 2 per pass
    x, y = data.valid_windows(4, 16)
    with torch.no_grad():
        logits = model(x)
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    assert torch.allclose(loss, expected, atol=1e-6)


def test_a_run_calibrates_every_length_and_its_records_say_so(tiny_config, tmp_path):
    rows = bench.run(tiny_config("pe=nope_temp", "pe.steps=2", "pe.held_out_tokens=64"), tmp_path)
    assert sorted(r["eval_len"] for r in rows) == [16, 32, 64]
    for row in rows:
        assert "held-out nll" in row["calibration"] and "head search" in row["calibration"]
    plain = bench.run(tiny_config("pe=nope"), tmp_path / "nope")
    assert not any("calibration" in row for row in plain)
