"""Scale-out: DDP through torchrun (gloo, 2 CPU processes) and a sweep through the submitit
local launcher, the same code path as SLURM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pe_bench.errors import UserError
from pe_bench.records import load_records
from pe_bench.run.distributed import World
from tests.helpers import TINY, overridden, pe_bench

RUN = overridden("pe=alibi", *TINY, "train.steps=8", "train.batch_size=8")


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in open(folder / "records.jsonl")]


@pytest.mark.slow
def test_ddp_on_two_processes_matches_one(tmp_path):
    cli = ["-m", "pe_bench.cli", *RUN]
    one = subprocess.run(
        [sys.executable, *cli, f"hydra.run.dir={tmp_path / 'one'}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            *cli,
            f"hydra.run.dir={tmp_path / 'two'}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = records(tmp_path / "one"), records(tmp_path / "two")
    assert len(b) == len(a)  # rank 0 alone wrote, once per key
    # the same global batches, gradients averaged over ranks: equal up to float reduction order
    for ra, rb in zip(a, b, strict=True):
        assert rb["nll"] == pytest.approx(ra["nll"], rel=1e-5)
    assert b[0]["final_train_loss"] == pytest.approx(a[0]["final_train_loss"], rel=1e-5)


def test_global_batch_is_split_between_ranks():
    assert [World(rank=r, size=4).batch_slice(32) for r in range(4)] == [
        slice(0, 8),
        slice(8, 16),
        slice(16, 24),
        slice(24, 32),
    ]
    with pytest.raises(UserError, match="train.batch_size=30 must be divisible by the 4 processes"):
        World(rank=0, size=4).batch_slice(30)


@pytest.mark.slow
def test_sweep_through_the_submitit_local_launcher(tmp_path):
    proc = pe_bench(
        "-m", "hydra/launcher=submitit_local", "pe=rope,alibi", *TINY, "name=sub", out=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = load_records(tmp_path / "sub")
    assert set(df["scheme"]) == {"rope", "alibi"}
    assert (tmp_path / "sub" / ".submitit").is_dir()  # the jobs really went through submitit
    assert (tmp_path / "sub" / "report.md").exists()
    # Progress counts jobs across processes: the job that ends last sees both ended.
    logs = "".join(path.read_text() for path in (tmp_path / "sub").glob("*/cli.log"))
    assert "sweep: 2/2 jobs done" in logs
