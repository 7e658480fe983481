"""The viewer's charts: inline SVG drawn on the server, pure functions from numbers to an `<svg>` string.

A train run's learning curves (`line_chart`: one metric against the step, any number of series, a gap
wherever a value is None or not finite, an error bar where a point carries an interval), the run list's
`sparkline`, and the eval comparison's `interval_chart` (one success rate with its interval a row). Nothing is
loaded and no script runs: the page works the same served, exported and offline, and under the viewer's
Content-Security-Policy (colours are presentation attributes and classes of the page's one style block, never
`style=`). Every label goes through `esc`; every number is written by a format of a finite float.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from trajlake.view.markup import esc

#: series colours, in order (a colour-blind-safe palette: Okabe and Ito's)
COLORS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#f0e442")
#: the most points a series' line is drawn through; a longer series keeps each bucket's lowest and highest
MAX_LINE_POINTS = 600
#: the most points of a chart that get a marker with its hover title (more would only weigh the page)
MAX_MARKERS = 200


class Point(NamedTuple):
    """One value of a series: `y` at `x`, with an interval (`lo`, `hi`) drawn as an error bar when both are
    given, and a `note` added to its hover title (e.g. the eval run it is the success of)."""

    x: float
    y: float | None
    lo: float | None = None
    hi: float | None = None
    note: str | None = None


@dataclass(frozen=True)
class Series:
    """A named line: its points in x order (tuples are read as `Point`s)."""

    name: str
    points: Sequence[Point | tuple]

    def finite(self) -> list[Point]:
        """Its points with a finite x, as Points (a None or non-finite y stays: it is a gap)."""
        out = []
        for p in self.points:
            p = p if isinstance(p, Point) else Point(*p)
            if _ok(p.x):
                out.append(p)
        return out


def _ok(v) -> bool:
    """Whether `v` is a number to draw (not None, not NaN, not infinite; bools are not numbers here)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def fmt(v: float) -> str:
    """A value for a label or a title: 4 significant digits, no exponent below a million."""
    if not _ok(v):
        return "none"
    if v == 0:
        return "0"
    if abs(v) >= 1e6 or abs(v) < 1e-4:
        return f"{v:.3g}"
    return f"{v:.4g}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round values (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if not (_ok(lo) and _ok(hi)) or hi <= lo:
        return [lo] if _ok(lo) else []
    raw = (hi - lo) / max(1, n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, k = [], 0
    while first + k * step <= hi + step * 1e-9 and k < 50:
        ticks.append(round(first + k * step, 12))
        k += 1
    return ticks


def _tick_label(v: float, ticks: list[float]) -> str:
    """A tick's label, with as many decimals as the ticks' spacing needs (0.25 apart: 0.00, 0.25, 0.50...)."""
    if len(ticks) > 1 and max(abs(t) for t in ticks) < 1e6:
        step = abs(ticks[1] - ticks[0])
        decimals = 0
        while decimals < 6 and abs(step * 10 ** decimals - round(step * 10 ** decimals)) > 1e-6:
            decimals += 1
        if decimals < 6:
            return f"{v:.{decimals}f}"
    return fmt(v)


def _range(values: Iterable[float], fixed: tuple[float | None, float | None] = (None, None)) -> tuple[float, float]:
    """The axis range of `values` (finite ones), widened where they are all one value; `fixed` ends win."""
    vals = [v for v in values if _ok(v)]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    if fixed[0] is not None:
        lo = min(lo, fixed[0])
    if fixed[1] is not None:
        hi = max(hi, fixed[1])
    if hi - lo < 1e-12 * max(1.0, abs(lo)):  # one value: a band around it
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    return lo, hi


def _thin(points: list[Point]) -> list[Point]:
    """At most about MAX_LINE_POINTS points of a long series for its line: each bucket's lowest and highest,
    in x order, so the envelope stays (gaps within a bucket are lost; there are too many points to see them)."""
    if len(points) <= MAX_LINE_POINTS:
        return points
    size = math.ceil(len(points) / (MAX_LINE_POINTS // 2))
    out = []
    for k in range(0, len(points), size):
        bucket = [p for p in points[k:k + size] if _ok(p.y)]
        if bucket:
            a, b = min(bucket, key=lambda p: p.y), max(bucket, key=lambda p: p.y)
            out += sorted({a, b}, key=lambda p: p.x)
    return out


def _runs(points: list[Point]) -> list[list[Point]]:
    """The stretches of consecutive points with a finite y (a None or NaN ends one)."""
    runs, cur = [], []
    for p in points:
        if _ok(p.y):
            cur.append(p)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs


def _title(series: str, p: Point, x_label: str) -> str:
    text = f"{series}: {x_label} {fmt(p.x)}: {fmt(p.y)}"
    if _ok(p.lo) and _ok(p.hi):
        text += f" [{fmt(p.lo)}, {fmt(p.hi)}]"
    if p.note:
        text += f" ({p.note})"
    return text


def line_chart(series: Sequence[Series], *, title: str, x_label: str = "step", y_label: str = "",
               y_min: float | None = None, y_max: float | None = None, width: int = 360, height: int = 200,
               css_class: str = "chart") -> str:
    """One metric's chart: each series a line against x, broken at every None/NaN value, with a marker and
    hover title per point (up to MAX_MARKERS) and an error bar where a point has `lo` and `hi`. `y_min`/`y_max`
    widen the y axis to include them (a rate's 0 and 1). A chart with no finite value says so."""
    series = [Series(s.name, s.finite()) for s in series]
    pts = [p for s in series for p in s.points]
    ys = [v for p in pts for v in (p.y, p.lo, p.hi)]
    left, right, top, bottom = 52, 12, 24 + 14 * (len(series) > 1), 34
    pw, ph = width - left - right, height - top - bottom
    head = (f"<svg{_svg_attrs(css_class, width, height)}><title>{esc(title)}</title>"
            f"<text class=\"ct\" x=\"{left}\" y=\"14\">{esc(title)}</text>")
    if not any(_ok(p.y) for p in pts):
        return head + f"<text class=\"cn\" x=\"{left}\" y=\"{top + ph / 2:.1f}\">no values</text></svg>"
    x0, x1 = _range((p.x for p in pts))
    if len({p.x for p in pts}) == 1:  # one step: the point in the middle
        x0, x1 = pts[0].x - 1, pts[0].x + 1
    y0, y1 = _range(ys, (y_min, y_max))
    sx = lambda x: left + (x - x0) / (x1 - x0) * pw  # noqa: E731
    sy = lambda y: top + ph - (y - y0) / (y1 - y0) * ph  # noqa: E731
    out = [head]
    yt, xt = nice_ticks(y0, y1, 5), nice_ticks(x0, x1, 6)
    for v in yt:
        y = sy(v)
        if top - 0.5 <= y <= top + ph + 0.5:
            out.append(f"<line class=\"cg\" x1=\"{left}\" y1=\"{y:.1f}\" x2=\"{left + pw}\" y2=\"{y:.1f}\"/>"
                       f"<text class=\"cl\" x=\"{left - 4}\" y=\"{y + 3:.1f}\" text-anchor=\"end\">"
                       f"{esc(_tick_label(v, yt))}</text>")
    for v in xt:
        x = sx(v)
        if left - 0.5 <= x <= left + pw + 0.5:
            out.append(f"<line class=\"ca\" x1=\"{x:.1f}\" y1=\"{top + ph}\" x2=\"{x:.1f}\" y2=\"{top + ph + 4}\"/>"
                       f"<text class=\"cl\" x=\"{x:.1f}\" y=\"{top + ph + 14}\" text-anchor=\"middle\">"
                       f"{esc(_tick_label(v, xt))}</text>")
    out.append(f"<line class=\"ca\" x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{top + ph}\"/>"
               f"<line class=\"ca\" x1=\"{left}\" y1=\"{top + ph}\" x2=\"{left + pw}\" y2=\"{top + ph}\"/>"
               f"<text class=\"cl\" x=\"{left + pw / 2:.1f}\" y=\"{height - 4}\" text-anchor=\"middle\">"
               f"{esc(x_label)}</text>")
    if y_label:
        out.append(f"<text class=\"cl\" x=\"12\" y=\"{top + ph / 2:.1f}\" text-anchor=\"middle\" "
                   f"transform=\"rotate(-90 12 {top + ph / 2:.1f})\">{esc(y_label)}</text>")
    markers = len(pts) <= MAX_MARKERS
    lx = left
    for i, s in enumerate(series):
        color = COLORS[i % len(COLORS)]
        if len(series) > 1:  # the legend, one name after another from the left, in its series' colour
            out.append(f"<text class=\"lg\" x=\"{lx:.1f}\" y=\"{top - 6}\" fill=\"{color}\">{esc(s.name)}</text>")
            lx += 6 * len(s.name) + 12
        out.append(f"<g{_series_attrs(s.name, color)}>")
        for run in _runs(_thin(list(s.points))):
            if len(run) > 1:
                coords = " ".join(f"{sx(p.x):.1f},{sy(p.y):.1f}" for p in run)
                out.append(f"<polyline points=\"{coords}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\"/>")
        for p in s.points:
            if not _ok(p.y):
                continue
            x, y = sx(p.x), sy(p.y)
            if _ok(p.lo) and _ok(p.hi):
                a, b = sy(p.lo), sy(p.hi)
                out.append(f"<path d=\"M{x:.1f} {a:.1f}V{b:.1f}M{x - 3:.1f} {a:.1f}h6M{x - 3:.1f} {b:.1f}h6\" "
                           f"stroke=\"{color}\" fill=\"none\"/>")
            if markers:
                out.append(f"<circle cx=\"{x:.1f}\" cy=\"{y:.1f}\" r=\"2.5\" fill=\"{color}\">"
                           f"<title>{esc(_title(s.name, p, x_label))}</title></circle>")
        out.append("</g>")
    return "".join(out) + "</svg>"


def sparkline(values: Sequence[tuple[float, float | None]], *, label: str, width: int = 120, height: int = 24) -> str:
    """A small line of (x, y) values (None/NaN: a gap), its last value dotted; `label` is its hover title.
    No finite value: ''."""
    pts = Series(label, values).finite()
    good = [p for p in pts if _ok(p.y)]
    if not good:
        return ""
    x0, x1 = _range(p.x for p in pts)
    y0, y1 = _range(p.y for p in good)
    pad = 2
    sx = lambda x: pad + (x - x0) / (x1 - x0) * (width - 2 * pad)  # noqa: E731
    sy = lambda y: height - pad - (y - y0) / (y1 - y0) * (height - 2 * pad)  # noqa: E731
    if len({p.x for p in pts}) == 1:
        sx = lambda x: width / 2  # noqa: E731
    out = [f"<svg{_svg_attrs('spark', width, height)}><title>{esc(label)}</title>"]
    for run in _runs(_thin(pts)):
        if len(run) > 1:
            coords = " ".join(f"{sx(p.x):.1f},{sy(p.y):.1f}" for p in run)
            out.append(f"<polyline points=\"{coords}\" fill=\"none\" stroke=\"{COLORS[0]}\" stroke-width=\"1.2\"/>")
    last = good[-1]
    out.append(f"<circle cx=\"{sx(last.x):.1f}\" cy=\"{sy(last.y):.1f}\" r=\"2\" fill=\"{COLORS[1]}\"/>")
    return "".join(out) + "</svg>"


def interval_chart(rows: Sequence[tuple[str, float | None, float | None, float | None]], *, title: str,
                   x_label: str = "success", width: int = 460) -> str:
    """One row per (label, value, lo, hi): a dot at the value with a bar over its interval, on a 0-1 axis
    (values outside widen it), the label on the left (cut to 38 characters; whole in the hover title)."""
    rows = list(rows)
    left, right, top, row_h = 240, 16, 22, 18
    height = top + row_h * max(1, len(rows)) + 30
    pw = width - left - right
    x0, x1 = _range([v for _, *vals in rows for v in vals], (0.0, 1.0))
    sx = lambda x: left + (x - x0) / (x1 - x0) * pw  # noqa: E731
    out = [f"<svg{_svg_attrs('chart', width, height)}><title>{esc(title)}</title>"
           f"<text class=\"ct\" x=\"4\" y=\"14\">{esc(title)}</text>"]
    base = top + row_h * max(1, len(rows))
    ticks = nice_ticks(x0, x1, 6)
    for v in ticks:
        x = sx(v)
        out.append(f"<line class=\"cg\" x1=\"{x:.1f}\" y1=\"{top}\" x2=\"{x:.1f}\" y2=\"{base}\"/>"
                   f"<text class=\"cl\" x=\"{x:.1f}\" y=\"{base + 14}\" text-anchor=\"middle\">"
                   f"{esc(_tick_label(v, ticks))}</text>")
    out.append(f"<text class=\"cl\" x=\"{left + pw / 2:.1f}\" y=\"{height - 4}\" text-anchor=\"middle\">"
               f"{esc(x_label)}</text>")
    for i, (label, v, lo, hi) in enumerate(rows):
        y = top + row_h * i + row_h / 2
        short = label if len(label) <= 38 else label[:37] + "…"
        tip = f"{label}: {fmt(v)}" + (f" [{fmt(lo)}, {fmt(hi)}]" if _ok(lo) and _ok(hi) else "")
        out.append(f"<g><title>{esc(tip)}</title><text class=\"cl\" x=\"{left - 6}\" y=\"{y + 3:.1f}\" "
                   f"text-anchor=\"end\">{esc(short)}</text>")
        color = COLORS[i % len(COLORS)]
        if _ok(lo) and _ok(hi):
            out.append(f"<path d=\"M{sx(lo):.1f} {y:.1f}H{sx(hi):.1f}M{sx(lo):.1f} {y - 4:.1f}v8M{sx(hi):.1f} "
                       f"{y - 4:.1f}v8\" stroke=\"{color}\" fill=\"none\"/>")
        if _ok(v):
            out.append(f"<circle cx=\"{sx(v):.1f}\" cy=\"{y:.1f}\" r=\"3.5\" fill=\"{color}\"/>")
        out.append("</g>")
    return "".join(out) + "</svg>"


def _svg_attrs(css_class: str, width: int, height: int) -> str:
    return (f" class=\"{esc(css_class)}\" width=\"{int(width)}\" height=\"{int(height)}\" "
            f"viewBox=\"0 0 {int(width)} {int(height)}\" role=\"img\" xmlns=\"http://www.w3.org/2000/svg\"")


def _series_attrs(name: str, color: str) -> str:
    return f" class=\"series\" data-series=\"{esc(name)}\" data-color=\"{color}\""


__all__ = ["COLORS", "MAX_LINE_POINTS", "MAX_MARKERS", "Point", "Series", "fmt", "interval_chart", "line_chart",
           "nice_ticks", "sparkline"]
