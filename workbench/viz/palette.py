"""One colour-blind-safe palette for every figure (Okabe-Ito), so a colour means the same thing everywhere."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workbench.extras import require

# Okabe & Ito (2008): distinguishable under the common colour-vision deficiencies
BLUE = "#0072B2"
ORANGE = "#E69F00"
SKY = "#56B4E9"
GREEN = "#009E73"
YELLOW = "#F0E442"
VERMILLION = "#D55E00"
PURPLE = "#CC79A7"
GREY = "#999999"
LIGHT_GREY = "#D9D9D9"
BLACK = "#000000"

SEQUENCE = [BLUE, ORANGE, GREEN, VERMILLION, PURPLE, SKY, YELLOW, BLACK]


def category_heatmap(
    name: str,
    codes: Sequence[Sequence[int]],
    x: Sequence[Any],
    y: Sequence[Any],
    colours: Sequence[str],
    words: Sequence[Sequence[str]],
    gap: int = 1,
) -> Any:
    """A ``go.Heatmap`` of category codes ``0..len(colours)-1``, each drawn in its colour (a step colour scale,
    no colour bar), with ``words`` as each cell's hover text."""
    go = require("plotly.graph_objects", None, "workbench.viz figures")
    n = len(colours)
    scale: list[list[Any]] = []
    for k, c in enumerate(colours):  # a discrete colour scale: code k fills [k/n, (k+1)/n)
        scale += [[k / n, c], [(k + 1) / n, c]]
    return go.Heatmap(
        name=name, z=codes, x=list(x), y=list(y), zmin=-0.5, zmax=n - 0.5, colorscale=scale, showscale=False,
        customdata=words, hovertemplate="%{customdata}<extra></extra>", xgap=gap, ygap=gap,
    )  # fmt: skip
