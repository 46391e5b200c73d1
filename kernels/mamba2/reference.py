"""Torch reference of Mamba2's single-step selective state update (mamba_ssm semantics).

For each processed row n and head h, with state ``S = state[slot_n, h]`` of shape ``[headdim, dstate]``
and ``g = h // (nheads // ngroups)`` the head's B/C group:

    dt   = dt[n, h] (+ dt_bias[h]);  dt = softplus(dt) if dt_softplus       # [headdim]
    S    = S * exp(A[h] * dt[:, None]) + (dt * x[n, h])[:, None] * B[n, g][None, :]
    out  = S @ C[n, g]  (+ D[h] * x[n, h]);  out = out * silu(z[n, h]) if z is given

Computed in float32, or float64 when any input is float64 (the tests' ground truth). Reads the slot
indices on the host, so it synchronises on an accelerator; the Triton kernel does not.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.dtypes import compute_dtype
from kernels.padding import live_rows_and_slots


def selective_state_update_reference(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    state_indices: torch.Tensor,
    pad_slot_id: int | None,
    out: torch.Tensor,
) -> None:
    """One decode step of every row; updates ``state`` and writes ``out`` in place.

    state [num_slots, nheads, headdim, dstate]; x, dt, z, out [N, nheads, headdim];
    A [nheads, headdim, dstate]; B, C [N, ngroups, dstate]; D, dt_bias [nheads, headdim];
    state_indices [N] int.
    """
    ct = compute_dtype(state, x, dt, A, B, C, D, z, dt_bias)
    nheads, ngroups = x.shape[1], B.shape[1]
    heads_per_group = nheads // ngroups

    out.zero_()  # skipped rows keep these zeros
    rows, slots = live_rows_and_slots(state_indices, pad_slot_id, state.shape[0])

    x_r = x[rows].to(ct)  # [R, nheads, headdim]
    dt_r = dt[rows].to(ct)
    if dt_bias is not None:
        dt_r = dt_r + dt_bias.to(ct)
    if dt_softplus:
        dt_r = F.softplus(dt_r)  # beta 1, linear above 20, as mamba_ssm
    # Each head reads its group's B and C: repeat every group heads_per_group times along the head axis.
    B_r = B[rows].to(ct).repeat_interleave(heads_per_group, dim=1)  # [R, nheads, dstate]
    C_r = C[rows].to(ct).repeat_interleave(heads_per_group, dim=1)

    s = state[slots].to(ct)  # [R, nheads, headdim, dstate]
    decay = torch.exp(A.to(ct) * dt_r.unsqueeze(-1))  # [R, nheads, headdim, dstate]
    s = s * decay + (dt_r * x_r).unsqueeze(-1) * B_r.unsqueeze(2)
    state[slots] = s.to(state.dtype)

    y = (s * C_r.unsqueeze(2)).sum(-1)  # [R, nheads, headdim]
    if D is not None:
        y = y + D.to(ct) * x_r
    if z is not None:
        y = y * F.silu(z[rows].to(ct))
    out[rows] = y.to(out.dtype)
