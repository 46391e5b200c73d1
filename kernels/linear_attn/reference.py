"""Torch reference of plain (ungated) linear attention: the simplest recurrent layer, for teaching.

Each request keeps a state ``S`` of shape ``[K, V]`` per value head, in a pool slot. For every token,
in order:

    S <- S + k v^T           (write: add the outer product of this token's key and value)
    o  = S^T (scale * q)     (read: query the state)

Value head ``h`` uses query/key head ``h // (HV // H)`` (grouped value attention, GVA).
This file does exactly that, one sequence and one token at a time, in float32 (float64 when any input
is float64). It reads ``cu_seqlens`` and the slot indices on the host, so on an accelerator it
synchronises; the Triton kernel does not.
"""

from __future__ import annotations

import torch

from kernels.conventions import DEFAULT_STATE_LAYOUT, layout_view
from kernels.dtypes import compute_dtype
from kernels.padding import live_rows_and_slots


def recurrent_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    pad_slot_id: int | None,
    out: torch.Tensor,
    state_layout: str = DEFAULT_STATE_LAYOUT,
) -> None:
    """Run every sequence through its state; updates ``state`` and writes ``out`` in place.

    q, k [T, H, K]; v [T, HV, V]; state [num_slots, HV, K, V] (``state_layout="v_first"``:
    [num_slots, HV, V, K], read and written through its K-first view); state_indices [N] int;
    cu_seqlens [N+1] int; out [T, HV, V].
    """
    state = layout_view(state, state_layout, "k_first")  # the same memory, indexed [slot, h, k, v]
    ct = compute_dtype(q, k, v, state)
    HV = v.shape[1]
    group = HV // q.shape[1]  # value heads per query/key head

    # Tokens of skipped rows, and tokens after cu_seqlens[N] that no row owns, keep these zeros.
    out.zero_()
    rows, slots = live_rows_and_slots(state_indices, pad_slot_id, state.shape[0])  # the rows to process
    bounds = cu_seqlens.tolist()

    for n, slot in zip(rows.tolist(), slots.tolist(), strict=True):
        S = state[slot].to(ct)  # [HV, K, V]
        for t in range(bounds[n], bounds[n + 1]):
            q_t = q[t].to(ct).repeat_interleave(group, dim=0)  # [HV, K]: each value head's query
            k_t = k[t].to(ct).repeat_interleave(group, dim=0)  # [HV, K]
            v_t = v[t].to(ct)  # [HV, V]
            S = S + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)  # S += k v^T, per head
            o_t = (S * (scale * q_t).unsqueeze(-1)).sum(dim=1)  # o = S^T (scale q), per head
            out[t] = o_t.to(out.dtype)
        state[slot] = S.to(state.dtype)
