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
from workbench import html
from workbench.kernelcheck import ConventionResult, KernelCheck, candidate_name
from workbench.kernelcheck.choices import resolve_op
from workbench.widgets.figure_sync import updating
from workbench.widgets.html import error_html
from workbench.widgets.playground_model import CONTROLS, IMPLS, PADDED_ROWS, PlaygroundModel

FLOOR, CEILING = -12, 3  # log10 of the smallest error shown (exact zeros sit there too), and of the largest
TITLE = "Error per batch row and head vs the float64 reference"
LEFT = 190  # px for the row labels ("row 4 (pad -1, skipped)" at 12 px); the panels are stacked, so no
# panel's labels can reach into another's


def error_figure() -> go.Figure:
    """One heatmap per convention, stacked: |candidate - float64 reference| per batch row and head (log10
    colour). Stacked rather than side by side, so every panel's row labels sit in the left margin."""
    names = list(CONVENTIONS)
    fig = make_subplots(rows=len(names), cols=1, subplot_titles=names, vertical_spacing=0.12, shared_xaxes=True)
    for k, _ in enumerate(names, start=1):
        fig.add_trace(
            go.Heatmap(
                z=[[0.0]],
                colorscale="Viridis",
                zmin=FLOOR,
                zmax=0,
                showscale=k == 1,
                colorbar=dict(title=dict(text="log10 |error|", side="right")),  # beside the bar, clear of its "0"
                hovertemplate="%{y}, %{x}: |error| = %{customdata}<extra></extra>",
                customdata=[["0"]],
            ),
            row=k,
            col=1,
        )
        fig.update_yaxes(autorange="reversed", automargin=True, row=k, col=1)
    fig.update_layout(title=TITLE, height=200 * len(names) + 110, margin=dict(l=LEFT, r=20, t=70, b=40))
    return fig


def _shown(results: list[ConventionResult], name: str) -> ConventionResult | None:
    """The run of convention ``name`` the heatmap shows: its first failure, else its first run."""
    runs = [c for c in results if c.name == name]
    return next((c for c in runs if not c.ok), runs[0] if runs else None)


def _note_html(message: str | None) -> str:
    return f"<span style='color:#555'>{html.escape(message)}</span>" if message else ""


class KernelPlayground(W.VBox):
    """Run an op's ``triton`` (interpreter on the CPU) or ``reference`` implementation, or your own kernel
    (``use_kernel(fn)``), against the float64 reference under every padding convention, and capture it.

    Attributes: ``model``, ``op``, ``variant``, ``impl``, ``preset``, ``shape_controls`` (name -> IntText:
    ``rows``, ``padded`` and every size of ``kernels.testing.SHAPES``), ``padded_rows`` (both forms, or
    one), ``run_button``, ``errors`` (control -> HTML beside it: refusals in vermillion, clamped values
    in grey), ``result`` (HTML), ``figure`` (FigureWidget, one heatmap per convention).
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
        # IntText, not BoundedIntText: a bounded box clamps silently; the model clamps and says so
        self.shape_controls = {
            "rows": W.IntText(value=m.rows, description="rows", **box),
            "padded": W.IntText(value=m.padded, description="padded", **box),
        }
        self.shape_controls.update({n: W.IntText(value=v, description=n, **box) for n, v in sizes.items()})
        form = next(k for k, v in PADDED_ROWS.items() if v == m.padded_tokens)
        self.padded_rows = W.ToggleButtons(options=list(PADDED_ROWS), value=form, description="padded rows",
                                           style=style)  # fmt: skip
        self.capture = W.Checkbox(value=m.capture, description="capture through the CPU recorder too")
        self.run_button = W.Button(description="Run check", button_style="primary", icon="play")
        self.user_note = W.HTML()
        self.errors = {name: W.HTML() for name in CONTROLS}
        self.result = W.HTML()
        self.figure = go.FigureWidget(error_figure())
        self._quiet = False  # set while the view writes clamped values back into its own controls
        self._shown_html = ""  # the result on screen (empty: none)
        self.op.observe(lambda _: self._op_changed(), names="value")
        self.preset.observe(lambda _: self._preset_changed(), names="value")
        for w in (self.variant, self.impl, self.padded_rows, self.capture, *self.shape_controls.values()):
            w.observe(lambda _: self._changed(), names="value")
        self.run_button.on_click(lambda _: self.do_run())
        grid = W.GridBox(list(self.shape_controls.values()), layout=W.Layout(grid_template_columns="repeat(4, 230px)"))
        e = self.errors
        super().__init__(
            [
                W.HTML("<b>Kernel playground</b>"),
                W.HBox([self.op, e["op"]]),
                W.HBox([self.variant, e["variant"]]),
                W.HBox([self.impl, e["impl"]]),
                self.preset,
                grid,
                e["shapes"],
                W.HBox([self.padded_rows, e["padded_rows"]]),
                W.HBox([self.capture, self.run_button]),
                self.user_note,
                e["general"],
                self.result,
                self.figure,
            ]
        )
        self._changed()

    # -- controls -> model ----------------------------------------------------------------------------
    def _sync(self) -> None:
        """Copy the controls into the model."""
        m = self.model
        m.op, m.variant, m.impl = self.op.value, self.variant.value, self.impl.value
        m.shapes, m.capture = self._shapes(), self.capture.value
        m.padded_tokens = PADDED_ROWS[self.padded_rows.value]
        m.rows, m.padded = int(self.shape_controls["rows"].value), int(self.shape_controls["padded"].value)

    def _show(self, errors: dict[str, str], notes: dict[str, str]) -> None:
        for name, w in self.errors.items():
            w.value = error_html(errors.get(name)) + _note_html(notes.get(name))

    def _changed(self) -> None:
        """A control changed: say now what a run would refuse or clamp, and mark a shown result stale."""
        if self._quiet:
            return
        self._sync()
        plan = self.model.plan()
        self._show(plan.errors, plan.notes)
        self.run_button.disabled = not plan.ok
        if self._shown_html:  # the result on screen no longer answers the controls: say so, keep it readable
            stale = html.note("stale: the controls changed since this check ran; press Run check", fail=True)
            self.result.value = f"<div class='wb-kernel-check' data-ok='stale'>{stale}{self._shown_html}</div>"
            with updating(self.figure):
                self.figure.layout.title.text = f"{TITLE} (stale)"

    def _op_changed(self) -> None:
        self.variant.options = self.model.variants(self.op.value)
        self.variant.value = self.variant.options[0]
        self._changed()

    def _preset_changed(self) -> None:
        self._quiet = True
        try:
            for n, v in SHAPES[self.preset.value].items():
                self.shape_controls[n].value = v
        finally:
            self._quiet = False
        self._changed()

    def use_kernel(self, fn: Callable[..., Any] | None) -> None:
        """Check ``fn`` (with the selected op's signature) instead of the built-in implementation."""
        self.model.use_kernel(fn)
        self.impl.disabled = fn is not None
        note = f"checking <b>{html.escape(candidate_name(fn))}</b> (impl choice ignored)" if fn is not None else ""
        self.user_note.value = note
        self._changed()

    def _shapes(self) -> str | dict[str, int]:
        """The preset's name while its sizes are untouched, else every size typed."""
        sizes = {n: int(self.shape_controls[n].value) for n in SHAPES[self.preset.value]}
        return self.preset.value if sizes == SHAPES[self.preset.value] else sizes

    # -- run -------------------------------------------------------------------------------------------
    def _clear(self) -> None:
        self.result.value = self._shown_html = ""
        with updating(self.figure):
            for tr in self.figure.data:
                tr.update(z=[[None]], x=[""], y=[""], customdata=[[None]])
            self.figure.layout.title.text = TITLE

    def do_run(self) -> KernelCheck | None:
        self._sync()
        m = self.model
        plan = m.plan()
        res = m.run()
        self._quiet = True  # write the clamped sizes back, so the boxes show what ran
        try:
            for n, w in self.shape_controls.items():
                w.value = {"rows": plan.rows, "padded": plan.padded}.get(n, plan.sizes.get(n, w.value))
        finally:
            self._quiet = False
        self._show(m.errors, m.notes)
        self._clear()  # a refused or failed run leaves nothing of the previous one on screen
        if res is None:
            return None
        self._shown_html = res._repr_html_()
        self.result.value = f"<div class='wb-kernel-check' data-ok='{str(res.ok).lower()}'>{self._shown_html}</div>"
        with updating(self.figure):
            for k, (tr, name) in enumerate(zip(self.figure.data, CONVENTIONS, strict=True)):
                c = _shown(res.results, name)
                self.figure.layout.annotations[k].text = c.label if c is not None else name
                emap = c.error_map() if c is not None else None
                if emap is None:
                    tr.update(z=[[None]], x=[""], y=[""], customdata=[[None]])
                    continue
                rows, heads, err = emap
                # inf (an unwritten NaN) shows above the scale's top; the hover text says "inf"
                logz = [[min(math.log10(v), CEILING) if v > 0 else FLOOR for v in row] for row in err]
                tr.update(z=logz, x=heads, y=rows, customdata=[[f"{v:.3g}" for v in row] for row in err])
        return res
