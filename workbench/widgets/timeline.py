"""``ServingTimeline``: a thin ipywidgets view over :class:`TimelineModel`.

Build re-renders everything from the model; the step slider (and the Play button linked to it) only moves
the selection: the figure's outline is swapped in place, the step's table and line re-rendered.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from workbench import html as wb_html
from workbench.profiles import PROFILES
from workbench.traces.model import Trace
from workbench.viz.timeline import selected_shape, slot_timeline
from workbench.widgets.figure_sync import refill, updating
from workbench.widgets.html import error_html, records_html
from workbench.widgets.timeline_model import (
    CONTROLS,
    LAYERS,
    MAX_STEPS,
    PREFIX_CACHES,
    ROW_COLUMNS,
    TimelineModel,
)

_PLACEHOLDER: dict[str, Any] = dict(owners=[[None]], steps=[0], slots=[0], dummy=0)


def _pick(options: tuple[str, ...], value: str) -> str | None:
    return value if value in options else None  # an unknown name shows as no choice; the model says why


def summary_html(text: str) -> str:
    """The replay's verdict: a green tick before "OK: ...", a vermillion cross before "FAIL: ..."."""
    if not text:
        return ""
    ok = text.startswith("OK")
    mark, colour = ("&#10004;", wb_html.OK) if ok else ("&#10008;", wb_html.FAIL)
    return (
        f"<div class='wb-timeline-summary' data-ok='{str(ok).lower()}' style='white-space:pre-wrap'>"
        f"<span style='color:{colour}'>{mark} {html.escape(text)}</span></div>"
    )


class ServingTimeline(W.VBox):
    """A simulated serving trace replayed step by step: which request owns every state slot at every step.

    Controls: profile, layer, steps (1..400), seed, spec (D; 0: plain decode), mixed, dp dummies, prefix
    cache (none | no_buffer | extra_buffer | align), Build (or ``trace=``: a given trace, replayed as it is);
    then a step slider with a Play button. Shows the slot timeline (the selected step outlined, the first
    divergence crossed), the selected step's line (admissions, finishes, bucket and padding), its rows and
    the replay's summary. A refused value is one line under its control.

    Attributes: ``model`` (:class:`TimelineModel`), the controls (``profile``, ``layer``, ``steps``,
    ``seed``, ``spec``, ``mixed``, ``dp_dummies``, ``build_button``, ``slider``, ``play``), ``notes`` (an
    HTML line under each control, keyed as ``CONTROLS``), ``error``, ``step_line``, ``table``, ``summary``
    (HTML), ``figure`` (FigureWidget).
    """

    def __init__(self, trace: Trace | None = None, **params: Any) -> None:
        self.model = m = TimelineModel(**params)
        style = {"description_width": "80px"}
        names = tuple(PROFILES)
        self.profile = W.Dropdown(options=names, value=_pick(names, m.profile), description="profile", style=style)
        self.layer = W.Dropdown(options=LAYERS, value=_pick(LAYERS, m.layer), description="layer", style=style)
        self.steps = W.IntText(value=m.steps, description="steps", style=style)
        self.seed = W.IntText(value=m.seed, description="seed", style=style)
        self.spec = W.IntText(value=m.spec, description="spec (D)", style=style)
        self.mixed = W.Checkbox(value=bool(m.mixed), description="mixed", indent=False)
        self.dp_dummies = W.Checkbox(value=bool(m.dp_dummies), description="dp dummies", indent=False)
        self.prefix_cache = W.Dropdown(
            options=PREFIX_CACHES, value=_pick(PREFIX_CACHES, m.prefix_cache), description="prefix cache", style=style
        )
        self.build_button = W.Button(description="Build", button_style="primary", icon="play")
        self.slider = W.IntSlider(value=0, min=0, max=0, description="step", style=style, continuous_update=True)
        self.play = W.Play(value=0, min=0, max=0, interval=400, description="play")
        W.jslink((self.play, "value"), (self.slider, "value"))
        self.notes = {c: W.HTML() for c in CONTROLS if c != "general"}
        self.error, self.step_line, self.table, self.summary = (W.HTML() for _ in range(4))
        self.figure = go.FigureWidget(slot_timeline(**_PLACEHOLDER))
        self.inputs = {
            "profile": self.profile,
            "layer": self.layer,
            "steps": self.steps,
            "seed": self.seed,
            "spec": self.spec,
            "mixed": self.mixed,
            "dp_dummies": self.dp_dummies,
            "prefix_cache": self.prefix_cache,
        }
        self.build_button.on_click(lambda _: self.do_build())
        self.slider.observe(lambda change: self.do_select(change["new"]), names="value")
        cell = self._with_note
        super().__init__(
            [
                W.HTML("<b>Serving timeline</b>"),
                W.HBox([cell("profile", self.profile), cell("layer", self.layer), cell("steps", self.steps)]),
                W.HBox([cell("seed", self.seed), cell("spec", self.spec), self.mixed, self.dp_dummies]),
                W.HBox([cell("prefix_cache", self.prefix_cache)]),
                W.HBox([self.build_button, W.HTML(f"<small>at most {MAX_STEPS} steps</small>")]),
                self.error,
                self.summary,
                self.figure,
                W.HBox([self.play, cell("step", self.slider)]),
                self.step_line,
                self.table,
            ]
        )
        if trace is None:
            self.do_build()
        else:
            self.do_show(trace)

    def _with_note(self, name: str, control: W.Widget) -> W.VBox:
        return W.VBox([control, self.notes[name]])

    # -- actions (what the controls do; tests call these or .click()) ---------------------------------------
    def do_build(self) -> bool:
        values = {n: c.value for n, c in self.inputs.items() if c.value is not None}
        ok = self.model.build(**values)
        self._render_all()
        return ok

    def do_show(self, trace: Trace) -> bool:
        """Replay a given trace (a file, a ``scripted`` one, a zoo case's) instead of a simulated one."""
        ok = self.model.show(trace)
        if ok:  # the controls say what is shown (Build simulates a trace from them instead)
            h = trace.header
            self.profile.value, self.layer.value, self.steps.value = h.profile, h.layer, len(trace.steps)
        self._render_all()
        return ok

    def do_select(self, i: int) -> bool:
        m = self.model
        if not m.built or i == m.selected:
            return m.built
        ok = m.select(int(i))
        self._render_step()
        return ok

    # -- the view of the model -------------------------------------------------------------------------
    def _notes(self) -> None:
        m = self.model
        for name, note in self.notes.items():
            note.value = error_html(m.error) if m.error and m.error_control == name else ""
        self.error.value = error_html(m.error if m.error and m.error_control == "general" else None)

    def _render_all(self) -> None:
        m = self.model
        n = len(m.step_numbers)
        with self.slider.hold_trait_notifications():
            self.slider.max = max(0, n - 1)
            self.slider.value = m.selected
        self.play.max, self.play.value = self.slider.max, m.selected
        self.slider.disabled = self.play.disabled = not m.built
        new = slot_timeline(**(m.figure_data() if m.built else _PLACEHOLDER))
        refill(self.figure, new)
        self.summary.value = summary_html(m.summary())
        self._render_step()

    def _render_step(self) -> None:
        m = self.model
        self._notes()
        if not m.built:
            self.step_line.value, self.table.value = "", ""
            return
        if m.step_numbers:
            with updating(self.figure):
                self.figure.layout.shapes = [selected_shape(m.step_numbers[m.selected], m.slots)]
        self.step_line.value = f"<div class='wb-timeline-step'>{html.escape(m.step_text())}</div>"
        self.table.value = records_html(m.step_table(), ROW_COLUMNS)
