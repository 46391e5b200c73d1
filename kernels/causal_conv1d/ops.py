"""Public entry points of the short causal convolution, and their ``linattn::`` custom ops.

Each public function validates shapes, dtypes and devices (never values: that would read device memory
and synchronise the host, which a graph capture forbids), allocates ``out`` when it is None, and calls
ONE custom op. The custom op is what a ``TorchDispatchMode`` (the CPU graph recorder) sees: one op per
kernel call, whatever the implementation runs inside.
"""

from __future__ import annotations

import torch

from kernels.checks import ArgChecker, value_checks
from kernels.dispatch import call_op, implementation, inplace_custom_op
from kernels.dtypes import FLOAT_DTYPES, INDEX_DTYPES
from kernels.padding import skipped_rows

from .reference import update_reference, varlen_reference

ACTIVATIONS = (None, "silu")


@inplace_custom_op("linattn::causal_conv1d_update", mutates_args=("conv_state", "intermediate_conv_windows", "out"))
def _update_op(
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
    impl: str,
    retrieve_parent_token: torch.Tensor | None = None,  # last, with a default: positional callers keep working
) -> None:
    run = implementation(impl, reference=update_reference, triton="kernels.causal_conv1d.triton_conv:update_triton")
    run(
        x=x,
        conv_state=conv_state,
        weight=weight,
        bias=bias,
        state_indices=state_indices,
        intermediate_conv_windows=intermediate_conv_windows,
        retrieve_parent_token=retrieve_parent_token,
        out=out,
        activation=activation,
        disable_state_update=disable_state_update,
        pad_slot_id=pad_slot_id,
    )


@inplace_custom_op("linattn::causal_conv1d_varlen", mutates_args=("conv_state", "out"))
def _varlen_op(
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
    impl: str,
) -> None:
    run = implementation(impl, reference=varlen_reference, triton="kernels.causal_conv1d.triton_conv:varlen_triton")
    run(
        x=x,
        weight=weight,
        bias=bias,
        conv_state=conv_state,
        state_indices=state_indices,
        has_initial_state=has_initial_state,
        cu_seqlens=cu_seqlens,
        out=out,
        activation=activation,
        pad_slot_id=pad_slot_id,
    )


# --- validation (metadata only: shape, dtype, device) -------------------------------------------


def _check_common(
    check: ArgChecker,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    dim: int,
    activation: str | None,
    pad_slot_id: int | None,
) -> int:
    """Checks shared by both entry points; returns the kernel width W."""
    check.layout("weight", weight, "a 2-D tensor [dim, W]", 2)
    W = weight.shape[1]
    check.require(W >= 2, f"kernel width W = weight.shape[1] must be >= 2, got {W}")
    check.tensor("weight", weight, (dim, W), FLOAT_DTYPES, x.device)
    if bias is not None:
        check.tensor("bias", bias, (dim,), FLOAT_DTYPES, x.device)
    check.pool("conv_state", conv_state, "[num_slots, dim, W-1]", (dim, W - 1), FLOAT_DTYPES, x.device)
    check.require(activation in ACTIVATIONS, f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    check.pad_slot_id(pad_slot_id)
    return W


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        pa, pb = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # fake/meta tensors have no memory to share
        return False
    return pa != 0 and pa == pb


def _out(check: ArgChecker, out: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """``out`` checked, or allocated like x when None."""
    if out is None:
        return torch.empty_like(x)
    check.tensor("out", out, x.shape, FLOAT_DTYPES, x.device)
    # The kernels read a row's earlier tokens after writing its outputs: out must not share x's memory.
    check.require(
        not _shares_storage(out, x), "out must not share memory with x (in-place convolution is not supported)"
    )
    return out


# --- public API ---------------------------------------------------------------------------------


def update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    state_indices: torch.Tensor,
    activation: str | None = None,
    intermediate_conv_windows: torch.Tensor | None = None,
    disable_state_update: bool = False,
    pad_slot_id: int | None = -1,
    out: torch.Tensor | None = None,
    retrieve_parent_token: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Causal conv1d step for decode (``L == 1``) and speculative target-verify (``L == D``), chain or tree.

    Args:
        x: [N, L, dim] float (fp16/bf16/fp32/fp64), channels last; row ``n`` has L new tokens.
        conv_state: [num_slots, dim, W-1] float pool, oldest stored input in column 0. Updated in place.
        weight: [dim, W]; ``weight[c, W-1]`` multiplies the newest input.
        bias: [dim] or None.
        state_indices: [N] int32/int64, the slot of each row; rows skipped per ``pad_slot_id``
            (``kernels.padding``) read and write no slot and get zero outputs.
        activation: None or "silu".
        intermediate_conv_windows: [N, L, dim, W-1] or None; receives, by batch row, the window after
            each step (what the state would be had the row accepted exactly t+1 tokens).
        disable_state_update: leave ``conv_state`` untouched (verify keeps the pool until acceptance).
        retrieve_parent_token: [N, D'] int32/int64 (D' >= L) or None: a tree verify (sglang's topk > 1
            drafts). Row n's L tokens are the nodes of a draft tree in topological order; node t >= 1 convolves
            over its ancestors' inputs: the window of node ``retrieve_parent_token[n, t]`` (in 0..t-1), read
            back from ``intermediate_conv_windows[n, parent]``, shifted by one, with x[n, t] appended; node 0
            over the slot's window as a chain. ``intermediate_conv_windows[n, t]`` gets node t's window, as a
            chain's. Needs ``intermediate_conv_windows`` and ``disable_state_update=True``; a chain
            (``parent[t] = t - 1``) gives the chain verify's results bit for bit. ``[n, 0]`` is ignored;
            parents are range-checked on CPU tensors only (on a device an out-of-range parent reads zeros).
        pad_slot_id: the padding sentinel; None processes every row.
        out: [N, L, dim] float, written in full; allocated like x when None. Must not alias x.
        impl: "auto" | "reference" | "triton" (see ``kernels.dispatch.resolve_impl``).

    Returns:
        out: ``y[n, t, c] = act(bias[c] + sum_j weight[c, j] * window[c, j])`` where the window is the
        W-1 stored inputs followed by the inputs up to token t.
    """
    check = ArgChecker("causal_conv1d.update", device_of="x")
    check.leading("x", x, "[N, L, dim] (decode: x.unsqueeze(1))", 3)
    N, L, dim = x.shape
    check.require(L >= 1, f"x must have at least one token per row (L >= 1), got L={L}")
    W = _check_common(check, x, weight, bias, conv_state, dim, activation, pad_slot_id)
    check.tensor("state_indices", state_indices, (N,), INDEX_DTYPES, x.device)
    if intermediate_conv_windows is not None:
        check.tensor("intermediate_conv_windows", intermediate_conv_windows, (N, L, dim, W - 1), FLOAT_DTYPES, x.device)
    if retrieve_parent_token is not None:
        parents = check.tree(
            retrieve_parent_token, N, L, intermediate="intermediate_conv_windows",
            has_intermediate=intermediate_conv_windows is not None, disable_state_update=disable_state_update,
            dev=x.device,
        )  # fmt: skip
        if value_checks(x.device):
            check.tree_values(parents, [L] * N, skipped_rows(state_indices, pad_slot_id).tolist())
    out = _out(check, out, x)
    call_op(
        _update_op,
        x=x,
        conv_state=conv_state,
        weight=weight,
        bias=bias,
        state_indices=state_indices,
        intermediate_conv_windows=intermediate_conv_windows,
        retrieve_parent_token=retrieve_parent_token,
        out=out,
        activation=activation,
        disable_state_update=bool(disable_state_update),
        pad_slot_id=pad_slot_id,
        impl=check.impl(impl, x.device),
    )
    return out


def varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    conv_state: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    activation: str | None = None,
    pad_slot_id: int | None = -1,
    out: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Causal conv1d over packed variable-length sequences (extend / prefill).

    Args:
        x: [T, dim] float, the tokens of all sequences packed; sequence n is ``x[cu[n]:cu[n+1]]``.
        weight: [dim, W]; bias: [dim] or None.
        conv_state: [num_slots, dim, W-1] float pool. Each processed non-empty sequence's last W-1
            inputs (older state inputs included when it is shorter than W-1) are written to its slot.
        state_indices: [N] int32/int64, the slot of each sequence; skipped rows per ``pad_slot_id``.
        has_initial_state: [N] bool; False starts the window at zeros instead of reading the slot.
        cu_seqlens: [N+1] int32/int64, non-decreasing, ``cu[0] = 0``, ``cu[N] <= T``.
        activation: None or "silu".
        pad_slot_id: the padding sentinel; None processes every row.
        out: [T, dim] float, written in full; allocated like x when None. Must not alias x.
        impl: "auto" | "reference" | "triton".

    Returns:
        out: the convolution of each sequence; zeros for tokens of skipped rows and for the tail
        ``x[cu[N]:]`` that no sequence owns (graph padding). Zero-length rows output nothing and
        leave their slot unchanged.
    """
    check = ArgChecker("causal_conv1d.varlen", device_of="x")
    check.leading("x", x, "[T, dim] (packed tokens)", 2)
    dim = x.shape[1]
    _check_common(check, x, weight, bias, conv_state, dim, activation, pad_slot_id)
    N = check.cu_seqlens(cu_seqlens, x.device)
    check.tensor("state_indices", state_indices, (N,), INDEX_DTYPES, x.device)
    check.tensor("has_initial_state", has_initial_state, (N,), (torch.bool,), x.device)
    out = _out(check, out, x)
    impl = check.impl(impl, x.device)
    call_op(
        _varlen_op,
        x=x,
        weight=weight,
        bias=bias,
        conv_state=conv_state,
        state_indices=state_indices,
        has_initial_state=has_initial_state,
        cu_seqlens=cu_seqlens,
        out=out,
        activation=activation,
        pad_slot_id=pad_slot_id,
        impl=impl,
    )
    return out
