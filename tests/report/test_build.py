"""Reports end to end: the smoke experiment's report, options, diverged and skipped runs,
files replaced whole (tests/report/test_inputs.py holds what a report refuses)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from matplotlib.figure import Figure
from PIL import Image

from pe_bench.cli.report import main as report_main
from pe_bench.files import write_jsonl
from pe_bench.report import aggregate, figures
from pe_bench.report.build import build_report
from pe_bench.report.inputs import Options
from pe_bench.report.markdown import caption
from pe_bench.report.sections import score_markdown
from pe_bench.report.significance import pairwise_markdown, pairwise_tables
from pe_bench.report.styles import styles
from tests.helpers import (
    CLASSIC,
    diverged,
    prepared,
    read_rows,
    record,
    three_seeds,
    truncate_runs,
    write_runs,
)

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


def section_tables(text: str, heading: str) -> list[list[list[str]]]:
    """The tables of the report section ``## heading``."""
    return markdown_tables(text.split(f"\n## {heading}\n")[1].split("\n## ")[0])


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
    ppl, ratio, score = tables[:3]
    (runs,) = section_tables(text, "Runs")
    assert ppl[0] == ["scheme", "16", "32", "64"]
    assert [row[0] for row in ppl[1:]] == SMOKE_LABELS
    means = pd.read_csv(folder / "tables" / "ppl.csv")
    assert [row[1:] for row in ppl[1:]] == [
        [f"{m:.2f}" for m in means.loc[means["label"] == lab, "mean"]] for lab in SMOKE_LABELS
    ]
    assert all(float(cell) == 1.0 for cell in (row[1] for row in ratio[1:]))
    assert sorted(int(row[0].lstrip("=")) for row in score[1:]) == sorted(
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
    style = styles(SMOKE_LABELS)
    stats = pd.read_csv(folder / "tables" / "ppl.csv")
    fig = figures.length_figure(stats, style, "ppl", 16)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == SMOKE_LABELS
    positions = pd.read_csv(folder / "figures" / "position_loss.csv")
    fig = figures.position_figure(positions, style, 16)
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
    fig = figures.curve_figure(curves, style)
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
    report_main(
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
    report_main([str(tmp_path), "--metric", "nll"])
    (table,) = markdown_tables((tmp_path / "tables" / "nll.md").read_text())
    half = 4.302652729911275 * 0.2 / math.sqrt(3)
    assert table[2] == [
        "alibi",
        f"1.200 [{1.2 - half:.3f}, {1.2 + half:.3f}]",
        f"1.500 [{1.5 - half:.3f}, {1.5 + half:.3f}]",
    ]
    assert table[1] == ["rope", "0.900 (n=1)", "2.000 (n=1)"]
    assert "n = 3 seeds per cell" in capsys.readouterr().out


@pytest.mark.slow
def test_diverged_runs_are_shown(tmp_path):
    rows = [
        *three_seeds(),
        *diverged("alibi", 3, step=7),
        *diverged("xl", 0, step=40),
    ]
    write_runs(tmp_path, rows)
    build_report(tmp_path, echo=False)
    text = (tmp_path / "report.md").read_text()
    tables = markdown_tables(text)
    assert tables[0][1] == ["xl †", "diverged", "diverged"] and tables[0][3][0] == "alibi †"
    assert "## Diverged runs" in text
    (diverged_table,) = section_tables(text, "Diverged runs")
    assert diverged_table[1:] == [["alibi", "3", "alibi-3", "7"], ["xl", "0", "xl-0", "40"]]


def test_a_pretrained_model_s_intervals_are_over_test_slices_not_seeds():
    """A pretrained model's replicates are its test slices (documents): its report said it was
    trained at L, and paired its slices as seeds sharing "data order, trunk initialisation"."""
    rows = three_seeds()[:6]
    for seed, shift in enumerate([-0.1, 0.1, 0.0]):
        rows += [record("rope", seed, 16, 1.2 + shift), record("rope", seed, 32, 2.0 + seed * 0.2)]
    df = prepared([{**row, "pretrained": True} for row in rows])
    stats = {metric: aggregate.seed_stats(df, metric) for metric in ("ppl", "nll")}
    said = caption(stats["ppl"], "ppl", df)
    assert said.startswith("context L = 16 tokens") and "n = 3 test slices per cell" in said
    report = SimpleNamespace(
        tables=pairwise_tables(df, stats, "ppl"), options=Options(metric="ppl"), frame=df
    )
    text = "\n".join(pairwise_markdown(report))
    assert "## Which differences the test slices support" in text
    assert "paired over test slices (the same slice: the same documents, the same model)" in text
    assert "seed" not in text and "trunk" not in text


def test_the_report_ranks_only_what_the_seeds_separate(tmp_path):
    """rope is 0.7 nats worse than alibi at 32 in every seed (separated: rank 2) and within
    seed noise at 16 (shared rank 1); every pair is in tables/pairwise.csv."""
    rows = three_seeds()[:6]
    for seed, shift in enumerate([-0.1, 0.1, 0.0]):
        rows += [record("rope", seed, 16, 1.2 + shift), record("rope", seed, 32, 2.0 + seed * 0.2)]
    write_runs(tmp_path, rows)
    build_report(tmp_path, echo=False)
    text = (tmp_path / "report.md").read_text()
    (ranks,) = section_tables(text, "Which differences the seeds support")
    assert ranks == [["scheme", "16", "32"], ["rope", "1", "2"], ["alibi", "1", "1"]]
    assert "1 of 2 pairs are separated (up to n = 3 seeds per pair" in text
    pairs = pd.read_csv(tmp_path / "tables" / "pairwise.csv")
    assert pairs[["label_a", "label_b", "eval_len", "n"]].values.tolist() == [
        ["rope", "alibi", 16, 3],
        ["rope", "alibi", 32, 3],
    ]


def test_caveats_travel_with_the_numbers(tmp_path):
    """A scheme whose protocol departs from its paper's carries a one-line caveat from its
    records into report.md, under the value table; one seed's record carrying it is enough."""
    caveat = "key term a^K only"
    rows = [*three_seeds(), record("shaw", 0, 16, 1.1, caveat=caveat), record("shaw", 0, 32, 1.4)]
    write_runs(tmp_path, rows)
    build_report(tmp_path, echo=False)
    text = (tmp_path / "report.md").read_text()
    value_section = text.split("## Ratio to")[0]
    assert f"Caveat, shaw: {caveat}." in value_section
    assert "Caveat, alibi" not in text and "Caveat, rope" not in text


@pytest.mark.slow
def test_provenance_names_the_cpu_where_records_do(tmp_path):
    """Records that name their CPU model and ATen kernels put them in the provenance section
    and the cost notes, with how many records name none; records that name none (every one
    made before records carried them) leave both as they were."""
    write_runs(tmp_path / "old", three_seeds())
    build_report(tmp_path / "old", echo=False)
    old = (tmp_path / "old" / "report.md").read_text()
    assert "ATen" not in old and "; CPU " not in old
    cpu = {"cpu_model": "AMD EPYC", "cpu_capability": "AVX2"}
    rows = [{**r, **cpu} if r["scheme"] == "alibi" else r for r in three_seeds()]
    write_runs(tmp_path / "new", rows)
    build_report(tmp_path / "new", echo=False)
    text = (tmp_path / "new" / "report.md").read_text()
    named = "AMD EPYC (AVX2) for 6 of 8 records; the others name no CPU"
    assert f"- CPU (ATen kernels): {named}\n" in text
    assert ", device cpu, torch 2.13.0: one wall-clock" in text  # the cost notes, then
    assert f"CPU (ATen kernels): {named}.  \n" in text


def report_files(folder: Path) -> dict[Path, bytes]:
    """Every file a report wrote under ``folder`` (report.md, tables, figures) and its bytes."""
    paths = [folder / "report.md", *sorted((folder / "tables").iterdir())]
    paths += sorted((folder / "figures").iterdir())
    return {path: path.read_bytes() for path in paths}


@pytest.mark.slow
def test_every_report_file_replaces_the_old_one_whole(tmp_path, monkeypatch):
    """Figures, their data, tables and report.md each reach their place by one os.replace of a
    temporary file beside them: a report killed at any moment leaves each file old or new."""
    write_runs(tmp_path, three_seeds())
    build_report(tmp_path, echo=False)
    replaced = []
    real_replace = os.replace

    def replace(src, dst):
        replaced.append((Path(src).parent, Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    build_report(tmp_path, echo=False)
    written = sorted(report_files(tmp_path))
    assert sorted(dst for _, dst in replaced) == written
    assert all(folder == dst.parent for folder, dst in replaced)


@pytest.mark.slow
@pytest.mark.real_figures
def test_a_figure_that_fails_midway_leaves_the_old_one(tmp_path, monkeypatch):
    """A figure save that dies halfway through (a kill, a full disk) used to leave a truncated
    PNG in place of the good one."""
    write_runs(tmp_path, three_seeds())
    build_report(tmp_path, echo=False)
    before = report_files(tmp_path)

    def broken_savefig(self, fname, **kwargs):
        half = b"\x89PNG\r\n"  # the start of a figure, then the writer dies
        if isinstance(fname, (str, os.PathLike)):
            Path(fname).write_bytes(half)
        else:
            fname.write(half)
        raise OSError(28, "no space left on device")

    write_runs(tmp_path, [{**r, "nll": r["nll"] + 1} for r in three_seeds()])  # new numbers
    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    with pytest.raises(OSError, match="no space left"):
        build_report(tmp_path, echo=False)
    figures = {p: b for p, b in report_files(tmp_path).items() if p.parent.name == "figures"}
    assert figures == {p: b for p, b in before.items() if p.parent.name == "figures"}
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_a_killed_reports_temporary_files_are_removed(tmp_path):
    """A report killed mid-write leaves its temporary file; the next report clears it."""
    write_runs(tmp_path, three_seeds())
    build_report(tmp_path, echo=False)
    strays = [".report.md.ab12.tmp", "tables/.ppl.csv.cd34.tmp", "figures/.ratio_heatmap.pdf.x.tmp"]
    kept = [".records.jsonl.ef56.tmp", "notes.tmp", "figures/keep.txt"]
    for name in strays + kept:
        (tmp_path / name).write_bytes(b"")
    build_report(tmp_path, echo=False)
    assert [name for name in strays + kept if (tmp_path / name).exists()] == kept


@pytest.mark.slow
def test_fine_tunes_share_their_models_folder(tmp_path):
    """A fine-tune's run id is ``<run_id>:<key>-<hash>``: its records live beside its model's."""
    write_runs(tmp_path, three_seeds())
    path = tmp_path / "rope-0" / "records.jsonl"
    tuned = [
        {**r, "run_id": "rope-0:pi-0123abcd", "finetune": "pi", "nll": r["nll"] - 0.1}
        for r in read_rows(path)
    ]
    write_jsonl(path, [*read_rows(path), *tuned])
    rep = build_report(tmp_path, echo=False)
    assert rep.tables["nll"]["label"].unique().tolist() == ["rope", "rope:pi", "alibi"]


def oom(scheme: str, seed: int, eval_len: int) -> dict:
    """A record of an evaluation skipped for memory, as pe-bench writes it."""
    reason = f"out of memory at L={eval_len}: CUDA out of memory. Tried to allocate 8.00 GiB"
    nothing = {"nll": None, "ppl": None, "bpb": None}
    return {**record(scheme, seed, eval_len, 0.0, status="skipped", reason=reason), **nothing}


@pytest.mark.slow
def test_skipped_evaluations_are_listed_with_their_reason(tmp_path, capsys):
    rows = [r for r in three_seeds() if (r["run_id"], r["eval_len"]) != ("rope-0", 32)]
    write_runs(tmp_path, [*rows, oom("rope", 0, 32)])
    build_report(tmp_path)
    text = (tmp_path / "report.md").read_text()
    tables = markdown_tables(text)
    assert tables[0][1] == ["rope", "2.46 (n=1)", "– ‡"]
    assert tables[1][1] == ["rope", "1.000", "– ‡"]  # the ratio table
    assert "## Skipped evaluations" in text
    skipped = next(t for t in tables if t[0][-1] == "reason")
    assert skipped[1:] == [
        ["rope", "0", "rope-0", "32", oom("rope", 0, 32)["reason"]],
    ]
    assert text.count("‡ skipped evaluations (no number)") == 2  # under the two tables
    assert "‡ skipped evaluations" in (tmp_path / "tables" / "ppl.md").read_text()
    assert "‡ skipped evaluations" in capsys.readouterr().out


def test_score_table_is_best_first_and_ties_at_the_shown_digits_share_a_rank():
    """Scores that print alike are tied, and the table lists them best first (issue 17: a
    smoke run's table ranked rope-family schemes that printed the same, in label order)."""
    rows = []
    for lab, nll in (("nope", 3.0), ("rope", 2.00004), ("xpos", 2.00001), ("alibi", 2.5)):
        rows += [record(lab, 0, 16, nll), record(lab, 0, 32, nll)]
    scores = aggregate.extrapolation_scores(prepared(rows)).set_index("label")
    assert scores["rank"].to_dict() == {"nope": 4, "rope": 1, "alibi": 3, "xpos": 1}
    lines = score_markdown(scores.reset_index()).splitlines()[2:]
    cells = [[cell.strip() for cell in line.split("|")[1:3]] for line in lines]
    assert cells == [["=1", "rope"], ["=1", "xpos"], ["3", "alibi"], ["4", "nope"]]


@pytest.mark.slow  # two reports' figures: about 10 s
def test_the_truncate_modes_loss_by_position_is_drawn_whatever_mode_the_tables_hold(tmp_path):
    """Tables of nonoverlap: the truncate mode's loss by position (intervals over documents)
    is a figure of its own beside theirs; tables of truncate: their own position figure has
    the intervals, and there is no second one."""
    truncate_runs(tmp_path)
    report = build_report(tmp_path, echo=False)
    drawn = pd.read_csv(tmp_path / "figures" / "position_loss_truncate.csv")
    pd.testing.assert_frame_equal(drawn, report.positions, check_dtype=False)
    assert set(drawn["windows"]) == {4} and (drawn["ci_low"] < drawn["ci_high"]).all()
    text = (tmp_path / "report.md").read_text()
    assert "![Loss by position in documents truncated to the window (papers' protocol)]" in text
    assert "(figures/position_loss_truncate.png)" in text
    assert (tmp_path / "figures" / "position_loss_truncate.pdf").is_file()
    out = tmp_path / "truncate"
    build_report(tmp_path, out, Options(mode="truncate"), echo=False)
    assert not (out / "figures" / "position_loss_truncate.png").exists()
    bands = pd.read_csv(out / "figures" / "position_loss_windows.csv")
    pd.testing.assert_frame_equal(bands, drawn, check_dtype=False)
    assert "(figures/position_loss.png)" in (out / "report.md").read_text()
