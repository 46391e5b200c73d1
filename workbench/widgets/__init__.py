"""Interactive widgets (ipywidgets 8 + plotly ``FigureWidget``, default dependencies): thin views over the
models in :mod:`workbench.widgets.models`, which hold all logic in plain Python and are what tests drive.

- ``MetadataExplorer``: build state-index / query_start_loc metadata; padding map, slot map, qsl staircase.
- ``CaptureReplayLab``: capture a layer per bucket, replay steps, integrity, the recorded ops, timings.
- ``KernelPlayground``: a kernel (or your own) against the float64 reference under every padding convention.
- ``TimingDashboard``: eager vs replay sweeps, roofline, bucket waste; overlay saved results.
- ``BugZoo``: known bugs, broken and fixed side by side.
- ``ServingTimeline``: a simulated serving trace replayed step by step; who owns every state slot when.

The views import ipywidgets when first used (``from workbench.widgets import MetadataExplorer``); importing
this package or its models does not.
"""

from __future__ import annotations

from typing import Any

_VIEWS = {
    "MetadataExplorer": "workbench.widgets.explorer",
    "CaptureReplayLab": "workbench.widgets.lab",
    "KernelPlayground": "workbench.widgets.playground",
    "TimingDashboard": "workbench.widgets.timing",
    "BugZoo": "workbench.widgets.zoo",
    "ServingTimeline": "workbench.widgets.timeline",
}

__all__ = sorted(_VIEWS)


def __getattr__(name: str) -> Any:
    if name in _VIEWS:
        import importlib

        from workbench.extras import require

        for package in ("ipywidgets", "plotly", "anywidget"):  # what every view imports (anywidget: FigureWidget)
            require(package, None, f"workbench.widgets.{name}")
        return getattr(importlib.import_module(_VIEWS[name]), name)
    raise AttributeError(f"module 'workbench.widgets' has no attribute {name!r}")
