"""``KernelPlayground``: a thin ipywidgets view over :class:`PlaygroundModel`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.widgets.html import error_html, ok_html
from workbench.widgets.playground_model import CONVENTIONS, OPS, KernelCheck, PlaygroundModel

SHAPE_CONTROLS = ("rows", "padded", "tokens", "heads", "head_k", "head_v", "dim", "width", "state_dim")


def error_figure() -> go.Figure:
    """One heatmap per convention: |candidate - float64 reference| per batch row and head (log10 colour)."""
    fig = make_subplots(rows=1, cols=len(CONVENTIONS), subplot_titles=list(CONVENTIONS), horizontal_spacing=0.12)
    for k, _ in enumerate(CONVENTIONS, start=1):
        fig.add_trace(
            go.Heatmap(
                z=[[0.0]],
                colorscale="Viridis",
                zmin=-12,
                zmax=0,
                showscale=k == len(CONVENTIONS),
                colorbar=dict(title="log10 |error|"),
                hovertemplate="%{y}, %{x}: |error| = %{customdata:.3g}<extra></extra>",
                customdata=[[0.0]],
            ),
            row=1,
            col=k,
        )
        fig.update_yaxes(autorange="reversed", row=1, col=k)
        fig.update_xaxes(title_text="head", row=1, col=k)
    fig.update_layout(
        title="Error per batch row and head vs the float64 reference", height=360, margin=dict(l=150, r=20, t=70, b=50)
    )
    return fig


class KernelPlayground(W.VBox):
    """Run an op's ``triton`` (interpreter on the CPU) or ``reference`` implementation, or your own kernel
    (``use_kernel(fn)``), against the float64 reference under every padding convention, and capture it.

    Attributes: ``model``, ``op``, ``impl``, ``shape_controls`` (name -> IntSlider), ``run_button``,
    ``result`` (HTML), ``figure`` (FigureWidget, one heatmap per convention).
    """

    def __init__(self, **params: Any) -> None:
        self.model = PlaygroundModel(**params)
        style = {"description_width": "110px"}
        self.op = W.Dropdown(
            options=list(OPS), value=self.model.op, description="op", style=style, layout=W.Layout(width="420px")
        )
        self.impl = W.ToggleButtons(
            options=["triton", "reference"], value=self.model.impl, description="impl", style=style
        )
        self.shape_controls = {
            n: W.IntSlider(
                value=getattr(self.model.shapes, n),
                min=0 if n == "padded" else 1,
                max=32,
                description=n,
                style=style,
                continuous_update=False,
            )
            for n in SHAPE_CONTROLS
        }
        self.shape_controls["width"].min = 2
        self.capture = W.Checkbox(value=True, description="capture through the CPU recorder too")
        self.run_button = W.Button(description="Run check", button_style="primary", icon="play")
        self.user_note = W.HTML()
        self.error = W.HTML()
        self.result = W.HTML()
        self.figure = go.FigureWidget(error_figure())
        self.run_button.on_click(lambda _: self.do_run())
        grid = W.GridBox(list(self.shape_controls.values()), layout=W.Layout(grid_template_columns="repeat(3, 330px)"))
        super().__init__(
            [
                W.HTML("<b>Kernel playground</b>"),
                W.HBox([self.op, self.impl]),
                grid,
                W.HBox([self.capture, self.run_button]),
                self.user_note,
                self.error,
                self.result,
                self.figure,
            ]
        )

    def use_kernel(self, fn: Callable[..., Any] | None) -> None:
        """Check ``fn`` (with the selected op's signature) instead of the built-in implementation."""
        self.model.use_kernel(fn)
        self.impl.disabled = fn is not None
        name = getattr(fn, "__name__", "your kernel")
        self.user_note.value = f"checking <b>{name}</b> (impl choice ignored)" if fn is not None else ""

    def do_run(self) -> KernelCheck | None:
        m = self.model
        m.op, m.impl, m.capture = self.op.value, self.impl.value, self.capture.value
        res = m.run(**{n: int(w.value) for n, w in self.shape_controls.items()})
        self.error.value = error_html(m.error)
        if res is None:
            return None
        lines = res.summary().splitlines()
        head = ok_html(lines[0]) if res.ok else error_html(lines[0])
        body = "".join(f"<div style='font-family:monospace;font-size:12px'>{ln.strip()}</div>" for ln in lines[1:])
        self.result.value = f"<div class='wb-kernel-check' data-ok='{str(res.ok).lower()}'>{head}{body}</div>"
        import math

        by_name = {c.convention: c for c in res.conventions}
        with self.figure.batch_update():
            for tr, name in zip(self.figure.data, CONVENTIONS, strict=True):
                c = by_name.get(name)
                if c is None or not c.err:
                    tr.update(z=[[None]], x=[""], y=[""], customdata=[[None]])
                    continue
                logz = [[math.log10(v) if v > 0 else -12 for v in row] for row in c.err]
                tr.update(z=logz, x=c.head_labels, y=c.row_labels, customdata=c.err)
        return res
