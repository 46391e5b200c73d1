"""Bytes and FLOPs of plain linear attention, for the roofline.

Model: every row processed, each token's q, k, v read once and o written once, each row's state read
and written once. FLOPs per token and value head: ``S += k v^T`` is 2KV (multiply, add), ``S^T q`` is
2KV, scaling q is K.
"""

from __future__ import annotations

import torch

from kernels.cost import Cost


def recurrent_cost(
    T: int,
    N: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    dtype: torch.dtype,
    *,
    state_dtype: torch.dtype = torch.float32,
) -> Cost:
    """Cost of ``recurrent`` for T tokens in N sequences; q, k, v, out in ``dtype``."""
    es, ss = dtype.itemsize, state_dtype.itemsize
    nbytes = T * (2 * H * K + 2 * HV * V) * es + 2 * N * HV * K * V * ss
    flops = T * HV * (4 * K * V + K)
    return Cost(bytes=nbytes, flops=flops)
