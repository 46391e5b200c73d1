"""Public entry point of plain linear attention and its ``linattn::`` custom op.

The public function validates shapes, dtypes and devices only (never values: reading device memory would
synchronise the host, which graph capture forbids), allocates ``out`` when it is None and calls ONE
custom op, which is what a ``TorchDispatchMode`` (the CPU graph recorder) sees.
"""

from __future__ import annotations

import torch

from kernels._common import resolve_impl

from .reference import recurrent_reference

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_STATE_DTYPES = (torch.float32, torch.float64)
_INDEX_DTYPES = (torch.int32, torch.int64)


@torch.library.custom_op("linattn::linear_attn_recurrent", mutates_args=("state", "out"))
def _recurrent_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    pad_slot_id: int | None,
    out: torch.Tensor,
    impl: str,
) -> None:
    if impl == "triton":
        from .triton_recurrent import recurrent_triton as run
    else:
        run = recurrent_reference
    run(q, k, v, state, state_indices, cu_seqlens, scale, pad_slot_id, out)


@_recurrent_op.register_fake
def _recurrent_fake(*args, **kwargs) -> None:
    return None


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _check_tensor(
    name: str, t: object, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...], device: torch.device
) -> None:
    where = "linear_attn.recurrent"
    _check(isinstance(t, torch.Tensor), f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    _check(tuple(t.shape) == shape, f"{where}: {name} must have shape {list(shape)}, got {list(t.shape)}")
    _check(t.dtype in dtypes, f"{where}: {name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    _check(t.device == device, f"{where}: {name} is on {t.device}, expected {device} (the device of q)")


def recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    scale: float | None = None,
    pad_slot_id: int | None = -1,
    out: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Plain linear attention, token by token, over packed sequences and a pool of states.

    Per token of sequence n, with ``S = state[state_indices[n], h]`` (K-first, ``[K, V]``):
    ``S <- S + k v^T``, then ``o = S^T (scale q)``. Value head h uses q/k head ``h // (HV // H)``.

    Args:
        q, k: [T, H, K] float. v: [T, HV, V] float, ``HV % H == 0``.
        state: [num_slots, HV, K, V] float32 pool (float64 accepted for ground truth); each processed
            row starts from its slot and leaves its final state there.
        state_indices: [N] int32/int64; rows skipped per ``pad_slot_id`` (``kernels._common``) read and
            write no slot and output zeros.
        cu_seqlens: [N+1] int32/int64, ``cu[0] = 0``, non-decreasing, ``cu[N] <= T``; decode is
            ``[0, 1, ..., N]``. Tokens after ``cu[N]`` (graph padding) get zero outputs.
        scale: query scale, ``K ** -0.5`` when None.
        pad_slot_id: the padding sentinel; None processes every row.
        out: [T, HV, V] float, written in full; allocated like v when None.
        impl: "auto" | "reference" | "triton".

    Returns:
        out: [T, HV, V].
    """
    where = "linear_attn.recurrent"
    _check(isinstance(q, torch.Tensor), f"{where}: q must be a torch.Tensor, got {type(q).__name__}")
    _check(q.dim() == 3, f"{where}: q must be [T, H, K], got shape {list(q.shape)}")
    _check(q.dtype in _FLOATS, f"{where}: q must be floating point, got {q.dtype}")
    T, H, K = q.shape
    dev = q.device
    _check_tensor("k", k, (T, H, K), _FLOATS, dev)
    _check(
        isinstance(v, torch.Tensor) and v.dim() == 3 and v.shape[0] == T,
        f"{where}: v must be [T={T}, HV, V], got {getattr(v, 'shape', v)}",
    )
    HV, V = v.shape[1], v.shape[2]
    _check(
        H >= 1 and HV % H == 0,
        f"{where}: value heads HV={HV} must be a multiple of query/key heads H={H} (GVA)",
    )
    _check_tensor("v", v, (T, HV, V), _FLOATS, dev)
    _check(
        isinstance(state, torch.Tensor) and state.dim() == 4,
        f"{where}: state must be a 4-D pool [num_slots, HV, K, V], got {getattr(state, 'shape', state)}",
    )
    _check_tensor("state", state, (state.shape[0], HV, K, V), _STATE_DTYPES, dev)
    _check(
        isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dim() == 1 and cu_seqlens.shape[0] >= 1,
        f"{where}: cu_seqlens must be a 1-D tensor [N+1], got {getattr(cu_seqlens, 'shape', cu_seqlens)}",
    )
    N = cu_seqlens.shape[0] - 1
    _check_tensor("cu_seqlens", cu_seqlens, (N + 1,), _INDEX_DTYPES, dev)
    _check_tensor("state_indices", state_indices, (N,), _INDEX_DTYPES, dev)
    _check(
        pad_slot_id is None or (isinstance(pad_slot_id, int) and not isinstance(pad_slot_id, bool)),
        f"{where}: pad_slot_id must be an int or None, got {pad_slot_id!r}",
    )
    if scale is None:
        scale = K**-0.5
    _check(
        isinstance(scale, (int, float)) and not isinstance(scale, bool),
        f"{where}: scale must be a float or None, got {scale!r}",
    )
    if out is None:
        out = torch.empty_like(v)
    _check_tensor("out", out, (T, HV, V), _FLOATS, dev)
    _recurrent_op(q, k, v, state, state_indices, cu_seqlens, float(scale), pad_slot_id, out, resolve_impl(impl, dev))
    return out
