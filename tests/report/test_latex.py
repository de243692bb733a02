"""LaTeX tables: every report table as tables/*.tex, numbers in \\num{}, the best cell of a
column in \\pebest and the cells the seeds do not separate from it in \\petied, caveats as
notes; they compile with pdflatex where it is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pe_bench.cli.report import main as report_main
from pe_bench.report import latex
from pe_bench.report.build import build_report
from tests.helpers import ROOT, separable_seeds, write_runs


def cells(tex: str, label: str) -> list[str]:
    """The cells of ``label``'s row in a LaTeX table (the row with a cell naming it)."""
    rows = [x.removesuffix(" \\\\").split(" & ") for x in tex.splitlines() if " & " in x]
    (row,) = [r for r in rows if latex.escape(label) in r]
    return row


def test_cells_escape_text_and_put_numbers_in_num():
    assert latex.cell("rope+dynamic_ntk †", numeric=False) == "rope+dynamic\\_ntk \\dag{}"
    assert latex.cell("4.98 [4.64, 5.35]", numeric=True) == (
        "\\num{4.98} \\peci{[\\num{4.64}, \\num{5.35}]}"
    )
    assert latex.cell("[1.455, 1.527]", numeric=True) == "\\peci{[\\num{1.455}, \\num{1.527}]}"
    assert latex.cell("1,228,800", numeric=True) == "\\num{1228800}"
    assert latex.cell("+0.120 [-0.010, +0.250]", numeric=True).startswith("+\\num{0.120}")
    assert latex.cell("0.900 (n=1) ‡", numeric=True) == "\\num{0.900} (n=\\num{1}) \\ddag{}"
    assert latex.cell("–", numeric=True) == "--"
    assert latex.cell(">1000 / 11.45", numeric=True) == "\\textgreater{}\\num{1000} / \\num{11.45}"
    assert latex.prose("`pe_params` is **new**") == "\\texttt{pe\\_params} is \\textbf{new}"


def test_powers_in_prose_are_superscripts():
    """Caveats write powers as x^y: a superscript, not a circumflex accent ("a\u02c6K")."""
    assert latex.prose("a^K only") == "a\\textsuperscript{K} only"
    assert latex.prose("s^(2k/(h_d-2)), not 10^6") == (
        "s\\textsuperscript{2k/(h\\_d-2)}, not 10\\textsuperscript{6}"
    )
    assert latex.prose("a lone ^ stays") == "a lone \\textasciicircum{} stays"


def test_value_tables_mark_the_best_and_what_the_seeds_do_not_separate(tmp_path):
    write_runs(tmp_path, separable_seeds())
    report = build_report(tmp_path, echo=False)
    tex = (tmp_path / "tables" / "nll.tex").read_text()
    alibi, rope, nope = cells(tex, "alibi"), cells(tex, "rope"), cells(tex, "nope")
    assert alibi[1].startswith("\\pebest{\\num{1.100}") and alibi[2].startswith("\\pebest{")
    assert rope[1].startswith("\\petied{\\num{1.127}")  # not separated from alibi at 16
    assert rope[2].startswith("\\num{2.100}")  # separated at 32
    assert not any(c.startswith(("\\pebest", "\\petied")) for c in nope)
    assert "Caveat, alibi: a caveat with an\\_underscore \\& 50\\% of a \\#." in tex
    assert "underlined: not separated from it by the seeds" in tex
    assert "}{tab:pe-bench-" in tex and "\\toprule" in tex and "\\bottomrule" in tex
    names = {p.name for p in report.latex}
    assert names == {f"{n}.tex" for n in ("ppl", "bpb", "nll", "ratio", "score", "ranks", "cost")}
    assert names == {p.name for p in (tmp_path / "tables").glob("*.tex")}
    for path in report.latex:  # plain ASCII, balanced braces: what pdflatex reads
        text = path.read_text()
        assert text.isascii(), path.name
        assert text.count("{") == text.count("}"), path.name
    score = (tmp_path / "tables" / "score.tex").read_text()
    assert cells(score, "alibi")[2].startswith("\\pebest{")
    ranks = (tmp_path / "tables" / "ranks.tex").read_text()
    assert cells(ranks, "rope") == ["rope", "\\pebest{\\num{1}}", "\\num{2}"]


def test_one_seed_marks_the_best_only(tmp_path):
    rows = [r for r in separable_seeds() if r["seed"] == 0]
    write_runs(tmp_path, rows)
    build_report(tmp_path, echo=False)
    tex = (tmp_path / "tables" / "ppl.tex").read_text()
    assert "\\pebest{" in tex and "\\petied{" not in tex
    assert "underlined" not in tex


@pytest.mark.slow
def test_latex_option_copies_the_tables_into_a_folder(tmp_path, capsys):
    write_runs(tmp_path / "runs", separable_seeds())
    report_main([str(tmp_path / "runs"), "--latex", str(tmp_path / "paper")])
    copied = sorted(p.name for p in (tmp_path / "paper").iterdir())
    assert copied == sorted(p.name for p in (tmp_path / "runs" / "tables").glob("*.tex"))
    assert (tmp_path / "paper" / "ppl.tex").read_text() == (
        tmp_path / "runs" / "tables" / "ppl.tex"
    ).read_text()
    assert f"LaTeX tables: 7 in {tmp_path / 'paper'} (style table)" in capsys.readouterr().out


def test_latex_style_restyles_the_copies_only(tmp_path, capsys):
    write_runs(tmp_path / "runs", separable_seeds())
    report_main([str(tmp_path / "runs"), "--latex", str(tmp_path / "paper")])
    report_main(
        [str(tmp_path / "runs"), "--latex", str(tmp_path / "compact"), "--latex-style", "compact"]
    )
    own, default, compact = (
        (folder / "ppl.tex").read_text()
        for folder in (tmp_path / "runs" / "tables", tmp_path / "paper", tmp_path / "compact")
    )
    assert own == default and default.startswith(latex.header("table"))
    assert compact == latex.header("compact") + default[len(latex.header()) :]
    assert "\\providecommand{\\peci}[1]{}" in compact  # intervals dropped
    assert "\\providecommand{\\pefloat}{auto}" in compact
    assert "\\providecommand{\\pefloat}{table*}" in latex.header("compact*")
    with pytest.raises(SystemExit):
        report_main([str(tmp_path / "runs"), "--latex-style", "table*"])
    assert "--latex-style table* styles the --latex copies: add --latex DIR" in (
        capsys.readouterr().err
    )
    with pytest.raises(ValueError, match="not a table file of this pe-bench version"):
        latex.restyle("\\begin{table}", "compact")


def tex_missing() -> str:
    """Why pdflatex cannot compile the tables here ('' when it can)."""
    if shutil.which("pdflatex") is None or shutil.which("pdftohtml") is None:
        return "pdflatex or pdftohtml is not installed (Debian: texlive-latex-recommended "
        "texlive-science poppler-utils)"
    for package in ("booktabs.sty", "siunitx.sty", "graphicx.sty"):
        found = subprocess.run(["kpsewhich", package], capture_output=True, text=True)
        if not found.stdout.strip():
            return f"{package} is not installed"
    return ""


needs_tex = pytest.mark.skipif(bool(tex_missing()), reason=tex_missing() or "installed")

COMMITTED = sorted(ROOT.glob("results/*/tables/*.tex"))
# the article class in one and in two columns: a paper's narrowest and widest homes
DOCUMENTS = {"one column": "", "two columns": "twocolumn"}


def compile_tables(folder: Path, tables: list[Path], options: str, before: str = "") -> str:
    """pdflatex on an article (``options``) that inputs each table on a page of its own
    (``before`` first: a paper's own definitions), its log split by table: one string per
    table, what LaTeX said while it set and placed that table."""
    inputs = "\n".join(
        f"\\typeout{{PE-TABLE {i}}}\\input{{{p.resolve().as_posix()}}}\\clearpage"
        for i, p in enumerate(tables)
    )
    document = (
        f"\\documentclass[{options}]{{article}}\n\\usepackage{{booktabs}}\n"
        "\\usepackage{siunitx}\n\\usepackage{graphicx}\n"
        f"{before}\\begin{{document}}\n{inputs}\n\\typeout{{PE-TABLE end}}\\end{{document}}\n"
    )
    (folder / "paper.tex").write_text(document)
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = (folder / "paper.log").read_text(errors="replace")
    assert done.returncode == 0, log[-3000:]
    assert f"Output written on paper.pdf ({len(tables)} page" in log
    return re.split(r"PE-TABLE \S+", log)[1:-1]


PROBLEMS = re.compile(r"^(Overfull \\[hv]box .*|.*Float too large.*|! .*)$", flags=re.M)


@pytest.mark.slow
@needs_tex
@pytest.mark.parametrize("options", DOCUMENTS.values(), ids=list(DOCUMENTS))
def test_every_committed_table_fits_a_page_and_a_column(options, tmp_path):
    """No table overflows the line or the page in a one- or two-column article (the zoo's
    39 rows and notes, kazemnejad's 21 lengths): each is scaled down to fit."""
    assert len(COMMITTED) > 100
    pieces = compile_tables(tmp_path, COMMITTED, options)
    found = {
        str(p.relative_to(ROOT)): PROBLEMS.findall(log)
        for p, log in zip(COMMITTED, pieces, strict=True)
    }
    assert {name: lines for name, lines in found.items() if lines} == {}


@pytest.mark.slow
@needs_tex
@pytest.mark.parametrize("style", list(latex.STYLES))
def test_each_style_compiles_and_sets_the_best_cell_bold(style, tmp_path):
    """The best cell's digits (interval too) in a bold font in the PDF, the others' not, in
    every style and both document classes; compact leaves the intervals out."""
    write_runs(tmp_path / "runs", separable_seeds())
    report_main([str(tmp_path / "runs"), "--latex", str(tmp_path / "t"), "--latex-style", style])
    tables = [tmp_path / "t" / name for name in ("nll.tex", "ranks.tex", "score.tex")]
    for options in DOCUMENTS.values():
        pieces = compile_tables(tmp_path, tables, options)
        assert not any(PROBLEMS.findall(log) for log in pieces)
        nll, ranks = (
            row_fonts(tmp_path / "paper.pdf", "alibi", 1),
            row_fonts(tmp_path / "paper.pdf", "rope", 2),
        )
        assert ranks == [("rope", False), ("1", True), ("2", False)]
        # alibi's two NLL cells are both best: every digit bold, the label not
        assert nll[0] == ("alibi", False) and all(bold for _, bold in nll[1:]), nll
        text = "".join(t for t, _ in nll)
        assert ("[" in text) == style.startswith("table"), text


def row_fonts(pdf: Path, label: str, page: int) -> list[tuple[str, bool]]:
    """The text pieces on ``label``'s line of ``page``, left to right, each with whether its
    font is bold (Computer Modern's bold text and bold math fonts), read by pdftohtml."""
    xml = subprocess.run(
        ["pdftohtml", "-xml", "-i", "-stdout", "-f", str(page), "-l", str(page), str(pdf)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    fonts = {m[0]: m[1] for m in re.findall(r'<fontspec id="(\d+)"[^>]*family="([^"]+)"', xml)}
    pieces = [
        (int(top), int(left), text, fonts[font])
        for top, left, font, text in re.findall(
            r'<text top="(\d+)" left="(\d+)"[^>]*font="(\d+)">(.*?)</text>', xml
        )
    ]
    (row_top,) = {top for top, _, text, _ in pieces if text.strip() == label}
    line = sorted(  # an interval's smaller digits sit a few points lower
        (left, text, family) for top, left, text, family in pieces if abs(top - row_top) <= 5
    )
    words = []
    for _, text, family in line:
        bold = bool(re.search(r"CMBX|CMMIB|Bold", family))
        for word in text.split():
            words.append((word, bold))
    return merge_digits(words)


def merge_digits(words: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Pieces of one number (pdftohtml splits \\num's digits from its decimal point) joined
    while their weight agrees."""
    merged: list[tuple[str, bool]] = []
    for word, bold in words:
        if merged and merged[-1][1] == bold and not merged[-1][0].isalpha():
            merged[-1] = (merged[-1][0] + word, bold)
        else:
            merged.append((word, bold))
    return merged
