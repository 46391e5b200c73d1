"""``@triton.jit`` helpers shared by the kernel folders' Triton kernels (importing this module needs triton;
``kernels/_common.py`` does not, so that the torch references run without it)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def sigmoid(v):
    """1 / (1 + exp(-v)) from exp(-|v|), which cannot overflow."""
    e = tl.exp(-tl.abs(v))
    return tl.where(v >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
