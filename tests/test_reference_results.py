"""The committed results/ are regenerated from their own records: tables, figure data and
report.md byte for byte, figures as valid images of the same size.

Every ``results/<name>/`` and ``results/gpu/<name>/`` holding records is checked; the same check
runs on a copy of the smoke experiment's output, so the machinery is tested even before anything
is committed. A run longer than a session is committed as its records land, in a folder with an
``IN_PROGRESS.md`` saying how far it got and how to resume it: it has no report yet (none may
be there to go stale), and its records are checked as every other's are
(tests/test_committed_keys.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import assert_regenerates

RESULTS = Path(__file__).parents[1] / "results"
FOLDERS = [p for p in RESULTS.glob("*") if p.name != "gpu"] + list(RESULTS.glob("gpu/*"))
WITH_RECORDS = sorted(p for p in FOLDERS if p.is_dir() and any(p.rglob("records.jsonl")))
IN_PROGRESS = [p for p in WITH_RECORDS if (p / "IN_PROGRESS.md").exists()]
COMMITTED = [p for p in WITH_RECORDS if p not in IN_PROGRESS]


@pytest.mark.slow  # 30 s for the nine committed folders: the full suite (CI) runs it
@pytest.mark.parametrize(
    "folder", COMMITTED or [None], ids=lambda p: str(p.relative_to(RESULTS)) if p else "none"
)
def test_committed_report_regenerates(folder, tmp_path):
    if folder is None:
        pytest.skip("no results/*/ folder with records is committed")
    assert_regenerates(folder, tmp_path)


@pytest.mark.slow
def test_smoke_report_regenerates(smoke, tmp_path):
    assert_regenerates(smoke[1], tmp_path)


@pytest.mark.parametrize(
    "folder", IN_PROGRESS or [None], ids=lambda p: str(p.relative_to(RESULTS)) if p else "none"
)
def test_a_run_in_progress_has_no_report_and_says_how_to_resume(folder):
    if folder is None:
        pytest.skip("no run in progress is committed")
    assert not any((folder / name).exists() for name in ("report.md", "tables", "figures"))
    note = (folder / "IN_PROGRESS.md").read_text()
    assert "pe-bench -m experiment=" in note and "records" in note
