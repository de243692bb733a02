"""What the command line says (issue 41): ``--help`` pages a newcomer can read, and where a
report's files are, absolute; pe-bench-report refuses an output option before writing anything
(issue 37, item 5)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pe_bench.cli import check, place, report
from tests.helpers import three_seeds, write_runs


@pytest.mark.parametrize("script", [report, check, place], ids=["report", "check", "place"])
def test_help_describes_the_command_in_full_sentences_without_markup(script, capsys):
    with pytest.raises(SystemExit):
        script.main(["--help"])
    text = capsys.readouterr().out
    description = text.split("\n\n")[1]
    assert "`" not in text and description.rstrip().endswith(".")


@pytest.mark.slow  # the console script
def test_pe_bench_help_is_a_usage_page_not_hydra_s_template_and_the_config():
    proc = subprocess.run(
        [sys.executable, "-m", "pe_bench.cli", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0
    assert "powered by Hydra" not in proc.stdout and "== Config ==" not in proc.stdout
    assert proc.stdout.startswith("pe-bench: train small language models")
    assert "pe: alibi, " in proc.stdout and "pe-bench --cfg job" in proc.stdout
    for script in ("pe-bench-report <folder>", "pe-bench-check <scheme>", "pe-bench-place"):
        assert script in proc.stdout  # each command the package installs
    assert len(proc.stdout.splitlines()) < 40


def written(folder):
    return sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("option", ["--site", "--latex", "--out"])
def test_an_output_option_that_names_a_file_is_refused_before_anything_is_written(
    tmp_path, option, capsys
):
    write_runs(tmp_path / "runs", three_seeds())
    before = written(tmp_path)
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(SystemExit) as done:
        report.main([str(tmp_path / "runs"), option, str(tmp_path / "a.txt")])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        f"pe-bench-report: error: {option} '{tmp_path / 'a.txt'}' is a file; allowed: a "
        "folder, new or existing\n"
    )
    assert written(tmp_path) == sorted([*before, Path("a.txt")])


def test_a_site_folder_with_other_files_is_refused_before_anything_is_written(tmp_path, capsys):
    write_runs(tmp_path / "runs", three_seeds())
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "notes.txt").write_text("mine")
    before = written(tmp_path)
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "runs"), "--site", str(tmp_path / "site")])
    assert "--site" in capsys.readouterr().err and written(tmp_path) == before


def test_a_report_names_its_files_absolute_and_how_to_make_a_site(tmp_path, capsys, monkeypatch):
    write_runs(tmp_path / "runs", three_seeds())
    monkeypatch.chdir(tmp_path)
    report.main(["runs"])
    out = capsys.readouterr().out.splitlines()
    runs = tmp_path / "runs"
    assert f"report: {runs / 'report.md'}" in out
    assert any(line.startswith(f"figures: {runs / 'figures'} (") for line in out)
    assert f"tables: {runs / 'tables'} (Markdown, CSV and LaTeX)" in out
    assert f"site: pe-bench-report {runs} --site {runs / 'site'} writes it" in out
    report.main(["runs", "--site", "site"])
    assert f"site: {tmp_path / 'site' / 'index.html'}" in capsys.readouterr().out.splitlines()


def test_the_figures_line_names_the_sections_figures_too(tmp_path):
    """A SmolLM2 report drew a passkey heatmap the last lines did not name: the probes' and
    the passkey, RULER and RoPE-base sections' figures are named with the report's own."""
    from pe_bench.report.inputs import Options, Report
    from pe_bench.report.probes import ContextUse

    figures = tmp_path / "figures"
    done = Report(tmp_path / "report.md", Options(), figures={"length": figures / "ppl.png"})
    done.context = ContextUse(train_len=16, figures={"retrieval": figures / "retrieval.png"})
    done.passkey = ["## Passkey retrieval", "![Passkey by depth](figures/passkey.png)"]
    done.ruler = ["![RULER NIAH recall by depth and length](figures/ruler.png)"]
    lines = done.where(tmp_path).splitlines()
    assert f"figures: {figures} (passkey, ppl, retrieval, ruler; PNG and PDF)" in lines
    done.figures, done.context, done.passkey, done.ruler = {}, None, [], []
    assert not any(line.startswith("figures:") for line in done.where(tmp_path).splitlines())
