"""``BugZoo``: a thin ipywidgets view over :class:`ZooModel`."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from workbench.widgets.figure_sync import refill
from workbench.widgets.html import error_html
from workbench.widgets.zoo_model import SPEC_HINT, ZooModel

WAITING = "Run the case: its evidence, broken beside fixed, is drawn here"


def placeholder() -> go.Figure:
    """The figure before a run (and after a failed one): a line saying what will be drawn, no axes."""
    fig = go.Figure()
    fig.update_layout(
        title_text=WAITING,
        height=110,
        margin=dict(l=20, r=20, t=50, b=10),
        plot_bgcolor="white",
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


class BugZoo(W.VBox):
    """Pick a known production bug, run it unfixed and fixed side by side: evidence and explanation. Below,
    "your backend": a ``MODULE_OR_FILE:CLASS`` checked against every case that exercises a metadata backend.

    Attributes: ``model``, ``case`` (Dropdown), ``run_button``, ``figure`` (FigureWidget: the evidence,
    broken beside fixed), ``unfixed`` / ``fixed`` / ``explanation`` (HTML), ``error``; ``your_backend``
    (Text), ``check_button``, ``checks`` (HTML, the results table).
    """

    def __init__(self, **params: Any) -> None:
        self.model = ZooModel(**params)
        self.case = W.Dropdown(options=self.model.titles(), description="case", layout=W.Layout(width="720px"))
        self.run_button = W.Button(description="Run unfixed + fixed", button_style="primary", icon="bug")
        self.error = W.HTML()
        self.unfixed = W.HTML(layout=W.Layout(width="50%"))
        self.fixed = W.HTML(layout=W.Layout(width="50%"))
        self.explanation = W.HTML()
        self.figure = go.FigureWidget(placeholder())
        self.your_backend = W.Text(
            placeholder="MODULE_OR_FILE:CLASS",
            description="your backend",
            style={"description_width": "initial"},
            layout=W.Layout(width="560px"),
        )
        self.check_button = W.Button(
            description="Check my backend", icon="search", tooltip=SPEC_HINT, layout=W.Layout(width="auto")
        )
        self.checks = W.HTML()
        self.run_button.on_click(lambda _: self.do_run())
        self.check_button.on_click(lambda _: self.do_check())
        self.case.observe(lambda _: self._describe(), names="value")
        self.your_backend.observe(lambda _: self._spec_changed(), names="value")
        super().__init__(
            [
                W.HTML("<b>Bug zoo</b>: each case runs the bug as it shipped, then with its fix."),
                W.HBox([self.case, self.run_button]),
                self.error,
                self.explanation,
                self.figure,
                W.HBox([self.unfixed, self.fixed]),
                W.HTML("<b>Your backend</b>: which of these bugs would your MetadataBackend subclass have?"),
                W.HBox([self.your_backend, self.check_button]),
                self.checks,
            ]
        )
        self._describe()

    def _describe(self) -> None:
        c = self.model.case(self.case.value)
        self.explanation.value = (
            f"<div><b>{html.escape(c.title)}</b> ({html.escape(c.issue)}, profile {html.escape(c.profile)})"
            f"<p style='max-width:70em'>{html.escape(c.explanation)}</p></div>"
        )
        self._clear()

    def _clear(self) -> None:
        self.unfixed.value = self.fixed.value = ""
        if self.figure.layout.title.text != WAITING:
            refill(self.figure, placeholder())

    def do_run(self) -> bool:
        pair = self.model.run(self.case.value)
        self.error.value = error_html(self.model.error)
        if pair is None:
            self._clear()  # a failed run leaves no earlier verdict on show
            return False
        broken, fixed = pair
        refill(self.figure, self.model.figure())
        self.unfixed.value = (
            f"<div class='wb-zoo' data-broken='{str(broken.broken).lower()}'>{broken._repr_html_()}</div>"
        )
        self.fixed.value = f"<div class='wb-zoo' data-broken='{str(fixed.broken).lower()}'>{fixed._repr_html_()}</div>"
        return True

    def _spec_changed(self) -> None:
        self.model.set_backend_spec(self.your_backend.value)
        if self.model.checks is None:
            self.checks.value = ""  # the table described another spec

    def do_check(self) -> bool:
        checks = self.model.check_backend(self.your_backend.value)
        self.error.value = error_html(self.model.error)
        if checks is None:
            self.checks.value = ""
            return False
        self.checks.value = (
            f"<div class='wb-zoo-checks' data-ok='{str(checks.ok).lower()}'>{checks._repr_html_()}</div>"
        )
        return True
