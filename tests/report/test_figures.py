"""Figures: the expected series and panels in each label's style, legends that fit, byte-stable
files."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image

from pe_bench.positions import scheme_family
from pe_bench.report import aggregate, figures
from pe_bench.report.styles import CLASSIC_LABELS, styles
from tests.helpers import prepared, three_seeds


def labelled_lines(ax) -> list:
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


def test_a_long_legend_wraps_into_columns_inside_the_figure():
    labels = [*CLASSIC_LABELS, *(f"scheme{i}" for i in range(21))]
    rows = [
        {"label": lab, "eval_len": length, "mean": 2.0 + i, "n": 1}
        for i, lab in enumerate(labels)
        for length in (16, 32)
    ]
    stats = pd.DataFrame(rows).assign(ci_low=float("nan"), ci_high=float("nan"))
    with figures.theme():
        fig = figures.length_figure(stats, styles(labels), "ppl", train_len=16)
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)
        texts = fig.legends[0].get_texts()
        assert [t.get_text() for t in texts] == labels
        for text in texts:
            box = text.get_window_extent(renderer)
            assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1), text


def test_length_figure_has_a_line_per_label_and_bands_where_seeds():
    df = prepared(three_seeds())
    stats = aggregate.seed_stats(df, "ppl")
    fig = figures.length_figure(stats, styles(["rope", "alibi"]), "ppl", train_len=16)
    (ax,) = fig.axes
    lines = labelled_lines(ax)
    assert [line.get_label() for line in lines] == ["rope", "alibi"]
    alibi = stats[stats["label"] == "alibi"]
    assert list(lines[1].get_ydata()) == list(alibi["mean"])
    assert lines[1].get_color() == styles(["alibi"])["alibi"].color
    assert len(ax.collections) == 1  # a CI band for alibi (3 seeds), none for rope (1 seed)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["rope", "alibi"]


def thirty_labels() -> tuple[list[str], dict[str, str], pd.DataFrame]:
    """33 labels in 6 families (nope, rope and alibi alone in theirs) and their stats."""
    labels = ["nope", "rope", "alibi", *(f"scheme{i}" for i in range(30))]
    families = {lab: f"family{i % 3}" for i, lab in enumerate(labels)}
    families |= {"nope": "absolute", "rope": "rotary", "alibi": "bias"}
    rows = [
        {"label": lab, "eval_len": length, "mean": 2.0 + i, "n": 1}
        for i, lab in enumerate(labels)
        for length in (16, 32)
    ]
    return labels, families, pd.DataFrame(rows).assign(ci_low=float("nan"), ci_high=float("nan"))


def test_thirty_labels_are_drawn_as_a_panel_per_family():
    """The zoo's 30+ lines in one panel were unreadable: past MAX_LINES, one panel per family,
    each with its own legend, and nope/rope/alibi drawn faintly where they are not members."""
    labels, families, stats = thirty_labels()
    fig = figures.length_figure(stats, styles(labels), "ppl", 16, families=families)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert sorted(ax.get_title() for ax in panels) == sorted(set(families.values()))
    for ax in panels:
        members = [lab for lab in labels if families[lab] == ax.get_title()]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == members
        landmarks = [t.get_text() for t in ax.texts if t.get_text() in figures.LANDMARKS]
        assert sorted(landmarks) == sorted(set(figures.LANDMARKS) - set(members))
    few = figures.length_figure(
        stats[stats["label"].isin(labels[:5])], styles(labels), "ppl", 16, families=families
    )
    assert len(few.axes) == 1  # a handful of lines stay in one panel


@pytest.mark.slow  # draws six panels
def test_a_family_panels_legend_lies_beside_it_clear_of_the_training_length():
    """Issue 41: results/zoo's legends inside the axes covered the training-length label."""
    labels, families, stats = thirty_labels()
    fig = figures.length_figure(stats, styles(labels), "ppl", 16, families=families)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    for ax in [ax for ax in fig.axes if ax.get_visible()]:
        frame = ax.get_window_extent(renderer)
        assert not ax.get_legend().get_window_extent(renderer).overlaps(frame), ax.get_title()
        (mark,) = [t for t in ax.texts if t.get_text() == "training length"]
        box = mark.get_window_extent(renderer)
        assert frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1)


def test_scheme_families_come_from_the_classes():
    assert scheme_family("rope") == scheme_family("xpos") == "rotary"
    assert scheme_family("alibi") == scheme_family("t5") == "additive bias"
    assert scheme_family("nope") == scheme_family("learned") == "absolute or none"
    assert scheme_family("xl") == scheme_family("cope") == "content-dependent and gated"
    assert scheme_family("not_imported_plugin") == "plugins"


def test_position_figure_has_a_panel_per_eval_length():
    rows = [
        {"label": lab, "eval_len": length, "position": p, "loss": 1.0}
        for lab in ("rope", "alibi")
        for length in (16, 32, 64, 128)
        for p in (1, 2, 4)
    ]
    fig = figures.position_figure(pd.DataFrame(rows), styles(["rope", "alibi"]), 16)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == [
        f"windows of {n} tokens" for n in (16, 32, 64, 128)
    ]
    assert all(len(labelled_lines(ax)) == 2 for ax in panels)


def test_the_position_title_of_two_window_lengths_fits_its_figure():
    """A pretrained model at 1x and 2x (results/smollm2) has two panels: the one-line title
    ran past both edges of the figure."""
    rows = [
        {"label": "model", "eval_len": length, "position": p, "loss": 1.0}
        for length in (8192, 16384)
        for p in (1, 2, 4)
    ]
    with figures.theme():  # the report's fonts
        fig = figures.position_figure(pd.DataFrame(rows), styles(["model"]), 8192)
        renderer = FigureCanvasAgg(fig).get_renderer()
        title, page = fig._suptitle.get_window_extent(renderer), fig.bbox
    assert page.x0 <= title.x0 and title.x1 <= page.x1


@pytest.mark.slow  # draws nine panels of 20 lines
def test_many_labels_by_position_are_a_row_per_family_with_intervals():
    """Issue 41: the zoo's 39 lines in each position panel, no intervals, the title running
    into the legend, two panels without a tick at their end. Past MAX_LINES, a row per family
    (its legend beside it, outside the title), each line with its seeds' band, and every
    panel labels its window's last position."""
    from matplotlib.collections import PolyCollection

    from pe_bench.report.styles import report_styles

    labels = [f"scheme{i}" for i in range(20)]
    families = {lab: f"family{i % 3}" for i, lab in enumerate(labels)}
    rows = [
        {"label": lab, "eval_len": length, "position": p, "loss": 2.0 + i / 10, "n": 3,
         "ci_low": 1.9 + i / 10, "ci_high": 2.1 + i / 10}
        for i, lab in enumerate(labels)
        for length in (16, 48, 128)
        for p in range(1, length + 1)
    ]  # fmt: skip
    style = report_styles(labels, families)
    with figures.theme():
        fig = figures.position_figure(pd.DataFrame(rows), style, 16, families=families)
        fig.draw(FigureCanvasAgg(fig).get_renderer())
    grid = fig.axes[0].get_subplotspec().get_gridspec()
    assert (grid.nrows, grid.ncols) == (3, 3)
    for row in range(3):
        panels = fig.axes[3 * row : 3 * row + 3]
        members = [lab for lab in labels if families[lab] == f"family{row}"]
        assert panels[0].get_ylabel().startswith(f"family{row}\n")
        legend = [t.get_text() for t in panels[-1].get_legend().get_texts()]
        assert legend == members
        for ax, length in zip(panels, (16, 48, 128), strict=True):
            assert [line.get_label() for line in labelled_lines(ax)] == members
            bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
            assert len(bands) == len(members)
            assert ax.get_xticklabels()[-1].get_text() == str(length)
            assert ax.get_xlim() == (1, length)
    title = fig._suptitle.get_window_extent()
    for ax in fig.axes:
        box = ax.get_legend().get_window_extent() if ax.get_legend() else None
        assert box is None or not title.overlaps(box)
        assert not title.overlaps(ax.title.get_window_extent())


def test_curve_figure_has_training_and_validation_panels():
    rows = [
        {"label": "rope", "split": split, "step": step, "n": 1, "mean": 2.0, "ci_low": None,
         "ci_high": None}
        for split in ("train", "valid")
        for step in (10, 20)
    ]  # fmt: skip
    fig = figures.curve_figure(pd.DataFrame(rows), styles(["rope"]))
    assert [ax.get_title() for ax in fig.axes] == ["training loss", "validation loss"]
    assert all(len(labelled_lines(ax)) == 1 for ax in fig.axes)


def test_heatmap_annotates_every_cell():
    df = prepared(three_seeds())
    ratio = aggregate.ratio_table(aggregate.seed_stats(df, "bpb"), baseline=16)
    fig = figures.ratio_heatmap(ratio, "bpb", 16)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["1.00", f"{2.0 / 0.9:.2f}", "1.00", f"{1.5 / 1.2:.2f}"]  # rope, alibi


@pytest.mark.slow
@pytest.mark.real_figures
def test_saved_figures_are_valid_and_byte_stable(tmp_path):
    stats = aggregate.seed_stats(prepared(three_seeds()), "bpb")
    style = styles(["rope", "alibi"])
    with figures.theme():
        first = figures.save(figures.length_figure(stats, style, "bpb", 16), tmp_path / "a", "f")
        second = figures.save(figures.length_figure(stats, style, "bpb", 16), tmp_path / "b", "f")
    assert first.read_bytes() == second.read_bytes()
    assert first.with_suffix(".pdf").read_bytes() == second.with_suffix(".pdf").read_bytes()
    assert first.with_suffix(".pdf").read_bytes().startswith(b"%PDF")
    with Image.open(first) as image:
        image.verify()
        assert image.size[0] > 1000


@pytest.mark.parametrize(("n", "labelled"), [(5, 5), (8, 8), (21, 7)])
def test_a_length_axis_labels_at_most_eight_lengths_from_the_first(n, labelled):
    """A task's 21 lengths (42 to 82) ran their labels into each other; every length keeps
    its tick."""
    from matplotlib.figure import Figure

    lengths = [42 + 2 * i for i in range(n)]
    ax = Figure().subplots()
    figures.log2_lengths(ax, lengths)
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert list(ax.get_xticks()) == lengths and len(labels) == n
    assert labels[0] == "42" and sum(bool(t) for t in labels) == labelled
