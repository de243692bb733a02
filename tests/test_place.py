"""pe-bench-place: a plugin trained under a committed sweep's protocol and reported beside
the committed schemes, which are not retrained (issue 17: no way to place a plugin)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pe_bench.errors import UserError
from pe_bench.records import load_records
from pe_bench.run.place import protocol_overrides, scheme_overrides

from .helpers import TINY, pe_bench

EXAMPLE = Path(__file__).parents[1] / "examples" / "my_pe"


def test_the_protocol_is_the_committed_command_less_scheme_seed_and_outputs(tmp_path):
    (tmp_path / "commands.txt").write_text(
        "pe-bench -m experiment=quick out_root=results\n"
        "PYTHONPATH=x pe-bench -m experiment=quick train.seed=1,2 out_root=results\n"
        "pe-bench-place x --onto results/quick --out y  # copies results/quick's records, then:\n"
        "pe-bench -m experiment=quick pe=nope pe.name=x train.seed=0,1,2 hydra.sweep.dir=y\n"
    )
    assert protocol_overrides(tmp_path) == ["experiment=quick"]
    (tmp_path / "commands.txt").write_text(
        "pe-bench -m experiment=quick\npe-bench -m experiment=quick train.steps=5\n"
    )
    with pytest.raises(UserError, match="differ beyond pe and train.seed"):
        protocol_overrides(tmp_path)
    with pytest.raises(UserError, match="has no commands.txt"):
        protocol_overrides(tmp_path / "nowhere")


def test_a_scheme_without_a_yaml_is_selected_by_name_and_plugin():
    assert scheme_overrides("alibi", [], None) == ["pe=alibi"]
    assert scheme_overrides("my_pe", ["max_len=8"], "my_pe") == [
        "pe=nope",
        "pe.name=my_pe",
        "++pe.plugin=my_pe",
        "++pe.max_len=8",
    ]


@pytest.mark.slow
def test_a_plugin_is_placed_beside_a_committed_sweep_without_retraining_it(tmp_path):
    committed = tmp_path / "committed"
    made = pe_bench("-m", "pe=rope,alibi", "train.seed=0,1", "name=committed", *TINY, out=tmp_path)
    assert made.returncode == 0, made.stderr[-2000:]
    for checkpoint in committed.rglob("*.pt"):  # committed folders hold no trained models
        checkpoint.unlink()
    before = load_records(committed)
    out = tmp_path / "placed"
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE), "HYDRA_FULL_ERROR": "0"}
    args = ["my_pe", "--onto", str(committed), "--plugin", "my_pe", "--out", str(out)]
    place = [str(Path(sys.executable).parent / "pe-bench-place"), *args]
    if not shutil.which(place[0]):
        place = [sys.executable, "-c", "from pe_bench.run.place import main; main()", *args]
    proc = subprocess.run(place, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = load_records(out)
    assert set(records["scheme"]) == {"rope", "alibi", "my_pe"}
    assert sorted(set(records.loc[records["scheme"] == "my_pe", "seed"])) == [0, 1]
    kept = records[records["scheme"] != "my_pe"]
    assert sorted(kept["run_id"].unique()) == sorted(before["run_id"].unique())  # not retrained
    assert not any(committed.rglob("*.pt"))  # nothing written into the committed folder
    report = (out / "report.md").read_text()
    assert "| my_pe" in report and "| alibi" in report
    reproduce = report.split("## Reproduce")[1]
    where = os.path.relpath(EXAMPLE)  # the plugin's folder, relative to the working one
    assert f"PYTHONPATH={where} pe-bench-place my_pe --onto {committed}" in reproduce
    assert f"hydra.sweep.dir={out}" in reproduce  # the sweep's line says where it wrote
    again = subprocess.run(place, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0 and "records are there" in again.stdout + again.stderr
