"""The passkey heatmap (``report.passkey.depth_figure``): issue 41 found SmolLM2's third panel
title clipped ("+self_extenc"), no colour bar and blank cells unexplained."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from pe_bench.report import figures
from pe_bench.report.passkey import depth_figure

LABELS = ["SmolLM2", "SmolLM2+ntk_by_parts", "SmolLM2+self_extend", "SmolLM2+yarn",
          "SmolLM2+a_variant_with_a_much_longer_name"]  # fmt: skip


def cells() -> pd.DataFrame:
    """Every label at two lengths, a trial in 3 of the 5 depth bins (the others blank)."""
    rows = [
        {"label": lab, "eval_len": length, "depth_low": low, "depth_high": low + 0.2,
         "acc": float(i % 2), "trials": 1}
        for i, lab in enumerate(LABELS)
        for length in (4096, 8192)
        for low in (0.0, 0.4, 0.8)
    ]  # fmt: skip
    return pd.DataFrame(rows)


@pytest.mark.slow  # draws five heatmaps
def test_the_heatmap_has_one_colour_bar_whole_titles_and_says_what_a_blank_cell_is():
    with figures.theme():
        fig = depth_figure(cells(), train_len=8192)
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert [ax.get_title() for ax in panels] == [
        "as pretrained", "+ntk_by_parts", "+self_extend", "+yarn",
        "+a_variant_with_a_much_longer_name",
    ]  # fmt: skip
    boxes = [ax.title.get_window_extent(renderer) for ax in panels]
    for ax, box in zip(panels, boxes, strict=True):  # inside the figure, clear of its neighbours
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1, ax.get_title()
        assert not any(box.overlaps(other) for other in boxes if other is not box)
    bars = [ax for ax in fig.axes if ax.get_ylabel() == "score (share found)"]
    assert len(bars) == 1 and bars[0].get_ylim() == (0.0, 1.0)
    found = [t.get_text() for t in panels[0].texts]
    assert found == ["0/1", "0/1", "0/1", "0/1", "0/1", "0/1"]  # 6 cells with a trial, 4 blank
    assert "blank: no trial there" in fig._supxlabel.get_text()
