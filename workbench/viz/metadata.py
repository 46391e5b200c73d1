"""Plotly figures: pure functions, data in, ``go.Figure`` out (plotly is in the ``lab`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from workbench.metadata import Metadata

from workbench.viz.palette import BLUE as LIVE
from workbench.viz.palette import LIGHT_GREY as PAD


def padded_batch(metas: Sequence[Metadata], titles: Sequence[str] | None = None) -> go.Figure:
    """One panel per metadata: a bar per batch row spanning its ``query_start_loc`` tokens.

    Live rows are blue, padded rows grey (zero-length, drawn as a thin marker); each bar is labelled with
    the row's state index, so the profile's sentinel shows on the padded rows.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

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
