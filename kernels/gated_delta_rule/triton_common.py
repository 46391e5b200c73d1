"""Pieces shared by the two gated-delta-rule Triton kernels (``triton_recurrent.py``, ``triton_chunked.py``).

Both run one program per (sequence n, value head hv, V-block), keep a K x BV float32 tile of the state in
registers and follow the same row protocol: read the row's tokens and slot, load the tile (zeros for a
skipped row or one without initial state), walk the tokens, zero the tokens past the last row, store the
tile back. The ``@triton.jit`` helpers below are that protocol; the host helpers prepare its arguments.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def row_tokens_and_slot(cu_ptr, idx_ptr, n, pad_slot_id):
    """Row n's tokens [bos, eos), its slot and whether it is live under the padding rule (pad_slot_id=None
    arrives as -1). A skipped row's slot reads as 0, which keeps masked-off addresses inside the pool."""
    bos = tl.load(cu_ptr + n).to(tl.int64)
    eos = tl.load(cu_ptr + n + 1).to(tl.int64)
    slot = tl.load(idx_ptr + n).to(tl.int64)
    live = slot > pad_slot_id
    slot = tl.where(live, slot, 0)
    return bos, eos, slot, live


@triton.jit
def load_state_tile(s_ptrs, h0_ptr, n, live, offs_k, mask_v, K: tl.constexpr, HAS_H0_FLAG: tl.constexpr):
    """The [BK, BV] state tile at ``s_ptrs`` in float32: zeros for a skipped row and for a row whose
    has_initial_state flag is 0."""
    read = live
    if HAS_H0_FLAG:
        read = read & (tl.load(h0_ptr + n) != 0)
    # Scalar conditions are folded into the K bound (a block mask is never and-ed with a scalar: the
    # interpreter mis-types that broadcast, and a bound is as cheap on hardware).
    mask_read = (offs_k < tl.where(read, K, 0))[:, None] & mask_v[None, :]
    return tl.load(s_ptrs, mask=mask_read, other=0.0).to(tl.float32)


@triton.jit
def store_state_tile(s_ptrs, S, live, bos, eos, offs_k, mask_v, K: tl.constexpr):
    """Write the final tile back to the slot it came from; skipped and zero-length rows write nothing
    (their slot stays bitwise unchanged)."""
    mask_write = (offs_k < tl.where(live & (eos > bos), K, 0))[:, None] & mask_v[None, :]
    tl.store(s_ptrs, S.to(s_ptrs.dtype.element_ty), mask=mask_write)


@triton.jit
def zero_tail_tokens(
    out_ptr, n, num_rows, eos, num_tokens, hv, offs_v, mask_v, stride_o_t, stride_o_h, BV: tl.constexpr
):
    """Tokens past the last row (a graph bucket's padding) belong to no row: the last row zeroes them."""
    if n == num_rows - 1:
        for t in range(eos, num_tokens):
            tl.store(
                out_ptr + t * stride_o_t + hv * stride_o_h + offs_v,
                tl.zeros([BV], tl.float32).to(out_ptr.dtype.element_ty),
                mask=mask_v,
            )


@triton.jit
def l2norm(x, AXIS: tl.constexpr):
    """x / sqrt(sum(x^2) + 1e-6) along AXIS (reference.l2norm, eps inside the root)."""
    return x / tl.sqrt(tl.sum(x * x, axis=AXIS, keep_dims=True) + 1e-6)


def kernel_pad_slot_id(pad_slot_id: int | None) -> int:
    """The kernels skip rows with slot <= this; None (skip nothing) becomes -1: slots are never negative."""
    return -1 if pad_slot_id is None else int(pad_slot_id)


def h0_flags(has_initial_state: torch.Tensor | None, state_indices: torch.Tensor) -> torch.Tensor:
    """has_initial_state as int8 (bool pointers are a portability risk); without it, any int tensor stands
    in for the pointer (HAS_H0_FLAG=False never reads it)."""
    return has_initial_state.to(torch.int8) if has_initial_state is not None else state_indices


def token_strides(**tensors: torch.Tensor) -> dict[str, int]:
    """Strides of the first two dims (token, head) of each tensor, as the kernels' keyword arguments:
    ``token_strides(q=q)`` is ``{"stride_q_t": ..., "stride_q_h": ...}`` (the last dim must be contiguous)."""
    return {f"stride_{name}_{d}": t.stride(i) for name, t in tensors.items() for i, d in enumerate("th")}
