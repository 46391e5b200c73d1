"""Plotly figures: pure functions, data in, ``go.Figure`` out (plotly is in the ``lab`` extra).

``viz.metadata``: what a step's metadata looks like (padding, slots, query_start_loc). ``viz.timing``:
latency with IQR bands, the roofline, bucket waste. ``viz.palette``: the colour-blind-safe colours every
figure shares.
"""

from workbench.viz.metadata import padded_batch
from workbench.viz.timing import bucket_waste, latency, roofline

__all__ = ["bucket_waste", "latency", "padded_batch", "roofline"]
