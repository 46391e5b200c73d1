"""``TimingDashboard``: a thin ipywidgets view over :class:`TimingModel`."""

from __future__ import annotations

from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from workbench.layer_names import LAYER_NAMES
from workbench.profiles import sglang_buckets, vllm_buckets
from workbench.sweeps.common import PRESET_NAMES
from workbench.viz import bucket_waste, latency, roofline
from workbench.widgets.figure_sync import refill
from workbench.widgets.html import error_html, ok_html
from workbench.widgets.stale import mark_stale
from workbench.widgets.timing_model import IMPLS, TimingModel

# the controls an error is shown beside; "general" below the buttons
CONTROLS = ("batch_sizes", "impls", "modes", "layer", "preset", "path", "buckets", "general")


class TimingDashboard(W.VBox):
    """Sweep batch sizes x impl x eager/replay with progress; latency with IQR bands, roofline, bucket
    waste; load saved result files and overlay them (e.g. a GPU run beside this CPU run), each saved run in
    its own colours.

    Sizes past the model's limits and a Triton that cannot run here are refused beside their control before
    any work (checked again on every change of the sweep's controls); a failed action clears the success
    line and veils the figure it would have redrawn (``model.stale``).

    Attributes: ``model``, the controls (``batch_sizes``, ``impls``, ``modes``, ``layer``, ``preset``,
    ``buckets``, ``sweep_button``, ``roofline_button``, ``path``, ``load_button``), ``progress``,
    ``latency_fig``, ``roofline_fig``, ``waste_fig`` (FigureWidgets), ``status`` (HTML), ``errors`` (control
    -> HTML beside it; ``error`` is ``errors["general"]``).
    """

    def __init__(self, **params: Any) -> None:
        self.model = TimingModel(**params)
        m = self.model
        style = {"description_width": "110px"}
        self.batch_sizes = W.Text(value=m.batch_sizes, description="batch sizes", style=style)
        self.impls = W.SelectMultiple(options=list(IMPLS), value=m.impls, description="impls", rows=2, style=style)
        self.modes = W.SelectMultiple(
            options=["eager", "replay"], value=m.modes, description="modes", rows=2, style=style
        )
        self.layer = W.Dropdown(options=list(LAYER_NAMES), value=m.layer, description="layer", style=style)
        self.preset = W.Dropdown(options=list(PRESET_NAMES), value=m.preset, description="preset", style=style)
        self.buckets = W.Text(value=m.buckets, description="your buckets", placeholder="e.g. 1, 4, 16, 64", style=style)
        self.sweep_button = W.Button(description="Sweep", button_style="primary", icon="play")
        self.roofline_button = W.Button(description="Ceilings + kernels", icon="tachometer")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="sweep")
        self.path = W.Text(value="", placeholder="path/to/results.json", description="saved file", style=style)
        self.load_button = W.Button(description="Load + overlay", icon="upload")
        self.errors = {name: W.HTML() for name in CONTROLS}
        self.error = self.errors["general"]
        self.status = W.HTML()
        self.latency_fig = go.FigureWidget(latency(m.results, title="Latency (run a sweep)"))
        # no axes until there is data: plotly's empty default axes draw both "-1" labels in one corner
        empty = dict(title="Roofline (measure ceilings + kernels)", xaxis_visible=False, yaxis_visible=False)
        self.roofline_fig = go.FigureWidget(go.Figure(layout=empty))
        lists = m.bucket_lists() or {"sglang default": sglang_buckets(64), "vLLM default": vllm_buckets(64)}
        self.waste_fig = go.FigureWidget(bucket_waste(lists, max(max(v) for v in lists.values())))
        self.sweep_button.on_click(lambda _: self.do_sweep())
        self.roofline_button.on_click(lambda _: self.do_roofline())
        self.load_button.on_click(lambda _: self.do_load())
        self.buckets.observe(lambda _: self.do_waste(), names="value")
        self.batch_sizes.observe(lambda _: self.do_waste(), names="value")  # do_waste shows the sweep's checks too
        for w in (self.impls, self.modes, self.layer, self.preset):
            w.observe(lambda _: self.check(), names="value")
        e = self.errors
        super().__init__(
            [
                W.HTML("<b>Timing dashboard</b>"),
                W.HBox([self.batch_sizes, self.layer, self.preset]),
                e["batch_sizes"],
                e["layer"],
                e["preset"],
                W.HBox([self.impls, self.modes]),
                e["impls"],
                e["modes"],
                W.HBox([self.sweep_button, self.progress, self.roofline_button]),
                W.HBox([self.path, self.load_button]),
                e["path"],
                self.error,
                self.status,
                self.latency_fig,
                self.roofline_fig,
                self.buckets,
                e["buckets"],
                self.waste_fig,
            ]
        )
        self._show()

    def _sync(self) -> None:
        m = self.model
        m.batch_sizes, m.impls, m.modes = self.batch_sizes.value, tuple(self.impls.value), tuple(self.modes.value)
        m.layer, m.preset, m.buckets = self.layer.value, self.preset.value, self.buckets.value

    def _show(self) -> None:
        """Beside each control the last action's error or what would refuse a sweep of the current inputs
        (``model.problems``: no work), the success line, and the stale veils."""
        m = self.model
        found = m.problems()
        for name, w in self.errors.items():
            w.value = error_html(m.error if m.error_on == name else found.get(name))
        self.status.value = ok_html(m.status) if m.status else ""
        for name, fig in (("latency", self.latency_fig), ("roofline", self.roofline_fig), ("waste", self.waste_fig)):
            mark_stale(fig, m.stale.get(name))

    def check(self) -> bool:
        """Take the controls' values and say what would refuse a sweep of them; True when nothing would."""
        self._sync()
        self._show()
        return not self.model.problems()

    def do_sweep(self) -> bool:
        self._sync()
        self.progress.value = 0

        def progress(done: int, total: int) -> None:
            self.progress.max, self.progress.value = total, done

        res = self.model.sweep(progress)
        if res is not None:
            refill(self.latency_fig, latency(self.model.results, overlays=self.model.overlays))
        self._show()
        return res is not None

    def do_roofline(self) -> bool:
        self._sync()
        res = self.model.roofline_run()
        if res is not None:
            refill(self.roofline_fig, roofline(res, self.model.ceilings))
        self._show()
        return res is not None

    def do_load(self) -> bool:
        res = self.model.load(self.path.value.strip())
        if res is not None:
            refill(self.latency_fig, latency(self.model.results, overlays=self.model.overlays))
        self._show()
        return res is not None

    def do_waste(self) -> bool:
        self._sync()
        lists = self.model.bucket_lists()
        if lists:
            refill(self.waste_fig, bucket_waste(lists, max(max(v) for v in lists.values())))
        self._show()
        return bool(lists)
