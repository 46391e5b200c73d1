"""Triton kernel of plain linear attention over packed sequences and a pool of states.

Grid ``(N + 1, HV, cdiv(V, BLOCK_V))``: a program owns one sequence, one value head and a block of V
columns of the ``[K, V]`` state, keeps that ``[BLOCK_K, BLOCK_V]`` tile in registers while it walks the
sequence's tokens, and stores it back to the slot it came from (same lanes, so no barrier). The extra
program ``n == N`` owns the tail tokens ``[cu_seqlens[N], T)`` that graph padding leaves to no row and
writes zeros there. The whole K axis is one block, because ``o = S^T q`` sums over K.

The state is addressed through ``(stride_s_k, stride_s_v)``: the launcher passes the strides of the pool's
K-first view (``kernels.conventions.layout_view``), so the one kernel serves k_first and v_first pools.

Computation is float32 whatever the storage dtype. Only masked ``tl.load``/``tl.store`` and a runtime
``for`` over tokens are used, so that triton-ascend could compile it; not tried without Ascend hardware.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._triton_helpers import named_strides
from kernels.conventions import DEFAULT_STATE_LAYOUT, layout_view


@triton.jit
def _linear_attn_recurrent_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    state_ptr,
    indices_ptr,
    cu_seqlens_ptr,
    out_ptr,
    num_rows,
    num_tokens,
    K,
    V,
    heads_per_qk_head,
    scale,
    pad_slot_id,
    stride_q_t,
    stride_q_h,
    stride_q_k,
    stride_k_t,
    stride_k_h,
    stride_k_k,
    stride_v_t,
    stride_v_h,
    stride_v_v,
    stride_s_n,
    stride_s_h,
    stride_s_k,
    stride_s_v,
    stride_o_t,
    stride_o_h,
    stride_o_v,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    HAS_PAD: tl.constexpr,
):
    n = tl.program_id(0)
    hv = tl.program_id(1)
    h = hv // heads_per_qk_head  # GVA: the query/key head this value head reads
    kk = tl.arange(0, BLOCK_K)
    vv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    k_mask = kk < K
    v_mask = vv < V

    bos = tl.load(cu_seqlens_ptr + n).to(tl.int64)
    eos = tl.load(cu_seqlens_ptr + n + 1, mask=n < num_rows, other=num_tokens).to(tl.int64)
    slot = tl.load(indices_ptr + n, mask=n < num_rows, other=0).to(tl.int64)
    # Row predicate as a vector (the interpreter mis-types scalar bools broadcast into masks).
    live = ((n + 0 * vv) < num_rows) & v_mask
    if HAS_PAD:
        live = live & ((slot + 0 * vv) > pad_slot_id)
    tile_mask = k_mask[:, None] & live[None, :]

    state_tile = state_ptr + slot * stride_s_n + hv * stride_s_h + kk[:, None] * stride_s_k + vv[None, :] * stride_s_v
    S = tl.load(state_tile, mask=tile_mask, other=0.0).to(tl.float32)  # [BLOCK_K, BLOCK_V]

    for t in range(bos, eos):
        q = tl.load(q_ptr + t * stride_q_t + h * stride_q_h + kk * stride_q_k, mask=k_mask, other=0.0)
        k = tl.load(k_ptr + t * stride_k_t + h * stride_k_h + kk * stride_k_k, mask=k_mask, other=0.0)
        v = tl.load(v_ptr + t * stride_v_t + hv * stride_v_h + vv * stride_v_v, mask=v_mask, other=0.0)
        S += k.to(tl.float32)[:, None] * v.to(tl.float32)[None, :]  # S += k v^T
        o = tl.sum(S * (scale * q.to(tl.float32))[:, None], axis=0)  # o = S^T (scale q)
        o = tl.where(live, o, 0.0)  # skipped rows and tail tokens: zeros
        tl.store(
            out_ptr + t * stride_o_t + hv * stride_o_h + vv * stride_o_v,
            o.to(out_ptr.dtype.element_ty),
            mask=v_mask,
        )

    tl.store(state_tile, S.to(state_ptr.dtype.element_ty), mask=tile_mask)


def recurrent_triton(
    *,
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
) -> object:
    """Launch; same arguments and shapes as ``reference.recurrent_reference``.

    Returns the launch's compiled kernel (None in the interpreter), for its ``n_regs`` / ``n_spills``.
    """
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = state_indices.shape[0]
    block_k = triton.next_power_of_2(K)
    # The state tile lives in registers: keep it at most 8192 elements.
    block_v = max(1, min(triton.next_power_of_2(V), 8192 // block_k, 64))
    return _linear_attn_recurrent_kernel[(N + 1, HV, triton.cdiv(V, block_v))](
        q_ptr=q,
        k_ptr=k,
        v_ptr=v,
        state_ptr=state,
        indices_ptr=state_indices,
        cu_seqlens_ptr=cu_seqlens,
        out_ptr=out,
        num_rows=N,
        num_tokens=T,
        K=K,
        V=V,
        heads_per_qk_head=HV // H,
        scale=float(scale),
        pad_slot_id=pad_slot_id if pad_slot_id is not None else 0,
        **named_strides("q", q, "thk"),
        **named_strides("k", k, "thk"),
        **named_strides("v", v, "thv"),
        **named_strides("s", layout_view(state, state_layout, "k_first"), "nhkv"),
        **named_strides("o", out, "thv"),
        BLOCK_K=block_k,
        BLOCK_V=block_v,
        HAS_PAD=pad_slot_id is not None,
    )
