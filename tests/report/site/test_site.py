"""``pe-bench-report --site``: a static leaderboard that needs no network and no server, shows
the report's numbers and marks, a page per scheme; the committed sites under docs/site/
regenerate byte for byte from their records."""

from __future__ import annotations

import filecmp
import json
import re
import shutil
from pathlib import Path

import pytest

from pe_bench.cli.report import main as report_main
from pe_bench.report import aggregate
from pe_bench.report.best import value_marks
from pe_bench.report.build import build_report
from pe_bench.report.site import write_site
from tests.helpers import ROOT, record, report_command, separable_seeds, write_runs

COMMITTED = {
    "zoo": ROOT / "docs" / "site" / "zoo",
    "tasks_quick": ROOT / "docs" / "site" / "tasks_quick",
    "scale": ROOT / "docs" / "site" / "scale",
}


def site_rows() -> list[dict]:
    """``separable_seeds`` with rope's pi variant beside it."""
    rows = separable_seeds()
    rope = [r for r in rows if r["scheme"] == "rope"]
    return rows + [{**r, "variant": "pi", "nll": r["nll"] + 0.3} for r in rope]


@pytest.fixture
def site(tmp_path) -> Path:
    write_runs(tmp_path / "runs", site_rows())
    report_main([str(tmp_path / "runs"), "--site", str(tmp_path / "site")])
    return tmp_path / "site"


def table_rows(html: str, board: str) -> dict[str, list[tuple[str, str, str]]]:
    """label -> (data-v, class, text) of each cell of a board's table."""
    body = html.split(f'data-board="{board}"')[1].split("</table>")[0]
    found = {}
    for attributes, row in re.findall(r"<tr([^>]*)>(.*?)</tr>", body):
        label = dict(re.findall(r'([\w-]+)="([^"]*)"', attributes)).get("data-label")
        if label is None:
            continue
        cells = []
        for cell_attributes, text in re.findall(r"<td([^>]*)>(.*?)</td>", row):
            named = dict(re.findall(r'([\w-]+)="([^"]*)"', cell_attributes))
            mark = " ".join(c for c in named.get("class", "").split() if c != "t")
            cells.append((named.get("data-v", ""), mark, text))
        found[label] = cells
    return found


@pytest.mark.slow
def test_the_site_loads_nothing_from_the_network(site):
    files = sorted(p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file())
    assert files == [
        "assets/site.css",
        "assets/site.js",
        "index.html",
        "schemes/alibi.html",
        "schemes/nope.html",
        "schemes/pi.html",
        "schemes/rope.html",
    ]
    for path in site.rglob("*.html"):
        html = path.read_text()
        sources = re.findall(
            r'<(?:script|img|iframe|link|source)\b[^>]*(?:src|href)="([^"]+)"', html
        )
        assert sources and all(not re.match(r"[a-z]+:|//", s) for s in sources), (path, sources)
        assert "<style" not in html and "@import" not in html
    script = (site / "assets" / "site.js").read_text()
    assert not re.search(r"fetch\(|XMLHttpRequest|import\(|https?:", script)
    assert not re.search(r"url\(|@import|https?:", (site / "assets" / "site.css").read_text())


@pytest.mark.slow
def test_the_leaderboard_shows_the_reports_numbers_and_marks(site, tmp_path):
    report = build_report(tmp_path / "runs", echo=False)
    html = (site / "index.html").read_text()
    rows = table_rows(html, "main")
    assert list(rows) == ["nope", "rope", "rope+pi", "alibi"]
    stats = report.tables["ppl"].set_index(["label", "eval_len"])
    marks = value_marks(report.tables["ppl"], report.tables["pairwise"])
    for label, cells in rows.items():
        for length, (value, mark, text) in zip((16, 32), cells[3:5], strict=True):
            cell = stats.loc[(label, length)]
            assert float(value) == pytest.approx(cell["mean"], rel=1e-5)
            assert text.startswith(f"{cell['mean']:.2f} [{cell['ci_low']:.2f}, ")
            assert mark == marks.get((label, length), "")
    assert rows["alibi"][3][1] == "best" and rows["rope"][3][1] == "tied"
    pairs = json.loads(re.search(r'id="pairs-main">(.*?)</script>', html).group(1))
    names = pairs["labels"]
    tied = [names[j] for j in pairs["ties"]["16"][names.index("rope")]]
    assert tied == ["alibi"] and "32" not in pairs["ties"]
    score = aggregate.extrapolation_scores(report.frame).set_index("label")
    assert float(rows["alibi"][5][0]) == pytest.approx(score.loc["alibi", "score"], rel=1e-5)
    assert '<th data-len="32" data-sort="num" data-best="low" tabindex="0">32 (2x)</th>' in html
    assert "Caveats" in html and "a caveat with an_underscore &amp; 50% of a #" in html


@pytest.mark.slow
def test_scheme_pages_have_the_docstring_options_numbers_and_cost(site):
    alibi = (site / "schemes" / "alibi.html").read_text()
    assert '<a href="https://arxiv.org/abs/2108.12409">' in alibi  # its reference, linked
    assert "pe_bench.positions.bias.ALiBi" in alibi
    assert "eval 16" in alibi and "peak eval MB" in alibi
    pi = (site / "schemes" / "pi.html").read_text()
    assert "An eval-time variant of <code>rope</code>" in pi
    assert '<td data-v="factor" class="t">factor</td>' in pi and ">None</td>" in pi
    assert '<a href="rope.html">rope</a>' in pi
    rope = (site / "schemes" / "rope.html").read_text()
    assert '<a href="pi.html">pi</a>' in rope and "rope+pi" not in table_rows(rope, "main-rope")


@pytest.mark.slow
def test_the_site_is_deterministic_and_keeps_to_its_folder(site, tmp_path, capsys):
    before = {p: p.read_bytes() for p in site.rglob("*") if p.is_file()}
    (site / "schemes" / "gone.html").write_text("a page of an earlier site")
    report = build_report(tmp_path / "runs", echo=False)
    write_site(report, tmp_path / "runs", site)
    assert {p: p.read_bytes() for p in site.rglob("*") if p.is_file()} == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_:
        report_main([str(tmp_path / "runs"), "--site", str(other)])
    assert exit_.value.code == 2
    assert "holds no pe-bench site" in capsys.readouterr().err
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]


def test_a_task_report_site_has_the_reciprocal_ranks_and_a_board_per_task(tmp_path):
    copy = {"mode": "task", "task": "copy", "corpus": "task:copy"}
    write_runs(
        tmp_path / "runs",
        [
            record(scheme, seed, n, 0.0, **copy, exact_match=float(n == 16), token_acc=token)
            for seed in range(3)
            for scheme, past in (("nope", 0.10), ("rope", 0.40))
            for n, token in ((16, 1.0), (32, past + 0.01 * seed))
        ],
    )
    report_main([str(tmp_path / "runs"), "--site", str(tmp_path / "site")])
    html = (tmp_path / "site" / "index.html").read_text()
    assert 'data-board="mrr"' in html and 'id="task-copy"' in html
    token = table_rows(html, "copy_token_acc")
    assert token["rope"][4][1] == "best" and token["nope"][4][1] == ""
    exact = table_rows(html, "copy_exact_match")
    assert exact["rope"][4][1] == "" and exact["nope"][4][1] == ""  # all 0: nothing stands out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_the_committed_site_regenerates(name, tmp_path):
    """docs/site/<name> is ``pe-bench-report results/<name> --site docs/site/<name>``, byte for
    byte (so it is never stale)."""
    folder, committed = ROOT / "results" / name, COMMITTED[name]
    copy = tmp_path / name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.pt", "wandb"))
    args = report_command(folder)
    report_main([str(copy / args[0]), *args[1:], "--site", str(tmp_path / "site")])
    made = sorted(
        p.relative_to(tmp_path / "site") for p in (tmp_path / "site").rglob("*") if p.is_file()
    )
    assert made == sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file())
    _, mismatch, errors = filecmp.cmpfiles(
        committed, tmp_path / "site", [str(p) for p in made], shallow=False
    )
    assert not mismatch and not errors, f"stale: {mismatch or errors}"
