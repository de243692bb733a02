"""LaTeX tables: every report table as tables/*.tex, numbers in \\num{}, the best cell of a
column in \\pebest and the cells the seeds do not separate from it in \\petied, caveats as
notes; they compile with pdflatex where it is installed."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from pe_bench.cli.report import main as report_main
from pe_bench.report import latex
from pe_bench.report.build import build_report
from tests.helpers import separable_seeds, write_runs


def cells(tex: str, label: str) -> list[str]:
    """The cells of ``label``'s row in a LaTeX table (the row with a cell naming it)."""
    rows = [x.removesuffix(" \\\\").split(" & ") for x in tex.splitlines() if " & " in x]
    (row,) = [r for r in rows if latex.escape(label) in r]
    return row


def test_cells_escape_text_and_put_numbers_in_num():
    assert latex.cell("rope+dynamic_ntk †", numeric=False) == "rope+dynamic\\_ntk \\dag{}"
    assert latex.cell("4.98 [4.64, 5.35]", numeric=True) == (
        "\\num{4.98} {\\scriptsize[\\num{4.64}, \\num{5.35}]}"
    )
    assert latex.cell("1,228,800", numeric=True) == "\\num{1228800}"
    assert latex.cell("+0.120 [-0.010, +0.250]", numeric=True).startswith("+\\num{0.120}")
    assert latex.cell("0.900 (n=1) ‡", numeric=True) == "\\num{0.900} (n=\\num{1}) \\ddag{}"
    assert latex.cell("–", numeric=True) == "--"
    assert latex.cell(">1000 / 11.45", numeric=True) == "\\textgreater{}\\num{1000} / \\num{11.45}"
    assert latex.prose("`pe_params` is **new**") == "\\texttt{pe\\_params} is \\textbf{new}"


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
    assert "\\label{tab:pe-bench-" in tex and "\\toprule" in tex and "\\bottomrule" in tex
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
    assert f"LaTeX tables: 7 in {tmp_path / 'paper'}" in capsys.readouterr().out


def tex_missing() -> str:
    """Why pdflatex cannot compile the tables here ('' when it can)."""
    if shutil.which("pdflatex") is None:
        return "pdflatex is not installed (Debian: texlive-latex-recommended texlive-science)"
    for package in ("booktabs.sty", "siunitx.sty"):
        found = subprocess.run(["kpsewhich", package], capture_output=True, text=True)
        if not found.stdout.strip():
            return f"{package} is not installed"
    return ""


@pytest.mark.slow
@pytest.mark.skipif(bool(tex_missing()), reason=tex_missing() or "pdflatex is installed")
def test_the_tables_compile_with_pdflatex(tmp_path):
    write_runs(tmp_path / "runs", separable_seeds())
    report = build_report(tmp_path / "runs", echo=False)
    inputs = "\n".join(f"\\input{{{p.as_posix()}}}\\clearpage" for p in report.latex)
    document = (
        "\\documentclass{article}\n\\usepackage{booktabs}\n\\usepackage{siunitx}\n"
        f"\\begin{{document}}\n{inputs}\n\\end{{document}}\n"
    )
    (tmp_path / "paper.tex").write_text(document)
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = (tmp_path / "paper.log").read_text(errors="replace")
    assert done.returncode == 0, log[-3000:]
    assert not re.search(r"^! ", log, flags=re.M), log[-3000:]
    assert (tmp_path / "paper.pdf").read_bytes().startswith(b"%PDF")
    assert f"Output written on paper.pdf ({len(report.latex)} pages" in log
