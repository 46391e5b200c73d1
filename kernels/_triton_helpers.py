"""``@triton.jit`` helpers and launch helpers shared by the kernel folders' Triton kernels.

Importing this module needs triton; the other ``kernels/*.py`` modules do not, so that the torch
references run without it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def sigmoid(v):
    """1 / (1 + exp(-v)) from exp(-|v|), which cannot overflow."""
    e = tl.exp(-tl.abs(v))
    return tl.where(v >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def named_strides(name: str, t: torch.Tensor | None, dims: str) -> dict[str, int]:
    """``{"stride_<name>_<d>": t.stride(i)}`` for the i-th letter d of ``dims``; zeros when ``t`` is None
    (the kernel never reads it)."""
    return {f"stride_{name}_{d}": (t.stride(i) if t is not None else 0) for i, d in enumerate(dims)}
