"""Plotly figures: pure functions, data in, ``go.Figure`` out (plotly is in the ``lab`` extra).

``viz.metadata``: what a step's metadata looks like (padding, slots, query_start_loc, integrity).
``viz.palette``: the colour-blind-safe colours every figure shares.
"""

from workbench.viz.metadata import integrity_heatmap, padded_batch, padding_map, qsl_staircase, slot_map

__all__ = ["integrity_heatmap", "padded_batch", "padding_map", "qsl_staircase", "slot_map"]
