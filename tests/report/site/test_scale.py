"""The scale view of a ladder's site: per label the 16x/1x ratio at each rung with its
interval, the rank per rung, Kendall's tau and the claims per rung, each cell read from the
tables the ladder report writes (``tables/scale_*.csv``)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from pe_bench.cli.report import main as report_main
from tests.helpers import write_runs
from tests.report.test_ladder import ladder_rows


@pytest.fixture(scope="module")
def ladder_site(tmp_path_factory) -> tuple[Path, str]:
    """A two-rung ladder's folder (report and tables) and its site's index.html."""
    tmp = tmp_path_factory.mktemp("scale")
    write_runs(tmp / "ladder", ladder_rows())
    report_main([str(tmp / "ladder"), "--site", str(tmp / "site")])
    return tmp, (tmp / "site" / "index.html").read_text()


def board(html: str, key: str) -> dict[str, list[tuple[str, str, str]]]:
    """First cell's data-v -> (data-v, class, text) of each other cell, per row of a board."""
    body = html.split(f'data-board="{key}"')[1].split("</table>")[0]
    found = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body):
        cells = []
        for attributes, text in re.findall(r"<td([^>]*)>(.*?)</td>", row):
            named = dict(re.findall(r'([\w-]+)="([^"]*)"', attributes))
            cells.append((named.get("data-v", ""), named.get("class", ""), text))
        if cells:
            found[cells[0][0]] = cells[1:]
    return found


def test_the_ratio_at_each_rung_is_the_reports_with_its_interval(ladder_site):
    tmp, html = ladder_site
    far = pd.read_csv(tmp / "ladder" / "tables" / "scale_far.csv")
    rungs = ["small", "wide"]
    shown = board(html, "scale-ratio")
    assert sorted(shown) == sorted(far["label"].unique())
    for row in far.itertuples():
        value, mark, text = shown[row.label][rungs.index(row.rung)]
        assert text == f"{row.ratio:.2f} [{row.ratio_low:.2f}, {row.ratio_high:.2f}]"
        assert float(value) == pytest.approx(row.ratio, rel=1e-5)
        lowest = far[far["rung"] == row.rung]["ratio"].min()
        assert (mark == "best") == (f"{row.ratio:.2f}" == f"{lowest:.2f}")  # xl, alibi tie
    rope = shown["rope"][0][2]  # 16x - 1x: 1.2, 1.205, 1.2 nats over seeds: exp(1.2017)
    assert rope.startswith("3.33 [")


def test_the_rank_per_rung_kendall_and_the_claims_are_the_reports(ladder_site):
    tmp, html = ladder_site
    tables = tmp / "ladder" / "tables"
    ranks = pd.read_csv(tables / "scale_rank.csv", index_col=0)
    shown = board(html, "scale-rank")
    for label, row in ranks.iterrows():
        assert [text for _, _, text in shown[label]] == [f"{v:g}" for v in row]
    assert [t for _, _, t in shown["xl"]] == ["1", "2"]  # xl first at small, alibi at wide
    tau = pd.read_csv(tables / "scale_kendall.csv", index_col=0)
    kendall = board(html, "scale-kendall")
    assert kendall["small"][1][2] == f"{tau.loc['small', 'wide']:.2f}" == "0.33"
    verdicts = pd.read_csv(tables / "scale_claims.csv", index_col=0)
    claims_shown = board(html, "scale-claims")
    assert len(claims_shown) == len(verdicts)
    beats = next(c for text, c in claims_shown.items() if "Transformer-XL is better" in text)
    assert [text for _, _, text in beats] == list(verdicts.loc["xl_beats_alibi"])
    assert beats[0][1] == "t best" and beats[1][2].startswith("no: xl worse than alibi")
    separated = board(html, "scale-separated")
    assert [text for _, _, text in separated["xl vs alibi"]] == ["&lt;", "&gt;"]


def test_the_ladder_site_has_its_figure_and_scheme_pages(ladder_site):
    tmp, html = ladder_site
    site = tmp / "site"
    assert "<h1>Scale ladder leaderboard: ladder</h1>" in html
    assert 'src="figures/scale_params.png"' in html and "scale_length.png" not in html
    png = (site / "figures" / "scale_params.png").read_bytes()
    assert png == (tmp / "ladder" / "figures" / "scale_params.png").read_bytes()
    for scheme in ("xl", "alibi", "rope"):
        assert f'href="schemes/{scheme}.html"' in html
        assert "What it is" in (site / "schemes" / f"{scheme}.html").read_text()
