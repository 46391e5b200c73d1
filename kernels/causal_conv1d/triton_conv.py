"""Triton kernel of the short causal convolution: one kernel serves decode/verify and varlen prefill.

Grid ``(rows, cdiv(dim, BLOCK_D))``: a program owns one row (sequence) and a block of channels, and
walks that row's tokens in order. The convolution input of a row is the sequence
``ext = [W-1 stored inputs, the row's tokens]``; the window of step ``t`` is ``ext[t : t+W]`` and the
state left behind is ``ext[len : len+W-1]``. Every element of ``ext`` is loaded straight from memory
(``_ext_at``), the state from its slot, the tokens from ``x``, instead of shifting a window held in
registers. That costs W cached loads per output but keeps each channel's loads and stores in the same
lanes, in program order, so the final state can be written over the slot that was read without a
barrier between reading and writing, and it works for any constexpr width ``W``.

Tree verify (``IS_TREE``, sglang's topk > 1 drafts): node t >= 1 of a row convolves its parent node's
window, read back from the intermediate windows the program stored at step ``retrieve_parent_token[n, t]``,
with x_t appended; node 0 reads the slot as a chain's step 0 does. A ``tl.debug_barrier`` orders each
node's reads after the earlier nodes' stores. Without IS_TREE none of this is compiled.

Computation is float32 whatever the storage dtype (bf16 arithmetic is wrong in Triton's interpreter).
Only masked ``tl.load``/``tl.store``, ``tl.exp`` and plain control flow are used, so that triton-ascend
could compile it; that has not been tried without Ascend hardware.

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
def _ext_at(state_cols, x_chans, p, zero, state_ok, c_mask, stride_s_w, stride_x_t, W: tl.constexpr):
    """Element ``p`` of ``ext`` (float32, one per channel): a stored input if p < W-1, else a token.

    ``state_cols``/``x_chans`` point at column 0 of the slot / token 0 of the row for every channel;
    ``state_ok`` is false where the row has no initial state, which then reads as zeros.
    """
    # (p + zero) makes the predicate a vector: the interpreter's range yields Python ints, and it gives
    # a scalar bool broadcast into a mask the wrong dtype.
    in_state = (p + zero) < W - 1
    from_state = tl.load(state_cols + p * stride_s_w, mask=state_ok & in_state, other=0.0)
    from_x = tl.load(x_chans + (p - (W - 1)) * stride_x_t, mask=c_mask & (p + zero >= W - 1), other=0.0)
    return tl.where(in_state, from_state.to(tl.float32), from_x.to(tl.float32))


@triton.jit
def _causal_conv1d_kernel(
    x_ptr,
    weight_ptr,
    bias_ptr,
    state_ptr,
    indices_ptr,
    cu_seqlens_ptr,
    has_init_ptr,
    inter_ptr,
    out_ptr,
    parent_ptr,  # retrieve_parent_token [N, D'] when IS_TREE
    num_rows,
    num_tokens,
    dim,
    tokens_per_row,
    pad_slot_id,
    stride_x_n,
    stride_x_t,
    stride_x_d,
    stride_w_d,
    stride_w_w,
    stride_s_n,
    stride_s_d,
    stride_s_w,
    stride_i_n,
    stride_i_t,
    stride_i_d,
    stride_i_w,
    stride_o_n,
    stride_o_t,
    stride_o_d,
    stride_p_n,
    stride_p_t,
    W: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    HAS_PAD: tl.constexpr,
    VARLEN: tl.constexpr,
    HAS_INTER: tl.constexpr,
    UPDATE_STATE: tl.constexpr,
    IS_TREE: tl.constexpr,  # a tree verify (needs HAS_INTER, not UPDATE_STATE, not VARLEN)
):
    n = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    c_mask = c < dim
    # Row predicates are [BLOCK_D] vectors, not scalars: Triton's interpreter gives a scalar bool
    # broadcast into a mask the wrong dtype. Compiled, the vectors cost nothing.
    zero = 0 * c
    # varlen adds one program past the last row: it zeroes the tail tokens that no row owns.
    is_row = (n + zero) < num_rows

    if VARLEN:
        # Packed tokens: token t of this row is x[bos + t]; x is [T, dim] and stride_x_n is unused.
        bos = tl.load(cu_seqlens_ptr + n).to(tl.int64)
        eos = tl.load(cu_seqlens_ptr + n + 1, mask=n < num_rows, other=num_tokens).to(tl.int64)
        seq_len = eos - bos
        use_state = tl.load(has_init_ptr + n + zero, mask=is_row, other=0) != 0
        x_first = x_ptr + bos * stride_x_t
        out_first = out_ptr + bos * stride_o_t
    else:
        # x is [N, L, dim]: token t of row n is x[n, t].
        seq_len = tokens_per_row
        use_state = is_row
        x_first = x_ptr + n.to(tl.int64) * stride_x_n
        out_first = out_ptr + n.to(tl.int64) * stride_o_n

    slot = tl.load(indices_ptr + n, mask=n < num_rows, other=0).to(tl.int64)
    live = is_row
    if HAS_PAD:
        live = live & ((slot + zero) > pad_slot_id)
    use_state = use_state & live
    # Skipped rows never dereference their slot: every state access below is masked by `live`.
    state_cols = state_ptr + slot * stride_s_n + c * stride_s_d
    state_ok = c_mask & use_state
    x_chans = x_first + c * stride_x_d
    out_chans = out_first + c * stride_o_d
    w_chans = weight_ptr + c * stride_w_d

    if HAS_BIAS:
        bias = tl.load(bias_ptr + c, mask=c_mask, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BLOCK_D], dtype=tl.float32)

    for t in range(0, seq_len):
        # Window after step t (verify scratch, indexed by batch row) = the last W-1 inputs of step t.
        inter_chans = inter_ptr + n.to(tl.int64) * stride_i_n + t * stride_i_t + c * stride_i_d
        if IS_TREE:
            # node t >= 1: its parent's window, stored by this program (other threads maybe: barrier first)
            tl.debug_barrier()
            parent = tl.load(parent_ptr + n.to(tl.int64) * stride_p_n + t * stride_p_t).to(tl.int64)
            node = (t + zero) > 0
            # an out-of-range parent (unvalidated on a device) reads zeros, never outside the row's steps
            parent_ok = c_mask & live & node & ((parent + zero) >= 0) & ((parent + zero) < t)
            parent_chans = inter_ptr + n.to(tl.int64) * stride_i_n + parent * stride_i_t + c * stride_i_d
        acc = bias
        for j in tl.static_range(W):
            if IS_TREE and j < W - 1:
                # the W-1 older inputs: the parent's window (node t >= 1) or the slot's (node 0)
                from_parent = tl.load(parent_chans + j * stride_i_w, mask=parent_ok, other=0.0).to(tl.float32)
                from_slot = tl.load(state_cols + j * stride_s_w, mask=state_ok & ~node, other=0.0).to(tl.float32)
                v = tl.where(node, from_parent, from_slot)
            else:
                v = _ext_at(state_cols, x_chans, t + j, zero, state_ok, c_mask, stride_s_w, stride_x_t, W)
            acc += tl.load(w_chans + j * stride_w_w, mask=c_mask, other=0.0).to(tl.float32) * v
            if HAS_INTER and j >= 1:
                tl.store(inter_chans + (j - 1) * stride_i_w, v.to(inter_ptr.dtype.element_ty), mask=c_mask & live)
        if SILU:
            acc = acc * sigmoid(acc)
        acc = tl.where(live, acc, 0.0)  # skipped rows and tail tokens: zeros, never garbage
        tl.store(out_chans + t * stride_o_t, acc.to(out_ptr.dtype.element_ty), mask=c_mask)

    if UPDATE_STATE:
        # State left behind: ext[len : len+W-1]. Column j is read from column len+j > j (or from x)
        # before column j is written, and by the same lane, so writing in increasing j never clobbers
        # a value still to be read. A zero-length row keeps its slot as it was.
        keep = c_mask & live & ((seq_len + zero) > 0)
        for j in tl.static_range(W - 1):
            v = _ext_at(state_cols, x_chans, seq_len + j, zero, state_ok, c_mask, stride_s_w, stride_x_t, W)
            tl.store(state_cols + j * stride_s_w, v.to(state_ptr.dtype.element_ty), mask=keep)


def _block_d(dim: int) -> int:
    return min(triton.next_power_of_2(dim), 256)


def update_triton(
    *,
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state_indices: torch.Tensor,
    intermediate_conv_windows: torch.Tensor | None,
    out: torch.Tensor,
    activation: str | None,
    disable_state_update: bool,
    pad_slot_id: int | None,
    retrieve_parent_token: torch.Tensor | None = None,
) -> object:
    """Launch for decode/verify (chain, or a tree with ``retrieve_parent_token``); same arguments and shapes
    as ``reference.update_reference``.

    Returns the launch's compiled kernel (None in the interpreter), for its ``n_regs`` / ``n_spills``.
    """
    N, L, dim = x.shape
    if N == 0:
        return None
    inter = intermediate_conv_windows
    tree = retrieve_parent_token is not None
    if tree and (inter is None or not disable_state_update):
        raise ValueError("update_triton: a tree verify needs intermediate_conv_windows and disable_state_update")
    block_d = _block_d(dim)
    return _causal_conv1d_kernel[(N, triton.cdiv(dim, block_d))](
        x_ptr=x,
        weight_ptr=weight,
        bias_ptr=bias if bias is not None else x,  # unread without HAS_BIAS
        state_ptr=conv_state,
        indices_ptr=state_indices,
        cu_seqlens_ptr=state_indices,  # unread without VARLEN
        has_init_ptr=state_indices,  # unread without VARLEN
        inter_ptr=inter if inter is not None else x,  # unwritten without HAS_INTER
        out_ptr=out,
        parent_ptr=retrieve_parent_token if tree else state_indices,  # unread without IS_TREE
        num_rows=N,
        num_tokens=N * L,
        dim=dim,
        tokens_per_row=L,
        pad_slot_id=pad_slot_id if pad_slot_id is not None else 0,
        **named_strides("x", x, "ntd"),
        **named_strides("w", weight, "dw"),
        **named_strides("s", conv_state, "ndw"),
        **named_strides("i", inter, "ntdw"),
        **named_strides("o", out, "ntd"),
        **named_strides("p", retrieve_parent_token, "nt"),
        W=weight.shape[1],
        BLOCK_D=block_d,
        HAS_BIAS=bias is not None,
        SILU=activation == "silu",
        HAS_PAD=pad_slot_id is not None,
        VARLEN=False,
        HAS_INTER=inter is not None,
        UPDATE_STATE=not disable_state_update,
        IS_TREE=tree,
    )


def varlen_triton(
    *,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    out: torch.Tensor,
    activation: str | None,
    pad_slot_id: int | None,
) -> object:
    """Launch for varlen prefill; same arguments and shapes as ``reference.varlen_reference``."""
    T, dim = x.shape
    N = state_indices.shape[0]
    block_d = _block_d(dim)
    grid = (N + 1, triton.cdiv(dim, block_d))  # +1: the program that zeroes tokens after cu_seqlens[N]
    return _causal_conv1d_kernel[grid](
        x_ptr=x,
        weight_ptr=weight,
        bias_ptr=bias if bias is not None else x,
        state_ptr=conv_state,
        indices_ptr=state_indices,
        cu_seqlens_ptr=cu_seqlens,
        has_init_ptr=has_initial_state,
        inter_ptr=x,  # no intermediate windows in prefill
        out_ptr=out,
        parent_ptr=state_indices,  # no tree in prefill
        stride_p_n=0,
        stride_p_t=0,
        num_rows=N,
        num_tokens=T,
        dim=dim,
        tokens_per_row=0,
        pad_slot_id=pad_slot_id if pad_slot_id is not None else 0,
        stride_x_n=0,  # x is [T, dim]
        **named_strides("x", x, "td"),
        **named_strides("w", weight, "dw"),
        **named_strides("s", conv_state, "ndw"),
        **named_strides("i", None, "ntdw"),
        stride_o_n=0,  # out is [T, dim]
        **named_strides("o", out, "td"),
        W=weight.shape[1],
        BLOCK_D=block_d,
        HAS_BIAS=bias is not None,
        SILU=activation == "silu",
        HAS_PAD=pad_slot_id is not None,
        VARLEN=True,
        HAS_INTER=False,
        UPDATE_STATE=True,
        IS_TREE=False,
    )
