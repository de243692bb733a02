"""Reports end to end: the smoke experiment's report, options, bad inputs, diverged runs."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from pe_bench import plots, report
from pe_bench.results import write_jsonl

from .helpers import CLASSIC, diverged, record, three_seeds

SMOKE_LABELS = ["nope", "sinusoidal", "learned", "t5", "xl", "rope", "rope+pi", "rope+ntk", "alibi"]
TABLES = ("ppl", "bpb", "nll", "ratio", "score")
FIGURES = ("ppl_vs_length", "ratio_heatmap", "position_loss", "training_curves")
FILES = [
    "report.md",
    *(f"tables/{name}.{ext}" for name in TABLES for ext in ("csv", "md")),
    *(f"figures/{name}.{ext}" for name in FIGURES for ext in ("png", "pdf")),
    "figures/position_loss.csv",
    "figures/training_curves.csv",
]


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every pipe table in ``text`` as rows of cells (header first, rule dropped); a row whose
    cell count differs from its header's fails the test."""
    tables, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append([cell.strip() for cell in line.strip("|").split("|")])
        elif current:
            header, rule, *rows = current
            assert all(re.fullmatch(r":?-+:?", cell) for cell in rule), rule
            assert all(len(row) == len(header) for row in rows), current
            tables.append([header, *rows])
            current = []
    return tables


def write_runs(folder: Path, rows: list[dict]) -> None:
    """Hand-made records, one run folder per run id."""
    for run_id in dict.fromkeys(r["run_id"] for r in rows):
        write_jsonl(folder / run_id / "records.jsonl", [r for r in rows if r["run_id"] == run_id])


@pytest.mark.slow
def test_smoke_report_end_to_end(smoke):
    proc, folder = smoke
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in FILES:
        assert (folder / name).is_file(), name
    for png in (folder / "figures").glob("*.png"):
        with Image.open(png) as image:
            image.verify()
    text = (folder / "report.md").read_text()
    tables = markdown_tables(text)
    ppl, ratio, score, runs = tables[:4]
    assert ppl[0] == ["scheme", "16", "32", "64"]
    assert [row[0] for row in ppl[1:]] == SMOKE_LABELS
    means = pd.read_csv(folder / "tables" / "ppl.csv")
    assert [row[1:] for row in ppl[1:]] == [
        [f"{m:.2f}" for m in means.loc[means["label"] == lab, "mean"]] for lab in SMOKE_LABELS
    ]
    assert all(float(cell) == 1.0 for cell in (row[1] for row in ratio[1:]))
    assert sorted(int(row[0]) for row in score[1:]) == sorted(
        pd.read_csv(folder / "tables" / "score.csv")["rank"]
    )
    assert [row[0] for row in runs[1:]] == CLASSIC
    assert "pe-bench -m experiment=smoke out_root=" in text
    assert "pe-bench-report . --metric ppl --mode nonoverlap --baseline 16" in text
    for png in ("ppl_vs_length", "ratio_heatmap", "position_loss", "training_curves"):
        assert f"(figures/{png}.png)" in text
    # one series per label in every figure's data
    assert (
        pd.read_csv(folder / "figures" / "position_loss.csv")["label"].unique().tolist()
        == SMOKE_LABELS
    )
    assert (
        pd.read_csv(folder / "figures" / "training_curves.csv")["label"].unique().tolist()
        == CLASSIC
    )


@pytest.mark.slow
def test_smoke_figures_have_a_series_per_label(smoke):
    folder = smoke[1]
    style = plots.styles(SMOKE_LABELS)
    stats = pd.read_csv(folder / "tables" / "ppl.csv")
    fig = plots.length_figure(stats, style, "ppl", 16)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == SMOKE_LABELS
    positions = pd.read_csv(folder / "figures" / "position_loss.csv")
    fig = plots.position_figure(positions, style, 16)
    lengths = sorted(positions["eval_len"].unique())
    assert [ax.get_title() for ax in fig.axes] == [f"windows of {n} tokens" for n in lengths]
    for ax, length in zip(fig.axes, lengths, strict=True):
        panel = positions[positions["eval_len"] == length]
        assert plotted(ax) == {
            lab: (line["position"].tolist(), line["loss"].tolist())
            for lab, line in panel.groupby("label", sort=False)
        }
        assert list(plotted(ax)) == SMOKE_LABELS
        # the dotted training-length line, in the panels longer than the training length
        assert unlabelled_xs(ax) == ([[16, 16]] if length > 16 else [])
    curves = pd.read_csv(folder / "figures" / "training_curves.csv")
    fig = plots.curve_figure(curves, style)
    assert [ax.get_title() for ax in fig.axes] == ["training loss", "validation loss"]
    for ax, split in zip(fig.axes, ["train", "valid"], strict=True):
        at = curves[curves["split"] == split]
        assert plotted(ax) == {
            lab: (line["step"].tolist(), line["mean"].tolist())
            for lab, line in at.groupby("label", sort=False)
        }
        assert list(plotted(ax)) == CLASSIC
        assert unlabelled_xs(ax) == []


def plotted(ax) -> dict[str, tuple[list, list]]:
    """label -> (x, y) of every labelled line of ``ax``, in drawing order."""
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }


def unlabelled_xs(ax) -> list[list]:
    """The x data of the lines without a label (reference lines)."""
    return [list(line.get_xdata()) for line in ax.get_lines() if line.get_label().startswith("_")]


@pytest.mark.slow
def test_options_metric_schemes_and_out(smoke, tmp_path, capsys):
    report.main(
        [str(smoke[1]), "--metric", "bpb", "--schemes", "rope", "alibi", "--out", str(tmp_path)]
    )
    assert (tmp_path / "figures" / "bpb_vs_length.png").exists()
    ratio = pd.read_csv(tmp_path / "tables" / "ratio.csv")
    assert ratio["label"].tolist() == ["rope", "rope+pi", "rope+ntk", "alibi"]
    text = (tmp_path / "report.md").read_text()
    assert "--metric bpb --mode nonoverlap --baseline 16 --schemes rope alibi" in text
    assert "## Bits per byte by evaluation length" in text
    printed = capsys.readouterr().out
    assert "ppl by eval length" in printed and "bpb by eval length" in printed


def test_seeds_give_confidence_intervals(tmp_path, capsys):
    write_runs(tmp_path, three_seeds())
    report.main([str(tmp_path), "--metric", "nll"])
    (table,) = markdown_tables((tmp_path / "tables" / "nll.md").read_text())
    half = 4.302652729911275 * 0.2 / math.sqrt(3)
    assert table[2] == [
        "alibi",
        f"1.200 [{1.2 - half:.3f}, {1.2 + half:.3f}]",
        f"1.500 [{1.5 - half:.3f}, {1.5 + half:.3f}]",
    ]
    assert table[1] == ["rope", "0.900 (n=1)", "2.000 (n=1)"]
    assert "n = 3 seeds per cell" in capsys.readouterr().out


def test_diverged_runs_are_shown(tmp_path):
    rows = [
        *three_seeds(),
        *diverged("alibi", 3, step=7),
        *diverged("xl", 0, step=40),
    ]
    write_runs(tmp_path, rows)
    report.build_report(tmp_path, echo=False)
    text = (tmp_path / "report.md").read_text()
    tables = markdown_tables(text)
    assert tables[0][1] == ["xl †", "diverged", "diverged"] and tables[0][3][0] == "alibi †"
    assert "## Diverged runs" in text
    assert tables[3][1:] == [["alibi", "3", "alibi-3", "7"], ["xl", "0", "xl-0", "40"]]


def test_empty_folder_is_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pe-bench-report: error: no records under") and err.count("\n") == 1


def test_mixed_protocols_are_one_line_error(tmp_path, capsys):
    write_runs(
        tmp_path,
        [r if r["scheme"] == "rope" else {**r, "corpus": "wikitext"} for r in three_seeds()],
    )
    with pytest.raises(SystemExit):
        report.main([str(tmp_path)])
    err = capsys.readouterr().err
    assert "records disagree on corpus: stdlib (rope); wikitext (alibi)" in err
    assert err.count("\n") == 1


def test_corrupt_line_is_skipped_with_file_and_line(tmp_path):
    write_runs(tmp_path, three_seeds())
    path = tmp_path / "rope-0" / "records.jsonl"
    good = path.read_text().splitlines()
    path.write_text("\n".join([good[0], '{"run_id": "rope-0", "sch', good[1]]) + "\n")
    with pytest.warns(UserWarning, match=r"rope-0/records.jsonl:2: corrupt line skipped"):
        rep = report.build_report(tmp_path, echo=False)
    assert rep.tables["nll"]["n"].tolist() == [1, 1, 3, 3]


def test_bad_baseline_is_one_line_error(tmp_path, capsys):
    write_runs(tmp_path, three_seeds())
    with pytest.raises(SystemExit):
        report.main([str(tmp_path), "--baseline", "20"])
    assert (
        "baseline length 20 is not an eval length; the records have 16, 32"
        in capsys.readouterr().err
    )


def test_commands_come_from_hydra_files(tmp_path):
    write_runs(tmp_path / "sweep", three_seeds())
    (tmp_path / "sweep" / "multirun.yaml").write_text(
        json.dumps({"hydra": {"overrides": {"task": ["pe=rope,alibi", "eval.factors=[1,2]"]}}})
    )
    write_runs(tmp_path / "single", [record("t5", 0, 16, 1.0)])
    (tmp_path / "single" / "t5-0" / ".hydra").mkdir()
    (tmp_path / "single" / "t5-0" / ".hydra" / "overrides.yaml").write_text("- pe=t5\n")
    assert report.commands(tmp_path) == [
        "pe-bench pe=t5",
        "pe-bench -m pe=rope,alibi 'eval.factors=[1,2]'",
    ]
