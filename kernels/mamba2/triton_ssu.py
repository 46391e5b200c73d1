"""Triton kernel of Mamba2's selective state update (a decode step per row, or a verify's D steps).

Grid ``(cdiv(headdim, BLOCK_P), N, nheads)``: a program owns a ``[BLOCK_P, dstate]`` tile of one row's
head state, loads it, updates it elementwise once per step (storing each step's state into the verify's
intermediate buffer when given) and reduces over dstate for each step's output, then stores the tile back
to the same addresses unless the state update is disabled (each element is read and written by the same
lane, so no barrier is needed).
Tree verify (``IS_TREE``, sglang's topk > 1 drafts): before step t >= 1 the program reloads its tile from
the intermediate buffer at step ``retrieve_parent_token[n, t]``, where it stored that node's state (after a
``tl.debug_barrier``: the storing threads need not be the loading ones); step 0 starts from the slot. Without
IS_TREE none of this is compiled.
Inputs are read through their strides, so the "tied" layouts engines pass (A, dt, D, dt_bias expanded
from per-head scalars with stride 0) cost no copy.

Computation is float32 whatever the storage dtype. softplus and silu are written with ``tl.exp`` and
``tl.log`` (no libdevice). Only masked ``tl.load``/``tl.store`` are used, so that triton-ascend could
compile it; that has not been tried without Ascend hardware.

Ascend convention (``pad_slot_id=None``): every padded row points at the dummy slot 0 and is really
processed, so several programs read and write slot 0 at once, with no ordering between them. The race is
benign (nobody reads slot 0 as a request's state), but slot 0's contents after such a step depend on
scheduling. Never compare slot 0 (``kernels.testing.Case.check`` leaves the dummy slot out, on every
device, and so do the CPU tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._triton_helpers import named_strides, sigmoid


@triton.jit
def _softplus(v):
    """log(1 + exp(v)), linear above 20 as in mamba_ssm; log1p written out to stay accurate for v << 0."""
    u = tl.exp(-tl.abs(v))  # in (0, 1]: never overflows
    w = 1.0 + u
    # log1p(u) = log(w) * u / (w - 1) corrects the rounding of 1 + u; when w rounds to 1, log1p(u) = u.
    # The guarded denominator keeps the branch that tl.where discards free of a division by zero.
    log1p_u = tl.where(w == 1.0, u, tl.log(w) * (u / tl.where(w == 1.0, 1.0, w - 1.0)))
    return tl.where(v > 20.0, v, tl.maximum(v, 0.0) + log1p_u)


@triton.jit
def _selective_state_update_kernel(
    state_ptr,
    x_ptr,
    dt_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    z_ptr,
    dt_bias_ptr,
    indices_ptr,
    out_ptr,
    inter_ptr,
    parent_ptr,  # retrieve_parent_token [N, D'] when IS_TREE
    num_steps,
    headdim,
    dstate,
    heads_per_group,
    pad_slot_id,
    stride_s_n,
    stride_s_h,
    stride_s_p,
    stride_s_s,
    stride_x_n,
    stride_x_l,
    stride_x_h,
    stride_x_p,
    stride_dt_n,
    stride_dt_l,
    stride_dt_h,
    stride_dt_p,
    stride_A_h,
    stride_A_p,
    stride_A_s,
    stride_B_n,
    stride_B_l,
    stride_B_g,
    stride_B_s,
    stride_C_n,
    stride_C_l,
    stride_C_g,
    stride_C_s,
    stride_D_h,
    stride_D_p,
    stride_z_n,
    stride_z_l,
    stride_z_h,
    stride_z_p,
    stride_db_h,
    stride_db_p,
    stride_o_n,
    stride_o_l,
    stride_o_h,
    stride_o_p,
    stride_i_n,
    stride_i_l,
    stride_i_h,
    stride_i_p,
    stride_i_s,
    stride_p_n,
    stride_p_t,
    BLOCK_P: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr,
    HAS_PAD: tl.constexpr,
    STORE_INTER: tl.constexpr,
    STORE_STATE: tl.constexpr,
    IS_TREE: tl.constexpr,  # a tree verify (needs STORE_INTER, not STORE_STATE)
):
    pid_p = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2)
    g = h // heads_per_group

    p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    s = tl.arange(0, BLOCK_S)
    p_mask = p < headdim
    s_mask = s < dstate

    slot = tl.load(indices_ptr + n).to(tl.int64)
    # The row predicate is a vector (see causal_conv1d: the interpreter mis-types broadcast scalar bools).
    live = p_mask
    if HAS_PAD:
        live = live & ((slot + 0 * p) > pad_slot_id)
    tile_mask = live[:, None] & s_mask[None, :]

    A = tl.load(
        A_ptr + h * stride_A_h + p[:, None] * stride_A_p + s[None, :] * stride_A_s,
        mask=p_mask[:, None] & s_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    if HAS_DT_BIAS:
        dt_bias = tl.load(dt_bias_ptr + h * stride_db_h + p * stride_db_p, mask=p_mask, other=0.0).to(tl.float32)
    if HAS_D:
        D = tl.load(D_ptr + h * stride_D_h + p * stride_D_p, mask=p_mask, other=0.0).to(tl.float32)
    state_tile = state_ptr + slot * stride_s_n + h * stride_s_h + p[:, None] * stride_s_p + s[None, :] * stride_s_s
    S = tl.load(state_tile, mask=tile_mask, other=0.0).to(tl.float32)

    for t in range(num_steps):  # one token per row in decode; D of them in a verify
        if IS_TREE:
            tl.debug_barrier()  # the parent's tile was stored by this program, maybe by other threads
            parent = tl.load(parent_ptr + n * stride_p_n + t * stride_p_t).to(tl.int64)
            node = (t + 0 * p) > 0  # a vector, as `live`
            # an out-of-range parent (unvalidated on a device) reads zeros, never outside the row's steps
            from_parent = live & node & ((parent + 0 * p) >= 0) & ((parent + 0 * p) < t)
            p_tile = inter_ptr + n * stride_i_n + parent * stride_i_l + h * stride_i_h
            S_parent = tl.load(
                p_tile + p[:, None] * stride_i_p + s[None, :] * stride_i_s,
                mask=from_parent[:, None] & s_mask[None, :],
                other=0.0,
            ).to(tl.float32)
            S = tl.where(node[:, None], S_parent, S)  # step 0 keeps the slot's tile
        x = tl.load(x_ptr + n * stride_x_n + t * stride_x_l + h * stride_x_h + p * stride_x_p, mask=p_mask, other=0.0)
        x = x.to(tl.float32)
        dt = tl.load(
            dt_ptr + n * stride_dt_n + t * stride_dt_l + h * stride_dt_h + p * stride_dt_p, mask=p_mask, other=0.0
        ).to(tl.float32)
        if HAS_DT_BIAS:
            dt += dt_bias
        if DT_SOFTPLUS:
            dt = _softplus(dt)
        B = tl.load(
            B_ptr + n * stride_B_n + t * stride_B_l + g * stride_B_g + s * stride_B_s, mask=s_mask, other=0.0
        ).to(tl.float32)
        C = tl.load(
            C_ptr + n * stride_C_n + t * stride_C_l + g * stride_C_g + s * stride_C_s, mask=s_mask, other=0.0
        ).to(tl.float32)
        S = S * tl.exp(A * dt[:, None]) + (dt * x)[:, None] * B[None, :]
        if STORE_INTER:  # the state after step t, by batch row (not slot); skipped rows write nothing
            i_tile = inter_ptr + n * stride_i_n + t * stride_i_l + h * stride_i_h
            tl.store(i_tile + p[:, None] * stride_i_p + s[None, :] * stride_i_s, S, mask=tile_mask)

        y = tl.sum(S * C[None, :], axis=1)  # [BLOCK_P]
        if HAS_D:
            y += x * D
        if HAS_Z:
            z = tl.load(
                z_ptr + n * stride_z_n + t * stride_z_l + h * stride_z_h + p * stride_z_p, mask=p_mask, other=0.0
            ).to(tl.float32)
            y = y * (z * sigmoid(z))
        y = tl.where(live, y, 0.0)  # skipped rows: zeros, never garbage
        tl.store(
            out_ptr + n * stride_o_n + t * stride_o_l + h * stride_o_h + p * stride_o_p,
            y.to(out_ptr.dtype.element_ty),
            mask=p_mask,
        )
    if STORE_STATE:  # each element is read and written by the same lane: no barrier needed
        tl.store(state_tile, S.to(state_ptr.dtype.element_ty), mask=tile_mask)


def selective_state_update_triton(
    *,
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
    intermediate_states: torch.Tensor | None = None,
    disable_state_update: bool = False,
    retrieve_parent_token: torch.Tensor | None = None,
) -> object:
    """Launch; same arguments and shapes as ``reference.selective_state_update_reference``.

    Returns the launch's compiled kernel (None in the interpreter), for its ``n_regs`` / ``n_spills``.
    """
    if x.dim() == 3:  # decode: one step per row, given the step axis as a view
        x, dt, B, C, out = (t.unsqueeze(1) for t in (x, dt, B, C, out))
        z = z.unsqueeze(1) if z is not None else None
    N, L, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    if N == 0:
        return None
    tree = retrieve_parent_token is not None
    if tree and (intermediate_states is None or not disable_state_update):
        raise ValueError("selective_state_update_triton: a tree verify needs intermediate_states, no state update")
    block_s = triton.next_power_of_2(dstate)
    # At most 4096 state elements per program: the tile, A and the decay all live in registers.
    block_p = max(1, min(triton.next_power_of_2(headdim), 4096 // block_s))
    return _selective_state_update_kernel[(triton.cdiv(headdim, block_p), N, nheads)](
        state_ptr=state,
        x_ptr=x,
        dt_ptr=dt,
        A_ptr=A,
        B_ptr=B,
        C_ptr=C,
        D_ptr=D if D is not None else x,  # optional inputs: unread without their HAS_* flag
        z_ptr=z if z is not None else x,
        dt_bias_ptr=dt_bias if dt_bias is not None else x,
        indices_ptr=state_indices,
        out_ptr=out,
        inter_ptr=intermediate_states if intermediate_states is not None else state,
        parent_ptr=retrieve_parent_token if tree else state_indices,  # unread without IS_TREE
        num_steps=L,
        headdim=headdim,
        dstate=dstate,
        heads_per_group=nheads // ngroups,
        pad_slot_id=pad_slot_id if pad_slot_id is not None else 0,
        **named_strides("s", state, "nhps"),
        **named_strides("x", x, "nlhp"),
        **named_strides("dt", dt, "nlhp"),
        **named_strides("A", A, "hps"),
        **named_strides("B", B, "nlgs"),
        **named_strides("C", C, "nlgs"),
        **named_strides("D", D, "hp"),
        **named_strides("z", z, "nlhp"),
        **named_strides("db", dt_bias, "hp"),
        **named_strides("o", out, "nlhp"),
        **named_strides("i", intermediate_states, "nlhps"),
        **named_strides("p", retrieve_parent_token, "nt"),
        BLOCK_P=block_p,
        BLOCK_S=block_s,
        HAS_D=D is not None,
        HAS_Z=z is not None,
        HAS_DT_BIAS=dt_bias is not None,
        DT_SOFTPLUS=bool(dt_softplus),
        HAS_PAD=pad_slot_id is not None,
        STORE_INTER=intermediate_states is not None,
        STORE_STATE=not disable_state_update,
        IS_TREE=tree,
    )
