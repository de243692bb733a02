"""One style (colour, marker, line style) per label, the same in every figure of a report.

Colours come from seaborn's colour-blind palette and four of Paul Tol's; labels drawn in one
panel differ in colour, and markers and line styles tell the lines apart in black and white
too. The classic labels always get the same style, whatever else a report holds. The figures
that draw with them are ``pe_bench.report.figures``'s (and the site's, ``report.site``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CLASSIC_LABELS = (
    "nope",
    "sinusoidal",
    "learned",
    "t5",
    "xl",
    "rope",
    "rope+pi",
    "rope+ntk",
    "alibi",
)
# seaborn "colorblind" (Wong's palette) in the order that gives the classic labels the darker
# colours, black added, then four dark colours of Paul Tol's (indigo, wine, olive, magenta): 13
# colours at least 25 apart in CIELAB (Delta E 1976; the closest pairs are Wong's own orange
# and vermillion, blue and sky), none lighter than sky on white (Wong's yellow and light pink
# dropped: on white they were hard to see). nope (no positions) is grey; rope is blue.
PALETTE = (
    "#949494",
    "#de8f05",
    "#ca9161",
    "#cc78bc",
    "#029e73",
    "#0173b2",
    "#56b4e9",
    "#000000",
    "#d55e00",
    "#332288",
    "#882255",
    "#999933",
    "#d81b60",
)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h")
LINESTYLES = ("-", "--", ":", "-.")
# Above this many lines one panel is unreadable: the length figure draws a panel per family.
MAX_LINES = 16


@dataclass(frozen=True)
class Style:
    color: str
    marker: str
    linestyle: str

    def line(self) -> dict:
        """Keyword arguments of ``Axes.plot``."""
        return {"color": self.color, "marker": self.marker, "linestyle": self.linestyle}


def styles(labels: list[str], groups: Mapping[str, str] | None = None) -> dict[str, Style]:
    """A style per label: fixed for the classic labels, then in the given order for the rest.

    ``groups`` maps a label to the panel it is drawn in (the labels drawn together; all of
    them when None): labels drawn together get different colours while the 13 last, and no
    two labels anywhere share a (colour, line style) pair (52 of them) or a (colour, marker)
    pair, so every line differs from the others of its legend in colour, and from every line
    in colour and dash. A label's style depends on the labels before it, not after.
    """
    others = [lab for lab in labels if lab not in CLASSIC_LABELS]
    order = [*CLASSIC_LABELS, *others]
    group = {lab: (groups or {}).get(lab, "") for lab in order}
    pairs: set[tuple[str, str]] = set()
    marked: set[tuple[str, str]] = set()
    dashed: set[tuple[str, str]] = set()
    found: dict[str, Style] = {}
    for i, lab in enumerate(order):
        if i < len(CLASSIC_LABELS):  # fixed: the same in every report
            color, dash = PALETTE[i], LINESTYLES[i % len(LINESTYLES)]
        else:
            taken = {found[o].color for o in found if group[o] == group[lab]}
            color, dash = _free_pair(taken, pairs)
        marker = _free_marker(i, color, dash, marked, dashed)
        pairs.add((color, dash))
        marked.add((color, marker))
        dashed.add((marker, dash))
        found[lab] = Style(color, marker, dash)
    return {lab: found[lab] for lab in labels}


def report_styles(labels: list[str], families: Mapping[str, str]) -> dict[str, Style]:
    """The styles of a report's labels (in its canonical order): by family, the panels
    ``length_figure`` draws, where they are more than ``MAX_LINES`` (one panel otherwise)."""
    return styles(labels, families if len(labels) > MAX_LINES else None)


def _free_pair(taken: set[str], pairs: set[tuple[str, str]]) -> tuple[str, str]:
    """A (colour, line style) not yet used, with a colour its panel does not show yet where
    one is left: the least used such colour (so that each keeps line styles for the panels
    after) with its least used line style (so that markers can tell apart the lines of one
    style), in palette order, grey last (nope's, and the faint landmarks' shade)."""
    colors = [*PALETTE[1:], PALETTE[0]]
    used = {c: sum(c == pc for pc, _ in pairs) for c in colors}
    dashed = {d: sum(d == pd for _, pd in pairs) for d in LINESTYLES}
    free = [(c, d) for c in colors for d in LINESTYLES if (c, d) not in pairs]
    fresh = [(c, d) for c, d in free if c not in taken]
    ranked = sorted(fresh or free, key=lambda p: (used[p[0]], dashed[p[1]]))  # stable
    return (ranked or [(PALETTE[len(pairs) % len(PALETTE)], "-")])[0]


def _free_marker(
    i: int, color: str, dash: str, marked: set[tuple[str, str]], dashed: set[tuple[str, str]]
) -> str:
    """A marker, from the ``i``-th on, not yet drawn in ``color`` (and, where one is left, not
    with ``dash``): a legend swatch tells the label apart in black and white too."""
    turn = [MARKERS[(i + k) % len(MARKERS)] for k in range(len(MARKERS))]
    fresh = [m for m in turn if (color, m) not in marked]
    return next((m for m in fresh if (m, dash) not in dashed), (fresh or turn)[0])
