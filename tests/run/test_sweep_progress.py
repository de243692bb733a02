"""A sweep counts its own jobs (issue 37, item 6: two sweeps into one out_root counted each
other's, "sweep: 3/2 jobs done")."""

from __future__ import annotations

import re

import pytest

from pe_bench.run.store import DONE
from pe_bench.run.sweep import DONE_KEPT, jobs_done, mark_done

from ..helpers import TINY, pe_bench


def test_a_marker_names_the_sweeps_that_ended_its_job(tmp_path):
    for job, sweeps in {"a": ["first"], "b": ["first", "second"], "c": ["second"]}.items():
        for sweep in sweeps:
            mark_done(tmp_path / job, sweep)
    assert (jobs_done(tmp_path, "first"), jobs_done(tmp_path, "second")) == (2, 2)
    assert jobs_done(tmp_path, "third") == 0
    assert (tmp_path / "b" / DONE).read_text() == "first\nsecond\n"
    for n in range(DONE_KEPT + 5):
        mark_done(tmp_path / "a", f"s{n}")
    assert len((tmp_path / "a" / DONE).read_text().split()) == DONE_KEPT


@pytest.mark.slow  # two sweeps of two tiny jobs
def test_a_second_sweep_into_the_same_folder_counts_its_own_jobs(tmp_path):
    first = pe_bench("-m", "pe=rope,alibi", *TINY, "report=false", out=tmp_path)
    second = pe_bench("-m", "pe=nope,t5", *TINY, "report=false", out=tmp_path)
    assert first.returncode == second.returncode == 0, second.stderr[-2000:]
    counts = re.findall(r"sweep: (\d+)/(\d+) jobs done", second.stdout + second.stderr)
    assert counts == [("1", "2"), ("2", "2")]
