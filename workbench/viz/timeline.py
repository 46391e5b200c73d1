"""The slot timeline of a serving trace: which request owns each state slot at each scheduler step.

Pure functions, data in, ``go.Figure`` out (plotly, imported inside through ``workbench.extras``). Steps run
along x, the pool's state slots along y; each cell is coloured by its owner at that step (Okabe-Ito, from
``viz.palette``):

- free: light grey; the dummy slot (capture and padding rows write it, no request owns it): dark grey;
- a live request: one of six categorical colours, cycling by request id (the hover names the id), so a
  slot that changes colour over time was freed and handed to a later request (slot reuse);
- written by a foreign row (the replay saw a slot change that no row of the step owns): vermillion;
- a checkpoint held by a prefix cache (the state after exactly some prefix): bluish green when it was
  verified against the float64 state of that prefix, vermillion when it was off (the hover names the
  request and the prefix length); copies between slots (a hit's copy-on-write, an insert) are arrows
  from source to destination at their step.

The selected step is outlined (:func:`selected_shape`, which a widget swaps in place as its slider moves);
the first divergence is a black cross on its cell, named in the legend.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.extras import require
from workbench.viz.palette import (
    BLACK,
    BLUE,
    GREEN,
    LIGHT_GREY,
    ORANGE,
    PURPLE,
    SKY,
    VERMILLION,
    YELLOW,
    category_heatmap,
)

if TYPE_CHECKING:
    import plotly.graph_objects as go

DARK_GREY = "#4D4D4D"
FREE, DUMMY, FOREIGN, CHECKPOINT = 0, 1, 2, 3
LIVE_COLOURS = (BLUE, ORANGE, PURPLE, SKY, YELLOW)
"""A live request's colour is ``LIVE_COLOURS[id % 5]`` (green, vermillion and the greys mean something else)."""
COLOURS = (LIGHT_GREY, DARK_GREY, VERMILLION, GREEN, *LIVE_COLOURS)
LIVE = len(COLOURS) - len(LIVE_COLOURS)  # the first live request's code
LEGEND = {
    "free": LIGHT_GREY,
    "dummy slot (capture and padding write it)": DARK_GREY,
    "written by a foreign row, or a checkpoint off its prefix": VERMILLION,
    "checkpoint, verified against its prefix": GREEN,
    "live request (a colour per id, cycling)": BLUE,
}
SELECTED = "selected step"


def timeline_codes(
    owners: Sequence[Sequence[int | None]],
    slots: Sequence[int],
    *,
    dummy: int,
    foreign: Collection[tuple[int, int]] | None = None,
    steps: Sequence[int] | None = None,
    checkpoints: Mapping[tuple[int, int], Checkpointed] | None = None,
) -> list[list[int]]:
    """Colour codes ``[slot][step]`` (the heatmap's ``z``): ``FREE``, ``DUMMY``, ``FOREIGN``, ``CHECKPOINT``
    or ``LIVE + id % 5`` for a live request. ``owners[i][j]``: the request owning ``slots[j]`` at step ``i``;
    ``foreign``: ``(step, slot)`` pairs a foreign row wrote (``steps`` names step ``i``; default ``i``);
    ``checkpoints``: ``(step, slot)`` -> the checkpoint the slot holds after that step (a bad one is
    ``FOREIGN``)."""
    names = list(steps) if steps is not None else list(range(len(owners)))
    bad = set(foreign or ())
    held = checkpoints or {}
    out = []
    for j, s in enumerate(slots):
        line = []
        for i, row in enumerate(owners):
            who, cp = row[j], held.get((names[i], s))
            if (names[i], s) in bad or (cp is not None and not cp.ok):
                line.append(FOREIGN)
            elif s == dummy:
                line.append(DUMMY)
            elif who is None and cp is not None:
                line.append(CHECKPOINT)
            elif who is None:
                line.append(FREE)
            else:
                line.append(LIVE + who % len(LIVE_COLOURS))
        out.append(line)
    return out


@dataclass(frozen=True)
class Checkpointed:
    """What a prefix cache's slot holds after a step: ``request``'s first ``tokens`` tokens; ``ok``: the
    replay verified it against the float64 state of that prefix."""

    request: int
    tokens: int
    ok: bool = True


@dataclass(frozen=True)
class Copy:
    """A whole-slot copy at ``step``, ``before`` or after its forward (a hit's copy-on-write, an insert)."""

    step: int
    src: int
    dst: int
    before: bool


def selected_shape(selected: int, slots: Sequence[int]) -> dict[str, Any]:
    """The outline of step ``selected``'s column (a ``layout.shapes`` entry)."""
    lo, hi = (min(slots), max(slots)) if slots else (0, 0)
    return dict(
        type="rect",
        name=SELECTED,
        x0=selected - 0.5,
        x1=selected + 0.5,
        y0=lo - 0.5,
        y1=hi + 0.5,
        line=dict(color=BLACK, width=3),
        fillcolor="rgba(0,0,0,0)",
        layer="above",
    )


def _words(who: int | None, step: int, slot: int, code: int, cp: Checkpointed | None = None) -> str:
    where = f"step {step}, slot {slot}"
    if cp is not None and who is None:
        verdict = "verified against" if cp.ok else "OFF"
        return f"{where}: checkpoint of request {cp.request}'s first {cp.tokens} tokens ({verdict} its float64 state)"
    if code == FOREIGN:
        owner = f" (owner: request {who})" if who is not None else " (no live request owns it)"
        return f"{where}: written by a foreign row{owner}"
    if code == DUMMY:
        return f"{where}: the dummy slot (capture and padding rows write it)"
    if who is None:
        return f"{where}: free"
    return f"{where}: request {who}"


def _arrow(c: Copy) -> dict[str, Any]:
    """A copy as an annotation arrow from its source slot to its destination, beside its step's column."""
    x = c.step + (-0.3 if c.before else 0.3)
    when = "before" if c.before else "after"
    return dict(
        x=x, y=c.dst, ax=x, ay=c.src, xref="x", yref="y", axref="x", ayref="y", text="", showarrow=True,
        arrowhead=2, arrowsize=1, arrowwidth=1.5, arrowcolor=BLACK,
        hovertext=f"step {c.step}: copy slot {c.src} -> {c.dst} ({when} the forward)",
    )  # fmt: skip


def slot_timeline(
    owners: Sequence[Sequence[int | None]],
    steps: Sequence[int],
    slots: Sequence[int],
    *,
    dummy: int,
    foreign: Collection[tuple[int, int]] | None = None,
    selected: int | None = None,
    divergence: tuple[int, int | None, str] | None = None,
    checkpoints: Mapping[tuple[int, int], Checkpointed] | None = None,
    copies: Sequence[Copy] = (),
) -> go.Figure:
    """Steps x slots, coloured by owner (see the module).

    Args:
        owners: ``owners[i][j]``: the request id owning ``slots[j]`` at ``steps[i]`` (None: free).
        steps: the step number of each row of ``owners`` (x). slots: the slot number of each column (y).
        dummy: the profile's dummy slot. foreign: ``(step, slot)`` pairs written by a foreign row.
        selected: the step to outline. divergence: ``(step, slot or None, what)`` of the first divergence
            (None slot: the cross sits mid-column).
        checkpoints: ``(step, slot)`` -> the checkpoint a prefix cache holds there after the step.
        copies: slot-to-slot copies, drawn as arrows (left of the step's column before its forward, right
            after it).
    """
    go = require("plotly.graph_objects", None, "workbench.viz figures")

    steps, slots = list(steps), list(slots)
    held = checkpoints or {}
    codes = timeline_codes(owners, slots, dummy=dummy, foreign=foreign, steps=steps, checkpoints=held)
    words = [
        [_words(owners[i][j], steps[i], s, codes[j][i], held.get((steps[i], s))) for i in range(len(steps))]
        for j, s in enumerate(slots)
    ]
    fig = go.Figure(category_heatmap("owners", codes, steps, slots, COLOURS, words, gap=1))
    for name, colour in LEGEND.items():  # legend swatches: the heatmap has no legend of its own
        fig.add_trace(
            go.Scatter(
                name=name, x=[None], y=[None], mode="markers", marker=dict(color=colour, symbol="square", size=12)
            )
        )
    dx: list[Any] = []
    dy: list[Any] = []
    dname = "first divergence: none"
    if divergence is not None:
        d_step, d_slot, what = divergence
        mid = (min(slots) + max(slots)) / 2 if slots else 0
        dx, dy = [d_step], [d_slot if d_slot is not None else mid]
        dname = f"first divergence: step {d_step} ({what})"
    fig.add_trace(
        go.Scatter(
            name=dname,
            x=dx,
            y=dy,
            mode="markers",
            marker=dict(color=BLACK, symbol="x", size=14, line=dict(color="white", width=1)),
            hovertemplate=f"{dname}<extra></extra>",
            visible=True if divergence is not None else "legendonly",
        )
    )
    arrows = [_arrow(c) for c in copies]
    fig.update_layout(
        annotations=arrows,
        title_text="Slot timeline: the owner of every state slot, step by step",
        height=max(320, 230 + 16 * len(slots)),
        margin=dict(l=70, r=20, t=60, b=10),
        plot_bgcolor="white",
        legend=dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left"),
        shapes=[selected_shape(selected, slots)] if selected is not None else [],
    )
    fig.update_xaxes(title_text="scheduler step", showgrid=False, zeroline=False)
    fig.update_yaxes(title_text="state slot", showgrid=False, zeroline=False)
    return fig
