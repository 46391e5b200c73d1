"""Bytes and FLOPs of the causal conv1d ops, for the roofline.

Model: every row is processed (skipped rows would only lower the numbers), each input and parameter is
read once from memory and each output written once (the kernel's repeated window loads hit the cache).
FLOPs: 2W per output (W multiply-adds) plus 1 for the bias, plus 4 for silu (exp, add, divide, and
the multiply folded into the divide counted as one).
"""

from __future__ import annotations

import torch

from kernels.cost import Cost

_SILU_FLOPS = 4


def _per_output_flops(W: int, has_bias: bool, activation: str | None) -> int:
    return 2 * W + int(has_bias) + (_SILU_FLOPS if activation == "silu" else 0)


def update_cost(
    N: int,
    L: int,
    dim: int,
    W: int,
    dtype: torch.dtype,
    *,
    state_dtype: torch.dtype | None = None,
    has_bias: bool = True,
    activation: str | None = "silu",
    intermediate: bool = False,
    state_update: bool = True,
    tree: bool = False,
) -> Cost:
    """Cost of ``update``: x [N, L, dim] and out in ``dtype``, conv state in ``state_dtype`` (default dtype).

    Reads x, weight, bias and each row's W-1 stored inputs; writes out, the new state (unless
    ``state_update`` is False) and, for verify, L intermediate windows per row. ``tree``: a tree verify, whose
    nodes past the first read their parent's window back (L - 1 per row) and each its parent index (int32).
    """
    es = dtype.itemsize
    ss = (state_dtype or dtype).itemsize
    window = N * dim * (W - 1) * ss
    nbytes = (
        2 * N * L * dim * es  # x in, out
        + dim * (W + int(has_bias)) * es  # weight, bias
        + window * (1 + int(state_update))  # state in (+ out)
        + (L * window if intermediate else 0)
        + ((L - 1) * window + N * L * 4 if tree else 0)
    )
    return Cost(bytes=nbytes, flops=N * L * dim * _per_output_flops(W, has_bias, activation))


def varlen_cost(
    T: int,
    N: int,
    dim: int,
    W: int,
    dtype: torch.dtype,
    *,
    state_dtype: torch.dtype | None = None,
    has_bias: bool = True,
    activation: str | None = "silu",
) -> Cost:
    """Cost of ``varlen`` for T packed tokens in N sequences, all with an initial state."""
    es = dtype.itemsize
    ss = (state_dtype or dtype).itemsize
    nbytes = 2 * T * dim * es + dim * (W + int(has_bias)) * es + 2 * N * dim * (W - 1) * ss
    return Cost(bytes=nbytes, flops=T * dim * _per_output_flops(W, has_bias, activation))
