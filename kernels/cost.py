"""The cost record of one op call (bytes moved, FLOPs), what every ``kernels/*/cost.py`` returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    """Bytes moved to/from memory and floating-point operations of one op call (for the roofline)."""

    bytes: int
    flops: int

    @property
    def intensity(self) -> float:
        """FLOPs per byte."""
        return self.flops / max(self.bytes, 1)

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.bytes + other.bytes, self.flops + other.flops)
