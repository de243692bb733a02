"""pe-bench-place: a plugin trained under a committed sweep's protocol and reported beside
the committed schemes, which are not retrained (issue 17: no way to place a plugin)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pe_bench.cli import place
from pe_bench.cli.place import copy_records, protocol_overrides, scheme_overrides
from pe_bench.errors import UserError
from pe_bench.records import load_records
from tests.helpers import ROOT, TINY, pe_bench, record, write_runs

EXAMPLE = ROOT / "examples" / "my_pe"


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


def test_the_plugins_own_yaml_is_used_through_its_searchpath(tmp_path):
    """Issue 29, item 6: with --searchpath, the scheme's YAML there (its options) is selected,
    not the empty NoPE config renamed, which gave the constructor's defaults."""
    (tmp_path / "conf" / "pe").mkdir(parents=True)
    (tmp_path / "conf" / "pe" / "my_pe.yaml").write_text("name: my_pe\ninit_scale: 2.0\n")
    searchpath = f"file://{tmp_path / 'conf'}"
    assert scheme_overrides("my_pe", ["init_scale=4"], "my_pe", searchpath) == [
        "pe=my_pe",
        "++pe.plugin=my_pe",
        "++pe.init_scale=4",
    ]
    assert scheme_overrides("my_pe", [], None)[0] == "pe=nope"  # without it: none found


def committed(folder: Path, files: int = 0) -> Path:
    """A committed sweep's folder as pe-bench-place reads it: commands.txt, two seeds of
    rope in job folders, and ``files`` more files to copy."""
    (folder / "commands.txt").parent.mkdir(parents=True, exist_ok=True)
    (folder / "commands.txt").write_text(f"pe-bench -m {' '.join(TINY)} pe=rope train.seed=0,1\n")
    write_runs(folder, [record("rope", seed, 16, 1.0 + seed) for seed in (0, 1)])
    for i in range(files):
        (folder / f"rope-{i % 2}" / f"extra-{i}.txt").write_text(f"{i}\n")
    return folder


def copied(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_copy_killed_midway_is_made_whole_by_the_rerun(tmp_path, monkeypatch):
    """Issue 29, item 1: a placement killed while copying left a partial --out, which every
    rerun then took for the copy (the report listed the placed scheme alone)."""
    onto, out = committed(tmp_path / "onto", files=6), tmp_path / "place" / "out"
    real, done = shutil.copyfile, []

    def killed_after_3(src, dst, **kwargs):
        if len(done) == 3:
            raise KeyboardInterrupt  # a kill: nothing after this runs
        done.append(src)
        return real(src, dst, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", killed_after_3)
    with pytest.raises(KeyboardInterrupt):
        copy_records(onto, out)
    monkeypatch.undo()
    assert not out.exists()  # no copy, rather than a partial one taken for whole
    copy_records(onto, out)
    assert copied(out) == copied(onto)
    assert [p.name for p in out.parent.iterdir()] == ["out"]  # the cut-short copy removed


def test_a_copy_cut_short_by_an_older_version_gets_its_missing_files(tmp_path, capsys):
    onto, out = committed(tmp_path / "onto", files=4), tmp_path / "out"
    shutil.copytree(onto / "rope-0", out / "rope-0")  # as copytree in place left it
    copy_records(onto, out)
    assert copied(out) == copied(onto)
    assert "lacked 4 files" in capsys.readouterr().out


@pytest.mark.slow
def test_a_bad_option_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """Issue 29, item 5: --option nosuch=3 was checked by the sweep after the copy, leaving
    --out with the bad command in its commands.txt (and error.txt files)."""
    onto, out = committed(tmp_path / "onto"), tmp_path / "out"
    ran = []
    monkeypatch.setattr(place.subprocess, "run", lambda *a, **k: ran.append(a) or Exited(2))
    with pytest.raises(UserError, match="scheme 't5' has no option nosuch; allowed: num_buckets"):
        place.place("t5", onto, out, ["nosuch=3"])
    assert not out.exists() and not ran


def test_a_scheme_the_committed_sweep_holds_is_refused_before_anything_is_written(tmp_path):
    """``pe-bench-place alibi`` onto results/quick trained alibi's seed 0 again for minutes,
    into another folder, and then the report refused the same run stored twice."""
    out = tmp_path / "out"
    onto = ROOT / "results" / "quick"
    with pytest.raises(UserError) as refused:
        place.place("alibi", onto, out, [])
    assert str(refused.value).startswith(f"alibi with these options is already in {onto} (run ")
    assert f"its numbers are in {onto / 'report.md'}" in str(refused.value)
    assert not out.exists()


class Exited:
    """What ``subprocess.run`` returns, as far as ``place`` reads it."""

    def __init__(self, returncode: int) -> None:
        self.returncode = returncode


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
        place = [sys.executable, "-c", "from pe_bench.cli.place import main; main()", *args]
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


@pytest.mark.slow
def test_two_placements_at_once_both_end_with_the_report(tmp_path):
    """Issue 29, item 2: two pe-bench-place at once into one --out lost the report in 2 of 2
    trials, the one that exited 0 naming a report.md that did not exist. Now one copies and
    trains, the other waits for each, and both end 0 with the report there."""
    made = pe_bench("-m", "pe=rope", "train.seed=0", "name=committed", *TINY, out=tmp_path)
    assert made.returncode == 0, made.stderr[-2000:]
    out = tmp_path / "placed"
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE), "HYDRA_FULL_ERROR": "0"}
    args = ["my_pe", "--onto", str(tmp_path / "committed"), "--plugin", "my_pe", "--out", str(out)]
    code = "from pe_bench.cli.place import main; main()"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outs = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    assert [rc for rc, _, _ in outs] == [0, 0], [err[-2000:] for *_, err in outs]
    report = (out / "report.md").read_text()
    assert "| my_pe" in report and "| rope" in report
    assert not list(out.rglob("error.txt")) and not list(tmp_path.glob(".placed.copy-*"))
    lines = (out / "commands.txt").read_text().splitlines()
    assert len(lines) == len(set(lines)) == 3  # committed sweep, placement, placed sweep
