"""One colour-blind-safe palette for every figure (Okabe-Ito), so a colour means the same thing everywhere."""

from __future__ import annotations

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
