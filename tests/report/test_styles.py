"""Styles: one per label everywhere, labels drawn together told apart in colour, every label
in colour and dash, and in black and white."""

from __future__ import annotations

from pe_bench.report.styles import CLASSIC_LABELS, report_styles, styles


def test_classic_labels_keep_their_style_whatever_else_is_there():
    few = styles(["rope", "alibi"])
    many = styles([*CLASSIC_LABELS, "fire", "rope+yarn"])
    assert few["rope"] == many["rope"] and few["alibi"] == many["alibi"]


def test_twenty_labels_differ_in_colour_and_in_black_and_white():
    labels = [*CLASSIC_LABELS, *(f"scheme{i}" for i in range(11))]
    style = styles(labels).values()
    assert len({(s.color, s.linestyle) for s in style}) == 20
    assert len({(s.marker, s.linestyle) for s in style}) == 20


def test_no_two_labels_share_colour_and_marker():
    # The zoo has 21 labels: past 11 the colours come round, and the legend swatches (colour and
    # marker, the line too short to show its dashes) must still tell every label apart.
    labels = [*CLASSIC_LABELS, *(f"scheme{i}" for i in range(40))]
    style = styles(labels).values()
    assert len({(s.color, s.marker) for s in style}) == len(labels)


# The zoo's labels by panel (families), with the issue-38 schemes that join them.
ZOO = {
    "absolute or none": ["nope", "sinusoidal", "learned", "randomized_learned", "nope_temp"],
    "additive bias": [
        "t5", "alibi", "dape_alibi", "dape_kerple", "fire", "kerple_log", "kerple_power",
        "sandwich", "ssmax_alibi", "bipe_alibi", "cable",
    ],
    "content-dependent and gated": [
        "xl", "cope", "fox", "shaw", "ssmax_nope", "stickbreaking", "path",
    ],
    "rotary": [
        "rope", "hope", "irope", "p_rope", "randomized_rope", "resonance_rope",
        "rope_nope_hybrid", "ssmax_rope", "xpos", "pope", "fope", "drope", "bipe",
    ],
    "rope at eval time": [
        "rope+pi", "rope+ntk", "rope+dynamic_ntk", "rope+leaky_rerope", "rope+llama3",
        "rope+logn", "rope+longrope", "rope+ntk_by_parts", "rope+rerope", "rope+self_extend",
        "rope+yarn",
    ],
}  # fmt: skip


def test_labels_drawn_together_differ_in_colour_and_all_in_colour_and_dash():
    """Issue 41 found rope, p_rope and xpos in one colour, alibi and dape_alibi, t5 and
    kerple_log, fire and sandwich (in a pale yellow), xl and stickbreaking, fox and shaw,
    rope+pi and rope+yarn: each pair in one panel. With 47 labels, every panel's colours
    differ, every (colour, dash) pair is used once, and no colour is paler than sky."""
    families = {lab: family for family, labs in ZOO.items() for lab in labs}
    labels = list(families)
    style = report_styles(labels, families)
    assert len(labels) == 47
    for family, members in ZOO.items():
        colours = [style[lab].color for lab in members]
        assert len(set(colours)) == len(colours), family
    assert len({(s.color, s.linestyle) for s in style.values()}) == len(labels)
    assert len({(s.color, s.marker) for s in style.values()}) == len(labels)
    assert "#ece133" not in {s.color for s in style.values()}  # the pale yellow
    for a, b in [("rope", "p_rope"), ("rope", "xpos"), ("alibi", "dape_alibi"), ("fox", "shaw")]:
        assert style[a].color != style[b].color, (a, b)


def test_a_labels_style_does_not_depend_on_the_labels_after_it():
    families = {lab: family for family, labs in ZOO.items() for lab in labs}
    labels = list(families)
    whole, first = styles(labels, families), styles(labels[:20], families)
    assert all(whole[lab] == first[lab] for lab in labels[:20])
