"""The optional wandb logger: a no-op by default, offline with no account or network."""

from __future__ import annotations

import sys

import pytest

from pe_bench.errors import UserError
from pe_bench.run import tracking
from tests.helpers import TINY, pe_bench

START = {"name": "job", "group": "g", "job_type": "train", "config": {}}


def test_default_logger_does_nothing_and_needs_no_wandb(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # importing wandb would fail
    tracker = tracking.start(tracking.parse_logger({"name": "none"}), folder=tmp_path, **START)
    assert type(tracker) is tracking.Tracker
    tracker.log_point({"step": 1, "loss": 2.0})
    tracker.finish()
    assert list(tmp_path.iterdir()) == []


def test_wandb_without_the_package_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(UserError, match=r"logger=wandb needs the wandb package: pip install"):
        tracking.start(tracking.parse_logger({"name": "wandb"}), folder=tmp_path, **START)


def test_bad_logger_settings(tmp_path):
    with pytest.raises(UserError, match="logger='tensorboard' is not a logger"):
        tracking.parse_logger({"name": "tensorboard"})
    with pytest.raises(UserError, match="logger.mode='offlne' must be one of"):
        tracking.parse_logger({"name": "wandb", "mode": "offlne"})


@pytest.mark.slow
def test_offline_sweep_logs_curves_records_and_report(tmp_path):
    pytest.importorskip("wandb")
    proc = pe_bench(
        "-m", "pe=rope,alibi", "logger=wandb", "name=wb", *TINY, out=tmp_path,
        env={"WANDB_MODE": "offline", "WANDB_API_KEY": ""},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    sweep = tmp_path / "wb"
    jobs = sorted(p.name for p in sweep.iterdir() if (p / "records.jsonl").exists())
    assert len(jobs) == 2 and all("logger" not in job for job in jobs)
    for job in jobs:
        (run,) = (sweep / job / "wandb").glob("offline-run-*/run-*.wandb")
        data = run.read_bytes()
        for key in (b"train/loss", b"val/loss", b"eval/records", b"d_model", b"run_id"):
            assert key in data, (job, key)
    (report_run,) = (sweep / "wandb").glob("offline-run-*")
    images = sorted(p.name.split("_")[0] for p in report_run.glob("files/media/images/figures/*"))
    assert images == ["curves", "length", "positions", "ratio"]
    tables = sorted(p.name.split("_")[0] for p in report_run.glob("files/media/table/tables/*"))
    # score twice: the scores and their paired differences (score_pairwise)
    assert tables == ["bpb", "cost", "nll", "pairwise", "ppl", "ranks", "ratio", "score", "score"]
