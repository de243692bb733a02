"""experiments/kill_together.py's parts that start no process: the phase a placement's output
line starts, the comparison of two folders and what a process that exits 0 must leave (the
trials themselves run in the committed experiment; tests/run/test_resume.py and
tests/cli/test_place.py start two sweeps and two placements at once)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).parents[2] / "experiments"


@pytest.fixture(scope="module")
def together():
    sys.path.insert(0, str(EXPERIMENTS))
    try:
        import kill_together
        import same_outputs
    finally:
        sys.path.pop(0)
    return kill_together, same_outputs


PLACEMENT = [
    ("pe-bench-place: copying results/quick's records into out", "copy"),
    ("pe-bench-place: pe-bench -m experiment=quick pe=nope pe.name=my_pe", "sweep startup"),
    ("[...][pe_bench][INFO] - run my_pe-1a: 3 of 3 records to compute, 33,090 parameters", "train"),
    (
        "[...][pe_bench.run.train][INFO] - train my_pe: 60 steps in 0.6 s, final loss 3.6",
        "evaluate",
    ),
    ("[...][HYDRA] sweep: 1/2 jobs done in 0.1 min, about 0.1 min left", "between jobs"),
    ("[...][pe_bench.run.store][INFO] - out/x: another pe-bench run holds it; waiting", "waiting"),
    ("[...][HYDRA] sweep: 2/2 jobs done in 0.2 min", "report"),
    ("pe-bench-place: my_pe beside results/quick's schemes: out/report.md", "ended"),
]


def test_each_line_of_a_placement_starts_its_phase(together):
    kill_together, _ = together
    lines = []
    for line, phase in PLACEMENT:
        lines.append(line)
        assert kill_together.phase(lines) == phase, line
    assert kill_together.phase([]) == "startup"


def test_two_folders_are_compared_file_by_file_leaving_out_the_log(together, tmp_path):
    _, same_outputs = together
    for name in ("ref", "got"):
        (tmp_path / name / "job").mkdir(parents=True)
        (tmp_path / name / "job" / "config.yaml").write_text(f"out: {tmp_path / name}\n")
        (tmp_path / name / "job" / "cli.log").write_text(f"{name} appended here\n")
    ref, got = tmp_path / "ref", tmp_path / "got"
    rename = (str(got), str(ref))
    assert same_outputs.compare_folders(ref, got, rename) == []
    (got / "job" / ".done").write_text("")
    (ref / "report.md").write_text("a report\n")
    assert same_outputs.compare_folders(ref, got, rename) == [
        "missing report.md",
        "extra job/.done",
    ]


def test_an_exit_0_needs_the_report_and_every_record(together, tmp_path):
    kill_together, _ = together
    ref = tmp_path / "reference" / "placed"
    (ref / "job").mkdir(parents=True)
    (ref / "job" / "records.jsonl").write_text("{}\n{}\n")
    kind = kill_together.Kind("place", None, kill_together.placed, ref.parent, [])
    got = tmp_path / "trial" / "placed"
    (got / "job").mkdir(parents=True)
    (got / "job" / "records.jsonl").write_text("{}\n")
    assert kill_together.check_outputs(kind, got) == ["no report.md", "job: records missing"]
    (got / "report.md").write_text("")
    (got / "job" / "records.jsonl").write_text("{}\n{}\n")
    assert kill_together.check_outputs(kind, got) == []
