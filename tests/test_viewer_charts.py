"""The viewer's SVG charts (view/charts.py), as pure functions: well-formed SVG whatever the numbers
(gaps at None, NaN and infinities, one point, a constant series, a long series thinned), every label escaped,
and nothing in them a browser would run or load."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from tests.viewer_helpers import Tags, payload
from trajlake.view.charts import (
    MAX_LINE_POINTS,
    MAX_MARKERS,
    Point,
    Series,
    fmt,
    interval_chart,
    line_chart,
    nice_ticks,
    sparkline,
)

SVG = "{http://www.w3.org/2000/svg}"
#: the elements a chart may hold: nothing that runs, loads or links
ALLOWED = {"svg", "title", "text", "line", "polyline", "circle", "path", "g"}


def parse(svg: str) -> ET.Element:
    """The chart as XML (it must be well-formed), checked to hold only ALLOWED elements and no handler or link."""
    root = ET.fromstring(svg)
    for el in root.iter():
        assert el.tag.removeprefix(SVG) in ALLOWED, el.tag
        assert not [a for a in el.attrib if a.lower().startswith("on") or "href" in a.lower()], el.attrib
    return root


def all_of(root: ET.Element, tag: str) -> list[ET.Element]:
    return list(root.iter(SVG + tag))


def lines(root: ET.Element) -> list[list[tuple[float, float]]]:
    return [[tuple(map(float, p.split(","))) for p in pl.get("points").split()] for pl in all_of(root, "polyline")]


def test_gaps_break_the_line_at_none_nan_and_infinity():
    values = [(0, 1.0), (1, 2.0), (2, None), (3, 3.0), (4, 4.0), (5, math.nan), (6, 5.0), (7, math.inf), (8, 6.0),
              (9, 7.0)]
    root = parse(line_chart([Series("reward", values)], title="reward"))
    assert [len(run) for run in lines(root)] == [2, 2, 2]  # 0-1, 3-4, 8-9; 6 stands alone
    assert len(all_of(root, "circle")) == 7  # a marker per finite value
    hover = [c.find(SVG + "title").text for c in all_of(root, "circle")]
    assert hover[0] == "reward: step 0: 1" and "nan" not in " ".join(hover).lower()


def test_one_point_and_a_constant_series_draw_without_dividing_by_zero():
    root = parse(line_chart([Series("loss", [(5, 0.25)])], title="loss"))
    assert lines(root) == [] and len(all_of(root, "circle")) == 1
    cx = float(all_of(root, "circle")[0].get("cx"))
    assert 52 < cx < 360 - 12  # inside the plot, not at an edge
    flat = parse(line_chart([Series("kl", [(s, 0.0) for s in range(10)])], title="kl"))
    ys = {y for run in lines(flat) for _, y in run}
    assert len(ys) == 1 and all(math.isfinite(y) for y in ys)
    labels = [t.text for t in all_of(flat, "text")]
    assert "0" in labels or "0.0" in labels  # the value itself is on the axis


def test_error_bars_and_fixed_ranges():
    pts = [Point(0, 0.2, 0.1, 0.35, note="eval-a"), Point(10, 0.9, 0.8, 0.97, note="eval-b")]
    root = parse(line_chart([Series("doors test", pts)], title="eval success", y_min=0.0, y_max=1.0))
    assert len(all_of(root, "path")) == 2
    hover = [c.find(SVG + "title").text for c in all_of(root, "circle")]
    assert hover == ["doors test: step 0: 0.2 [0.1, 0.35] (eval-a)", "doors test: step 10: 0.9 [0.8, 0.97] (eval-b)"]
    ticks = [t.text for t in all_of(root, "text") if t.get("text-anchor") == "end"]
    assert ticks == ["0.00", "0.25", "0.50", "0.75", "1.00"]  # the whole rate, as many decimals as the ticks need


def test_no_values_is_said_and_series_can_be_many():
    root = parse(line_chart([Series("x", [(0, None), (1, math.nan)])], title="x"))
    assert "no values" in [t.text for t in all_of(root, "text")] and not all_of(root, "circle")
    many = parse(line_chart([Series(f"s{i}", [(0, i), (1, i + 1)]) for i in range(10)], title="many"))
    assert len(all_of(many, "polyline")) == 10
    assert len({pl.get("stroke") for pl in all_of(many, "polyline")}) == 8  # the palette, round again


def test_a_long_series_is_thinned_and_keeps_its_extremes():
    values = [(i, math.sin(i / 50)) for i in range(5000)] + [(5000, 9.0)]
    root = parse(line_chart([Series("loss", values)], title="loss"))
    (run,) = lines(root)
    assert len(run) <= MAX_LINE_POINTS + 2 and not all_of(root, "circle")  # too many points for markers
    top = min(y for _, y in run)  # SVG y grows downwards: the highest value has the smallest y
    assert abs(top - 24) < 1  # the spike is kept
    assert len(values) > MAX_MARKERS


def test_hostile_labels_are_escaped_everywhere():
    bad = payload("chart")
    svg = line_chart([Series(bad, [Point(0, 1.0, note=bad), Point(1, 2.0)]), Series("b", [(0, 1)])], title=bad,
                     x_label=bad, y_label=bad)
    root = parse(svg)
    texts = [t.text for t in all_of(root, "text")] + [t.text for t in all_of(root, "title")]
    assert texts.count(bad) >= 3  # title, axis labels, legend: shown as the text it is
    parsed = Tags(f"<body>{svg}</body>")
    assert "script" not in parsed.tags and "img" not in parsed.tags
    assert not [a for a in parsed.attrs if a.startswith("on")]
    spark = sparkline([(0, 1.0), (1, 2.0)], label=bad)
    assert parse(spark).find(SVG + "title").text == bad
    rows = interval_chart([(bad, 0.5, 0.3, 0.7), ("none", None, None, None)], title=bad)
    root = parse(rows)
    assert [t.text for t in all_of(root, "title")][0] == bad and len(all_of(root, "circle")) == 1


def test_sparkline_and_interval_chart_edges():
    assert sparkline([], label="x") == "" and sparkline([(0, None), (1, math.nan)], label="x") == ""
    one = parse(sparkline([(3, 0.5)], label="one"))
    assert len(all_of(one, "circle")) == 1 and not all_of(one, "polyline")
    gappy = parse(sparkline([(0, 1), (1, 2), (2, None), (3, 1), (4, 0)], label="g"))
    assert len(all_of(gappy, "polyline")) == 2
    wide = parse(interval_chart([("a", 1.5, 1.2, 1.8)], title="outside 0-1"))  # the axis widens to hold it
    right = float(wide.get("width")) - 16  # the plot's right edge
    assert float(all_of(wide, "circle")[0].get("cx")) < right
    assert abs(float(all_of(wide, "path")[0].get("d").split("H")[1].split("M")[0]) - right) < 0.1  # 1.8 at the edge


@pytest.mark.parametrize("lo, hi, want", [(0, 1, [0, 0.25, 0.5, 0.75, 1.0]), (0, 20, [0, 5, 10, 15, 20]),
                                          (-0.3, 0.1, [-0.3, -0.2, -0.1, 0.0, 0.1]), (3, 3, [3])])
def test_nice_ticks(lo, hi, want):
    assert nice_ticks(lo, hi) == pytest.approx(want)


def test_fmt():
    assert [fmt(v) for v in (0, 0.123456, 12345678, 1e-7, math.nan, None)] == ["0", "0.1235", "1.23e+07", "1e-07",
                                                                               "none", "none"]
