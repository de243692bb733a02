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
    for label, cells in rows.items():  # scheme, score, the lengths, cost, family, kind, paper
        for length, (value, mark, text) in zip((16, 32), cells[2:4], strict=True):
            cell = stats.loc[(label, length)]
            assert float(value) == pytest.approx(cell["mean"], rel=1e-5)
            mean, interval = f"{cell['mean']:.2f}", f" [{cell['ci_low']:.2f}, "
            assert text.startswith(f'{mean}<span class="ci">{interval}')  # compact mode hides it
            assert mark == marks.get((label, length), "")
    assert rows["alibi"][2][1] == "best" and rows["rope"][2][1] == "tied"
    pairs = json.loads(re.search(r'id="pairs-main">(.*?)</script>', html).group(1))
    names = pairs["labels"]
    tied = [names[j] for j in pairs["ties"]["16"][names.index("rope")]]
    assert tied == ["alibi"] and "32" not in pairs["ties"]
    score = aggregate.extrapolation_scores(report.frame).set_index("label")
    assert float(rows["alibi"][1][0]) == pytest.approx(score.loc["alibi", "score"], rel=1e-5)
    head = '<th data-len="32" data-x="2" data-mark="32" data-sort="num" data-best="low"'
    assert f'{head} tabindex="0">32 (2x)</th>' in html
    assert (
        rows["alibi"][-1][2] == '<a href="https://arxiv.org/abs/2108.12409">Press et al. 2022</a>'
    )
    assert rows["nope"][-1][2].endswith(">Haviv et al. 2022</a>")
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
    assert token["rope"][2][1] == "best" and token["nope"][2][1] == ""
    exact = table_rows(html, "copy_exact_match")
    assert exact["rope"][2][1] == "" and exact["nope"][2][1] == ""  # all 0: nothing stands out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_the_committed_site_regenerates(name, tmp_path):
    """docs/site/<name> is ``pe-bench-report results/<name> --site docs/site/<name>``, byte for
    byte (so it is never stale)."""
    folder, committed = ROOT / "results" / name, COMMITTED[name]
    copy, site = tmp_path / "results" / name, tmp_path / "docs" / "site" / name  # as in the repo:
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.pt", "wandb"))  # its links
    args = report_command(folder)  # to the CSV tables and records are relative to the site
    report_main([str(copy / args[0]), *args[1:], "--site", str(site)])
    made = sorted(p.relative_to(site) for p in site.rglob("*") if p.is_file())
    assert made == sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file())
    _, mismatch, errors = filecmp.cmpfiles(committed, site, [str(p) for p in made], shallow=False)
    assert not mismatch and not errors, f"stale: {mismatch or errors}"


def test_the_mrr_says_which_tasks_separate_the_schemes(tmp_path):
    """A task every scheme ties on (all fail reverse past its training length) adds the same
    to every MRR: the page says the differences come from the other task alone."""
    rows = []
    for task, better in (("copy", 0.5), ("reverse", 0.0)):
        kind = {"mode": "task", "task": task, "corpus": f"task:{task}"}
        for seed in range(3):
            for scheme, past in (("nope", 0.0), ("rope", better + 0.01 * seed if better else 0)):
                for n in (16, 32):
                    exact = 1.0 if n == 16 else past
                    rows.append(
                        record(scheme, seed, n, 0.0, **kind, exact_match=exact, token_acc=exact)
                    )
    write_runs(tmp_path / "runs", rows)
    report_main([str(tmp_path / "runs"), "--site", str(tmp_path / "site")])
    html = (tmp_path / "site" / "index.html").read_text()
    assert (
        "Every scheme has the same rank on reverse (rank 1, a tie in every seed), so the "
        "differences in MRR come from copy alone." in html
    )
    assert '<option value="2">2x (copy 32, reverse 32)</option>' in html


def test_scheme_pages_show_each_seeds_values_and_link_its_records(site, tmp_path):
    report = build_report(tmp_path / "runs", echo=False)
    alibi = (site / "schemes" / "alibi.html").read_text()
    body = alibi.split('data-board="seeds-main-alibi"')[1].split("</table>")[0]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", body.split("<tbody>")[1])
    runs = report.frame[report.frame["label"] == "alibi"]
    assert len(rows) == runs["seed"].nunique() == 3
    for row in rows:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        seed = int(cells[1])
        (href,) = re.findall(r'href="([^"]+)"', cells[2])
        assert (site / "schemes" / href).resolve().is_file()  # the run's records.jsonl
        for n, text in zip((16, 32), cells[3:5], strict=True):
            ppl = runs.loc[(runs["seed"] == seed) & (runs["eval_len"] == n), "ppl"]
            assert text == f"{ppl.item():.2f}"


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_every_link_of_a_committed_site_resolves(name):
    """Pages, anchors' files, the report's CSV tables and the runs' records: every relative
    link of every page names a file that exists (in the repository, beside the site)."""
    site = COMMITTED[name]
    csv = 0
    for path in site.rglob("*.html"):
        for href in re.findall(r'href="([^"#]*)(?:#[^"]*)?"', path.read_text()):
            if not href or re.match(r"[a-z]+:", href):
                continue
            assert (path.parent / href).resolve().is_file(), (path, href)
            csv += href.endswith(".csv")
    assert csv  # the report's tables are linked


def attributes(tag: str) -> dict[str, str]:
    return dict(re.findall(r'([\w:-]+)="([^"]*)"', tag))


def line_style(tag: str) -> tuple[str, str]:
    """A legend swatch's ``<line>``: its colour and dash ('' for solid)."""
    found = attributes(tag)
    return found["stroke"], found.get("stroke-dasharray", "")


@pytest.mark.parametrize("name", ["zoo", "tasks_quick"])  # scale's figures are PNGs
def test_each_legend_entry_draws_its_curves_colour_and_dash(name):
    """Issue 41: the legend's swatches were blocks of colour, so lines that differ only by
    dash read the same. Each entry is a line in its curve's colour and dash, and no two
    entries of a panel share both."""
    html = (COMMITTED[name] / "index.html").read_text()
    panels = re.findall(r'<figure class="panel">(.*?)</figure>', html, flags=re.S)
    assert panels
    for panel in panels:
        series = re.findall(r'(<g class="series"[^>]*>).*?(<polyline [^>]*>)', panel, re.S)
        curves = {
            attributes(group)["data-label"]: (
                re.search(r"--c:([^;\"]+)", group)[1],
                attributes(line).get("stroke-dasharray", ""),
            )
            for group, line in series
        }
        entries = re.findall(r'<li data-label="([^"]+)"><svg class="sw".*?(<line [^>]*>)', panel)
        legend = {label: line_style(swatch) for label, swatch in entries}
        assert curves and {label: legend[label] for label in curves} == curves
        assert len(set(legend.values())) == len(legend)
