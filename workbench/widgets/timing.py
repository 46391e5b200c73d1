"""``TimingDashboard``: a thin ipywidgets view over :class:`TimingModel`."""

from __future__ import annotations

from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from workbench.sweeps.common import PRESET_NAMES
from workbench.viz import bucket_waste, latency, roofline
from workbench.widgets.html import error_html, ok_html
from workbench.widgets.timing_model import TimingModel


def refill(fw: go.FigureWidget, fig: go.Figure) -> None:
    """Put ``fig``'s traces and layout into the existing FigureWidget ``fw`` (the widget is kept: the
    browser view updates, nothing is re-created)."""
    fw.data = ()
    fw.add_traces(list(fig.data))
    with fw.batch_update():
        fw.layout = fig.layout


class TimingDashboard(W.VBox):
    """Sweep batch sizes x impl x eager/replay with progress; latency with IQR bands, roofline, bucket
    waste; load saved result files and overlay them (e.g. a GPU run beside this CPU run).

    Attributes: ``model``, the controls (``batch_sizes``, ``impls``, ``modes``, ``layer``, ``preset``,
    ``buckets``, ``sweep_button``, ``roofline_button``, ``path``, ``load_button``), ``progress``,
    ``latency_fig``, ``roofline_fig``, ``waste_fig`` (FigureWidgets), ``status`` / ``error`` (HTML).
    """

    def __init__(self, **params: Any) -> None:
        self.model = TimingModel(**params)
        m = self.model
        style = {"description_width": "110px"}
        self.batch_sizes = W.Text(value=m.batch_sizes, description="batch sizes", style=style)
        self.impls = W.SelectMultiple(
            options=["reference", "triton"], value=m.impls, description="impls", rows=2, style=style
        )
        self.modes = W.SelectMultiple(
            options=["eager", "replay"], value=m.modes, description="modes", rows=2, style=style
        )
        self.layer = W.Dropdown(options=["gdn", "mamba2"], value=m.layer, description="layer", style=style)
        self.preset = W.Dropdown(options=list(PRESET_NAMES), value=m.preset, description="preset", style=style)
        self.buckets = W.Text(value=m.buckets, description="your buckets", placeholder="e.g. 1, 4, 16, 64", style=style)
        self.sweep_button = W.Button(description="Sweep", button_style="primary", icon="play")
        self.roofline_button = W.Button(description="Ceilings + kernels", icon="tachometer")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="sweep")
        self.path = W.Text(value="", placeholder="path/to/results.json", description="saved file", style=style)
        self.load_button = W.Button(description="Load + overlay", icon="upload")
        self.error = W.HTML()
        self.status = W.HTML()
        self.latency_fig = go.FigureWidget(latency(m.results, title="Latency (run a sweep)"))
        self.roofline_fig = go.FigureWidget(go.Figure(layout=dict(title="Roofline (measure ceilings + kernels)")))
        lists = m.bucket_lists() or {}
        self.waste_fig = go.FigureWidget(bucket_waste(lists, max(max(v) for v in lists.values())))
        self.sweep_button.on_click(lambda _: self.do_sweep())
        self.roofline_button.on_click(lambda _: self.do_roofline())
        self.load_button.on_click(lambda _: self.do_load())
        self.buckets.observe(lambda _: self.do_waste(), names="value")
        self.batch_sizes.observe(lambda _: self.do_waste(), names="value")
        super().__init__(
            [
                W.HTML("<b>Timing dashboard</b>"),
                W.HBox([self.batch_sizes, self.layer, self.preset]),
                W.HBox([self.impls, self.modes]),
                W.HBox([self.sweep_button, self.progress, self.roofline_button]),
                W.HBox([self.path, self.load_button]),
                self.error,
                self.status,
                self.latency_fig,
                self.roofline_fig,
                self.buckets,
                self.waste_fig,
            ]
        )

    def _sync(self) -> None:
        m = self.model
        m.batch_sizes, m.impls, m.modes = self.batch_sizes.value, tuple(self.impls.value), tuple(self.modes.value)
        m.layer, m.preset, m.buckets = self.layer.value, self.preset.value, self.buckets.value

    def do_sweep(self) -> bool:
        self._sync()
        self.progress.value = 0

        def progress(done: int, total: int) -> None:
            self.progress.max, self.progress.value = total, done

        res = self.model.sweep(progress)
        self.error.value = error_html(self.model.error)
        if res is None:
            return False
        self.status.value = ok_html(f"{len(res)} records: {self.model.layer} step, {res.meta.get('graph_backend', '')}")
        refill(self.latency_fig, latency(self.model.combined()))
        return True

    def do_roofline(self) -> bool:
        self._sync()
        res = self.model.roofline_run()
        self.error.value = error_html(self.model.error)
        if res is None:
            return False
        c = self.model.ceilings
        self.status.value = ok_html(
            f"ceilings on {c.device}: copy {c.copy_gbps:.1f} GB/s, matmul "
            f"{c.matmul_tflops:.3f} TFLOP/s; {len(res)} kernel records"
        )
        refill(self.roofline_fig, roofline(res, c))
        return True

    def do_load(self) -> bool:
        res = self.model.load(self.path.value.strip())
        self.error.value = error_html(self.model.error)
        if res is None:
            return False
        self.status.value = ok_html(f"loaded {len(res)} records from {self.path.value.strip()}")
        refill(self.latency_fig, latency(self.model.combined()))
        return True

    def do_waste(self) -> bool:
        self._sync()
        lists = self.model.bucket_lists()
        self.error.value = error_html(self.model.error)
        if not lists:
            return False
        refill(self.waste_fig, bucket_waste(lists, max(max(v) for v in lists.values())))
        return True
