"""Plotly figures: pure functions, data in, ``go.Figure`` out (plotly: a default dependency).

``viz.metadata``: what a step's metadata looks like (padding, slots, query_start_loc, integrity).
``viz.timeline``: a serving trace's slot owners, step by step. ``viz.layout``: which element a read in one
state layout takes from a slot written in the other. ``viz.zoo``: a bug zoo case's evidence,
broken beside fixed. ``viz.timing``: latency with IQR bands, the
roofline, bucket waste. ``viz.tree``: a verify row's draft tree and its accepted path.
``viz.palette``: the colour-blind-safe colours every figure shares.
"""

from workbench.viz.layout import state_layout_map
from workbench.viz.metadata import integrity_heatmap, padded_batch, padding_map, qsl_staircase, slot_map
from workbench.viz.timeline import slot_timeline
from workbench.viz.timing import bucket_waste, latency, roofline
from workbench.viz.tree import draft_tree_figure
from workbench.viz.zoo import zoo_evidence

__all__ = [
    "bucket_waste",
    "draft_tree_figure",
    "integrity_heatmap",
    "latency",
    "padded_batch",
    "padding_map",
    "qsl_staircase",
    "roofline",
    "slot_map",
    "slot_timeline",
    "state_layout_map",
    "zoo_evidence",
]
