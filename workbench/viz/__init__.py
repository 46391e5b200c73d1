"""Plotly figures: pure functions, data in, ``go.Figure`` out (plotly is in the ``lab`` extra).

``viz.metadata``: what a step's metadata looks like (padding, slots, query_start_loc). ``viz.palette``: the
colour-blind-safe colours every figure shares.
"""

from workbench.viz.metadata import padded_batch

__all__ = ["padded_batch"]
