"""Labels drawn over each other in a rendered plotly figure: the geometry the browser test checks, as plain
functions over made-up or measured boxes (``tests/test_figure_labels.py`` tests them without a browser).

A label is one line of SVG text of a figure (figure title, axis titles, tick labels, legend texts,
annotations such as subplot titles, colour-bar title and labels) as the browser drew it: a quadrilateral in
page pixels (four corners, so that rotated tick labels keep their true outline), or a subplot's plot area
("panel"). :data:`COLLECT_JS` measures them in the page; :func:`labels_of` reads its answer;
:func:`overlaps` finds the pairs that cover each other by more than a tolerance. Left out on purpose:

- two lines of one text element (plotly stacks them itself);
- two tick labels of the same axis or colour bar (plotly spaces them itself, and rotates them when crowded);
- text inside the data (bar and scatter texts: plotly shrinks or hides them to fit), hover labels, the modebar.

A panel conflicts only with tick labels and axis titles of another subplot's axes: row labels of one
heatmap drawn over the next panel, say. Legends, titles and annotations may sit on a panel.

A plain module beside the tests (``tests`` is not a package), imported as ``_figure_labels``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Point = tuple[float, float]
# the kinds of label; "panel" is a subplot's plot area, the only label that is not text
KINDS = ("title", "axis title", "tick", "legend", "legend title", "annotation", "colour bar", "panel", "text")
# how far (px) two boxes may cover each other before it counts: text boxes carry a little air above and below
TOLERANCE = 2.0


@dataclass(frozen=True)
class Label:
    """One measured label.

    ``quad``: its four corners in page pixels, in order around the outline. ``group``: labels plotly spaces
    itself share it (the tick labels of one axis or colour bar: ``"tick:x2"``). ``element``: the lines of
    one text element share it (-1: none). ``axes``: the axis a tick label or axis title belongs to
    (``("x2",)``), or a panel's two axes (``("x2", "y2")``)."""

    text: str
    kind: str
    quad: tuple[Point, Point, Point, Point]
    group: str = ""
    element: int = -1
    axes: tuple[str, ...] = ()

    @classmethod
    def box(cls, text: str, kind: str, x0: float, y0: float, x1: float, y1: float, **kw: Any) -> Label:
        """An upright box from its left, top, right and bottom edges."""
        return cls(text, kind, ((x0, y0), (x1, y0), (x1, y1), (x0, y1)), **kw)

    def describe(self) -> str:
        if self.kind == "panel":
            return f"the plot area of subplot {self.text}"
        axis = f" ({self.axes[0]})" if self.axes else ""
        return f"{self.kind}{axis} {self.text!r}"


@dataclass(frozen=True)
class Overlap:
    """Two labels that cover each other ``depth`` px deep (the least push that would part them)."""

    a: Label
    b: Label
    depth: float

    def describe(self) -> str:
        return f"{self.a.describe()} and {self.b.describe()} overlap by {self.depth:.0f} px"


def _axes_of(quad: Sequence[Point]) -> list[Point]:
    """The unit normals of a convex polygon's edges (the separating-axis candidates)."""
    out = []
    for i, (x0, y0) in enumerate(quad):
        x1, y1 = quad[(i + 1) % len(quad)]
        nx, ny = y0 - y1, x1 - x0
        length = (nx * nx + ny * ny) ** 0.5
        if length > 1e-9:
            out.append((nx / length, ny / length))
    return out


def penetration(a: Sequence[Point], b: Sequence[Point]) -> float:
    """How deep two convex polygons cover each other, in px: the smallest overlap of their projections onto
    the normals of their edges (the separating-axis test). Zero or below: they do not overlap (a gap of
    that many px along some axis), so the result is comparable with a tolerance.

    >>> penetration([(0, 0), (10, 0), (10, 10), (0, 10)], [(8, 2), (20, 2), (20, 4), (8, 4)])
    2.0
    >>> penetration([(0, 0), (10, 0), (10, 10), (0, 10)], [(13, 0), (20, 0), (20, 10), (13, 10)])
    -3.0
    """
    depth = float("inf")
    for ax, ay in _axes_of(a) + _axes_of(b):
        pa = [x * ax + y * ay for x, y in a]
        pb = [x * ax + y * ay for x, y in b]
        depth = min(depth, min(max(pa), max(pb)) - max(min(pa), min(pb)))
    return depth


def _conflicts(a: Label, b: Label) -> bool:
    """Whether the pair is one the check looks at (see the module docstring)."""
    if a.element >= 0 and a.element == b.element:
        return False
    if a.group and a.group == b.group:
        return False
    if a.kind == "panel" or b.kind == "panel":
        panel, other = (a, b) if a.kind == "panel" else (b, a)
        if other.kind not in ("tick", "axis title"):
            return False  # panels with each other, and legends, titles, annotations on a panel
        return not set(other.axes) & set(panel.axes)  # an axis's own plot area is its place
    return True


def overlaps(labels: Iterable[Label], tolerance: float = TOLERANCE) -> list[Overlap]:
    """Every pair of ``labels`` the check looks at that covers each other more than ``tolerance`` px deep,
    deepest first."""
    labels = list(labels)
    found = []
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            if not _conflicts(a, b):
                continue
            depth = penetration(a.quad, b.quad)
            if depth > tolerance:
                found.append(Overlap(a, b, depth))
    return sorted(found, key=lambda o: -o.depth)


def cut_off(
    labels: Iterable[Label], frame: tuple[float, float, float, float], tolerance: float = TOLERANCE
) -> list[str]:
    """Text ``labels`` that leave the figure's ``frame`` (left, top, right, bottom in page pixels) by more
    than ``tolerance`` px, where the figure's edge cuts them off: one line each naming the edge."""
    x0, y0, x1, y1 = frame
    out = []
    for lab in labels:
        if lab.kind == "panel":
            continue
        xs, ys = [x for x, _ in lab.quad], [y for _, y in lab.quad]
        edges = {"left": x0 - min(xs), "top": y0 - min(ys), "right": max(xs) - x1, "bottom": max(ys) - y1}
        for edge, by in edges.items():
            if by > tolerance:
                out.append(f"{lab.describe()} is cut off by the figure's {edge} edge ({by:.0f} px)")
    return out


# -- reading the page ------------------------------------------------------------------------------------
_TICK = re.compile(r"^([xy]\d*)tick$")
_CB_TICK = re.compile(r"^ycb(\S+)tick$")
_AXIS_TITLE = re.compile(r"^([xy]\d*)title$")
_CB_TITLE = re.compile(r"^ycb(\S+)title$")
_SUBPLOT = re.compile(r"^(x\d*)(y\d*)$")


def classify(text_class: str, parent_class: str, in_legend: bool) -> tuple[str, str, tuple[str, ...]]:
    """``(kind, group, axes)`` of an SVG text element from its own and its parent's ``class`` attribute
    (as plotly names them) and whether it sits in a legend.

    >>> classify("", "x2tick", False)
    ('tick', 'tick:x2', ('x2',))
    >>> classify("y3title", "g-y3title", False)
    ('axis title', '', ('y3',))
    >>> classify("", "ycb1a2b3ctick", False)
    ('colour bar', 'tick:cb1a2b3c', ())
    """
    classes = text_class.split()
    parents = parent_class.split()
    for c in parents:
        if m := _TICK.match(c):
            return "tick", f"tick:{m.group(1)}", (m.group(1),)
        if m := _CB_TICK.match(c):
            return "colour bar", f"tick:cb{m.group(1)}", ()
    for c in classes:
        if c == "gtitle":
            return "title", "", ()
        if c == "legendtext":
            return "legend", "", ()
        if c == "legendtitletext":
            return "legend title", "", ()
        if c == "annotation-text":
            return "annotation", "", ()
        if _CB_TITLE.match(c):
            return "colour bar", "", ()
        if m := _AXIS_TITLE.match(c):
            return "axis title", "", (m.group(1),)
    return ("legend", "", ()) if in_legend else ("text", "", ())


def subplot_axes(subplot: str) -> tuple[str, ...]:
    """``"x2y2"`` -> ``("x2", "y2")``; anything else -> ``()``."""
    m = _SUBPLOT.match(subplot)
    return (m.group(1), m.group(2)) if m else ()


def labels_of(measured: Mapping[str, Any]) -> list[Label]:
    """The labels of one figure as :data:`COLLECT_JS` measured them."""
    out = []
    for t in measured["texts"]:
        kind, group, axes = classify(t["cls"], t["parent"], t["legend"])
        quad = tuple((float(x), float(y)) for x, y in t["quad"])
        out.append(Label(t["text"], kind, quad, group=group, element=int(t["element"]), axes=axes))  # type: ignore[arg-type]
    for p in measured["panels"]:
        quad = tuple((float(x), float(y)) for x, y in p["quad"])
        out.append(Label(p["subplot"], "panel", quad, axes=subplot_axes(p["subplot"])))  # type: ignore[arg-type]
    return out


def figure_name(measured: Mapping[str, Any]) -> str:
    """``figure 3 ('Slot map: ...', cell [7])``: where a figure is, for a failure message."""
    title = measured.get("title") or "untitled"
    prompt = str(measured.get("prompt") or "").rstrip(":")
    cell = f", cell {prompt}" if prompt else ""
    return f"figure {measured['index'] + 1} ({title!r}{cell})"


# Runs in the page: ``(root) => [figure, ...]`` for every plotly figure under the CSS selector ``root``.
# A figure: ``index``, ``title`` (its title, else its first annotation), ``prompt`` (the input prompt of its
# cell), ``texts`` (one entry per line of text: ``text``, ``cls``, ``parent`` (class attributes),
# ``legend``, ``element``, ``quad``) and ``panels`` (``subplot``, ``quad``). Corners come from ``getBBox``
# (the unrotated box in the element's own coordinates) through ``getScreenCTM`` (its transforms, rotation
# included, to page pixels), all measured in one call so that nothing scrolls in between.
COLLECT_JS = r"""
(root) => {
  const corners = (el) => {
    const b = el.getBBox(), m = el.getScreenCTM();
    if (!m || !(b.width > 0) || !(b.height > 0)) return null;
    return [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height], [b.x, b.y + b.height]]
      .map(([x, y]) => [m.a * x + m.c * y + m.e, m.b * x + m.d * y + m.f]);
  };
  const shown = (el) => !el.checkVisibility || el.checkVisibility({opacityProperty: true, visibilityProperty: true});
  const plots = [...document.querySelectorAll(root + ' .js-plotly-plot')];
  return plots.map((gd, index) => {
    const texts = [];
    let element = 0;
    for (const t of gd.querySelectorAll('svg.main-svg text')) {
      if (t.closest('.hoverlayer, .modebar, g.trace, .bartext, .textpoint')) continue;
      if (!t.textContent.trim() || !shown(t)) continue;
      element += 1;
      const lines = [...t.querySelectorAll('tspan.line')].filter(l => l.textContent.trim());
      for (const part of (lines.length > 1 ? lines : [t])) {
        let quad = null;
        try { quad = corners(part); } catch (e) { quad = null; }
        if (part !== t && !quad) quad = corners(t);
        if (!quad) continue;
        texts.push({text: part.textContent.trim(), cls: t.getAttribute('class') || '',
                    parent: (t.parentElement && t.parentElement.getAttribute('class')) || '',
                    legend: !!t.closest('.legend'), element, quad});
      }
    }
    const panels = [...gd.querySelectorAll('.draglayer > g > rect.nsewdrag')].map(r => ({
      subplot: (r.parentElement.getAttribute('class') || '').split(' ')[0], quad: corners(r),
    })).filter(p => p.quad);
    const title = gd.querySelector('.gtitle') || gd.querySelector('.annotation-text');
    const cell = gd.closest('.jp-Cell');
    const prompt = cell && cell.querySelector('.jp-InputPrompt');
    const r = gd.querySelector('svg.main-svg').getBoundingClientRect();
    return {index, title: title ? title.textContent.trim() : '', prompt: prompt ? prompt.textContent.trim() : '',
            frame: [r.left, r.top, r.right, r.bottom], texts, panels};
  });
}
"""


def figure_problems(figures: Sequence[Mapping[str, Any]], tolerance: float = TOLERANCE) -> list[str]:
    """One line per overlap (the figure and the two labels) and per label cut off by its figure's edge in
    the measured ``figures``."""
    out = []
    for f in figures:
        labels = labels_of(f)
        out += [f"{figure_name(f)}: {o.describe()}" for o in overlaps(labels, tolerance=tolerance)]
        out += [f"{figure_name(f)}: {line}" for line in cut_off(labels, tuple(f["frame"]), tolerance=tolerance)]
    return out
