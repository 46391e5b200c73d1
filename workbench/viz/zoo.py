"""The bug zoo's evidence as a figure: a case run unfixed ("broken") beside the same case fixed.

Data in (two :class:`~workbench.zoo.ZooResult`), ``go.Figure`` out. One row of two panels per kind of evidence
that has a picture (:func:`evidence_panels`, the case's own mechanism first, two rows at most), drawn with the
figures' own pieces:

- metadata rows (``RowsDiffer``): the padding map (``viz.metadata.padding_map_traces``) of the metadata the
  graph ran with above the metadata it should have had; each cell a batch row coloured by what the kernel
  does with it, its text the compared field's value, the rows that differ outlined in black;
- the state pool (``IntegrityEvidence``): the integrity heatmap's colours (``viz.metadata.integrity_codes``)
  over every slot of the pool, a line per checked step: written by the live row that owns it (blue), the
  dummy slot (yellow), lost state (vermillion: written by a row that does not own it, or a live slot off the
  float64 reference);
- NaN rows (``Propagation``): each stage of the pipeline by token row, non-finite rows vermillion;
- a serving trace (``TraceEvidence``): the slot timeline (``viz.timeline.slot_timeline``) of the steps that
  ran, the first divergence crossed.

A side without that kind of evidence (a capture that raised before any step ran, say) says in words what
it produced instead.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import zip_longest
from typing import TYPE_CHECKING, Any

from workbench.extras import require
from workbench.viz.metadata import (
    CHANGED_BAD,
    CHANGED_DUMMY,
    CHANGED_OK,
    LIVE,
    PAD_PROCESSED,
    PAD_SKIPPED,
    PADDING_TRACES,
    PROCESSED,
    SKIPPED,
    UNCHANGED,
    integrity_codes,
    padding_cells,
    padding_map_traces,
    unique_labels,
)
from workbench.viz.palette import BLACK, BLUE, GREY, LIGHT_GREY, VERMILLION, YELLOW, category_heatmap
from workbench.viz.timeline import (
    CHECKPOINT,
    COLOURS,
    DUMMY,
    FOREIGN,
    FREE,
    LEGEND,
    LIVE_COLOURS,
    Checkpointed,
    Copy,
    slot_timeline,
)

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from workbench.zoo import ZooResult

PANEL_KINDS = ("rows", "pool", "nan", "trace")
"""What a panel draws: metadata rows, the state pool, NaN rows by stage, a trace's slot timeline."""
SIDES = ("broken", "fixed")

GOT, WANT = "graph's metadata", "should be"
DIFFERS = "row that differs from what it should be"
POOL_WORDS = {
    UNCHANGED: "unchanged",
    CHANGED_OK: "written by the live row that owns it",
    CHANGED_DUMMY: "dummy slot written (allowed)",
    CHANGED_BAD: "lost state: written without an owner, or off the float64 reference",
}
POOL_COLOURS = {UNCHANGED: "#FFFFFF", CHANGED_OK: BLUE, CHANGED_DUMMY: YELLOW, CHANGED_BAD: VERMILLION}
FINITE, NONFINITE = "finite", "NaN or inf"
PADDING_STYLE = {
    PADDING_TRACES[0]: dict(color=LIVE, pattern=dict(shape="")),
    PAD_SKIPPED: dict(color=SKIPPED, pattern=dict(shape="/", fgcolor=GREY)),
    PAD_PROCESSED: dict(color=PROCESSED, pattern=dict(shape="x", fgcolor="white")),
}
GAP_PX = 110  # between two rows of panels: the upper one's axis title and ticks, the lower one's titles


@dataclass(frozen=True)
class Panel:
    """One row of the figure: its ``kind`` (one of ``PANEL_KINDS``), a ``title``, and the evidence each side
    draws (a list: the pool draws a line per checked step; empty when that side has none of the kind)."""

    kind: str
    title: str
    broken: tuple[Any, ...]
    fixed: tuple[Any, ...]


def kind_of(e: Any) -> str | None:
    """The panel kind that draws evidence ``e`` (None: it has no picture, or lacks the data for one)."""
    from workbench.zoo.result import IntegrityEvidence, Propagation, RowsDiffer, TraceEvidence

    if isinstance(e, RowsDiffer) and e.metadata is not None and e.field_name:
        return "rows"
    if isinstance(e, IntegrityEvidence) and e.num_slots > 0:
        return "pool"
    if isinstance(e, Propagation) and e.num_rows > 0:
        return "nan"
    if isinstance(e, TraceEvidence) and e.timeline is not None and e.timeline.steps:
        return "trace"
    return None


def _title(kind: str, e: Any) -> str:
    if kind == "rows":
        return e.field_name
    if kind == "pool":
        return "state slots written"
    if kind == "nan":
        return "NaN rows by stage"
    return f"{e.what}, slot owners" if e.what != "trace replay" else "slot owners by step"


def evidence_panels(broken: ZooResult, fixed: ZooResult, *, max_rows: int = 2) -> list[Panel]:
    """The panels :func:`zoo_evidence` draws, top first: the kinds of evidence that show the case's bug in
    the broken run first, then the other kinds either run has; ``max_rows`` at most.

    Of several metadata comparisons one is drawn (one that differs, ``state_indices`` first), matched with
    the fixed run's comparison of the same field; every checked step of the pool is a line of its panel; a
    case with several traces gets a row per trace.
    """
    kinds: list[str] = []
    ordered = [e for e in broken.evidence if broken.shows_bug(e)] + list(broken.evidence) + list(fixed.evidence)
    for e in ordered:
        k = kind_of(e)
        if k is not None and k not in kinds:
            kinds.append(k)
    panels: list[Panel] = []
    for kind in kinds:
        b: list[Any] = [e for e in broken.evidence if kind_of(e) == kind]
        f: list[Any] = [e for e in fixed.evidence if kind_of(e) == kind]
        if kind == "rows":
            pick = sorted(b or f, key=lambda e: (not e.broken, e.field_name != "state_indices"))[0]
            pair = (
                [e for e in b if e.field_name == pick.field_name][:1],
                [e for e in f if e.field_name == pick.field_name][:1],
            )
            panels.append(Panel(kind, _title(kind, pick), tuple(pair[0]), tuple(pair[1])))
        elif kind == "trace":
            for eb, ef in zip_longest(b, f):
                panels.append(Panel(kind, _title(kind, eb or ef), (eb,) if eb else (), (ef,) if ef else ()))
        else:
            panels.append(Panel(kind, _title(kind, (b or f)[0]), tuple(b), tuple(f)))
    return ([*panels[:1], *[p for p in panels[1:] if _differs(p)]])[:max_rows]


def _differs(p: Panel) -> bool:
    """Whether the two sides of a panel draw differently (a panel below the first is kept only then)."""
    if not p.broken or not p.fixed:
        return True
    if p.kind == "pool":
        return [(e.written, e.live, e.slots) for e in p.broken] != [(e.written, e.live, e.slots) for e in p.fixed]
    if p.kind == "nan" or p.kind == "rows":
        return any(e.broken for e in p.broken) != any(e.broken for e in p.fixed)
    return True


def _panel_height(p: Panel) -> int:
    """Pixels of a row's plot area."""
    if p.kind == "rows":
        return 110
    if p.kind == "pool":
        return 40 + 34 * max(len(p.broken), len(p.fixed), 1)
    if p.kind == "nan":
        return 130
    slots = max(len(e.timeline.slots) for e in (*p.broken, *p.fixed))
    return max(150, 18 * slots)


def _legend(fig: go.Figure, seen: set[str], name: str, row: int, col: int, **marker: Any) -> None:
    """A legend swatch (a marker with no data) on panel ``(row, col)``, once per name."""
    go = require("plotly.graph_objects", None, "workbench.viz figures")
    if name in seen:
        return
    seen.add(name)
    fig.add_trace(
        go.Scatter(name=name, x=[None], y=[None], mode="markers", marker=dict(symbol="square", size=12, **marker)),
        row=row,
        col=col,
    )


def _rows_side(fig: go.Figure, e: Any, row: int, col: int, seen: set[str]) -> None:
    go = require("plotly.graph_objects", None, "workbench.viz figures")
    got, want = e.metadata
    # the step's live rows, whatever the graph's copy of the host-side count says: the kernels go by the index
    got = replace(got, raw_batch_size=want.raw_batch_size)
    labels = unique_labels([got, want])
    name_of = {labels[0]: GOT, labels[1]: WANT}
    values = {}
    for label, meta in zip(labels, (got, want), strict=True):
        t = getattr(meta, e.field_name, None)
        values[label] = t.tolist() if t is not None else ["missing"] * meta.batch_size
    differ = set(e.rows)
    data = _by_index(padding_map_traces([got, want]), got, labels[0])
    for name in PADDING_TRACES:
        d = data[name]
        cells = list(zip(d["x"], d["y"], strict=True))
        fig.add_trace(
            go.Bar(
                name=name,
                legendgroup=name,
                showlegend=name not in seen,
                orientation="h",
                **padding_cells(d["x"]),
                y=[name_of[y] for y in d["y"]],
                text=[_fmt(values[y][x]) for x, y in cells],
                customdata=[[*c, _fmt(values[y][x])] for c, (x, y) in zip(d["customdata"], cells, strict=True)],
                textposition="inside",
                insidetextanchor="middle",
                marker=dict(line=dict(color="white", width=1), **PADDING_STYLE[name]),
                hovertemplate=f"batch row %{{customdata[1]}}: {e.field_name} %{{customdata[5]}}, state index "
                "%{customdata[2]}<br>request row %{customdata[3]}<br>%{customdata[4]}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        if d["x"]:
            seen.add(name)
    rows = sorted(differ)
    fig.add_trace(  # the rows that differ, outlined over their cells
        go.Bar(
            name=DIFFERS,
            legendgroup=DIFFERS,
            showlegend=bool(rows) and DIFFERS not in seen,
            orientation="h",
            **padding_cells(rows),
            y=[GOT] * len(rows),
            customdata=[[r, _fmt(values[labels[0]][r]), _fmt(values[labels[1]][r])] for r in rows],
            marker=dict(color="rgba(0,0,0,0)", line=dict(color=BLACK, width=3)),
            hovertemplate=f"batch row %{{customdata[0]}}: {e.field_name} %{{customdata[1]}}, should be "
            "%{customdata[2]}<extra></extra>",
        ),
        row=row,
        col=col,
    )
    if rows:
        seen.add(DIFFERS)
    bs = max(got.batch_size, want.batch_size)
    fig.update_xaxes(range=[-0.6, bs - 0.4], dtick=1, title_text="batch row", row=row, col=col)
    fig.update_yaxes(categoryorder="array", categoryarray=[WANT, GOT], row=row, col=col)


def _by_index(data: dict[str, dict[str, list]], meta: Any, label: str) -> dict[str, dict[str, list]]:
    """``padding_map_traces`` data with the cells of ``label`` (the graph's metadata) moved to the skipped
    trace where the kernel skips their state index: a live row the graph was handed a sentinel for is not
    read or written, whatever the host-side count of live rows says."""
    out: dict[str, dict[str, list]] = {n: {k: [] for k in data[n]} for n in data}
    idx = meta.state_indices.tolist()
    for name, d in data.items():
        for i, (x, y) in enumerate(zip(d["x"], d["y"], strict=True)):
            to, cell = name, {k: d[k][i] for k in d}
            first = idx[x][0] if isinstance(idx[x], list) else idx[x]
            if y == label and name != PAD_SKIPPED and meta.profile.convention.skips(first):
                to = PAD_SKIPPED
                what = f"skipped ({meta.profile.guard}): the kernel neither reads nor writes a state for it"
                cell["customdata"] = [*cell["customdata"][:4], what]
            for k, v in cell.items():
                out[to][k].append(v)
    return out


def _fmt(v: Any) -> str:
    return str(v) if not isinstance(v, list) else "[" + ",".join(map(str, v)) + "]"


def _pool_side(fig: go.Figure, lines: Sequence[Any], slots: list[int], row: int, col: int, seen: set[str]) -> None:
    codes, words = [], []
    for e in lines:
        line = integrity_codes([[s in e.written for s in slots]], [[s in e.live for s in slots]], e.dummy, slots)[0]
        bad = set(e.slots)
        off = {s for n, s, _ in e.report.state_mismatches if not n.startswith("intermediate")}
        line = [CHANGED_BAD if s in bad else c for s, c in zip(slots, line, strict=True)]
        codes.append(line)
        words.append([_pool_words(e, s, c, off) for s, c in zip(slots, line, strict=True)])
    colours = [POOL_COLOURS[k] for k in range(len(POOL_COLOURS))]
    fig.add_trace(
        category_heatmap("slots", codes, [str(s) for s in slots], [e.what for e in lines], colours, words, gap=2),
        row=row,
        col=col,
    )
    for code in (CHANGED_OK, CHANGED_DUMMY, CHANGED_BAD):
        if any(code in line for line in codes):
            _legend(fig, seen, POOL_WORDS[code], row, col, color=POOL_COLOURS[code])
    fig.update_xaxes(type="category", title_text="state slot", row=row, col=col)
    fig.update_yaxes(type="category", autorange="reversed", row=row, col=col)


def _pool_words(e: Any, slot: int, code: int, off: set[int]) -> str:
    where = f"{e.what}, slot {slot}"
    owner = e.owners.get(slot)
    owned = f" (request row {owner})" if owner is not None else ""
    if code == CHANGED_BAD and slot in off:
        return f"{where}: off the float64 reference{owned}: lost state"
    if code == CHANGED_BAD:
        return f"{where}: written, but no live row of the step owns it{owned}: lost state"
    if code == CHANGED_OK:
        return f"{where}: written by the live row that owns it"
    if code == CHANGED_DUMMY:
        return f"{where}: the dummy slot, written (allowed)"
    return f"{where}: unchanged"


def _nan_side(fig: go.Figure, e: Any, row: int, col: int, seen: set[str]) -> None:
    go = require("plotly.graph_objects", None, "workbench.viz figures")
    rows = list(range(e.num_rows))
    stages = [name for name, _ in e.stages]
    z = [[1 if r in set(bad) else 0 for r in rows] for _, bad in e.stages]
    words = [
        [f"{s}, token row {r}: {NONFINITE if v else FINITE}" for r, v in zip(rows, line, strict=True)]
        for s, line in zip(stages, z, strict=True)
    ]
    fig.add_trace(
        go.Heatmap(
            name="stages",
            z=z,
            x=[str(r) for r in rows],
            y=stages,
            zmin=-0.5,
            zmax=1.5,
            colorscale=[[0, LIGHT_GREY], [0.5, LIGHT_GREY], [0.5, VERMILLION], [1, VERMILLION]],
            showscale=False,
            customdata=words,
            hovertemplate="%{customdata}<extra></extra>",
            xgap=2,
            ygap=2,
        ),
        row=row,
        col=col,
    )
    _legend(fig, seen, FINITE, row, col, color=LIGHT_GREY)
    if any(any(line) for line in z):
        _legend(fig, seen, NONFINITE, row, col, color=VERMILLION)
    fig.update_xaxes(type="category", title_text="token row of the step", row=row, col=col)
    fig.update_yaxes(type="category", autorange="reversed", row=row, col=col)


def _trace_side(fig: go.Figure, e: Any, row: int, col: int, seen: set[str]) -> None:

    t = e.timeline
    d = e.divergence
    one = slot_timeline(
        [list(line) for line in t.owners],
        list(t.steps),
        list(t.slots),
        dummy=t.dummy,
        foreign=set(t.foreign),
        divergence=(d.step, d.slot, d.kind) if d is not None else None,
        checkpoints={(st, sl): Checkpointed(req, tokens, ok) for st, sl, req, tokens, ok in t.checkpoints},
        copies=[Copy(*c) for c in t.copies],
    )
    used = {COLOURS[FREE], COLOURS[DUMMY], LIVE_COLOURS[0]}  # the timeline's legend names colours
    if t.foreign or any(not ok for *_, ok in t.checkpoints):
        used.add(COLOURS[FOREIGN])
    if any(ok for *_, ok in t.checkpoints):
        used.add(COLOURS[CHECKPOINT])
    present = {name for name, colour in LEGEND.items() if colour in used}
    for tr in one.data:
        if tr.type != "heatmap":
            swatch = not any(v is not None for v in (tr.x or ()))
            if tr.visible == "legendonly" or (swatch and tr.name not in present):
                continue  # no divergence to mark, or a colour this timeline does not use
            tr.legendgroup, tr.showlegend = tr.name, tr.name not in seen
            seen.add(tr.name)
        fig.add_trace(tr, row=row, col=col)
    axis = fig.get_subplot(row, col)
    xref, yref = axis.xaxis.plotly_name.replace("axis", ""), axis.yaxis.plotly_name.replace("axis", "")
    for a in one.layout.annotations:  # the copies' arrows, onto this panel's axes
        fig.add_annotation(a.update(xref=xref, yref=yref, axref=xref, ayref=yref))
    fig.update_xaxes(title_text="scheduler step", dtick=1, showgrid=False, zeroline=False, row=row, col=col)
    fig.update_yaxes(showgrid=False, zeroline=False, row=row, col=col)


def _words_side(fig: go.Figure, result: ZooResult, kind: str, row: int, col: int) -> None:
    """A side without evidence of ``kind``: what it produced instead, in words, in the middle of the panel."""
    bad = [e for e in result.evidence if e.broken]
    if bad:
        said = "nothing to draw here: " + bad[0].summary()
    else:
        said = "nothing to draw here: " + "; ".join(e.summary() for e in result.evidence)
    text = "<br>".join(textwrap.wrap(said, 40)[:6])  # half of a narrow widget: about 260 px of 12 px text
    axis = fig.get_subplot(row, col)
    xref, yref = axis.xaxis.plotly_name.replace("axis", ""), axis.yaxis.plotly_name.replace("axis", "")
    fig.add_annotation(
        text=text,
        xref=f"{xref} domain",
        yref=f"{yref} domain",
        x=0.5,
        y=0.5,
        showarrow=False,
        align="left",
        font=dict(size=12, color=GREY),
    )
    fig.update_xaxes(visible=False, row=row, col=col)
    fig.update_yaxes(visible=False, row=row, col=col)


def zoo_evidence(broken: ZooResult, fixed: ZooResult, *, sides: Sequence[str] = SIDES) -> go.Figure:
    """A case's evidence, unfixed beside fixed: a row of two panels per kind of evidence that has a picture
    (see the module and :func:`evidence_panels`), titled ``sides`` ("broken", "fixed") and what they show.

    ``broken``, ``fixed``: two results of the same case (``ZooCase.run(False)``, ``run(True)``; a run against
    your backend beside the case's fixed one works too). A case whose evidence has no picture at all
    (errors only) gets one panel each saying what happened.
    """
    make_subplots = require("plotly.subplots", None, "workbench.viz figures").make_subplots
    from workbench.zoo.result import ZooError, ZooResult

    if not (isinstance(broken, ZooResult) and isinstance(fixed, ZooResult)):
        raise ZooError(f"zoo_evidence: expected two ZooResults, got {type(broken).__name__}, {type(fixed).__name__}")
    if broken.case != fixed.case:
        raise ZooError(f"zoo_evidence: results of two cases, {broken.case!r} and {fixed.case!r}")
    if len(sides) != 2:
        raise ZooError(f"zoo_evidence: sides: expected two titles, got {list(sides)!r}")
    panels = evidence_panels(broken, fixed) or [Panel("none", "what the runs produced", (), ())]
    # a side in words needs room for five lines of them
    heights = [max(_panel_height(p) if p.kind != "none" else 0, 0 if p.broken and p.fixed else 100) for p in panels]
    plot_px = sum(heights) + GAP_PX * (len(panels) - 1)
    titles = [f"{side}: {p.title}" for p in panels for side in sides]
    fig = make_subplots(
        rows=len(panels),
        cols=2,
        subplot_titles=titles,
        row_heights=heights,
        horizontal_spacing=0.05,
        vertical_spacing=GAP_PX / plot_px if len(panels) > 1 else 0.0,
    )
    seen: set[str] = set()
    for r, p in enumerate(panels, start=1):
        slots = sorted({s for e in (*p.broken, *p.fixed) if p.kind == "pool" for s in range(e.num_slots)})
        for c, (result, shown) in enumerate(((broken, p.broken), (fixed, p.fixed)), start=1):
            if not shown:
                _words_side(fig, result, p.kind, r, c)
            elif p.kind == "rows":
                _rows_side(fig, shown[0], r, c, seen)
            elif p.kind == "pool":
                _pool_side(fig, shown, slots, r, c, seen)
            elif p.kind == "nan":
                _nan_side(fig, shown[0], r, c, seen)
            else:
                _trace_side(fig, shown[0], r, c, seen)
            if c == 2:  # the same lines as the left panel: its labels say what they are
                fig.update_yaxes(showticklabels=False, row=r, col=c)
        if p.kind == "trace":
            fig.update_yaxes(title_text="state slot", row=r, col=1)
    fig.update_layout(
        title_text=f"{broken.case} ({broken.issue}): {sides[0]} beside {sides[1]}",
        height=plot_px + 90 + 130,  # the title and panel titles above, the axis titles and legend below
        margin=dict(l=130, r=20, t=90, b=10),
        barmode="overlay",
        bargap=0.25,
        plot_bgcolor="white",
        legend=dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left"),
    )
    return fig
