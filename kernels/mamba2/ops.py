"""Public entry point of Mamba2's selective state update and its ``linattn::`` custom op.

The public function validates shapes, dtypes and devices only (never values: that would synchronise the
host, which graph capture forbids), allocates ``out`` when it is None and calls ONE custom op, which is
what a ``TorchDispatchMode`` (the CPU graph recorder) sees.
"""

from __future__ import annotations

import torch

from kernels._common import resolve_impl

from .reference import selective_state_update_reference

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_STATE_DTYPES = (torch.float32, torch.float64)
_INDEX_DTYPES = (torch.int32, torch.int64)


@torch.library.custom_op("linattn::mamba2_selective_state_update", mutates_args=("state", "out"))
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
    state_batch_indices: torch.Tensor,
    pad_slot_id: int | None,
    out: torch.Tensor,
    impl: str,
) -> None:
    if impl == "triton":
        from .triton_ssu import selective_state_update_triton as run
    else:
        run = selective_state_update_reference
    run(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, out)


@_ssu_op.register_fake
def _ssu_fake(*args, **kwargs) -> None:
    return None


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _check_tensor(
    name: str, t: object, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...], device: torch.device
) -> None:
    where = "mamba2.selective_state_update"
    _check(isinstance(t, torch.Tensor), f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    _check(tuple(t.shape) == shape, f"{where}: {name} must have shape {list(shape)}, got {list(t.shape)}")
    _check(t.dtype in dtypes, f"{where}: {name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    _check(t.device == device, f"{where}: {name} is on {t.device}, expected {device} (the device of x)")


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
    state_batch_indices: torch.Tensor,
    pad_slot_id: int | None = -1,
    out: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Mamba2 single-step SSM update on a pool of states (mamba_ssm's ``selective_state_update``).

    Args:
        state: [num_slots, nheads, headdim, dstate] float32 pool (float64 accepted for ground truth),
            updated in place for processed rows.
        x: [N, nheads, headdim] float.
        dt: [N, nheads, headdim] float (engines pass a per-head value expanded with stride 0: fine).
        A: [nheads, headdim, dstate] float (usually -exp(A_log) expanded).
        B, C: [N, ngroups, dstate] float; head h uses group ``h // (nheads // ngroups)``.
        D: [nheads, headdim] or None, skip connection ``+ D * x``.
        z: [N, nheads, headdim] or None, gate ``out * silu(z)``.
        dt_bias: [nheads, headdim] or None, added to dt (before softplus).
        dt_softplus: apply ``softplus`` (linear above 20) to ``dt + dt_bias``.
        state_batch_indices: [N] int32/int64 slot of each row; rows skipped per ``pad_slot_id``
            (``kernels._common``) read and write no slot and output zeros.
        pad_slot_id: the padding sentinel; None processes every row.
        out: [N, nheads, headdim] float, written in full; allocated like x when None.
        impl: "auto" | "reference" | "triton".

    Returns:
        out: ``sum_s state'[slot, h, p, s] * C[n, g, s] (+ D x) (* silu(z))`` with
        ``state' = state * exp(A dt) + dt x B``.
    """
    where = "mamba2.selective_state_update"
    _check(isinstance(x, torch.Tensor), f"{where}: x must be a torch.Tensor, got {type(x).__name__}")
    _check(x.dim() == 3, f"{where}: x must be [N, nheads, headdim], got shape {list(x.shape)}")
    _check(x.dtype in _FLOATS, f"{where}: x must be floating point, got {x.dtype}")
    N, nheads, headdim = x.shape
    dev = x.device
    _check(
        isinstance(state, torch.Tensor) and state.dim() == 4,
        f"{where}: state must be a 4-D pool [num_slots, nheads, headdim, dstate], got {getattr(state, 'shape', state)}",
    )
    dstate = state.shape[3]
    _check_tensor("state", state, (state.shape[0], nheads, headdim, dstate), _STATE_DTYPES, dev)
    _check(
        isinstance(B, torch.Tensor) and B.dim() == 3,
        f"{where}: B must be [N, ngroups, dstate], got {getattr(B, 'shape', B)}",
    )
    ngroups = B.shape[1]
    _check(
        ngroups >= 1 and nheads % ngroups == 0,
        f"{where}: nheads ({nheads}) must be a multiple of ngroups = B.shape[1] ({ngroups})",
    )
    _check_tensor("B", B, (N, ngroups, dstate), _FLOATS, dev)
    _check_tensor("C", C, (N, ngroups, dstate), _FLOATS, dev)
    _check_tensor("dt", dt, (N, nheads, headdim), _FLOATS, dev)
    _check_tensor("A", A, (nheads, headdim, dstate), _FLOATS, dev)
    if D is not None:
        _check_tensor("D", D, (nheads, headdim), _FLOATS, dev)
    if z is not None:
        _check_tensor("z", z, (N, nheads, headdim), _FLOATS, dev)
    if dt_bias is not None:
        _check_tensor("dt_bias", dt_bias, (nheads, headdim), _FLOATS, dev)
    _check_tensor("state_batch_indices", state_batch_indices, (N,), _INDEX_DTYPES, dev)
    _check(
        pad_slot_id is None or (isinstance(pad_slot_id, int) and not isinstance(pad_slot_id, bool)),
        f"{where}: pad_slot_id must be an int or None, got {pad_slot_id!r}",
    )
    if out is None:
        out = torch.empty_like(x)
    _check_tensor("out", out, (N, nheads, headdim), _FLOATS, dev)
    _ssu_op(
        state,
        x,
        dt,
        A,
        B,
        C,
        D,
        z,
        dt_bias,
        bool(dt_softplus),
        state_batch_indices,
        pad_slot_id,
        out,
        resolve_impl(impl, dev),
    )
    return out
