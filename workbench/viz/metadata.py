"""Figures of a step's metadata: padded rows, padding per profile, slots, query_start_loc, integrity.

Pure functions, data in, ``go.Figure`` out (plotly, imported inside each function through ``workbench.extras``).
Each figure has a fixed set of traces named for what they show, so a widget can update one in place
(``*_traces`` return the per-trace data the figure functions draw; traces with nothing to show are empty,
never missing). Colours come from ``viz.palette`` (Okabe-Ito, colour-blind safe):

- live rows: blue; padded rows the kernel skips (sglang ``-1``, vLLM's null slot ``0``): light grey, hatched;
  padded rows processed on the dummy slot (sglang on Ascend): vermillion, cross-hatched. Processed means the
  conv update (one token a row, whatever ``query_start_loc`` says) writes the dummy slot; under the
  recurrence the padded rows are zero-length, so it computes nothing and stores the slot back unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from workbench.extras import require
from workbench.metadata import predicted_access, row_fate  # the kernels' skip rule lives with the metadata
from workbench.viz.palette import BLUE, GREY, LIGHT_GREY, ORANGE, SKY, VERMILLION, YELLOW

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from workbench.metadata import Metadata
    from workbench.pool import StatePool

LIVE = BLUE
PAD = LIGHT_GREY
SKIPPED = LIGHT_GREY
PROCESSED = VERMILLION

# names of the padding-map traces (the legend): what the kernel does with each row
LIVE_ROW = "live row"
PAD_SKIPPED = "padded, skipped by the kernel (no read, no write)"
PAD_PROCESSED = "padded, processed on the dummy slot (the conv writes it; zero-length under the recurrence)"
PADDING_TRACES = (LIVE_ROW, PAD_SKIPPED, PAD_PROCESSED)


def _as_list(metas: Metadata | Sequence[Metadata]) -> list[Metadata]:
    from workbench.metadata import Metadata

    return [metas] if isinstance(metas, Metadata) else list(metas)


def panel_label(meta: Metadata) -> str:
    """A short unique-enough label of one step: profile, mode, raw batch size and padded size."""
    return f"{meta.profile.name} {meta.forward_mode} {meta.raw_batch_size}->{meta.batch_size}"


def unique_labels(metas: Sequence[Metadata]) -> list[str]:
    """:func:`panel_label` of each step, a repeated one numbered " (2)", " (3)"...: the y categories of
    the padding map and the trace names of the qsl staircase."""
    labels: list[str] = []
    for m in metas:
        base = lab = panel_label(m)
        k = 2
        while lab in labels:
            lab, k = f"{base} ({k})", k + 1
        labels.append(lab)
    return labels


def _fmt_idx(v: Any) -> str:
    return str(v) if not isinstance(v, list) else "[" + ",".join(map(str, v)) + "]"


# -- padded batch (tokens per row) -------------------------------------------------------------------------
def padded_batch(metas: Metadata | Sequence[Metadata], titles: Sequence[str] | None = None) -> go.Figure:
    """One panel per metadata (one ``Metadata`` or a sequence): a bar per batch row spanning its
    ``query_start_loc`` tokens.

    Live rows are blue, padded rows grey (zero-length, drawn as a thin marker); each bar is labelled with
    the row's state index, so the profile's sentinel shows on the padded rows.
    """
    go = require("plotly.graph_objects", None, "workbench.viz figures")
    make_subplots = require("plotly.subplots", None, "workbench.viz figures").make_subplots

    metas = _as_list(metas)

    titles = list(
        titles or [f"{m.profile.name}: {m.forward_mode}, raw_bs={m.raw_batch_size} -> bs={m.batch_size}" for m in metas]
    )
    fig = make_subplots(rows=len(metas), cols=1, subplot_titles=titles, vertical_spacing=0.12)
    for k, meta in enumerate(metas, start=1):
        rows = meta.rows()
        # zero-length rows get a sliver 3% of the axis wide, so they stay visible at any token count
        sliver = max(0.15, 0.03 * max(r["qsl_end"] for r in rows)) if rows else 0.15
        for kind, color in (("live", LIVE), ("pad", PAD)):
            sel = [r for r in rows if r["kind"] == kind]
            if not sel:
                continue
            fig.add_trace(
                go.Bar(
                    y=[f"row {r['row']}" for r in sel],
                    x=[r["num_tokens"] or sliver for r in sel],
                    base=[r["qsl_start"] for r in sel],
                    orientation="h",
                    marker_color=color,
                    text=[f"slot {r['state_index']}" for r in sel],
                    textposition="inside",
                    insidetextanchor="middle",
                    name=f"{kind} rows",
                    legendgroup=kind,
                    showlegend=k == 1,
                    customdata=[[r["req_pool_index"], r["seq_len"], r["num_tokens"]] for r in sel],
                    hovertemplate="%{y}: state index %{text}<br>req row %{customdata[0]}, seq_len %{customdata[1]}"
                    "<br>tokens %{customdata[2]}<extra></extra>",
                ),
                row=k,
                col=1,
            )
        fig.update_yaxes(autorange="reversed", row=k, col=1)
        fig.update_xaxes(title_text="token position (query_start_loc)", row=k, col=1)
    fig.update_layout(height=220 * len(metas) + 80, barmode="overlay", margin=dict(l=60, r=20, t=60, b=40))
    return fig


# -- padding map ----------------------------------------------------------------------------------------
def padding_map_traces(metas: Metadata | Sequence[Metadata]) -> dict[str, dict[str, list]]:
    """Per trace of :func:`padding_map` (by legend name): ``x`` (batch row), ``y`` (panel label),
    ``text`` (state index) and ``customdata`` (profile, row, state index, request row, what happens)."""
    metas = _as_list(metas)
    out: dict[str, dict[str, list]] = {n: {"x": [], "y": [], "text": [], "customdata": []} for n in PADDING_TRACES}
    names = {"live": LIVE_ROW, "skipped": PAD_SKIPPED, "processed": PAD_PROCESSED}
    for meta, label in zip(metas, unique_labels(metas), strict=True):
        idx = meta.state_indices.tolist()
        rpi = meta.req_pool_indices.tolist()
        prof = meta.profile
        for row in range(meta.batch_size):
            fate = row_fate(meta, row)
            what = {
                "live": f"live: reads and writes slot {_fmt_idx(idx[row])}",
                "skipped": f"skipped ({prof.guard}): no state read or write, zero output",
                "processed": (
                    f"processed on dummy slot {prof.dummy_slot}: the conv update writes it; "
                    "zero-length under the recurrence, which leaves it unchanged"
                ),
            }[fate]
            t = out[names[fate]]
            t["x"].append(row)
            t["y"].append(label)
            t["text"].append(_fmt_idx(idx[row]))
            t["customdata"].append([prof.name, row, _fmt_idx(idx[row]), rpi[row], what])
    return out


def padding_cells(rows: Sequence[int]) -> dict[str, list]:
    """``go.Bar`` keywords that draw batch rows ``rows`` as the padding map's cells: ``x`` (each cell one
    row wide) and ``base`` (its left edge, so row ``r`` is centred on ``r``)."""
    return {"x": [1] * len(rows), "base": [r - 0.5 for r in rows]}


def padding_map(metas: Metadata | Sequence[Metadata]) -> go.Figure:
    """Rows x bucket, one line per step (e.g. one per profile): each cell a batch row, coloured by what the
    kernel does with it.

    Live rows blue; padded rows the kernel skips (sglang ``-1``, vLLM's null slot ``0``) light grey and
    hatched; padded rows processed on the dummy slot (sglang on Ascend: the conv update writes slot 0, the
    recurrence sees them zero-length) vermillion and cross-hatched. Cell text: the row's state index.
    Hover: profile, row, request row, fate.
    """
    go = require("plotly.graph_objects", None, "workbench.viz figures")

    metas = _as_list(metas)
    data = padding_map_traces(metas)
    style = {
        LIVE_ROW: dict(color=LIVE, pattern=dict(shape="")),
        PAD_SKIPPED: dict(color=SKIPPED, pattern=dict(shape="/", fgcolor=GREY)),
        PAD_PROCESSED: dict(color=PROCESSED, pattern=dict(shape="x", fgcolor="white")),
    }
    fig = go.Figure()
    for name in PADDING_TRACES:
        d = data[name]
        fig.add_trace(
            go.Bar(
                name=name,
                orientation="h",
                **padding_cells(d["x"]),
                y=d["y"],
                text=d["text"],
                customdata=d["customdata"],
                textposition="inside",
                insidetextanchor="middle",
                marker=dict(line=dict(color="white", width=1), **style[name]),
                hovertemplate="%{customdata[0]}, batch row %{customdata[1]}: state index %{customdata[2]}"
                "<br>request row %{customdata[3]}<br>%{customdata[4]}<extra></extra>",
            )
        )
    # The legend sits at the figure's foot (yref "container" reserves its rows), so the x-axis title stays
    # above it however few steps are drawn and however many rows the legend wraps to; the y-axis title is a
    # word, so it fits beside a single step (the tick labels say "profile mode raw->bs").
    fig.update_layout(
        title="Padding map: what the kernel does with each row of the bucket",
        barmode="overlay",
        bargap=0.25,
        margin=dict(l=200, r=20, t=60, b=10),
        legend=dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left"),
    )
    fig.update_xaxes(title_text="batch row (bucket slot, rows)")
    fig.update_yaxes(categoryorder="array", type="category", title_text="step")
    fig.update_layout(**padding_map_layout(metas))
    return fig


def padding_map_layout(metas: Metadata | Sequence[Metadata]) -> dict[str, Any]:
    """The part of :func:`padding_map`'s layout that follows the data, as ``fig.update_layout`` keywords (a
    widget updating the figure in place applies the same): ``height`` (px, 60 a step), ``xaxis_range``
    (batch rows; at least one, so an empty step keeps a readable axis) and ``yaxis_categoryarray`` (the steps'
    :func:`unique_labels`, top first)."""
    metas = _as_list(metas)
    max_bs = max((m.batch_size for m in metas), default=1)
    return {
        "height": 140 + 60 * max(len(metas), 1),
        "xaxis_range": [-0.6, max(max_bs, 1) - 0.4],
        "yaxis_categoryarray": unique_labels(metas)[::-1],
    }


# -- slot map -------------------------------------------------------------------------------------------
SLOT_LIVE = "live row -> its slot"
SLOT_SKIPPED = "padded row -> sentinel (skipped)"
SLOT_PROCESSED = "padded row -> dummy slot (processed)"
POOL_DUMMY = "dummy slot (reserved)"
POOL_BATCH = "slot of a row in this batch"
POOL_OTHER = "slot of another request"
POOL_FREE = "free slot"
POOL_READ = "read by the step"
POOL_WRITTEN = "written by the step"
SLOT_TRACES = (SLOT_LIVE, SLOT_SKIPPED, SLOT_PROCESSED)
POOL_TRACES = (POOL_DUMMY, POOL_BATCH, POOL_OTHER, POOL_FREE)
MARK_TRACES = (POOL_READ, POOL_WRITTEN)


def slot_map_traces(
    meta: Metadata, pool: StatePool, *, read: Sequence[int] | None = None, written: Sequence[int] | None = None
) -> dict[str, dict[str, list]]:
    """Per trace of :func:`slot_map` (by legend name): ``x`` (slot; -1 is the sentinel column), ``y``
    (batch row, or the pool strip "pool"), ``customdata`` (hover words)."""
    out: dict[str, dict[str, list]] = {
        n: {"x": [], "y": [], "customdata": []} for n in (*SLOT_TRACES, *POOL_TRACES, *MARK_TRACES)
    }
    prof = meta.profile
    idx = meta.state_indices.tolist()
    rpi = meta.req_pool_indices.tolist()
    in_batch: dict[int, int] = {}
    for row in range(meta.batch_size):
        fate = row_fate(meta, row)
        slots = idx[row] if isinstance(idx[row], list) else [idx[row]]
        for j, s in enumerate(slots):
            pos = f" (draft position {j})" if len(slots) > 1 else ""
            if fate == "live":
                name = SLOT_LIVE
                in_batch.setdefault(s, row)
                words = f"batch row {row} (request row {rpi[row]}) -> slot {s}{pos}"
            elif fate == "skipped":
                name = SLOT_SKIPPED
                words = f"padded batch row {row} -> {s}: skipped ({prof.guard})"
            else:
                name = SLOT_PROCESSED
                words = f"padded batch row {row} -> dummy slot {s}: processed (the conv update writes it)"
            t = out[name]
            t["x"].append(s if s >= 0 else -1)
            t["y"].append(row)
            t["customdata"].append(words)
    owner = {s: r for r in pool.live_rows for s in pool.slots_of(r)}
    for s in range(pool.num_slots):
        if s == prof.dummy_slot:
            name, words = POOL_DUMMY, f"slot {s}: reserved dummy (capture and processed padding write it)"
        elif s in in_batch:
            name, words = POOL_BATCH, f"slot {s}: request row {owner.get(s)} at batch row {in_batch[s]}"
        elif s in owner:
            name, words = POOL_OTHER, f"slot {s}: request row {owner[s]}, not in this batch (must stay unchanged)"
        else:
            name, words = POOL_FREE, f"slot {s}: free"
        out[name]["x"].append(s)
        out[name]["y"].append("pool")
        out[name]["customdata"].append(words)
    if read is None or written is None:
        p_read, p_written = predicted_access(meta)
        read = p_read if read is None else read
        written = p_written if written is None else written
    for name, slots, what in ((POOL_READ, read, "read"), (POOL_WRITTEN, written, "written")):
        for s in sorted(set(slots)):
            out[name]["x"].append(s)
            out[name]["y"].append(what)
            out[name]["customdata"].append(f"slot {s} {what} by the step")
    return out


def slot_map_layout(meta: Metadata, pool: StatePool) -> dict[str, Any]:
    """The part of :func:`slot_map`'s layout that follows the data, as ``fig.update_layout`` keywords: the
    ``title_text``, the ``height`` (px, 12 a batch row) and the pool axis (``xaxis2_*``: the slot range with
    the sentinel column left of slot 0, about 16 ticks)."""
    ticks = [-1, *range(0, pool.num_slots, max(1, pool.num_slots // 16))]
    return {
        "title_text": f"Slot map: {panel_label(meta)} on a pool of {pool.num_slots} slots",
        "height": 320 + 12 * meta.batch_size,  # 60 of it for the legend rows at the foot
        "xaxis2_range": [-1.6, pool.num_slots - 0.4],
        "xaxis2_tickvals": ticks,
        "xaxis2_ticktext": ["sentinel" if t == -1 else str(t) for t in ticks],
    }


def slot_map(
    meta: Metadata, pool: StatePool, *, read: Sequence[int] | None = None, written: Sequence[int] | None = None
) -> go.Figure:
    """Batch row -> state slot(s), and the pool beneath: dummy and sentinel visible, slots read and written.

    Top panel: one marker per (batch row, slot) pair (vLLM verify rows have ``D`` slots); padded rows
    point at the sentinel column (``-1``, left of the pool) or at the dummy slot, filled vermillion where
    they are processed there, hollow grey where the kernel skips them. Bottom panel: every slot of the
    pool by owner, and the slots the step reads and writes (default: what the profile's kernel rule
    predicts, see :func:`workbench.metadata.predicted_access`; pass the slots a real step changed to show those).
    """
    go = require("plotly.graph_objects", None, "workbench.viz figures")
    make_subplots = require("plotly.subplots", None, "workbench.viz figures").make_subplots

    data = slot_map_traces(meta, pool, read=read, written=written)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.72, 0.28], vertical_spacing=0.06)
    marker = {
        SLOT_LIVE: dict(color=LIVE, symbol="circle", size=10),
        SLOT_SKIPPED: dict(color=GREY, symbol="circle-open", size=10, line=dict(width=2)),
        SLOT_PROCESSED: dict(color=PROCESSED, symbol="x", size=11),
        POOL_DUMMY: dict(color=PROCESSED, symbol="square", size=12),
        POOL_BATCH: dict(color=LIVE, symbol="square", size=12),
        POOL_OTHER: dict(color=SKY, symbol="square", size=12),
        POOL_FREE: dict(color=LIGHT_GREY, symbol="square", size=12),
        POOL_READ: dict(color=ORANGE, symbol="triangle-down", size=10),
        POOL_WRITTEN: dict(color=YELLOW, symbol="triangle-up", size=10, line=dict(color="black", width=1)),
    }
    for name in (*SLOT_TRACES, *POOL_TRACES, *MARK_TRACES):
        d = data[name]
        fig.add_trace(
            go.Scatter(
                name=name,
                x=d["x"],
                y=d["y"],
                customdata=d["customdata"],
                mode="markers",
                marker=marker[name],
                hovertemplate="%{customdata}<extra></extra>",
            ),
            row=1 if name in SLOT_TRACES else 2,
            col=1,
        )
    fig.update_xaxes(title_text="state slot (index into the pool; left: the sentinel column)", row=2, col=1)
    fig.update_yaxes(autorange="reversed", title_text="batch row", row=1, col=1)
    fig.update_yaxes(categoryorder="array", categoryarray=["written", "read", "pool"], row=2, col=1)
    # the legend at the figure's foot (yref "container" reserves its rows), so the pool axis's title and
    # labels sit above it at any width, however many rows the legend wraps to
    fig.update_layout(
        margin=dict(l=60, r=20, t=60, b=10),
        legend=dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left"),
    )
    fig.update_layout(**slot_map_layout(meta, pool))
    fig.add_vrect(x0=-1.5, x1=-0.5, fillcolor=LIGHT_GREY, opacity=0.35, line_width=0, layer="below")
    return fig


# -- query_start_loc staircase ----------------------------------------------------------------------------
def qsl_traces(metas: Metadata | Sequence[Metadata]) -> list[dict[str, Any]]:
    """One entry per step: ``name``, ``x`` (entry i of query_start_loc), ``y`` (its value), ``symbol``
    (filled for entries bounding a live row, open on padding) and ``customdata`` (hover words)."""
    metas = _as_list(metas)
    out: list[dict[str, Any]] = []
    for meta, label in zip(metas, unique_labels(metas), strict=True):
        qsl = meta.query_start_loc.tolist()
        r = meta.raw_batch_size
        words = []
        for i, v in enumerate(qsl):
            if i == 0:
                words.append("qsl[0] = 0: start of row 0")
            elif i <= r:
                words.append(f"qsl[{i}] = {v}: end of live row {i - 1} ({qsl[i] - qsl[i - 1]} tokens)")
            else:
                words.append(f"qsl[{i}] = {v}: end of padded row {i - 1} (zero-length)")
        out.append(
            {
                "name": label,
                "x": list(range(len(qsl))),
                "y": qsl,
                "symbol": ["circle" if i <= r else "circle-open" for i in range(len(qsl))],
                "customdata": words,
            }
        )
    return out


def qsl_staircase(metas: Metadata | Sequence[Metadata]) -> go.Figure:
    """``query_start_loc`` as a staircase, one line per step: decode climbs by 1 a row, verify by ``D``,
    extend by each row's length; padded rows are the flat tail (open markers)."""
    go = require("plotly.graph_objects", None, "workbench.viz figures")

    from workbench.viz.palette import SEQUENCE

    fig = go.Figure()
    for k, t in enumerate(qsl_traces(metas)):
        fig.add_trace(
            go.Scatter(
                name=t["name"],
                x=t["x"],
                y=t["y"],
                customdata=t["customdata"],
                mode="lines+markers",
                line=dict(shape="hv", color=SEQUENCE[k % len(SEQUENCE)]),
                marker=dict(symbol=t["symbol"], size=8),
                hovertemplate="%{customdata}<extra>%{fullData.name}</extra>",
            )
        )
    fig.update_layout(
        title="query_start_loc: where each row's tokens start (flat tail = zero-length padded rows)",
        height=360,
        margin=dict(l=60, r=20, t=60, b=10),
        # at the figure's foot, as the padding and slot maps: below the x-axis title however many rows it wraps to
        legend=dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left"),
    )
    # the entry labels stand a little below the axis: where both axes have a tick at the corner (an empty
    # step's single point (0, 0), drawn in [-1, 1] both ways), the two "-1" labels would meet there
    fig.update_xaxes(title_text="entry i of query_start_loc (row i starts here)", ticklabelstandoff=6)
    fig.update_yaxes(title_text="token offset (tokens)")
    return fig


# -- integrity heatmap ----------------------------------------------------------------------------------
UNCHANGED, CHANGED_OK, CHANGED_DUMMY, CHANGED_BAD = 0, 1, 2, 3
INTEGRITY_LABELS = {
    UNCHANGED: "unchanged",
    CHANGED_OK: "changed by its owner (expected)",
    CHANGED_DUMMY: "dummy slot written (allowed)",
    CHANGED_BAD: "changed but should not have (lost state)",
}


def integrity_codes(
    changed: Sequence[Sequence[bool]],
    allowed: Sequence[Sequence[bool]] | None = None,
    dummy_slot: int | None = None,
    slots: Sequence[int] | None = None,
) -> list[list[int]]:
    """Code each (step, slot) cell: 0 unchanged, 1 changed and allowed, 2 the dummy slot changed,
    3 changed but not allowed. ``allowed`` None: every change but the dummy slot's is a violation."""
    cols = list(range(len(changed[0]))) if (changed and slots is None) else list(slots or [])
    codes = []
    for i, row in enumerate(changed):
        line = []
        for j, c in enumerate(row):
            if not c:
                line.append(UNCHANGED)
            elif dummy_slot is not None and cols[j] == dummy_slot:
                line.append(CHANGED_DUMMY)
            elif allowed is not None and allowed[i][j]:
                line.append(CHANGED_OK)
            else:
                line.append(CHANGED_BAD)
        codes.append(line)
    return codes


def integrity_heatmap(
    changed: Sequence[Sequence[bool]] | Any,
    *,
    slots: Sequence[int],
    steps: Sequence[str],
    dummy_slot: int | None = None,
    allowed: Sequence[Sequence[bool]] | Any | None = None,
) -> go.Figure:
    """Slots x steps: which state slots each step changed, changed-when-it-should-not in vermillion (red).

    Args:
        changed: bool ``[len(steps), len(slots)]`` (nested lists, numpy or torch): the slot's bytes differ
            after the step.
        slots: the slot number of each column. steps: a label per row (e.g. "capture", "replay bs=4").
        dummy_slot: the profile's dummy slot (its changes are allowed, drawn in yellow).
        allowed: bool, same shape: the step's live rows own the slot (a change there is expected, blue).
            None: every change other than the dummy slot's counts as a violation.
    """
    go = require("plotly.graph_objects", None, "workbench.viz figures")

    changed = changed.tolist() if hasattr(changed, "tolist") else [list(r) for r in changed]
    if allowed is not None:
        allowed = allowed.tolist() if hasattr(allowed, "tolist") else [list(r) for r in allowed]
    codes = integrity_codes(changed, allowed, dummy_slot, slots)
    words = [
        [f"{steps[i]}, slot {slots[j]}: {INTEGRITY_LABELS[c]}" for j, c in enumerate(r)] for i, r in enumerate(codes)
    ]
    colours = ["#FFFFFF", BLUE, YELLOW, VERMILLION]
    scale = []
    for k, c in enumerate(colours):  # a discrete colour scale over codes 0..3
        scale += [[k / 4, c], [(k + 1) / 4, c]]
    fig = go.Figure(
        go.Heatmap(
            z=codes,
            x=[str(s) for s in slots],
            y=list(steps),
            zmin=-0.5,
            zmax=3.5,
            colorscale=scale,
            customdata=words,
            hovertemplate="%{customdata}<extra></extra>",
            xgap=1,
            ygap=1,
            colorbar=dict(tickvals=list(INTEGRITY_LABELS), ticktext=list(INTEGRITY_LABELS.values()), title="slot"),
        )
    )
    fig.update_layout(
        title="Integrity: slots changed by each step (red: changed but no live row owns it)",
        height=max(300, 160 + 28 * len(steps)),  # room for the four colour-bar labels
        margin=dict(l=120, r=20, t=60, b=50),
    )
    fig.update_xaxes(title_text="state slot", type="category")
    fig.update_yaxes(title_text="step", autorange="reversed", type="category")
    return fig
