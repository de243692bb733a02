"""The committed results/ are regenerated from their own records: tables, figure data and
report.md byte for byte, figures as valid images of the same size.

Every ``results/<name>/`` and ``results/gpu/<name>/`` holding records is checked; the same check
runs on a copy of the smoke experiment's output, so the machinery is tested even before anything
is committed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import assert_regenerates

RESULTS = Path(__file__).parents[1] / "results"
FOLDERS = [p for p in RESULTS.glob("*") if p.name != "gpu"] + list(RESULTS.glob("gpu/*"))
COMMITTED = sorted(p for p in FOLDERS if p.is_dir() and any(p.rglob("records.jsonl")))


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
