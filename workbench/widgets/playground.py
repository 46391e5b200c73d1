"""``KernelPlayground``: a thin ipywidgets view over :class:`PlaygroundModel`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kernels.conventions import CONVENTIONS
from kernels.testing import SHAPES
from workbench.kernelcheck import KernelCheck, candidate_name
from workbench.kernelcheck.choices import resolve_op
from workbench.widgets.html import error_html
from workbench.widgets.playground_model import IMPLS, PlaygroundModel

FLOOR, CEILING = -12, 3  # log10 of the smallest error shown (exact zeros sit there too), and of the largest


def error_figure() -> go.Figure:
    """One heatmap per convention: |candidate - float64 reference| per batch row and head (log10 colour)."""
    names = list(CONVENTIONS)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names, horizontal_spacing=0.12)
    for k, _ in enumerate(names, start=1):
        fig.add_trace(
            go.Heatmap(
                z=[[0.0]],
                colorscale="Viridis",
                zmin=FLOOR,
                zmax=0,
                showscale=k == len(names),
                colorbar=dict(title="log10 |error|"),
                hovertemplate="%{y}, %{x}: |error| = %{customdata}<extra></extra>",
                customdata=[["0"]],
            ),
            row=1,
            col=k,
        )
        fig.update_yaxes(autorange="reversed", row=1, col=k)
    fig.update_layout(
        title="Error per batch row and head vs the float64 reference", height=360, margin=dict(l=150, r=20, t=70, b=50)
    )
    return fig


class KernelPlayground(W.VBox):
    """Run an op's ``triton`` (interpreter on the CPU) or ``reference`` implementation, or your own kernel
    (``use_kernel(fn)``), against the float64 reference under every padding convention, and capture it.

    Attributes: ``model``, ``op``, ``variant``, ``impl``, ``preset``, ``shape_controls`` (name -> IntText:
    ``rows``, ``padded`` and every size of ``kernels.testing.SHAPES``), ``run_button``, ``result`` (HTML),
    ``figure`` (FigureWidget, one heatmap per convention).
    """

    def __init__(self, **params: Any) -> None:
        self.model = m = PlaygroundModel(**params)
        resolve_op(m.op)  # a bad op is refused here, naming the choices (the dropdown could not show it)
        style = {"description_width": "110px"}
        self.op = W.Dropdown(options=m.ops(), value=m.op, description="op", style=style, layout=W.Layout(width="420px"))
        variants = m.variants(m.op)
        variant = m.variant if m.variant in variants else variants[0]  # one the op lacks: its first
        self.variant = W.Dropdown(options=variants, value=variant, description="variant", style=style)
        self.impl = W.ToggleButtons(options=list(IMPLS), value=m.impl, description="impl", style=style)
        preset = m.shapes if isinstance(m.shapes, str) else "small"
        self.preset = W.Dropdown(options=m.presets(), value=preset, description="shapes", style=style)
        sizes = SHAPES[preset] if isinstance(m.shapes, str) else {**SHAPES["small"], **m.shapes}
        box = {"style": style, "layout": W.Layout(width="220px")}
        self.shape_controls = {
            "rows": W.BoundedIntText(value=m.rows, min=1, max=64, description="rows", **box),
            "padded": W.BoundedIntText(value=m.padded, min=0, max=64, description="padded", **box),
        }
        self.shape_controls.update(
            {
                n: W.BoundedIntText(value=v, min=2 if n == "width" else 1, max=8192, description=n, **box)
                for n, v in sizes.items()
            }  # fmt: skip
        )
        self.padded_tokens = W.Checkbox(value=m.padded_tokens, description="padded rows carry tokens (varlen)")
        self.capture = W.Checkbox(value=m.capture, description="capture through the CPU recorder too")
        self.run_button = W.Button(description="Run check", button_style="primary", icon="play")
        self.user_note = W.HTML()
        self.error = W.HTML()
        self.result = W.HTML()
        self.figure = go.FigureWidget(error_figure())
        self.op.observe(lambda _: self._op_changed(), names="value")
        self.preset.observe(lambda _: self._preset_changed(), names="value")
        self.run_button.on_click(lambda _: self.do_run())
        grid = W.GridBox(list(self.shape_controls.values()), layout=W.Layout(grid_template_columns="repeat(4, 230px)"))
        super().__init__(
            [
                W.HTML("<b>Kernel playground</b>"),
                W.HBox([self.op, self.variant]),
                W.HBox([self.impl, self.preset]),
                grid,
                W.HBox([self.padded_tokens, self.capture, self.run_button]),
                self.user_note,
                self.error,
                self.result,
                self.figure,
            ]
        )

    def _op_changed(self) -> None:
        self.variant.options = self.model.variants(self.op.value)
        self.variant.value = self.variant.options[0]

    def _preset_changed(self) -> None:
        for n, v in SHAPES[self.preset.value].items():
            self.shape_controls[n].value = v

    def use_kernel(self, fn: Callable[..., Any] | None) -> None:
        """Check ``fn`` (with the selected op's signature) instead of the built-in implementation."""
        self.model.use_kernel(fn)
        self.impl.disabled = fn is not None
        note = f"checking <b>{candidate_name(fn)}</b> (impl choice ignored)" if fn is not None else ""
        self.user_note.value = note

    def _shapes(self) -> str | dict[str, int]:
        """The preset's name while its sizes are untouched, else every size typed."""
        sizes = {n: int(self.shape_controls[n].value) for n in SHAPES[self.preset.value]}
        return self.preset.value if sizes == SHAPES[self.preset.value] else sizes

    def do_run(self) -> KernelCheck | None:
        m = self.model
        m.op, m.variant, m.impl = self.op.value, self.variant.value, self.impl.value
        m.shapes, m.capture, m.padded_tokens = self._shapes(), self.capture.value, self.padded_tokens.value
        m.rows, m.padded = int(self.shape_controls["rows"].value), int(self.shape_controls["padded"].value)
        res = m.run()
        self.error.value = error_html(m.error)
        if res is None:
            return None
        self.result.value = f"<div class='wb-kernel-check' data-ok='{str(res.ok).lower()}'>{res._repr_html_()}</div>"
        by_name = {c.name: c for c in res.conventions}
        with self.figure.batch_update():
            for tr, name in zip(self.figure.data, CONVENTIONS, strict=True):
                c = by_name.get(name)
                emap = c.error_map() if c is not None else None
                if emap is None:
                    tr.update(z=[[None]], x=[""], y=[""], customdata=[[None]])
                    continue
                rows, heads, err = emap
                # inf (an unwritten NaN) shows above the scale's top; the hover text says "inf"
                logz = [[min(math.log10(v), CEILING) if v > 0 else FLOOR for v in row] for row in err]
                tr.update(z=logz, x=heads, y=rows, customdata=[[f"{v:.3g}" for v in row] for row in err])
        return res
