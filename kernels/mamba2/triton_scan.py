"""Triton kernel of Mamba2's chunk scan over a packed prefill batch, token-sequential.

Grid ``(N, nheads, cdiv(headdim, BLOCK_P))``: a program owns a ``[BLOCK_P, dstate]`` tile of one row's head
state in registers (float32), walks the row's tokens, writes each token's output, stores the tile into
``chunk_states`` whenever the flattened position it reached is a multiple of ``chunk_size`` (the global grid
of :mod:`kernels.mamba2.chunk_grid`), and writes the tile back to its slot once. This is the recurrence the
SSD algorithm computes in chunks (mamba_ssm's ``ssd_combined``: intra-chunk matmuls, then a pass over chunk
states); its chunk states are the same numbers, so the grid semantics are what it shares with the engines'
kernel, not the work split. The chunked SSD form is not built here.

The same portability rules as ``triton_ssu.py``: masked ``tl.load``/``tl.store`` only, ``tl.exp``/``tl.log``
(no libdevice), scalar conditions folded into mask bounds. Only run under ``TRITON_INTERPRET=1`` so far.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._triton_helpers import named_strides, sigmoid
from kernels.gated_delta_rule.triton_common import h0_flags, kernel_pad_slot_id, row_tokens_and_slot
from kernels.mamba2.chunk_grid import grid_size
from kernels.mamba2.triton_ssu import _softplus


@triton.jit
def _chunk_scan_kernel(
    x_ptr,
    dt_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    z_ptr,
    dt_bias_ptr,
    state_ptr,
    idx_ptr,
    cu_ptr,
    h0_ptr,
    out_ptr,
    h_ptr,
    headdim,
    dstate,
    heads_per_group,
    pad_slot_id,
    num_rows,
    num_tokens,
    chunk_size,
    num_chunks,
    stride_x_t,
    stride_x_h,
    stride_x_p,
    stride_dt_t,
    stride_dt_h,
    stride_B_t,
    stride_B_g,
    stride_B_s,
    stride_C_t,
    stride_C_g,
    stride_C_s,
    stride_z_t,
    stride_z_h,
    stride_z_p,
    stride_s_n,
    stride_s_h,
    stride_s_p,
    stride_s_s,
    stride_o_t,
    stride_o_h,
    stride_o_p,
    stride_hc_k,
    stride_hc_h,
    stride_hc_p,
    stride_hc_s,
    BLOCK_P: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr,
    HAS_H0_FLAG: tl.constexpr,
    STORE_H: tl.constexpr,
):
    n = tl.program_id(0)
    h = tl.program_id(1)
    pid_p = tl.program_id(2)
    g = h // heads_per_group

    bos, eos, slot, live = row_tokens_and_slot(cu_ptr, idx_ptr, n, pad_slot_id)
    p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    s = tl.arange(0, BLOCK_S)
    p_mask = p < headdim
    s_mask = s < dstate

    read = live
    if HAS_H0_FLAG:
        read = read & (tl.load(h0_ptr + n) != 0)
    tile = p[:, None] * stride_s_p + s[None, :] * stride_s_s
    s_ptrs = state_ptr + slot * stride_s_n + h * stride_s_h + tile
    S = tl.load(s_ptrs, mask=(p < tl.where(read, headdim, 0))[:, None] & s_mask[None, :], other=0.0).to(tl.float32)

    A = tl.load(A_ptr + h).to(tl.float32)
    if HAS_DT_BIAS:
        dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    if HAS_D:
        D = tl.load(D_ptr + h).to(tl.float32)
    h_tile = h * stride_hc_h + p[:, None] * stride_hc_p + s[None, :] * stride_hc_s
    live_lim = tl.where(live, headdim, 0)
    if STORE_H:  # noqa: SIM102 (a constexpr branch, then a runtime one: triton keeps them apart)
        if n == 0:  # entry 0: the first row's initial state
            tl.store(h_ptr + h_tile, S, mask=(p < live_lim)[:, None] & s_mask[None, :])

    for t in range(bos, eos):
        x = tl.load(x_ptr + t * stride_x_t + h * stride_x_h + p * stride_x_p, mask=p_mask, other=0.0).to(tl.float32)
        dt = tl.load(dt_ptr + t * stride_dt_t + h * stride_dt_h).to(tl.float32)
        if HAS_DT_BIAS:
            dt += dt_bias
        if DT_SOFTPLUS:
            dt = _softplus(dt)
        Bv = tl.load(B_ptr + t * stride_B_t + g * stride_B_g + s * stride_B_s, mask=s_mask, other=0.0).to(tl.float32)
        Cv = tl.load(C_ptr + t * stride_C_t + g * stride_C_g + s * stride_C_s, mask=s_mask, other=0.0).to(tl.float32)
        S = S * tl.exp(A * dt) + (dt * x)[:, None] * Bv[None, :]
        y = tl.sum(S * Cv[None, :], axis=1)
        if HAS_D:
            y += D * x
        if HAS_Z:
            zv = tl.load(z_ptr + t * stride_z_t + h * stride_z_h + p * stride_z_p, mask=p_mask, other=0.0)
            zv = zv.to(tl.float32)
            y = y * (zv * sigmoid(zv))
        y = tl.where(p < live_lim, y, 0.0)  # skipped rows: zeros, never garbage
        tl.store(
            out_ptr + t * stride_o_t + h * stride_o_h + p * stride_o_p, y.to(out_ptr.dtype.element_ty), mask=p_mask
        )
        if STORE_H:
            k = (t + 1) // chunk_size
            on_grid = ((t + 1) % chunk_size == 0) & (k < num_chunks) & live
            h_mask = (p < tl.where(on_grid, headdim, 0))[:, None] & s_mask[None, :]
            tl.store(h_ptr + k * stride_hc_k + h_tile, S, mask=h_mask)

    if n == num_rows - 1:  # tokens past the last row (a bucket's padding) belong to no row: zeros
        for t in range(eos, num_tokens):
            tl.store(
                out_ptr + t * stride_o_t + h * stride_o_h + p * stride_o_p,
                tl.zeros([BLOCK_P], tl.float32).to(out_ptr.dtype.element_ty),
                mask=p_mask,
            )
    write = (p < tl.where(live & (eos > bos), headdim, 0))[:, None] & s_mask[None, :]
    tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=write)


def chunk_scan_triton(
    *,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    pad_slot_id: int | None,
    chunk_size: int,
    out: torch.Tensor,
    chunk_states: torch.Tensor | None,
    block_p: int | None = None,
) -> object:
    """Launch; same arguments and shapes as ``reference.chunk_scan_reference`` (``block_p``: headdim
    channels per program, default as ``triton_ssu``). Returns the compiled kernel (None in the interpreter).
    """
    T, nheads, headdim = x.shape
    ngroups, dstate = B.shape[1], B.shape[2]
    N = state_indices.shape[0]
    if chunk_states is not None:
        chunk_states.zero_()  # entries no processed row owns (skipped rows, padding tokens) read as zeros
    if N == 0 or T == 0:  # nothing to scan (no row writes a state without tokens)
        out.zero_()
        return None
    block_s = triton.next_power_of_2(dstate)
    if block_p is None:
        block_p = max(1, min(triton.next_power_of_2(headdim), 4096 // block_s))
    h = chunk_states if chunk_states is not None else state
    A = A.contiguous()  # the per-head parameters are read at offset h
    D, dt_bias = (t.contiguous() if t is not None else None for t in (D, dt_bias))
    return _chunk_scan_kernel[(N, nheads, triton.cdiv(headdim, block_p))](
        x_ptr=x,
        dt_ptr=dt,
        A_ptr=A,
        B_ptr=B,
        C_ptr=C,
        D_ptr=D if D is not None else A,  # optional inputs: unread without their HAS_* flag
        z_ptr=z if z is not None else x,
        dt_bias_ptr=dt_bias if dt_bias is not None else A,
        state_ptr=state,
        idx_ptr=state_indices,
        cu_ptr=cu_seqlens,
        h0_ptr=h0_flags(has_initial_state, state_indices),
        out_ptr=out,
        h_ptr=h,
        headdim=headdim,
        dstate=dstate,
        heads_per_group=nheads // ngroups,
        pad_slot_id=kernel_pad_slot_id(pad_slot_id),
        num_rows=N,
        num_tokens=T,
        chunk_size=chunk_size,
        num_chunks=grid_size(T, chunk_size),
        **named_strides("x", x, "thp"),
        **named_strides("dt", dt, "th"),
        **named_strides("B", B, "tgs"),
        **named_strides("C", C, "tgs"),
        **named_strides("z", z, "thp"),
        **named_strides("s", state, "nhps"),
        **named_strides("o", out, "thp"),
        **named_strides("hc", h, "khps"),
        BLOCK_P=block_p,
        BLOCK_S=block_s,
        HAS_D=D is not None,
        HAS_Z=z is not None,
        HAS_DT_BIAS=dt_bias is not None,
        DT_SOFTPLUS=bool(dt_softplus),
        HAS_H0_FLAG=has_initial_state is not None,
        STORE_H=chunk_states is not None,
    )
