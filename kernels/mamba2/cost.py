"""Bytes and FLOPs of Mamba2's selective state update, for the roofline.

Model: every row processed (skipped rows only lower the numbers), each tensor read or written once.
FLOPs per state element: exp(A dt) counted as 2 (multiply, exp), decay multiply 1, ``dt x B`` 1 (the
product ``dt x`` is per row/head/channel), add 1, and the output multiply-add 2: 7. Per
(row, head, channel): 1 ``dt * x``, plus 1 for dt_bias, 4 for softplus, 2 for D, 5 for the silu gate.
"""

from __future__ import annotations

import torch

from kernels.cost import Cost


def selective_state_update_cost(
    N: int,
    nheads: int,
    headdim: int,
    dstate: int,
    ngroups: int,
    dtype: torch.dtype,
    *,
    state_dtype: torch.dtype = torch.float32,
    param_dtype: torch.dtype = torch.float32,
    has_D: bool = True,
    has_z: bool = True,
    has_dt_bias: bool = True,
    dt_softplus: bool = True,
    tied: bool = True,
    steps: int = 1,
    state_update: bool = True,
    intermediate: bool = False,
    tree: bool = False,
) -> Cost:
    """Cost of one ``selective_state_update`` call of ``N`` rows of ``steps`` tokens each.

    ``dtype``: x, dt, B, C, z and out; ``param_dtype``: A, D, dt_bias. ``tied``: A, dt, D and dt_bias
    are per-head scalars expanded over headdim (and dstate for A), as engines pass them, so only
    ``nheads`` values are read (dt: ``N * nheads`` per step). A verify (``steps`` = D) reads each slot once,
    writes it back only with ``state_update`` and, with ``intermediate``, writes the state after every step.
    ``tree``: a tree verify, whose steps past the first read their parent's state back (``steps - 1`` per
    row) and each its parent index (int32).
    """
    es, ss, ps = dtype.itemsize, state_dtype.itemsize, param_dtype.itemsize
    slot = nheads * headdim * dstate * ss
    state_bytes = (1 + int(state_update)) * N * slot + (N * steps * slot if intermediate else 0)
    if tree:
        state_bytes += N * (steps - 1) * slot + N * steps * 4
    N = N * steps  # the per-token inputs and work below
    chan = N * nheads * headdim
    per_head = nheads if tied else nheads * headdim
    nbytes = (
        state_bytes  # state in (and out), per-step states
        + chan * es * (2 + int(has_z))  # x, out, z
        + (N * nheads if tied else chan) * es  # dt
        + 2 * N * ngroups * dstate * es  # B, C
        + (nheads if tied else nheads * headdim * dstate) * ps  # A
        + per_head * ps * (int(has_D) + int(has_dt_bias))
    )
    per_chan = 1 + int(has_dt_bias) + 4 * int(dt_softplus) + 2 * int(has_D) + 5 * int(has_z)
    flops = 7 * chan * dstate + per_chan * chan
    return Cost(bytes=nbytes, flops=flops)


def chunk_scan_cost(
    T: int,
    N: int,
    nheads: int,
    headdim: int,
    dstate: int,
    ngroups: int,
    dtype: torch.dtype,
    *,
    num_chunks: int = 0,
    state_dtype: torch.dtype = torch.float32,
    has_D: bool = True,
    has_z: bool = False,
) -> Cost:
    """Cost of one ``chunk_scan`` call over ``T`` tokens of ``N`` rows, writing ``num_chunks`` chunk states.

    Per token the update is the selective state update's (7 FLOPs per state element, the per-head
    ``exp(A dt)`` and softplus once per head); states are read and written once per row, chunk states
    written once each. dt is per head, A, D and dt_bias per head.
    """
    es, ss = dtype.itemsize, state_dtype.itemsize
    state = nheads * headdim * dstate
    chan = T * nheads * headdim
    nbytes = (
        2 * N * state * ss  # each row's state in and out
        + num_chunks * state * ss  # chunk states out
        + chan * es * (2 + int(has_z))  # x, out, z
        + T * nheads * es  # dt
        + 2 * T * ngroups * dstate * es  # B, C
        + nheads * 4 * (2 + int(has_D))  # A, dt_bias, D (float32)
    )
    flops = 7 * T * state + chan * (1 + 2 * int(has_D) + 5 * int(has_z)) + T * nheads * 7
    return Cost(bytes=nbytes, flops=flops)
