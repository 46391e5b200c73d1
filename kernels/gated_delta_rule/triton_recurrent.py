"""Triton kernel: gated delta rule recurrence over a state pool (decode, target-verify, short extends).

One program per (sequence n, value head hv, V-block). The program keeps its K x BV tile of the state in
registers (float32), walks its sequence token by token, and writes the tile back once. Columns of the state
are independent in this recurrence (S^T k, the rank-1 update and S^T q act per column), which is why a
V-block split needs no communication between programs.

KDA (``PER_CHANNEL_GATE``): the gate is a [K] vector per token and head (``gk``, read through ``g_ptr``); the
decay scales row c of the tile by exp(gk[c]) instead of the whole tile by exp(g). Rows are split across no
programs (every program holds all K rows), so this too needs no communication.

State layout: the kernel addresses state element (k, v) as ``k * stride_s_k + v * stride_s_v`` (and the
intermediate states likewise); the launcher passes the strides of the pool's K-first view
(``kernels.conventions.layout_view``), so one kernel reads both layouts: k_first has ``stride_s_v == 1``,
v_first ``stride_s_k == 1`` and ``stride_s_v == K`` (a program's tile is then BV contiguous runs of K).

Tree verify (``IS_TREE``, sglang's topk > 1 drafts): a row's tokens are the nodes of a draft tree, node t
starting from the state after its parent node ``retrieve_parent_token[n, t]``. Before each node t >= 1 the
program reloads its tile from the intermediate buffer at step parent, where it stored that node's state
(float32: a chain's reload is what it holds, bit for bit); node 0 starts from the slot tile as a chain does.
A ``tl.debug_barrier`` comes first: the threads that stored the parent's tile need not be those that load it.
Without IS_TREE none of this is compiled.

Portability (see NOTES.md): only masked tl.load / tl.store on pointer arithmetic, tl.sum / tl.where /
tl.exp / tl.log, a dynamic `for` over the sequence's tokens and scalar branches on constexpr flags. No
block pointers, no libdevice, no inline asm, no atomics. bf16 inputs are upcast to float32 on load.
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

# Threads per program when the caller does not say (4 warps on NVIDIA); the GPU bench sweeps it.
DEFAULT_NUM_WARPS = 4


@triton.jit
def _gdn_recurrent_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,  # g [T, HV]; gk [T, HV, K] when PER_CHANNEL_GATE; the gate logits `a` when FUSED_GATING
    b_ptr,  # beta [T, HV], or the logits `b` when FUSED_GATING
    A_log_ptr,
    dt_bias_ptr,
    state_ptr,
    idx_ptr,
    cu_ptr,
    h0_ptr,
    out_ptr,
    inter_ptr,
    parent_ptr,  # retrieve_parent_token [N, D'] when IS_TREE
    scale,
    pad_slot_id,
    num_rows,
    num_tokens,
    softplus_beta,
    softplus_threshold,
    inter_depth,
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
    stride_i_n,
    stride_i_d,
    stride_i_h,
    stride_i_k,
    stride_i_v,
    stride_p_n,
    stride_p_t,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GROUP: tl.constexpr,  # HV // H: value heads per q/k head
    USE_L2NORM: tl.constexpr,
    FUSED_GATING: tl.constexpr,
    PER_CHANNEL_GATE: tl.constexpr,  # KDA: g_ptr holds gk [T, HV, K], its last dim contiguous
    HAS_H0_FLAG: tl.constexpr,
    STORE_FINAL: tl.constexpr,
    STORE_INTER: tl.constexpr,
    IS_TREE: tl.constexpr,  # a tree verify: node t >= 1 starts from its parent's stored state (needs STORE_INTER)
):
    n = tl.program_id(0)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    h = hv // GROUP

    bos, eos, slot, live = row_tokens_and_slot(cu_ptr, idx_ptr, n, pad_slot_id)
    offs_k = tl.arange(0, BK)
    offs_v = iv * BV + tl.arange(0, BV)
    mask_k = offs_k < K
    mask_v = offs_v < V
    s_ptrs = (
        state_ptr + slot * stride_s_n + hv * stride_s_h + offs_k[:, None] * stride_s_k + offs_v[None, :] * stride_s_v
    )
    S = load_state_tile(s_ptrs, h0_ptr, n, live, offs_k, mask_v, K, HAS_H0_FLAG)

    if FUSED_GATING:
        neg_A = -tl.exp(tl.load(A_log_ptr + hv).to(tl.float32))
        dt_bias = tl.load(dt_bias_ptr + hv).to(tl.float32)

    for t in range(bos, eos):
        if IS_TREE:
            step = t - bos
            # the parent's tile was stored by this program, but maybe by other threads: order it first
            tl.debug_barrier()
            parent = tl.load(parent_ptr + n.to(tl.int64) * stride_p_n + step * stride_p_t, mask=live, other=0)
            parent = parent.to(tl.int64)
            # an out-of-range parent (unvalidated on a device) reads zeros, never outside the row's steps
            p_lim = tl.where(live & (step > 0) & (parent >= 0) & (parent < step), K, 0)
            p_ptrs = (
                inter_ptr
                + n.to(tl.int64) * stride_i_n
                + parent * stride_i_d
                + hv * stride_i_h
                + offs_k[:, None] * stride_i_k
                + offs_v[None, :] * stride_i_v
            )
            S_parent = tl.load(p_ptrs, mask=(offs_k < p_lim)[:, None] & mask_v[None, :], other=0.0)
            S = tl.where(step > 0, S_parent.to(tl.float32), S)  # node 0 keeps the slot's tile
        b_q = tl.load(q_ptr + t * stride_q_t + h * stride_q_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        b_k = tl.load(k_ptr + t * stride_k_t + h * stride_k_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        b_v = tl.load(v_ptr + t * stride_v_t + hv * stride_v_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        beta = tl.load(b_ptr + t * stride_b_t + hv * stride_b_h).to(tl.float32)
        if PER_CHANNEL_GATE:
            # [BK, 1]: row c of the state decays by exp(gk[c]); padded channels (offs_k >= K) load 0, a
            # factor of 1 on rows that stay zero
            gk = tl.load(g_ptr + t * stride_g_t + hv * stride_g_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            decay = tl.exp(gk)[:, None]
        else:
            gate = tl.load(g_ptr + t * stride_g_t + hv * stride_g_h).to(tl.float32)
            if FUSED_GATING:
                # torch softplus: x above threshold/beta, else log(1 + exp(beta x)) / beta
                x = gate + dt_bias
                bx = softplus_beta * x
                soft = tl.log(1.0 + tl.exp(tl.minimum(bx, softplus_threshold))) / softplus_beta
                gate = neg_A * tl.where(bx > softplus_threshold, x, soft)
                beta = 1.0 / (1.0 + tl.exp(-beta))
            decay = tl.exp(gate)
        if USE_L2NORM:
            b_q, b_k = l2norm(b_q, 0), l2norm(b_k, 0)
        b_q = b_q * scale

        S = S * decay
        u = beta * (b_v - tl.sum(S * b_k[:, None], axis=0))  # [BV]
        S = S + b_k[:, None] * u[None, :]
        o = tl.sum(S * b_q[:, None], axis=0)
        o = tl.where(live, o, 0.0)  # skipped rows: deterministic zeros
        tl.store(
            out_ptr + t * stride_o_t + hv * stride_o_h + offs_v,
            o.to(out_ptr.dtype.element_ty),
            mask=mask_v,
        )
        if STORE_INTER:
            step = t - bos
            i_ptrs = (
                inter_ptr
                + n.to(tl.int64) * stride_i_n
                + step * stride_i_d
                + hv * stride_i_h
                + offs_k[:, None] * stride_i_k
                + offs_v[None, :] * stride_i_v
            )
            k_lim = tl.where(live & (step < inter_depth), K, 0)
            mask_i = (offs_k < k_lim)[:, None] & mask_v[None, :]
            tl.store(i_ptrs, S.to(inter_ptr.dtype.element_ty), mask=mask_i)

    zero_tail_tokens(out_ptr, n, num_rows, eos, num_tokens, hv, offs_v, mask_v, stride_o_t, stride_o_h, BV)
    if STORE_FINAL:
        store_state_tile(s_ptrs, S, live, bos, eos, offs_k, mask_v, K)


def _block_v(V: int, block_v: int | None) -> int:
    if block_v is not None:
        return block_v
    # 32 columns x K rows of fp32 per program: enough programs at small batch, few registers at K=128.
    return min(triton.next_power_of_2(V), 32)


def launch_recurrent(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    use_qk_l2norm: bool,
    has_initial_state: torch.Tensor | None,
    intermediate_states: torch.Tensor | None,
    disable_state_update: bool,
    pad_slot_id: int | None,
    g: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    a: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    state_layout: str = DEFAULT_STATE_LAYOUT,
    retrieve_parent_token: torch.Tensor | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> object:
    """Launch the kernel on validated tensors (see ops.py). Last dims of q, k, v, out must be contiguous.
    ``state`` and ``intermediate_states`` are laid out as ``state_layout`` says: the kernel gets the strides of
    their K-first views. ``retrieve_parent_token`` [N, D'] int (with ``intermediate_states`` and
    ``disable_state_update``): a tree verify (see the module docstring).

    With ``A_log`` given, the gates are computed in the kernel from the logits ``a``, ``b`` and ``A_log``,
    ``dt_bias`` (``g`` and ``beta`` are then None); otherwise ``g`` and ``beta`` are read as they are, or
    ``gk`` [T, HV, K] (last dim contiguous) and ``beta`` for the per-channel gate (KDA).
    ``block_v`` / ``num_warps`` override the defaults (the GPU benchmark sweeps them).
    Returns the launch's compiled kernel (None in the interpreter), for its ``n_regs`` / ``n_spills``.
    """
    N = state_indices.shape[0]
    H, K = q.shape[1], q.shape[2]
    HV, V = v.shape[1], v.shape[2]
    if N == 0:
        out.zero_()  # no row owns any token
        return None
    fused = A_log is not None
    per_channel = gk is not None
    gate, gate_b = (a, b) if fused else (gk if per_channel else g, beta)
    if gate is None or gate_b is None or (fused and per_channel):
        raise ValueError("launch_recurrent: give g and beta, gk and beta, or a, b, A_log and dt_bias")
    state_kv = layout_view(state, state_layout, "k_first")  # [num_slots, HV, K, V] view: strides only
    inter = None if intermediate_states is None else layout_view(intermediate_states, state_layout, "k_first")
    tree = retrieve_parent_token is not None
    if tree and (inter is None or not disable_state_update):
        raise ValueError("launch_recurrent: a tree verify needs intermediate_states and disable_state_update")
    grid = (N, HV, triton.cdiv(V, _block_v(V, block_v)))
    return _gdn_recurrent_kernel[grid](
        q_ptr=q,
        k_ptr=k,
        v_ptr=v,
        g_ptr=gate,
        b_ptr=gate_b,
        A_log_ptr=A_log if fused else gate,  # unread without FUSED_GATING
        dt_bias_ptr=dt_bias if fused else gate,
        state_ptr=state,
        idx_ptr=state_indices,
        cu_ptr=cu_seqlens,
        h0_ptr=h0_flags(has_initial_state, state_indices),
        out_ptr=out,
        inter_ptr=inter if inter is not None else state,  # unwritten without STORE_INTER
        parent_ptr=retrieve_parent_token if tree else state_indices,  # unread without IS_TREE
        scale=float(scale),
        pad_slot_id=kernel_pad_slot_id(pad_slot_id),
        num_rows=N,
        num_tokens=q.shape[0],
        softplus_beta=float(softplus_beta),
        softplus_threshold=float(softplus_threshold),
        inter_depth=inter.shape[1] if inter is not None else 0,
        **token_strides(q=q, k=k, v=v, g=gate, b=gate_b, o=out),
        **named_strides("s", state_kv, "nhkv"),
        **named_strides("i", inter, "ndhkv"),
        **named_strides("p", retrieve_parent_token, "nt"),
        K=K,
        V=V,
        BK=triton.next_power_of_2(K),
        BV=_block_v(V, block_v),
        GROUP=HV // H,
        USE_L2NORM=use_qk_l2norm,
        FUSED_GATING=fused,
        PER_CHANNEL_GATE=per_channel,
        HAS_H0_FLAG=has_initial_state is not None,
        STORE_FINAL=not disable_state_update,
        STORE_INTER=inter is not None,
        IS_TREE=tree,
        num_warps=num_warps or DEFAULT_NUM_WARPS,
    )


@triton.jit
def _scatter_accepted_kernel(
    state_ptr,
    inter_ptr,
    idx_ptr,
    acc_ptr,
    pad_slot_id,
    step_offset,
    depth,
    stride_s_n,
    stride_s_h,
    stride_i_n,
    stride_i_d,
    stride_i_h,
    KV: tl.constexpr,  # K * V elements per head, contiguous in both tensors
    BLOCK: tl.constexpr,
):
    n = tl.program_id(0)
    hv = tl.program_id(1)
    ib = tl.program_id(2)
    slot = tl.load(idx_ptr + n).to(tl.int64)
    # the step to commit: num_accepted - 1 (step_offset 1) or accepted_steps itself (step_offset 0)
    step = tl.load(acc_ptr + n).to(tl.int64) - step_offset
    # an out-of-range step (unvalidated on accelerators) writes nothing rather than garbage
    ok = (slot > pad_slot_id) & (step >= 0) & (step < depth)
    slot = tl.where(ok, slot, 0)
    step = tl.where(ok, step, 0)
    offs = ib * BLOCK + tl.arange(0, BLOCK)
    m = offs < tl.where(ok, KV, 0)  # scalar condition folded into the bound
    src = inter_ptr + n.to(tl.int64) * stride_i_n + step * stride_i_d + hv * stride_i_h + offs
    x = tl.load(src, mask=m, other=0.0)
    tl.store(state_ptr + slot * stride_s_n + hv * stride_s_h + offs, x.to(state_ptr.dtype.element_ty), mask=m)


def launch_scatter_accepted(
    *,
    state: torch.Tensor,
    intermediate_states: torch.Tensor,
    state_indices: torch.Tensor,
    pad_slot_id: int | None,
    num_accepted: torch.Tensor | None = None,
    accepted_steps: torch.Tensor | None = None,
    state_layout: str = DEFAULT_STATE_LAYOUT,
    block: int = 1024,
) -> object:
    """Copy intermediate_states[n, step] to state[state_indices[n]] for live rows, sync-free, where step is
    num_accepted[n] - 1 or accepted_steps[n] (exactly one given).

    The last two dims (K, V) of both tensors must be contiguous (checked by ops.py). Both are laid out as
    ``state_layout`` says, the same layout: a head's K * V elements are copied as they lie, so the layout
    changes nothing here."""
    del state_layout  # the same layout on both sides: a flat copy
    if (num_accepted is None) == (accepted_steps is None):
        raise ValueError("launch_scatter_accepted: give exactly one of num_accepted and accepted_steps")
    N, D, HV = intermediate_states.shape[:3]
    if N == 0:
        return None
    KV = intermediate_states.shape[3] * intermediate_states.shape[4]
    BLOCK = min(block, triton.next_power_of_2(KV))
    return _scatter_accepted_kernel[(N, HV, triton.cdiv(KV, BLOCK))](
        state_ptr=state,
        inter_ptr=intermediate_states,
        idx_ptr=state_indices,
        acc_ptr=num_accepted if num_accepted is not None else accepted_steps,
        pad_slot_id=kernel_pad_slot_id(pad_slot_id),
        step_offset=1 if num_accepted is not None else 0,
        depth=D,
        **named_strides("s", state, "nh"),
        **named_strides("i", intermediate_states, "ndh"),
        KV=KV,
        BLOCK=BLOCK,
    )
