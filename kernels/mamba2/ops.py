"""Public entry points of Mamba2's selective state update and chunk scan, each one ``linattn::`` custom op.

The public function validates shapes, dtypes and devices only (never values: that would synchronise the
host, which graph capture forbids), allocates ``out`` when it is None and calls ONE custom op, which is
what a ``TorchDispatchMode`` (the CPU graph recorder) sees.
"""

from __future__ import annotations

import torch

from kernels.checks import ArgChecker, value_checks
from kernels.dispatch import call_op, implementation, inplace_custom_op
from kernels.dtypes import FLOAT_DTYPES, INDEX_DTYPES, STATE_DTYPES
from kernels.padding import skipped_rows

from .chunk_grid import grid_size
from .reference import chunk_scan_reference, selective_state_update_reference

DEFAULT_CHUNK_SIZE = 256
"""``chunk_size`` of :func:`chunk_scan` (the grid of its chunk states): Mamba2 checkpoints' usual chunk."""


@inplace_custom_op("linattn::mamba2_selective_state_update", mutates_args=("state", "out", "intermediate_states"))
def _ssu_op(
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
    intermediate_states: torch.Tensor | None,
    disable_state_update: bool,
    impl: str,
    retrieve_parent_token: torch.Tensor | None = None,  # last, with a default: positional callers keep working
) -> None:
    run = implementation(
        impl,
        reference=selective_state_update_reference,
        triton="kernels.mamba2.triton_ssu:selective_state_update_triton",
    )
    run(
        state=state,
        x=x,
        dt=dt,
        A=A,
        B=B,
        C=C,
        D=D,
        z=z,
        dt_bias=dt_bias,
        dt_softplus=dt_softplus,
        state_indices=state_indices,
        pad_slot_id=pad_slot_id,
        out=out,
        intermediate_states=intermediate_states,
        retrieve_parent_token=retrieve_parent_token,
        disable_state_update=disable_state_update,
    )


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    *,
    dt_softplus: bool = False,
    state_indices: torch.Tensor,
    pad_slot_id: int | None = -1,
    out: torch.Tensor | None = None,
    intermediate_states: torch.Tensor | None = None,
    disable_state_update: bool = False,
    retrieve_parent_token: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Mamba2 SSM update on a pool of states (mamba_ssm's ``selective_state_update``): one decode step per row,
    or a verify's L steps per row with the state after each kept (sglang's ``intermediate_states_buffer``),
    along a chain or a draft tree (``retrieve_parent_token``).

    Args:
        state: [num_slots, nheads, headdim, dstate] float32 pool (float64 accepted for ground truth),
            updated in place for processed rows unless ``disable_state_update``.
        x: [N, nheads, headdim] float (one step), or [N, L, nheads, headdim] (L steps: a verify's draft tokens).
        dt: like x (engines pass a per-head value expanded with stride 0: fine).
        A: [nheads, headdim, dstate] float (usually -exp(A_log) expanded).
        B, C: [N, ngroups, dstate] float, or [N, L, ngroups, dstate]; head h uses group
            ``h // (nheads // ngroups)``.
        D: [nheads, headdim] or None, skip connection ``+ D * x``.
        z: like x, or None: gate ``out * silu(z)``.
        dt_bias: [nheads, headdim] or None, added to dt (before softplus).
        dt_softplus: apply ``softplus`` (linear above 20) to ``dt + dt_bias``.
        state_indices: [N] int32/int64 slot of each row; rows skipped per ``pad_slot_id``
            (``kernels.padding``) read and write no slot and output zeros.
        pad_slot_id: the padding sentinel; None processes every row.
        out: like x, written in full; allocated like x when None.
        intermediate_states: [N, L, nheads, headdim, dstate] float32 (float64 accepted) or None: the state
            after each step, by batch row (skipped rows leave theirs untouched); only with the step axis.
        disable_state_update: leave ``state`` unchanged (a verify keeps its steps in ``intermediate_states``).
        retrieve_parent_token: [N, D'] int32/int64 (D' >= L) or None: a tree verify (sglang's topk > 1
            drafts), with the step axis. Row n's L steps are the nodes of a draft tree in topological order;
            node t >= 1 starts from the state after node ``retrieve_parent_token[n, t]`` (in 0..t-1), read
            back from ``intermediate_states[n, parent]``; node 0 from the slot (``[n, 0]`` is ignored). The
            state after node t goes to ``intermediate_states[n, t]``, step t's output is computed from it.
            Needs ``intermediate_states`` and ``disable_state_update=True``; a chain (``parent[t] = t - 1``)
            gives the chain verify's results bit for bit. Parents are range-checked on CPU tensors only (on a
            device an out-of-range parent reads zeros).
        impl: "auto" | "reference" | "triton".

    Returns:
        out: ``sum_s state'[slot, h, p, s] * C[n, g, s] (+ D x) (* silu(z))`` with
        ``state' = state * exp(A dt) + dt x B``, per step.
    """
    check = ArgChecker("mamba2.selective_state_update", device_of="x")
    x = check.is_tensor("x", x)
    steps = x.dim() == 4
    check.leading("x", x, "[N, nheads, headdim] or [N, L, nheads, headdim]", 4 if steps else 3)
    N, nheads, headdim = x.shape[0], x.shape[-2], x.shape[-1]
    lead = tuple(x.shape[:-2])  # (N,) or (N, L)
    dev = x.device
    check.pool("state", state, "[num_slots, nheads, headdim, dstate]", (nheads, headdim, None), STATE_DTYPES, dev)
    dstate = state.shape[3]
    check.layout("B", B, f"[N, {'L, ' if steps else ''}ngroups, dstate]", len(lead) + 2)
    ngroups = B.shape[-2]
    check.require(
        ngroups >= 1 and nheads % ngroups == 0,
        f"nheads ({nheads}) must be a multiple of ngroups = B.shape[-2] ({ngroups})",
    )
    check.tensor("B", B, (*lead, ngroups, dstate), FLOAT_DTYPES, dev)
    check.tensor("C", C, (*lead, ngroups, dstate), FLOAT_DTYPES, dev)
    check.tensor("dt", dt, (*lead, nheads, headdim), FLOAT_DTYPES, dev)
    check.tensor("A", A, (nheads, headdim, dstate), FLOAT_DTYPES, dev)
    if D is not None:
        check.tensor("D", D, (nheads, headdim), FLOAT_DTYPES, dev)
    if z is not None:
        check.tensor("z", z, (*lead, nheads, headdim), FLOAT_DTYPES, dev)
    if dt_bias is not None:
        check.tensor("dt_bias", dt_bias, (nheads, headdim), FLOAT_DTYPES, dev)
    check.tensor("state_indices", state_indices, (N,), INDEX_DTYPES, dev)
    check.pad_slot_id(pad_slot_id)
    if intermediate_states is not None:
        check.require(steps, f"intermediate_states needs the step axis: x [N, L, nheads, headdim], got {list(x.shape)}")
        check.tensor("intermediate_states", intermediate_states, (*lead, nheads, headdim, dstate), STATE_DTYPES, dev)
    if retrieve_parent_token is not None:
        check.require(
            steps, f"retrieve_parent_token needs the step axis: x [N, L, nheads, headdim], got {list(x.shape)}"
        )
        L = lead[1]
        parents = check.tree(
            retrieve_parent_token, N, L, intermediate="intermediate_states",
            has_intermediate=intermediate_states is not None, disable_state_update=disable_state_update, dev=dev,
        )  # fmt: skip
        if value_checks(dev):
            check.tree_values(parents, [L] * N, skipped_rows(state_indices, pad_slot_id).tolist())
    if out is None:
        out = torch.empty_like(x)
    check.tensor("out", out, (*lead, nheads, headdim), FLOAT_DTYPES, dev)
    call_op(
        _ssu_op,
        state=state,
        x=x,
        dt=dt,
        A=A,
        B=B,
        C=C,
        D=D,
        z=z,
        dt_bias=dt_bias,
        dt_softplus=bool(dt_softplus),
        state_indices=state_indices,
        pad_slot_id=pad_slot_id,
        out=out,
        intermediate_states=intermediate_states,
        retrieve_parent_token=retrieve_parent_token,
        disable_state_update=bool(disable_state_update),
        impl=check.impl(impl, dev),
    )
    return out


@inplace_custom_op("linattn::mamba2_chunk_scan", mutates_args=("state", "out", "chunk_states"))
def _chunk_scan_op(
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
    impl: str,
) -> None:
    run = implementation(impl, reference=chunk_scan_reference, triton="kernels.mamba2.triton_scan:chunk_scan_triton")
    run(
        x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus, state=state,
        state_indices=state_indices, has_initial_state=has_initial_state, cu_seqlens=cu_seqlens,
        pad_slot_id=pad_slot_id, chunk_size=chunk_size, out=out, chunk_states=chunk_states,
    )  # fmt: skip


def chunk_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    *,
    dt_softplus: bool = False,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor | None = None,
    pad_slot_id: int | None = -1,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    out: torch.Tensor | None = None,
    chunk_states: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Mamba2's SSM over a packed prefill batch on a pool of states (mamba_ssm's ``mamba_chunk_scan_combined``
    with ``cu_seqlens``, ``initial_states`` gathered from the pool, the final states scattered back).

    Args:
        x: [T, nheads, headdim] float, the packed tokens of N rows.
        dt: [T, nheads] float, the per-head step (before ``dt_bias`` and softplus).
        A: [nheads] float (``-exp(A_log)``).
        B, C: [T, ngroups, dstate] float; head h uses group ``h // (nheads // ngroups)``.
        D: [nheads] or None, skip connection ``+ D * x``; z: [T, nheads, headdim] or None, gate
            ``out * silu(z)``; dt_bias: [nheads] or None, added to dt before softplus.
        state: [num_slots, nheads, headdim, dstate] float32 pool (float64 accepted for ground truth): a row
            starts from its slot (zeros where ``has_initial_state`` is false) and its final state is written
            back there; skipped rows (``kernels.padding``) and zero-length rows write nothing.
        state_indices: [N] int32/int64; cu_seqlens: [N+1] int32/int64, ``cu[0] = 0``, ``cu[N] <= T`` (tokens
            past it output zeros); has_initial_state: [N] bool/int or None (every row starts from its slot).
        chunk_size: the grid of ``chunk_states``.
        out: [T, nheads, headdim] float, written in full; allocated like x when None.
        chunk_states: [cdiv(T, chunk_size), nheads, headdim, dstate] float32 or None: the chunk states on
            one grid over the flattened batch (:mod:`kernels.mamba2.chunk_grid`), zeros where no processed
            row owns an entry.
        impl: "auto" | "reference" | "triton".
    """
    check = ArgChecker("mamba2.chunk_scan", device_of="x")
    check.leading("x", x, "[T, nheads, headdim]", 3)
    T, nheads, headdim = x.shape
    dev = x.device
    check.layout("B", B, "[T, ngroups, dstate]", 3)
    ngroups, dstate = B.shape[1], B.shape[2]
    check.require(
        ngroups >= 1 and nheads % ngroups == 0,
        f"nheads ({nheads}) must be a multiple of ngroups = B.shape[1] ({ngroups})",
    )
    check.tensor("B", B, (T, ngroups, dstate), FLOAT_DTYPES, dev)
    check.tensor("C", C, (T, ngroups, dstate), FLOAT_DTYPES, dev)
    check.tensor("dt", dt, (T, nheads), FLOAT_DTYPES, dev)
    check.tensor("A", A, (nheads,), FLOAT_DTYPES, dev)
    for name, t in (("D", D), ("dt_bias", dt_bias)):
        if t is not None:
            check.tensor(name, t, (nheads,), FLOAT_DTYPES, dev)
    if z is not None:
        check.tensor("z", z, (T, nheads, headdim), FLOAT_DTYPES, dev)
    check.require(
        isinstance(chunk_size, int) and not isinstance(chunk_size, bool) and chunk_size >= 1,
        f"chunk_size must be an int >= 1, got {chunk_size!r}",
    )
    check.varlen_rows(
        state, "[num_slots, nheads, headdim, dstate]", (nheads, headdim, dstate), state_indices, cu_seqlens,
        has_initial_state, T, pad_slot_id, dev,
    )  # fmt: skip
    check.tensor("state", state, (None, nheads, headdim, dstate), STATE_DTYPES, dev)
    if chunk_states is not None:
        check.tensor(
            "chunk_states", chunk_states, (grid_size(T, chunk_size), nheads, headdim, dstate), STATE_DTYPES, dev
        )
    if out is None:
        out = torch.empty_like(x)
    check.tensor("out", out, (T, nheads, headdim), FLOAT_DTYPES, dev)
    call_op(
        _chunk_scan_op,
        x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, dt_softplus=bool(dt_softplus), state=state,
        state_indices=state_indices, has_initial_state=has_initial_state, cu_seqlens=cu_seqlens,
        pad_slot_id=pad_slot_id, chunk_size=chunk_size, out=out, chunk_states=chunk_states,
        impl=check.impl(impl, dev),
    )  # fmt: skip
    return out
