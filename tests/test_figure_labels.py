"""The label-overlap geometry of the browser test (``tests/_figure_labels.py``) on made-up boxes: what it
must flag, what it must leave alone, and how it reads what the page measured. No browser."""

from __future__ import annotations

import math

import pytest
from _figure_labels import (
    TOLERANCE,
    Label,
    classify,
    cut_off,
    figure_name,
    figure_problems,
    labels_of,
    overlaps,
    penetration,
    subplot_axes,
)

box = Label.box


def _rotated(text: str, cx: float, cy: float, w: float, h: float, degrees: float, **kw) -> Label:
    """A ``w`` x ``h`` label centred on (cx, cy), turned by ``degrees`` (as plotly turns crowded tick labels)."""
    a = math.radians(degrees)
    c, s = math.cos(a), math.sin(a)
    corners = [(-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2)]
    quad = tuple((cx + x * c - y * s, cy + x * s + y * c) for x, y in corners)
    return Label(text, kw.pop("kind", "tick"), quad, **kw)  # type: ignore[arg-type]


def test_penetration_is_the_least_push_that_parts_two_boxes():
    a = box("a", "text", 0, 0, 100, 20).quad
    assert penetration(a, box("b", "text", 90, 5, 200, 15).quad) == pytest.approx(10)  # 10 px into a's right
    assert penetration(a, box("c", "text", 50, 18, 60, 40).quad) == pytest.approx(2)  # 2 px into a's foot
    assert penetration(a, box("d", "text", 0, 25, 100, 45).quad) == pytest.approx(-5)  # a 5 px gap
    assert penetration(a, box("e", "text", 100, 0, 150, 20).quad) == pytest.approx(0)  # edges touch


def test_an_axis_title_over_a_legend_entry_is_flagged_by_name_and_depth():
    title = box("state slot (index into the pool)", "axis title", 200, 400, 540, 416, axes=("x2",))
    legend = box("padded row -> sentinel (skipped)", "legend", 300, 401, 474, 415)
    found = overlaps([title, legend])
    assert len(found) == 1 and found[0].depth == pytest.approx(14)
    assert found[0].describe() == (
        "axis title (x2) 'state slot (index into the pool)' and legend 'padded row -> sentinel (skipped)' "
        "overlap by 14 px"
    )


def test_two_subplot_titles_side_by_side_overlap():
    left = box("sglang default: 12 buckets, 2.92 padded rows/step", "annotation", 0, 70, 350, 88)
    right = box("vLLM default: 11 buckets, 3.17 padded rows/step", "annotation", 248, 70, 580, 88)
    far = box("powers of two", "annotation", 600, 70, 700, 88)
    found = overlaps([left, right, far])
    assert [(o.a.text[:6], o.b.text[:6]) for o in found] == [("sglang", "vLLM d")]


def test_touching_boxes_and_a_sliver_within_the_tolerance_pass():
    a = box("live row", "legend", 0, 0, 40, 14)
    assert not overlaps([a, box("padded", "legend", 0, 14, 60, 28)])  # stacked legend lines touch
    assert not overlaps([a, box("padded", "legend", 0, 14 - TOLERANCE, 60, 28)])  # as deep as the tolerance
    assert overlaps([a, box("padded", "legend", 0, 14 - TOLERANCE - 0.5, 60, 28)])  # deeper: flagged
    assert overlaps([a, box("b", "legend", 0, 10, 60, 28)], tolerance=3.0)
    assert not overlaps([a, box("b", "legend", 0, 10, 60, 28)], tolerance=5.0)


def test_tick_labels_of_one_axis_are_left_to_plotly_but_not_across_axes():
    x0 = box("0", "tick", 100, 300, 108, 314, group="tick:x", axes=("x",))
    x1 = box("1", "tick", 104, 300, 112, 314, group="tick:x", axes=("x",))  # crowded: plotly's own business
    y0 = box("−1", "tick", 95, 296, 110, 310, group="tick:y", axes=("y",))  # another axis, same corner
    found = overlaps([x0, x1, y0])
    assert {frozenset((o.a.text, o.b.text)) for o in found} == {frozenset(("0", "−1")), frozenset(("1", "−1"))}


def test_colour_bar_labels_share_a_group_but_not_with_its_title():
    ticks = [box(f"{v}", "colour bar", 600, 100 + 20 * v, 615, 114 + 20 * v, group="tick:cb1") for v in range(3)]
    title = box("log10 |error|", "colour bar", 590, 90, 670, 104)
    found = overlaps([*ticks, title])
    assert [(o.a.text, o.b.text) for o in found] == [("0", "log10 |error|")]


def test_the_lines_of_one_text_element_are_not_compared():
    one = box("sglang default", "annotation", 0, 0, 100, 16, element=3)
    two = box("12 buckets", "annotation", 10, 12, 90, 28, element=3)  # plotly's line spacing: its own
    other = box("vLLM default", "annotation", 80, 12, 180, 28, element=4)
    found = overlaps([one, two, other])
    assert {frozenset((o.a.text, o.b.text)) for o in found} == {
        frozenset(("sglang default", "vLLM default")),
        frozenset(("12 buckets", "vLLM default")),
    }


def test_rotated_tick_labels_keep_their_true_outline():
    # two 45-degree labels whose upright bounding boxes would overlap, while the labels themselves do not
    a = _rotated("sentinel", 100, 100, 60, 10, 45, group="tick:x2", axes=("x2",))
    title = _rotated("MiB", 130, 70, 30, 10, 45, kind="axis title", axes=("y",))
    ax = [x for x, _ in a.quad]
    ay = [y for _, y in a.quad]
    tx = [x for x, _ in title.quad]
    ty = [y for _, y in title.quad]
    assert min(tx) < max(ax) and min(ty) < max(ay)  # the upright boxes overlap...
    assert not overlaps([a, title])  # ...the turned labels are side by side, 15 px apart
    across = _rotated("MiB", 105, 95, 30, 10, -45, kind="axis title", axes=("y",))
    assert overlaps([a, across])  # a label crossing it is flagged


def test_a_panel_conflicts_only_with_the_ticks_and_titles_of_other_axes():
    left = box("xy", "panel", 80, 90, 300, 300, axes=("x", "y"))
    right = box("x2y2", "panel", 320, 90, 540, 300, axes=("x2", "y2"))
    own_tick = box("row 3 (pad -1, skipped)", "tick", 200, 150, 318, 164, group="tick:y2", axes=("y2",))
    own_title = box("padded rows", "axis title", 290, 170, 306, 250, axes=("y2",))
    legend = box("padded rows", "legend", 100, 100, 200, 114)  # a legend may sit on a plot
    subplot_title = box("sglang", "annotation", 150, 80, 250, 98)
    found = overlaps([left, right, own_tick, own_title, legend, subplot_title])
    assert [(o.a.describe(), o.b.describe()) for o in found] == [
        ("the plot area of subplot xy", "tick (y2) 'row 3 (pad -1, skipped)'"),
        ("the plot area of subplot xy", "axis title (y2) 'padded rows'"),
    ]  # deepest first; a panel never conflicts with its own axes' labels, nor with another panel


def test_cut_off_names_the_edge():
    frame = (0.0, 0.0, 700.0, 400.0)
    inside = box("fine", "title", 10, 10, 690, 30)
    left = box("sglang default: 12 buckets", "annotation", -38, 60, 200, 78)
    low = box("raw batch size", "axis title", 300, 390, 380, 408, axes=("x",))
    panel = box("xy", "panel", -50, 0, 800, 400, axes=("x", "y"))  # plot areas are not text
    assert cut_off([inside, left, low, panel], frame) == [
        "annotation 'sglang default: 12 buckets' is cut off by the figure's left edge (38 px)",
        "axis title (x) 'raw batch size' is cut off by the figure's bottom edge (8 px)",
    ]
    assert not cut_off([box("edge", "title", -1, 0, 10, 10)], frame)  # within the tolerance


def test_classify_reads_plotlys_class_names():
    assert classify("gtitle", "g-gtitle", False) == ("title", "", ())
    assert classify("xtitle", "g-xtitle", False) == ("axis title", "", ("x",))
    assert classify("", "ytick", False) == ("tick", "tick:y", ("y",))
    assert classify("legendtext", "traces", True) == ("legend", "", ())
    assert classify("legendtitletext", "legend", True) == ("legend title", "", ())
    assert classify("annotation-text", "cursor-pointer", False) == ("annotation", "", ())
    assert classify("ycb11abc080-065ftitle", "cbtitle", False) == ("colour bar", "", ())
    assert classify("", "ycb11abc080-065ftick", False) == ("colour bar", "tick:cb11abc080-065f", ())
    assert classify("", "something", True) == ("legend", "", ())
    assert classify("", "something", False) == ("text", "", ())
    assert subplot_axes("x2y2") == ("x2", "y2") and subplot_axes("xy") == ("x", "y") and subplot_axes("pie") == ()


def _measured(**kw):
    quad = [[0, 0], [10, 0], [10, 10], [0, 10]]
    figure = {
        "index": 2,
        "title": "Slot map",
        "prompt": "[7]:",
        "frame": [0, 0, 500, 300],
        "texts": [
            {
                "text": "state slot",
                "cls": "x2title",
                "parent": "g-x2title",
                "legend": False,
                "element": 1,
                "quad": quad,
            },
            {"text": "free slot", "cls": "legendtext", "parent": "traces", "legend": True, "element": 2, "quad": quad},
        ],
        "panels": [{"subplot": "x2y2", "quad": [[20, 20], [400, 20], [400, 200], [20, 200]]}],
    }
    figure.update(kw)
    return figure


def test_labels_of_reads_what_the_page_measured():
    labels = labels_of(_measured())
    assert [(lab.kind, lab.text, lab.axes, lab.element) for lab in labels] == [
        ("axis title", "state slot", ("x2",), 1),
        ("legend", "free slot", (), 2),
        ("panel", "x2y2", ("x2", "y2"), -1),
    ]
    assert labels[0].quad == ((0.0, 0.0), (10.0, 0.0), (10.0, 10.0), (0.0, 10.0))
    assert figure_name(_measured()) == "figure 3 ('Slot map', cell [7])"
    assert figure_name(_measured(title="", prompt="")) == "figure 3 ('untitled')"


def test_figure_problems_names_the_figure_and_both_labels():
    problems = figure_problems([_measured()])
    assert problems == [
        "figure 3 ('Slot map', cell [7]): axis title (x2) 'state slot' and legend 'free slot' overlap by 10 px"
    ]
    apart = _measured()
    apart["texts"][1]["quad"] = [[0, 20], [10, 20], [10, 30], [0, 30]]
    assert figure_problems([apart]) == []
    off = _measured(frame=[5, 0, 500, 300])
    off["texts"] = off["texts"][:1]
    assert figure_problems([off]) == [
        "figure 3 ('Slot map', cell [7]): axis title (x2) 'state slot' is cut off by the figure's left edge (5 px)"
    ]
