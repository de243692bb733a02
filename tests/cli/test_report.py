"""``pe-bench-report`` as a console script (tests/report/ tests what it writes)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_report_on_a_folder_without_records(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", "from pe_bench.cli.report import main; main()", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "no records under" in proc.stderr and "Traceback" not in proc.stderr


# The paper experiments' CPU twins, shrunk to a toy model and a few steps: the same eval
# lengths, protocol, fine-tunes and comparison as the committed runs.
