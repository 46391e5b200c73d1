"""Readable torch reference of the gated delta rule over a state pool (CPU or any device, float64-capable).

Shapes (all tokens of all sequences packed along T):
    q, k: [T, H, K]      v: [T, HV, V]      g, beta: [T, HV]
    state: [num_slots, HV, K, V]  (K-first)   state_indices: [N] int   cu_seqlens: [N+1] int
    out: [T, HV, V]      intermediate_states: [N, D, HV, K, V] (indexed by batch row, not slot)

Per token, for every value head (K-first state S of K x V):
    S <- exp(g) S;   u = beta (v - S^T k);   S <- S + k u^T;   o = S^T (scale q)

Arithmetic runs in float64 if any float operand is float64, else float32. These functions read
`cu_seqlens`/`state_indices` on the host (`.tolist()`): they are the *inside* of a custom op (see ops.py),
so a graph recorder sees one op and never these syncs. They trust their inputs: validation is in ops.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.dtypes import compute_dtype
from kernels.padding import skipped_rows

L2NORM_EPS = 1e-6


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (the fla / vLLM convention, eps inside the root)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def gating(
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    *,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Engine gating. a, b: [T, HV]; A_log, dt_bias: [HV]. Returns (g, beta), both [T, HV] in `dtype`.

    g = -exp(A_log) * softplus(a + dt_bias) (torch softplus: linear above threshold/beta), beta = sigmoid(b).
    """
    x = a.to(dtype) + dt_bias.to(dtype)
    g = -torch.exp(A_log.to(dtype)) * F.softplus(x, beta=softplus_beta, threshold=softplus_threshold)
    return g, torch.sigmoid(b.to(dtype))


@dataclass
class _Batch:
    """The inputs as the recurrence reads them, and host copies of the per-row metadata."""

    q: torch.Tensor  # [T, HV, K] in the arithmetic dtype, (L2-normalised,) scaled, one per value head (GVA)
    k: torch.Tensor  # [T, HV, K] likewise, unscaled
    v: torch.Tensor  # [T, HV, V]
    g: torch.Tensor  # [T, HV]
    beta: torch.Tensor  # [T, HV]
    bounds: list[int]  # cu_seqlens: row n owns tokens bounds[n] .. bounds[n+1]-1
    slots: list[int]
    skipped: list[bool]  # the padding rule of kernels/padding.py
    has_init: list[bool]


def _prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    pad_slot_id: int | None,
    scale: float,
    use_qk_l2norm: bool,
) -> _Batch:
    """Cast to the arithmetic dtype, optionally L2-normalise q and k, scale q, expand the H q/k heads to the
    HV value heads (GVA), and read the row metadata on the host."""
    dtype = compute_dtype(q, k, v, g, beta, state)
    q, k = q.to(dtype), k.to(dtype)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    group = v.shape[1] // q.shape[1]  # value head h reads q/k head h // group
    slots = state_indices.tolist()
    return _Batch(
        q=(q * scale).repeat_interleave(group, dim=1),
        k=k.repeat_interleave(group, dim=1),
        v=v.to(dtype),
        g=g.to(dtype),
        beta=beta.to(dtype),
        bounds=cu_seqlens.tolist(),
        slots=slots,
        skipped=skipped_rows(state_indices, pad_slot_id).tolist(),
        has_init=[True] * len(slots) if has_initial_state is None else has_initial_state.bool().tolist(),
    )


def _zero_unowned_tokens(out: torch.Tensor, bounds: list[int], skipped: list[bool]) -> None:
    """Zeros for tokens of skipped rows and for tokens past the last row (a graph bucket's padding)."""
    for n, skip in enumerate(skipped):
        if skip:
            out[bounds[n] : bounds[n + 1]] = 0
    out[bounds[-1] :] = 0


def _initial_state(state: torch.Tensor, slot: int, has_init: bool, dtype: torch.dtype) -> torch.Tensor:
    """[HV, K, V] copy of the slot in `dtype`, or zeros for a row without initial state."""
    if has_init:
        return state[slot].to(dtype, copy=True)
    return torch.zeros(state.shape[1:], dtype=dtype, device=state.device)


def recurrent_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    use_qk_l2norm: bool = False,
    has_initial_state: torch.Tensor | None = None,
    intermediate_states: torch.Tensor | None = None,
    disable_state_update: bool = False,
    pad_slot_id: int | None = -1,
) -> None:
    """Token-by-token recurrence; writes `out`, `state` (unless disabled) and `intermediate_states` in place.

    Skipped rows (padding rule of kernels/padding.py) touch no slot and get zero outputs; zero-length rows
    write nothing. When every non-skipped, non-empty row has the same length (decode: 1, verify: D) the
    rows advance together token step by token step (`_recurrent_rows_together`); otherwise one sequence
    at a time (`_recurrent_one_sequence`, the plainest form of the recurrence).
    """
    batch = _prepare(
        q, k, v, g, beta, state, state_indices, cu_seqlens, has_initial_state, pad_slot_id, scale, use_qk_l2norm
    )
    _zero_unowned_tokens(out, batch.bounds, batch.skipped)

    work = [n for n in range(len(batch.slots)) if not batch.skipped[n] and batch.bounds[n + 1] > batch.bounds[n]]
    lengths = {batch.bounds[n + 1] - batch.bounds[n] for n in work}
    if len(lengths) == 1:
        _recurrent_rows_together(work, batch, state, out, intermediate_states, disable_state_update)
        return
    for n in work:
        _recurrent_one_sequence(n, batch, state, out, intermediate_states, disable_state_update)


def _recurrent_one_sequence(
    n: int,
    batch: _Batch,
    state: torch.Tensor,
    out: torch.Tensor,
    intermediate_states: torch.Tensor | None,
    disable_state_update: bool,
) -> None:
    """Sequence n, all value heads at once; S: [HV, K, V]."""
    q, k, v, g, beta = batch.q, batch.k, batch.v, batch.g, batch.beta
    bos, eos = batch.bounds[n], batch.bounds[n + 1]
    slot = batch.slots[n]
    S = _initial_state(state, slot, batch.has_init[n], q.dtype)
    for t in range(bos, eos):
        S = S * torch.exp(g[t])[:, None, None]
        u = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", S, k[t]))
        S = S + k[t][:, :, None] * u[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", S, q[t]).to(out.dtype)
        if intermediate_states is not None:
            intermediate_states[n, t - bos] = S.to(intermediate_states.dtype)
    if not disable_state_update:
        state[slot] = S.to(state.dtype)


def _recurrent_rows_together(
    rows: list[int],
    batch: _Batch,
    state: torch.Tensor,
    out: torch.Tensor,
    intermediate_states: torch.Tensor | None,
    disable_state_update: bool,
) -> None:
    """Rows of one common length L (decode: 1, verify: D): token step t of every row at once.

    The state dwarfs everything else, so what costs is passes over it. Per step there are three: one read
    (S^T k and S^T q together), one read-write (decay), one read-write (S += k u^T). Each row's state is
    updated where it lives, on its slot (or on one private copy when the pool must not change, or the
    arithmetic dtype differs): a batched gather into a fresh [R, HV, K, V] tensor and a scatter back would
    add two more passes plus page faults on the fresh memory, about twice the time on a CPU. The
    small per-token math (u, outputs) is vectorised over the rows.
    """
    q, k, v, g, beta = batch.q, batch.k, batch.v, batch.g, batch.beta
    slots = batch.slots
    L = batch.bounds[rows[0] + 1] - batch.bounds[rows[0]]
    first = torch.tensor([batch.bounds[n] for n in rows], device=q.device)
    in_place = state.dtype == q.dtype and not disable_state_update
    work = [state[slots[n]] if in_place else state[slots[n]].to(q.dtype, copy=True) for n in rows]
    for S, n in zip(work, rows, strict=True):
        if not batch.has_init[n]:
            S.zero_()
    R, HV, V = len(rows), state.shape[1], state.shape[3]
    proj = torch.empty(R, HV, 2, V, dtype=q.dtype, device=q.device)
    for t in range(L):
        tok = first + t
        qt, kt, vt = q.index_select(0, tok), k.index_select(0, tok), v.index_select(0, tok)  # [R, HV, K|V]
        decay = torch.exp(g.index_select(0, tok))[..., None, None]  # [R, HV, 1, 1]
        kq = torch.stack((kt, qt), dim=2)  # [R, HV, 2, K]
        for r, S in enumerate(work):  # read pass: S^T k and S^T q of the undecayed state
            torch.matmul(kq[r], S, out=proj[r])
        proj.mul_(decay)  # ... are those of the decayed state
        u = beta.index_select(0, tok)[..., None] * (vt - proj[:, :, 0])  # [R, HV, V]
        for r, S in enumerate(work):
            S.mul_(decay[r])
            S.baddbmm_(kt[r, :, :, None], u[r, :, None, :])  # S += k u^T
        # o = S_new^T q = (decayed S)^T q + u (k . q): no pass over the new state
        o = proj[:, :, 1] + u * (kt * qt).sum(-1, keepdim=True)
        out.index_copy_(0, tok, o.to(out.dtype))
        if intermediate_states is not None:
            for n, S in zip(rows, work, strict=True):
                intermediate_states[n, t] = S
    if not in_place and not disable_state_update:
        for n, S in zip(rows, work, strict=True):
            state[slots[n]] = S


def chunk_step(
    S: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of c tokens for all heads by the WY / UT transform. Returns (o [c, HV, V], S_new [HV, K, V]).

    S: [HV, K, V] state entering the chunk; q (already scaled), k: [c, HV, K]; v: [c, HV, V];
    g, beta: [c, HV].

    With G_t = sum_{s<=t} g_s (cumulative log-decay inside the chunk) the recurrence unrolls to
        S_t = e^{G_t} S + sum_{j<=t} e^{G_t - G_j} k_j u_j^T
        u_t = beta_t (v_t - e^{G_t} S^T k_t - sum_{j<t} e^{G_t - G_j} (k_t . k_j) u_j)
    i.e. (I + A) U = beta (V - e^G K S) with A strictly lower, A_tj = beta_t (k_t . k_j) e^{G_t - G_j}.
    The unit-lower-triangular system is solved once per chunk; outputs and the next state follow by matmuls.
    """
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # heads first: [HV, c, *]
    G = g.transpose(0, 1).cumsum(-1)  # [HV, c]
    b = beta.transpose(0, 1)
    c = G.shape[-1]
    idx = torch.arange(c, device=G.device)
    causal = idx[:, None] >= idx[None, :]
    # e^{G_i - G_j} for j <= i only; the exponent is masked before exp so that j > i cannot overflow.
    diff = G[:, :, None] - G[:, None, :]
    decay = torch.exp(torch.where(causal, diff, torch.full_like(diff, float("-inf"))))
    eye = torch.eye(c, dtype=G.dtype, device=G.device)
    A = (b[:, :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    rhs = b[:, :, None] * (v - torch.exp(G)[:, :, None] * (k @ S))
    U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    o = torch.exp(G)[:, :, None] * (q @ S) + ((q @ k.transpose(-1, -2)) * decay) @ U
    to_end = torch.exp(G[:, -1:] - G)  # decay from token j to the end of the chunk
    S_new = torch.exp(G[:, -1])[:, None, None] * S + (k * to_end[:, :, None]).transpose(-1, -2) @ U
    return o.transpose(0, 1), S_new


def chunked_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    use_qk_l2norm: bool = False,
    has_initial_state: torch.Tensor | None = None,
    disable_state_update: bool = False,
    pad_slot_id: int | None = -1,
    chunk_size: int,
) -> None:
    """Varlen prefill by chunks of `chunk_size` tokens (chunks restart at each sequence's first token; the
    public op's default is `ops.DEFAULT_CHUNK_SIZE`).

    Same semantics as `recurrent_reference` (no intermediate states)."""
    batch = _prepare(
        q, k, v, g, beta, state, state_indices, cu_seqlens, has_initial_state, pad_slot_id, scale, use_qk_l2norm
    )
    _zero_unowned_tokens(out, batch.bounds, batch.skipped)
    for n, slot in enumerate(batch.slots):
        bos, eos = batch.bounds[n], batch.bounds[n + 1]
        if batch.skipped[n] or eos == bos:
            continue
        S = _initial_state(state, slot, batch.has_init[n], batch.q.dtype)
        for c0 in range(bos, eos, chunk_size):
            c1 = min(c0 + chunk_size, eos)
            o, S = chunk_step(S, batch.q[c0:c1], batch.k[c0:c1], batch.v[c0:c1], batch.g[c0:c1], batch.beta[c0:c1])
            out[c0:c1] = o.to(out.dtype)
        if not disable_state_update:
            state[slot] = S.to(state.dtype)


def scatter_accepted_reference(
    state: torch.Tensor,
    intermediate_states: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor,
    *,
    pad_slot_id: int | None = -1,
) -> None:
    """state[state_indices[i]] = intermediate_states[i, num_accepted[i] - 1] for non-skipped rows.

    Boolean-mask selection: one host sync on an accelerator (it is inside a custom op)."""
    live = ~skipped_rows(state_indices, pad_slot_id)
    rows = torch.nonzero(live).flatten()
    steps = num_accepted.to(torch.long)[rows] - 1
    picked = intermediate_states[rows, steps]  # [R, HV, K, V]
    state.index_copy_(0, state_indices.to(torch.long)[rows], picked.to(state.dtype))
