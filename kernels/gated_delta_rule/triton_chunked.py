"""Triton kernel: chunked (WY / UT-transform) gated delta rule for varlen prefill.

One program per (sequence n, value head hv, V-block) walks its sequence chunk by chunk, carrying the
K x BV state tile in registers. Per chunk of C tokens (G = in-chunk cumulative log-decay, see
reference.chunk_step for the derivation):

    A   = strictly-lower( beta_i (k_i . k_j) e^{G_i - G_j} )          [C, C]
    T   = (I + A)^{-1}                (forward substitution, C steps)
    U   = T (beta (V - e^G K S))                                        [C, BV]
    O   = e^G (Q S) + (causal(Q K^T) * e^{G_i - G_j}) U
    S  <- e^{G_last} S + (K * e^{G_last - G})^T U

KDA (``PER_CHANNEL_GATE``, gate gk [T, HV, K]): G is a [C, BK] cumulative sum per key channel, and every
e^G above acts per channel (see reference.chunk_step_per_channel):

    A_ij = beta_i sum_c k_i[c] k_j[c] e^{G_i[c] - G_j[c]}  (j < i),   P_ij = sum_c q_i[c] k_j[c] e^{G_i[c] - G_j[c]}
    U   = T (beta (V - (K * e^G) S)),   O = (Q * e^G) S + P U,   S <- diag(e^{G_last}) S + (K * e^{G_last - G})^T U

A and P cannot be one matmul each (the decay sits inside the channel sum): they are built row by row, each
row from the channel differences G_i - G_j masked to j <= i before exp (no e^{-G}, which overflows), in the
same loop as the forward substitution (row i of A is used at once, never stored). C rows of [C, BK] work:
fine for C = 16, the default.

This is the simplest correct single-kernel form: unlike fla it does not split the intra-chunk work into
separate kernels parallel over chunks, so it is sequential in the number of chunks. It is a correctness
kernel for the interpreter and a starting point on hardware, not a tuned prefill kernel.

The state is addressed through (stride_s_k, stride_s_v): the launcher passes the strides of the pool's K-first
view (``kernels.conventions.layout_view``), so the same kernel reads and writes k_first and v_first pools.

Matmuls use tl.dot with input_precision="ieee" (no TF32: the state recurrence amplifies rounding), which
needs every dot dimension >= 16: K and V blocks are padded to at least 16 with masks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._triton_helpers import named_strides
from kernels.conventions import DEFAULT_STATE_LAYOUT, layout_view
from kernels.gated_delta_rule.triton_common import (
    h0_flags,
    kernel_pad_slot_id,
    l2norm,
    load_state_tile,
    row_tokens_and_slot,
    store_state_tile,
    token_strides,
    zero_tail_tokens,
)

# Defaults chosen from the kernel's register report for sm_90a (Triton's own ptxas -v, offline:
# benchmarks/kernel_resources.py; K=V=128, bf16 inputs): the old default C=64, BV=64, 8 warps spilled about
# 41 KB per thread (stores); C=16 (ops.DEFAULT_CHUNK_SIZE), BV=16, 8 warps spills least of the configurations
# tried (372 B), none was spill-free. The GPU benchmark's --sweep measures the alternatives.
DEFAULT_NUM_WARPS = 8


def default_block_v(V: int) -> int:
    """Value columns per program: 16 (tl.dot needs >= 16; wider blocks spill more at K=128)."""
    return 16


@triton.jit
def _solve_unit_lower(A, offs_c, C: tl.constexpr):
    """(I + A)^{-1} for a strictly lower [C, C] A, row by row: T_i = e_i - sum_{j<i} A_ij T_j (rows j < i are
    final already)."""
    Tm = tl.where(offs_c[:, None] == offs_c[None, :], 1.0, 0.0)
    for i in range(1, C):
        a_i = tl.sum(tl.where(offs_c[:, None] == i, A, 0.0), axis=0)  # row i of A
        Tm = tl.where(offs_c[:, None] == i, Tm - tl.sum(a_i[:, None] * Tm, axis=0)[None, :], Tm)
    return Tm


# Both chunk helpers return, for one chunk of C tokens (q already scaled):
#   ks      [C, BV]  the state as each key reads it before its own update, decayed to the key's token
#   o       [C, BV]  the entering state as each query reads it, decayed (the intra-chunk part P U is added after)
#   P       [C, C]   causal intra-chunk query-key weights, decayed from token j to token i
#   S_kept  [BK, BV] the entering state decayed to the chunk's end
#   k_end   [C, BK]  the keys decayed from their token to the chunk's end
#   Tm      [C, C]   (I + A)^{-1}, A the strictly lower beta-weighted decayed key-key products


@triton.jit
def _scalar_chunk(b_q, b_k, b_g, b_beta, S, offs_c, C: tl.constexpr):
    """One decay factor per token (b_g [C]): A and P are one matmul each, masked and scaled."""
    causal = offs_c[:, None] >= offs_c[None, :]
    G = tl.cumsum(b_g, axis=0)  # [C]
    G_last = tl.sum(tl.where(offs_c == C - 1, G, 0.0), axis=0)
    decay = tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf")))  # 0 above the diagonal
    kk = tl.dot(b_k, tl.trans(b_k), input_precision="ieee")
    A = tl.where(offs_c[:, None] > offs_c[None, :], b_beta[:, None] * kk * decay, 0.0)
    eG = tl.exp(G)
    ks = eG[:, None] * tl.dot(b_k, S, input_precision="ieee")
    o = eG[:, None] * tl.dot(b_q, S, input_precision="ieee")
    qk = tl.dot(b_q, tl.trans(b_k), input_precision="ieee")
    P = tl.where(causal, qk * decay, 0.0)
    S_kept = tl.exp(G_last) * S
    k_end = b_k * tl.exp(G_last - G)[:, None]
    return ks, o, P, S_kept, k_end, _solve_unit_lower(A, offs_c, C)


@triton.jit
def _per_channel_chunk(b_q, b_k, b_g, b_beta, S, offs_c, C: tl.constexpr):
    """One decay factor per token and key channel (KDA, b_g [C, BK]): P and (I + A)^{-1} row by row (module
    docstring). Row i of A is needed only at step i of the forward substitution, so A is never stored."""
    G = tl.cumsum(b_g, axis=0)  # [C, BK], per channel
    G_last = tl.sum(tl.where(offs_c[:, None] == C - 1, G, 0.0), axis=0)  # [BK]
    P = tl.zeros([C, C], dtype=tl.float32)
    Tm = tl.where(offs_c[:, None] == offs_c[None, :], 1.0, 0.0)
    for i in range(0, C):
        row = offs_c[:, None] == i  # [C, 1]
        g_i = tl.sum(tl.where(row, G, 0.0), axis=0)  # [BK]
        k_i = tl.sum(tl.where(row, b_k, 0.0), axis=0)
        q_i = tl.sum(tl.where(row, b_q, 0.0), axis=0)
        beta_i = tl.sum(tl.where(offs_c == i, b_beta, 0.0), axis=0)
        # e^{G_i - G_j} per channel for j <= i; masked before exp, so j > i gives 0, never overflow
        k_dec = b_k * tl.exp(tl.where(offs_c[:, None] <= i, g_i[None, :] - G, float("-inf")))  # [C(j), BK]
        a_i = tl.where(offs_c < i, beta_i * tl.sum(k_dec * k_i[None, :], axis=1), 0.0)  # row i of A, [C(j)]
        P = tl.where(row, tl.sum(k_dec * q_i[None, :], axis=1)[None, :], P)
        # T_i = e_i - sum_{j<i} A_ij T_j (rows j < i are final already; row 0 of A is zero)
        Tm = tl.where(row, Tm - tl.sum(a_i[:, None] * Tm, axis=0)[None, :], Tm)
    eG = tl.exp(G)
    ks = tl.dot(b_k * eG, S, input_precision="ieee")
    o = tl.dot(b_q * eG, S, input_precision="ieee")
    S_kept = tl.exp(G_last)[:, None] * S
    k_end = b_k * tl.exp(G_last[None, :] - G)
    return ks, o, P, S_kept, k_end, Tm


@triton.jit
def _gdn_chunked_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    b_ptr,
    state_ptr,
    idx_ptr,
    cu_ptr,
    h0_ptr,
    out_ptr,
    scale,
    pad_slot_id,
    num_rows,
    num_tokens,
    stride_q_t,
    stride_q_h,
    stride_k_t,
    stride_k_h,
    stride_v_t,
    stride_v_h,
    stride_g_t,
    stride_g_h,
    stride_b_t,
    stride_b_h,
    stride_s_n,
    stride_s_h,
    stride_s_k,
    stride_s_v,
    stride_o_t,
    stride_o_h,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,
    GROUP: tl.constexpr,
    USE_L2NORM: tl.constexpr,
    PER_CHANNEL_GATE: tl.constexpr,  # KDA: g_ptr holds gk [T, HV, K], its last dim contiguous
    HAS_H0_FLAG: tl.constexpr,
    STORE_FINAL: tl.constexpr,
):
    n = tl.program_id(0)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    h = hv // GROUP

    bos, eos, slot, live = row_tokens_and_slot(cu_ptr, idx_ptr, n, pad_slot_id)
    offs_k = tl.arange(0, BK)
    offs_v = iv * BV + tl.arange(0, BV)
    offs_c = tl.arange(0, C)
    mask_k = offs_k < K
    mask_v = offs_v < V
    s_ptrs = (
        state_ptr + slot * stride_s_n + hv * stride_s_h + offs_k[:, None] * stride_s_k + offs_v[None, :] * stride_s_v
    )
    S = load_state_tile(s_ptrs, h0_ptr, n, live, offs_k, mask_v, K, HAS_H0_FLAG)

    for c0 in range(bos, eos, C):
        offs_t = c0 + offs_c
        mask_t = offs_t < eos
        m_tk = mask_t[:, None] & mask_k[None, :]
        # tokens past the end load as zeros (k = v = g = beta = 0): they add nothing and decay nothing
        b_q = tl.load(q_ptr + offs_t[:, None] * stride_q_t + h * stride_q_h + offs_k[None, :], mask=m_tk, other=0.0).to(
            tl.float32
        )
        b_k = tl.load(k_ptr + offs_t[:, None] * stride_k_t + h * stride_k_h + offs_k[None, :], mask=m_tk, other=0.0).to(
            tl.float32
        )
        b_v = tl.load(
            v_ptr + offs_t[:, None] * stride_v_t + hv * stride_v_h + offs_v[None, :],
            mask=mask_t[:, None] & mask_v[None, :],
            other=0.0,
        ).to(tl.float32)
        b_beta = tl.load(b_ptr + offs_t * stride_b_t + hv * stride_b_h, mask=mask_t, other=0.0).to(tl.float32)
        if USE_L2NORM:
            b_q, b_k = l2norm(b_q, 1), l2norm(b_k, 1)
        b_q = b_q * scale

        if PER_CHANNEL_GATE:
            b_g = tl.load(
                g_ptr + offs_t[:, None] * stride_g_t + hv * stride_g_h + offs_k[None, :], mask=m_tk, other=0.0
            ).to(tl.float32)
            ks, o, P, S_kept, k_end, Tm = _per_channel_chunk(b_q, b_k, b_g, b_beta, S, offs_c, C)
        else:
            b_g = tl.load(g_ptr + offs_t * stride_g_t + hv * stride_g_h, mask=mask_t, other=0.0).to(tl.float32)
            ks, o, P, S_kept, k_end, Tm = _scalar_chunk(b_q, b_k, b_g, b_beta, S, offs_c, C)
        U = tl.dot(Tm, b_beta[:, None] * (b_v - ks), input_precision="ieee")  # [C, BV]
        o += tl.dot(P, U, input_precision="ieee")
        o = tl.where(live, o, 0.0)
        tl.store(
            out_ptr + offs_t[:, None] * stride_o_t + hv * stride_o_h + offs_v[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=mask_t[:, None] & mask_v[None, :],
        )
        S = S_kept + tl.dot(tl.trans(k_end), U, input_precision="ieee")

    zero_tail_tokens(out_ptr, n, num_rows, eos, num_tokens, hv, offs_v, mask_v, stride_o_t, stride_o_h, BV)
    if STORE_FINAL:
        store_state_tile(s_ptrs, S, live, bos, eos, offs_k, mask_v, K)


def launch_chunked(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    use_qk_l2norm: bool,
    has_initial_state: torch.Tensor | None,
    disable_state_update: bool,
    pad_slot_id: int | None,
    chunk_size: int,
    state_layout: str = DEFAULT_STATE_LAYOUT,
    gk: torch.Tensor | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> object:
    """Launch on validated tensors (ops.py). chunk_size: power of two >= 16. The gate: ``g`` [T, HV], or
    ``gk`` [T, HV, K] per key channel (KDA; last dim contiguous; ``g`` then None). ``block_v`` / ``num_warps``
    override the defaults (``default_block_v``, ``DEFAULT_NUM_WARPS``). ``state`` is laid out as
    ``state_layout`` says: the kernel gets the strides of its K-first view.
    Returns the launch's compiled kernel (None in the interpreter), for its ``n_regs`` / ``n_spills``.
    """
    N = state_indices.shape[0]
    H, K = q.shape[1], q.shape[2]
    HV, V = v.shape[1], v.shape[2]
    if N == 0:
        out.zero_()  # no row owns any token
        return None
    BV = block_v or default_block_v(V)
    gate = gk if gk is not None else g
    if gate is None or (g is not None and gk is not None):
        raise ValueError("launch_chunked: give g or gk (with beta), not both")
    return _gdn_chunked_kernel[(N, HV, triton.cdiv(V, BV))](
        q_ptr=q,
        k_ptr=k,
        v_ptr=v,
        g_ptr=gate,
        b_ptr=beta,
        state_ptr=state,
        idx_ptr=state_indices,
        cu_ptr=cu_seqlens,
        h0_ptr=h0_flags(has_initial_state, state_indices),
        out_ptr=out,
        scale=float(scale),
        pad_slot_id=kernel_pad_slot_id(pad_slot_id),
        num_rows=N,
        num_tokens=q.shape[0],
        **token_strides(q=q, k=k, v=v, g=gate, b=beta, o=out),
        **named_strides("s", layout_view(state, state_layout, "k_first"), "nhkv"),
        K=K,
        V=V,
        BK=max(16, triton.next_power_of_2(K)),
        BV=BV,
        C=chunk_size,
        GROUP=HV // H,
        USE_L2NORM=use_qk_l2norm,
        PER_CHANNEL_GATE=gk is not None,
        HAS_H0_FLAG=has_initial_state is not None,
        STORE_FINAL=not disable_state_update,
        num_warps=num_warps or DEFAULT_NUM_WARPS,
    )
