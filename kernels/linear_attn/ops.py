"""Public entry point of plain linear attention and its ``linattn::`` custom op.

The public function validates shapes, dtypes and devices only (never values: reading device memory would
synchronise the host, which graph capture forbids), allocates ``out`` when it is None and calls ONE
custom op, which is what a ``TorchDispatchMode`` (the CPU graph recorder) sees.
"""

from __future__ import annotations

import torch

from kernels.checks import ArgChecker
from kernels.conventions import DEFAULT_STATE_LAYOUT
from kernels.dispatch import call_op, implementation, inplace_custom_op
from kernels.dtypes import FLOAT_DTYPES, INDEX_DTYPES, STATE_DTYPES

from .reference import recurrent_reference


@inplace_custom_op("linattn::linear_attn_recurrent", mutates_args=("state", "out"))
def _recurrent_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor,
    state_layout: str,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    pad_slot_id: int | None,
    out: torch.Tensor,
    impl: str,
) -> None:
    run = implementation(
        impl, reference=recurrent_reference, triton="kernels.linear_attn.triton_recurrent:recurrent_triton"
    )
    run(
        q=q,
        k=k,
        v=v,
        state=state,
        state_layout=state_layout,
        state_indices=state_indices,
        cu_seqlens=cu_seqlens,
        scale=scale,
        pad_slot_id=pad_slot_id,
        out=out,
    )


def recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_layout: str = DEFAULT_STATE_LAYOUT,
    scale: float | None = None,
    pad_slot_id: int | None = -1,
    out: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Plain linear attention, token by token, over packed sequences and a pool of states.

    Per token of sequence n, with ``S = state[state_indices[n], h]`` (``[K, V]``; ``[V, K]`` in memory when
    ``state_layout="v_first"``):
    ``S <- S + k v^T``, then ``o = S^T (scale q)``. Value head h uses q/k head ``h // (HV // H)``.

    Args:
        q, k: [T, H, K] float. v: [T, HV, V] float, ``HV % H == 0``.
        state: [num_slots, HV, K, V] float32 pool (float64 accepted for ground truth); each processed
            row starts from its slot and leaves its final state there.
        state_layout: "k_first" ([num_slots, HV, K, V]) or "v_first" ([num_slots, HV, V, K], as the
            released engines lay out their GDN pools); see kernels.conventions.STATE_LAYOUTS.
        state_indices: [N] int32/int64; rows skipped per ``pad_slot_id`` (``kernels.padding``) read and
            write no slot and output zeros.
        cu_seqlens: [N+1] int32/int64, ``cu[0] = 0``, non-decreasing, ``cu[N] <= T``; decode is
            ``[0, 1, ..., N]``. Tokens after ``cu[N]`` (graph padding) get zero outputs.
        scale: query scale, ``K ** -0.5`` when None.
        pad_slot_id: the padding sentinel; None processes every row.
        out: [T, HV, V] float, written in full; allocated like v when None.
        impl: "auto" | "reference" | "triton".

    Returns:
        out: [T, HV, V].
    """
    check = ArgChecker("linear_attn.recurrent", device_of="q")
    check.leading("q", q, "[T, H, K]", 3)
    T, H, K = q.shape
    dev = q.device
    check.tensor("k", k, (T, H, K), FLOAT_DTYPES, dev)
    check.layout("v", v, f"[T={T}, HV, V]", 3, length=T)
    HV, V = v.shape[1], v.shape[2]
    check.require(H >= 1 and HV % H == 0, f"value heads HV={HV} must be a multiple of query/key heads H={H} (GVA)")
    check.tensor("v", v, (T, HV, V), FLOAT_DTYPES, dev)
    layout = check.state_layout(state_layout)
    dims = [("slots", None), ("HV", HV), ("K", K), ("V", V)]
    check.states("state", state, dims, layout, STATE_DTYPES, dev)
    N = check.cu_seqlens(cu_seqlens, dev)
    check.tensor("state_indices", state_indices, (N,), INDEX_DTYPES, dev)
    check.pad_slot_id(pad_slot_id)
    if scale is None:
        scale = K**-0.5
    check.require(
        isinstance(scale, (int, float)) and not isinstance(scale, bool),
        f"scale must be a float or None, got {scale!r}",
    )
    if out is None:
        out = torch.empty_like(v)
    check.tensor("out", out, (T, HV, V), FLOAT_DTYPES, dev)
    call_op(
        _recurrent_op,
        q=q,
        k=k,
        v=v,
        state=state,
        state_layout=layout,
        state_indices=state_indices,
        cu_seqlens=cu_seqlens,
        scale=float(scale),
        pad_slot_id=pad_slot_id,
        out=out,
        impl=check.impl(impl, dev),
    )
    return out
