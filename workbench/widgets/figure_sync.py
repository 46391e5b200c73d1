"""Editing a plotly ``FigureWidget`` in place so that a view drawn at any later time shows the edit.

A FigureWidget (plotly 6+, an anywidget) sends each in-place edit as a one-off message (``_py2js_*``: set,
then reset to None) that only its JavaScript module handles, and that module is a 5 MB bundle the browser
imports anew for every widget, after the widget's model exists. An edit sent in between (a widget built and
filled in one cell, on a busy machine) is dropped, and the view, drawn once the module has loaded, shows
the figure as it was built: an empty placeholder, for good. Plotly re-sends the full state
(``_widget_data``, ``_widget_layout``: the traits a view is drawn from) only when the FigureWidget itself
is displayed, never for one inside a box; :func:`updating` and :func:`refill` re-send it after each edit.

Not fixed here, and seen only with the browser starved of CPU for seconds (8 notebooks' kernels at once on
2 cores): plotly opens a FigureWidget's comm before its figure is set (the model is born empty, the figure
follows in an update), and anywidget gives a model 2 s to load and initialise its module before it gives up
("[anywidget] Failed to initialize model"); a view then shows plotly's empty default figure. The browser
test runs the notebooks one after another for that reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from copy import deepcopy
from typing import Any

import plotly.graph_objects as go


def resync(fig: Any) -> None:
    """Re-send the full data and layout of FigureWidget ``fig`` (what a view is drawn from); a plain
    ``go.Figure`` has no view and is left alone."""
    if isinstance(fig, go.FigureWidget):
        # the same two assignments plotly makes when it displays a FigureWidget on its own
        fig._widget_layout = deepcopy(fig._layout_obj._props)
        fig._widget_data = deepcopy(fig._data)


@contextmanager
def updating(fig: Any) -> Iterator[Any]:
    """``fig.batch_update()`` (one message for the edits made inside), then :func:`resync`; for a plain
    ``go.Figure``, the edits as they are."""
    with fig.batch_update() if isinstance(fig, go.FigureWidget) else nullcontext():
        yield fig
    resync(fig)


def refill(fw: go.FigureWidget, fig: go.Figure) -> None:
    """Put ``fig``'s traces and layout into the existing FigureWidget ``fw`` (the widget is kept: the
    browser view updates, nothing is re-created)."""
    with updating(fw):
        fw.data = ()
        fw.add_traces(list(fig.data))
        fw.layout = fig.layout
