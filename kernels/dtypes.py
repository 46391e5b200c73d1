"""Dtypes the ops accept, and the arithmetic dtype of the torch references."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
STATE_DTYPES = (torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)


def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in ``dtype``: ``x`` itself when it is already (as ``x.to(dtype)``, whose no-op costs ten times this
    check: the references make a few dozen such calls a step)."""
    return x if x.dtype == dtype else x.to(dtype)


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """Arithmetic dtype of the torch references: float64 if any given tensor is float64, else float32
    (fp16/bf16 are never accumulated in)."""
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32
