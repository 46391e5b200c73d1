"""Bytes moved and FLOPs of the gated-delta-rule ops, for the roofline (kernels.cost.Cost).

Bytes count what the kernels really move, once each: inputs read, output written, every touched state
slot read once and written once unless the state update is disabled (target-verify writes intermediate
states instead, and no slot). FLOPs count multiply and add separately.
"""

from __future__ import annotations

import math

import torch

from kernels.cost import Cost
from kernels.gated_delta_rule.ops import DEFAULT_CHUNK_SIZE


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _io_bytes(
    T, N, H, HV, K, V, dtype, gate_dtype, state_dtype, num_intermediate, state_update=True, per_channel_gate=False
) -> int:
    es, gs, ss = _size(dtype), _size(gate_dtype), _size(state_dtype)
    gate = T * HV * (K if per_channel_gate else 1) * gs  # g [T, HV], or KDA's gk [T, HV, K]
    inputs = 2 * T * H * K * es + T * HV * V * es + gate + T * HV * gs  # ... + beta
    metadata = N * 4 + (N + 1) * 4  # int32 state_indices + cu_seqlens
    state = (1 + int(state_update)) * N * HV * K * V * ss + num_intermediate * HV * K * V * ss
    return inputs + metadata + state + T * HV * V * es


def recurrent_cost(
    T: int,
    N: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    dtype: torch.dtype = torch.bfloat16,
    *,
    gate_dtype: torch.dtype = torch.float32,
    state_dtype: torch.dtype = torch.float32,
    num_intermediate: int = 0,
    fused_gating: bool = False,
    use_qk_l2norm: bool = False,
    state_update: bool = True,
    per_channel_gate: bool = False,
    tree: bool = False,
) -> Cost:
    """Cost of `recurrent` on T tokens in N rows (decode: T = N).

    dtype: q/k/v/out; gate_dtype: g/beta (or a/b, or gk/beta); num_intermediate: total intermediate states
    written (verify: N * D); fused_gating: the engine gating inside the kernel (a, b, A_log, dt_bias read);
    state_update=False: ``disable_state_update=True`` (verify), the slots are read but not written;
    per_channel_gate: KDA's ``gk`` [T, HV, K] read instead of ``g`` [T, HV] (K exps per token and head, not one).
    tree: a tree verify (``retrieve_parent_token``): every node past a row's first reads its parent's state
    back from the intermediate buffer (T - N states) and each token its parent's index (int32).
    FLOPs per token and value head: decay K*V, S^T k 2KV, u 2V, rank-1 update 2KV, S^T q 2KV.
    """
    flops = T * HV * (7 * K * V + 2 * V)
    if per_channel_gate:
        flops += T * HV * (K - 1)
    if use_qk_l2norm:
        flops += T * H * 2 * (3 * K)
    if fused_gating:
        flops += T * HV * 12  # softplus + sigmoid, a handful of transcendental-ish ops
    nbytes = _io_bytes(
        T, N, H, HV, K, V, dtype, gate_dtype, state_dtype, num_intermediate, state_update, per_channel_gate
    )
    if fused_gating:
        nbytes += 2 * HV * _size(gate_dtype)  # A_log, dt_bias
    if tree:
        nbytes += (T - N) * HV * K * V * _size(state_dtype) + T * 4
    return Cost(bytes=nbytes, flops=flops)


def chunked_cost(
    T: int,
    N: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    dtype: torch.dtype = torch.bfloat16,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    gate_dtype: torch.dtype = torch.float32,
    state_dtype: torch.dtype = torch.float32,
    per_channel_gate: bool = False,
) -> Cost:
    """Cost of `chunked` assuming max(N, ceil(T / chunk_size)) full chunks of C = chunk_size tokens.

    Per chunk and value head: K K^T and Q K^T 4C^2K, the triangular solve ~C^3/3, U = T rhs 2C^2V,
    intra-chunk output 2C^2V, K S / Q S / state update 6CKV, plus O(C^2 + CV + KV) elementwise work.
    per_channel_gate (KDA's gk [T, HV, K]): the decay sits inside the channel sums, so A and Q K^T are built
    from C^2 K channel differences and their exps (about 3C^2K more), plus the per-channel cumsum and the
    decayed keys and queries (about 4CK).
    """
    C = chunk_size
    chunks = max(N, math.ceil(T / C)) if T else 0
    per_chunk = 4 * C * C * K + C**3 // 3 + 4 * C * C * V + 6 * C * K * V + 3 * C * C + 4 * C * V + K * V
    if per_channel_gate:
        per_chunk += 3 * C * C * K + 4 * C * K
    nbytes = _io_bytes(T, N, H, HV, K, V, dtype, gate_dtype, state_dtype, 0, per_channel_gate=per_channel_gate)
    return Cost(bytes=nbytes, flops=chunks * HV * per_chunk)


def scatter_accepted_cost(N: int, HV: int, K: int, V: int, state_dtype: torch.dtype = torch.float32) -> Cost:
    """One intermediate state read and one slot written per row (num_accepted or accepted_steps alike)."""
    return Cost(bytes=2 * N * HV * K * V * _size(state_dtype) + 3 * N * 4, flops=0)
