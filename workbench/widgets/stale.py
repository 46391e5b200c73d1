"""Marking a result that no longer matches its inputs: a figure veiled with one line over it, an HTML block
dimmed under a banner. The models decide what is stale (a line of words, or None); the views only draw it.
"""

from __future__ import annotations

import textwrap
from typing import Any

from workbench import html
from workbench.widgets.figure_sync import updating

STALE = "stale"  # the name of the veil's shape and annotation, so they are found and removed again


def mark_stale(fig: Any, note: str | None) -> None:
    """Veil ``fig`` (a plotly figure or FigureWidget) with a white sheet and ``note`` over it, or, for None,
    take the veil away. Other shapes and annotations (subplot titles) are kept."""
    shapes = [s for s in fig.layout.shapes if s.name != STALE]
    annotations = [a for a in fig.layout.annotations if a.name != STALE]
    if note:
        shapes.append(
            dict(
                type="rect",
                name=STALE,
                xref="paper",
                yref="paper",
                x0=0,
                x1=1,
                y0=0,
                y1=1,
                fillcolor="white",
                opacity=0.75,
                line=dict(width=0),
                layer="above",
            )  # fmt: skip
        )
        annotations.append(
            dict(
                name=STALE,
                text="<br>".join(textwrap.wrap(note, 90)),
                xref="paper",
                yref="paper",
                x=0.5,
                y=0.5,
                showarrow=False,
                align="center",
                bgcolor="white",
                bordercolor=html.FAIL,
                borderwidth=1,
                font=dict(color=html.FAIL, size=13),
            )  # fmt: skip
        )
    with updating(fig):
        fig.layout.shapes = shapes
        fig.layout.annotations = annotations


def is_stale(fig: Any) -> bool:
    """Whether ``fig`` carries the veil of :func:`mark_stale`."""
    return any(a.name == STALE for a in fig.layout.annotations)


def stale_html(note: str | None, body: str) -> str:
    """``body`` as it is, or, with a ``note``, dimmed under a vermillion banner saying it is stale."""
    if not note:
        return body
    banner = f"<div data-stale='true' style='color:{html.FAIL}'>&#9888; {html.escape(note)}</div>"
    return f"{banner}<div style='opacity:0.35'>{body}</div>"
