"""pe_bench/report/site/positions.py: the site's loss-by-position section for the truncate
mode's records, the report's numbers in its curves."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from pe_bench.cli.report import main as report_main
from pe_bench.report.site.positions import position_section, position_ticks
from tests.helpers import record, truncate_runs, write_runs


def test_ticks_are_powers_of_two_up_to_the_window():
    assert position_ticks(16) == [1, 2, 4, 8, 16]
    assert position_ticks(16384) == [1, 4, 16, 64, 256, 1024, 4096, 16384]
    assert position_ticks(12288) == [1, 4, 16, 64, 256, 1024, 4096, 12288]


def test_no_truncate_records_no_section():
    assert position_section(pd.DataFrame(columns=["label", "eval_len"]), 16) == ""


@pytest.mark.slow  # a report and its site: about 10 s
def test_the_site_draws_the_reports_loss_by_position_with_its_intervals(tmp_path):
    """A panel per window length, a line and band per label, each point's hover the
    report's bucket (position, loss and interval over documents); no section without truncate
    records."""
    truncate_runs(tmp_path / "runs")
    report_main([str(tmp_path / "runs"), "--site", str(tmp_path / "site")])
    html = (tmp_path / "site" / "index.html").read_text()
    assert '<a href="#positions">positions</a>' in html
    body = html.split('<section id="positions">')[1].split("</section>")[0]
    assert re.findall(r"<figcaption>([^<]*)</figcaption>", body) == [
        "windows of 16 tokens",
        "windows of 32 tokens",
    ]
    assert body.count('<g class="series" data-label="rope"') == 2
    assert body.count('<polygon class="band"') == 4
    drawn = pd.read_csv(tmp_path / "runs" / "figures" / "position_loss_truncate.csv")
    tips = re.findall(r'data-tip="([^"]*)"', body)
    assert len(tips) == len(drawn)
    for row in drawn.itertuples():
        tip = (
            f"{row.label} · window {row.eval_len}, position ≈ {row.position:.0f}: "
            f"{row.loss:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}] over 4 documents"
        )
        assert tip in tips
    write_runs(tmp_path / "plain", [record("rope", 0, 16, 1.0), record("rope", 0, 32, 1.5)])
    report_main([str(tmp_path / "plain"), "--site", str(tmp_path / "plain_site")])
    assert 'id="positions"' not in (tmp_path / "plain_site" / "index.html").read_text()
