"""Readable torch reference of the gated delta rule over a state pool (CPU or any device, float64-capable).

Shapes (all tokens of all sequences packed along T):
    q, k: [T, H, K]      v: [T, HV, V]      g, beta: [T, HV]      or gk: [T, HV, K] instead of g (KDA)
    state: [num_slots, HV, K, V]  (k_first)   state_indices: [N] int   cu_seqlens: [N+1] int
    out: [T, HV, V]      intermediate_states: [N, D, HV, K, V] (indexed by batch row, not slot)
    state_layout="v_first": state [num_slots, HV, V, K], intermediate_states [N, D, HV, V, K], read and
    written through their K-first views (kernels.conventions.layout_view: no copy).

Per token, for every value head (K-first state S of K x V):
    S <- exp(g) S;   u = beta (v - S^T k);   S <- S + k u^T;   o = S^T (scale q)
With the per-channel gate ``gk`` (Kimi Delta Attention) the decay scales row c of S by exp(gk[c]):
    S <- diag(exp(gk)) S, the rest unchanged. A gk whose K entries all equal g is the scalar gate, bit for bit.

Arithmetic runs in float64 if any float operand is float64, else float32. These functions read
`cu_seqlens`/`state_indices` on the host (`.tolist()`): they are the *inside* of a custom op (see ops.py),
so a graph recorder sees one op and never these syncs. They trust their inputs: validation is in ops.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels import snapshots
from kernels.conventions import DEFAULT_STATE_LAYOUT, layout_view
from kernels.dtypes import cast, compute_dtype
from kernels.padding import host_rows, skipped_rows

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
    x = cast(a, dtype) + cast(dt_bias, dtype)
    g = -torch.exp(cast(A_log, dtype)) * F.softplus(x, beta=softplus_beta, threshold=softplus_threshold)
    return g, torch.sigmoid(cast(b, dtype))


@dataclass
class _Batch:
    """The inputs as the recurrence reads them, and host copies of the per-row metadata."""

    q: torch.Tensor  # [T, HV, K] in the arithmetic dtype, (L2-normalised,) scaled, one per value head (GVA)
    k: torch.Tensor  # [T, HV, K] likewise, unscaled
    v: torch.Tensor  # [T, HV, V]
    g: torch.Tensor  # [T, HV], or [T, HV, K] for the per-channel gate gk
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
    q, k = cast(q, dtype), cast(k, dtype)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    group = v.shape[1] // q.shape[1]  # value head h reads q/k head h // group
    slots, skipped = host_rows(state_indices, pad_slot_id, state.shape[0])  # -1 processed: an IndexError
    return _Batch(
        q=(q * scale).repeat_interleave(group, dim=1),
        k=k.repeat_interleave(group, dim=1),
        v=cast(v, dtype),
        g=cast(g, dtype),
        beta=cast(beta, dtype),
        bounds=cu_seqlens.tolist(),
        slots=slots,
        skipped=skipped,
        has_init=[True] * len(slots) if has_initial_state is None else has_initial_state.bool().tolist(),
    )


def _the_gate(g: torch.Tensor | None, gk: torch.Tensor | None) -> torch.Tensor:
    """The one gate given: the scalar `g` [T, HV] or the per-channel `gk` [T, HV, K] (ops.py refuses both)."""
    gate = g if gk is None else gk
    if gate is None or (g is not None and gk is not None):
        raise ValueError("gated delta rule reference: give exactly one of g and gk")
    return gate


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
    g: torch.Tensor | None,
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
    state_layout: str = DEFAULT_STATE_LAYOUT,
    gk: torch.Tensor | None = None,
    retrieve_parent_token: torch.Tensor | None = None,
) -> None:
    """Token-by-token recurrence; writes `out`, `state` (unless disabled) and `intermediate_states` in place.

    Skipped rows (padding rule of kernels/padding.py) touch no slot and get zero outputs; zero-length rows
    write nothing. The other rows advance together, token step by token step (`_recurrent_rows_together`).
    `state` and `intermediate_states` are laid out as `state_layout` says; everything below works on their
    K-first views (`layout_view`: the same memory, last two dims swapped for "v_first").
    The gate is `g` [T, HV], or `gk` [T, HV, K] per key channel (then `g` is None).

    Tree verify (`retrieve_parent_token` [N, D'] int, with `intermediate_states` and `disable_state_update`):
    token t >= 1 of row n is a node that starts from the state after node `retrieve_parent_token[n, t]`,
    read back from `intermediate_states[n, parent]`; node 0 starts from the slot. Otherwise as a chain.
    """
    state = layout_view(state, state_layout, "k_first")
    if intermediate_states is not None:
        intermediate_states = layout_view(intermediate_states, state_layout, "k_first")
    batch = _prepare(
        q,
        k,
        v,
        _the_gate(g, gk),
        beta,
        state,
        state_indices,
        cu_seqlens,
        has_initial_state,
        pad_slot_id,
        scale,
        use_qk_l2norm,
    )
    _zero_unowned_tokens(out, batch.bounds, batch.skipped)

    parents = None
    if retrieve_parent_token is not None:
        if intermediate_states is None or not disable_state_update:
            raise ValueError("gated delta rule reference: a tree verify needs intermediate_states and no state update")
        parents = retrieve_parent_token.tolist()
    work = [n for n in range(len(batch.slots)) if not batch.skipped[n] and batch.bounds[n + 1] > batch.bounds[n]]
    snaps = snapshots.active() if intermediate_states is None else None
    keep = None
    if snaps is not None and snaps.wanted:

        def keep(slot: int, S: torch.Tensor) -> None:  # a [HV, K, V] K-first state, as the pool lays it out
            snaps.ssm[slot] = layout_view(S, "k_first", state_layout).clone()

    if work:
        _recurrent_rows_together(work, batch, state, out, intermediate_states, disable_state_update, parents, keep)


# States of at most this many bytes per slot (in the arithmetic dtype) are gathered into one tensor; larger
# ones are updated where they live. See `_recurrent_rows_together`.
GATHER_MAX_SLOT_BYTES = 64 * 1024


def _recurrent_rows_together(
    rows: list[int],
    batch: _Batch,
    state: torch.Tensor,
    out: torch.Tensor,
    intermediate_states: torch.Tensor | None,
    disable_state_update: bool,
    parents: list[list[int]] | None = None,
    keep: Callable[[int, torch.Tensor], None] | None = None,
) -> None:
    """Token step t of every row at once (decode: 1 step, verify: D, extend: the longest row's length).

    Rows are taken longest first, so the rows still running at step t are a prefix, `rows[:running[t]]`.
    Every (row, value head) pair is an independent K x V recurrence; the inputs of all steps are gathered
    once, step-major, so that step t's inputs are one slice of each (a token step then costs a few torch
    calls however many rows run: on small layers per-call overhead, not arithmetic, is the cost).

    The states are gathered into one private [R*HV, K, V] tensor (scattered back at the end, unless the pool
    must not change), so a step is one token step for all rows: when they are small (<= GATHER_MAX_SLOT_BYTES
    per slot), and when a copy is needed anyway (verify, or an arithmetic dtype other than the pool's). Large
    ones (an engine layer: MBs per slot) are otherwise updated where they live, row by row on their slot:
    there the passes over the state are the cost, and a gather plus a scatter back would add two, plus page
    faults on fresh memory (NOTES.md).

    A tree verify (`parents`: host rows of `retrieve_parent_token`) is the same walk, but before step t >= 1
    each running row's state is replaced by its parent node's, read back from `intermediate_states` (where
    step parent stored it): a chain (parent t-1) reads back what it holds, bit for bit.

    `keep(slot, S)` is handed the state of each row `kernels.snapshots` asks for, after the token it asks for.
    """
    q, k = batch.q, batch.k
    dtype, device = q.dtype, q.device
    HV, K, V = state.shape[1], state.shape[2], state.shape[3]
    rows = sorted(rows, key=lambda n: batch.bounds[n] - batch.bounds[n + 1])  # longest first (stable sort)
    lengths = [batch.bounds[n + 1] - batch.bounds[n] for n in rows]
    running = [sum(1 for length in lengths if length > t) for t in range(lengths[0])]
    pairs = [live * HV for live in running]  # (row, head) pairs of each step
    # the token of row r at step t, step-major: step t holds rows[:running[t]]
    tok = torch.tensor([batch.bounds[n] + t for t, live in enumerate(running) for n in rows[:live]], device=device)
    kt, qt = k.index_select(0, tok), q.index_select(0, tok)  # [P, HV, K]
    m = tok.numel() * HV  # (token, head) pairs
    o = torch.empty(m, 1, V, dtype=dtype, device=device)
    small = HV * K * V * dtype.itemsize <= GATHER_MAX_SLOT_BYTES
    gathered = state.dtype != dtype or disable_state_update or small
    token_step, packed = _step_inputs(batch, tok, kt, qt, o, small)
    # split_with_sizes, not split: the Python wrapper of split costs as much as the call here
    steps = [packed] if len(pairs) == 1 else zip(*(x.split_with_sizes(pairs) for x in packed), strict=True)
    kept_at = _kept_at(rows, lengths, batch.slots) if keep is not None else {}

    if parents is not None and not (gathered and intermediate_states is not None):
        raise ValueError("gated delta rule reference: a tree verify reads its nodes back from intermediate_states")
    if gathered:
        slots, S_rows = _gather(state, rows, batch, dtype)
        S_all = S_rows.view(-1, K, V)
        running_states = {n: S_all[:n] for n in set(pairs)}  # the running pairs' states: a prefix
        if intermediate_states is not None:
            batch_rows = torch.tensor(rows, device=device)
    else:
        work = [state[batch.slots[n]] for n in rows]  # views on the pool: updated in place
        for S, n in zip(work, rows, strict=True):
            if not batch.has_init[n]:
                S.zero_()

    for t, step in enumerate(steps):
        live = running[t]
        if parents is not None and t > 0:
            # node t of each running row starts from its parent node's state, as step parent stored it
            assert intermediate_states is not None  # checked above: a tree reads its nodes back from there
            node_rows = rows[:live]
            parent_steps = torch.tensor([parents[n][t] for n in node_rows], device=device)
            S_rows[:live] = intermediate_states[batch_rows[:live], parent_steps].to(dtype)
        if gathered:
            token_step(running_states[pairs[t]], *step)
            for r in kept_at.get(t, ()):
                assert keep is not None  # kept_at is empty without it
                keep(batch.slots[rows[r]], S_rows[r])
            if intermediate_states is not None:
                # indexed by batch row, not slot: the engine picks the accepted step afterwards
                inter = cast(S_rows[:live], intermediate_states.dtype)
                intermediate_states[:, t].index_copy_(0, batch_rows[:live], inter)
            continue
        for r, S in enumerate(work[:live]):
            token_step(S, *(x[r * HV : (r + 1) * HV] for x in step))
            if keep is not None and r in kept_at.get(t, ()):
                keep(batch.slots[rows[r]], S)
            if intermediate_states is not None:
                intermediate_states[rows[r], t] = S
    out.index_copy_(0, tok, cast(o.view(-1, HV, V), out.dtype))
    if gathered and not disable_state_update:
        state.index_copy_(0, slots, cast(S_rows, state.dtype))


def _gather(
    state: torch.Tensor, rows: list[int], batch: _Batch, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The slots of `rows` and a private `dtype` copy of their states, [R, HV, K, V] (zeros for a row without
    initial state)."""
    slots = torch.tensor([batch.slots[n] for n in rows], device=state.device)
    S_rows = cast(state.index_select(0, slots), dtype)
    fresh = [r for r, n in enumerate(rows) if not batch.has_init[n]]
    if fresh:
        S_rows[fresh] = 0
    return slots, S_rows


def _step_inputs(
    batch: _Batch, tok: torch.Tensor, kt: torch.Tensor, qt: torch.Tensor, o: torch.Tensor, small: bool
) -> tuple[Callable[..., None], tuple[torch.Tensor, ...]]:
    """The token step for the state's size and its inputs, one (token, head) pair a row, step-major (`tok`: the
    tokens; `kt`, `qt` [P, HV, K] their k and q; `o` [m, 1, V] the output): `_small_token_step` where per-call
    overhead is the cost, `_token_step` where the passes over the state are."""
    m, K, V = o.shape[0], kt.shape[-1], o.shape[-1]
    vt, bt = batch.v.index_select(0, tok).view(m, 1, V), batch.beta.index_select(0, tok).view(m, 1, 1)
    decay = torch.exp(batch.g.index_select(0, tok)).view(m, -1, 1)  # [m, 1, 1], or [m, K, 1] per channel
    if small:
        return _small_token_step, (kt.view(m, 1, K), kt.view(m, K, 1), qt.view(m, 1, K), vt * bt, bt.neg(), decay, o)
    return _token_step, (
        torch.stack((kt, qt), dim=2).view(m, 2, K),  # S^T k and S^T q by one matmul
        kt.view(m, K, 1),  # k as a column, for S += k u^T
        vt, bt, decay,
        (kt * qt).sum(-1).view(m, 1, 1),  # k . q
        o,
    )  # fmt: skip


def _kept_at(rows: list[int], lengths: list[int], slots: list[int]) -> dict[int, list[int]]:
    """Token step -> the rows (indices into `rows`, of `lengths` tokens) whose state `kernels.snapshots` asks
    for after it."""
    snaps = snapshots.active()
    kept: dict[int, list[int]] = {}
    for r, (n, length) in enumerate(zip(rows, lengths, strict=True)):
        t = snaps.tokens(slots[n], length) if snaps is not None else None
        if t is not None:
            kept.setdefault(t - 1, []).append(r)
    return kept


def _token_step(
    S: torch.Tensor,
    kq: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    decay: torch.Tensor,
    k_dot_q: torch.Tensor,
    o: torch.Tensor,
) -> None:
    """One token of m independent (row, head) recurrences: S [m, K, V] is updated in place, o [m, 1, V] written.

    kq [m, 2, K] (k and scaled q); k [m, K, 1]; v [m, 1, V]; beta, k_dot_q [m, 1, 1]; decay (exp g) [m, 1, 1],
    or [m, K, 1] for a per-channel gate (row c of each state scaled by its own factor).
    Three passes over the state (what costs on a large layer): the decay, one read for S^T k and S^T q
    together, the rank-1 update; the output needs no fourth: o = S_new^T q = (decayed S)^T q + u (k . q).
    """
    S.mul_(decay)  # S <- exp(g) S (per channel: diag(exp(gk)) S)
    Sk, Sq = torch.bmm(kq, S).split_with_sizes([1, 1], dim=1)  # S^T k, S^T q: [m, 1, V] each
    u = (v - Sk).mul_(beta)  # u = beta (v - S^T k)
    S.addcmul_(k, u)  # S <- S + k u^T (the outer product by broadcasting)
    torch.addcmul(Sq, u, k_dot_q, out=o)


def _small_token_step(
    S: torch.Tensor,
    k_row: torch.Tensor,
    k: torch.Tensor,
    q_row: torch.Tensor,
    beta_v: torch.Tensor,
    neg_beta: torch.Tensor,
    decay: torch.Tensor,
    o: torch.Tensor,
) -> None:
    """`_token_step` in five torch calls instead of seven, for states small enough that a call's overhead
    costs more than a pass over them (at most GATHER_MAX_SLOT_BYTES a slot): o is read from the new state
    (a fourth pass) instead of being assembled from S^T q, u and k . q.

    k_row, q_row [m, 1, K] (q scaled); k [m, K, 1]; beta_v [m, 1, V] (beta v); neg_beta [m, 1, 1] (-beta);
    decay as `_token_step`'s."""
    S.mul_(decay)
    u = torch.addcmul(beta_v, torch.bmm(k_row, S), neg_beta)  # beta (v - S^T k)
    S.addcmul_(k, u)
    torch.bmm(q_row, S, out=o)  # S_new^T q


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


def chunk_step_per_channel(
    S: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk_step` with a per-key-channel gate (KDA): gk [c, HV, K]; the rest as there.

    With G_t = sum_{s<=t} gk_s per channel (a [c, K] cumulative log-decay per head) the recurrence unrolls to
        S_t = diag(e^{G_t}) S + sum_{j<=t} diag(e^{G_t - G_j}) k_j u_j^T
        u_t = beta_t (v_t - S^T (e^{G_t} * k_t) - sum_{j<t} <k_t, e^{G_t - G_j} * k_j> u_j)
    so A_tj = beta_t sum_c k_t[c] k_j[c] e^{G_t[c] - G_j[c]} (strictly lower) and the output's intra-chunk
    weights P_tj = sum_c q_t[c] k_j[c] e^{G_t[c] - G_j[c]} (j <= t). Both are formed from the per-channel
    differences G_t - G_j, masked to j <= t before exp (never e^{-G} alone, which overflows on long chunks).
    """
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # heads first: [HV, c, *]
    G = gk.transpose(0, 1).cumsum(1)  # [HV, c, K]
    b = beta.transpose(0, 1)
    c = G.shape[1]
    idx = torch.arange(c, device=G.device)
    causal = (idx[:, None] >= idx[None, :])[None, :, :, None]  # [1, c, c, 1]
    diff = G[:, :, None, :] - G[:, None, :, :]  # [HV, c(t), c(j), K]
    decay = torch.exp(torch.where(causal, diff, torch.full_like(diff, float("-inf"))))
    kj = k[:, None, :, :] * decay  # e^{G_t - G_j} * k_j, zero for j > t
    A = (b[:, :, None] * (k[:, :, None, :] * kj).sum(-1)).tril(-1)
    P = (q[:, :, None, :] * kj).sum(-1)  # causal by the mask
    eye = torch.eye(c, dtype=G.dtype, device=G.device)
    eG = torch.exp(G)
    rhs = b[:, :, None] * (v - (k * eG) @ S)
    U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    o = (q * eG) @ S + P @ U
    G_last = G[:, -1:, :]  # [HV, 1, K]
    S_new = torch.exp(G_last).transpose(-1, -2) * S + (k * torch.exp(G_last - G)).transpose(-1, -2) @ U
    return o.transpose(0, 1), S_new


def chunked_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
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
    state_layout: str = DEFAULT_STATE_LAYOUT,
    gk: torch.Tensor | None = None,
) -> None:
    """Varlen prefill by chunks of `chunk_size` tokens (chunks restart at each sequence's first token; the
    public op's default is `ops.DEFAULT_CHUNK_SIZE`).

    Same semantics as `recurrent_reference` (no intermediate states; `state` read through its K-first view;
    the gate `g`, or `gk` per key channel: then each chunk is `chunk_step_per_channel`)."""
    state = layout_view(state, state_layout, "k_first")
    batch = _prepare(
        q,
        k,
        v,
        _the_gate(g, gk),
        beta,
        state,
        state_indices,
        cu_seqlens,
        has_initial_state,
        pad_slot_id,
        scale,
        use_qk_l2norm,
    )
    _zero_unowned_tokens(out, batch.bounds, batch.skipped)
    step = chunk_step if gk is None else chunk_step_per_channel
    for n, slot in enumerate(batch.slots):
        bos, eos = batch.bounds[n], batch.bounds[n + 1]
        if batch.skipped[n] or eos == bos:
            continue
        S = _initial_state(state, slot, batch.has_init[n], batch.q.dtype)
        for c0 in range(bos, eos, chunk_size):
            c1 = min(c0 + chunk_size, eos)
            o, S = step(S, batch.q[c0:c1], batch.k[c0:c1], batch.v[c0:c1], batch.g[c0:c1], batch.beta[c0:c1])
            out[c0:c1] = o.to(out.dtype)
        if not disable_state_update:
            state[slot] = S.to(state.dtype)


def scatter_accepted_reference(
    state: torch.Tensor,
    intermediate_states: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor | None = None,
    *,
    accepted_steps: torch.Tensor | None = None,
    pad_slot_id: int | None = -1,
    state_layout: str = DEFAULT_STATE_LAYOUT,
) -> None:
    """state[state_indices[i]] = intermediate_states[i, step[i]] for non-skipped rows, where step is
    `num_accepted - 1` or `accepted_steps` (exactly one given; [N] int each).

    Both tensors are laid out as `state_layout` says, the same layout: a slot is copied whole, so the layout
    changes nothing here. Boolean-mask selection: one host sync on an accelerator (it is inside a custom op)."""
    del state_layout  # both in the same layout: the copy is the same either way
    if (num_accepted is None) == (accepted_steps is None):
        raise ValueError("scatter_accepted reference: give exactly one of num_accepted and accepted_steps")
    live = ~skipped_rows(state_indices, pad_slot_id)
    rows = torch.nonzero(live).flatten()
    if accepted_steps is not None:
        steps = accepted_steps.to(torch.long)[rows]
    else:
        assert num_accepted is not None
        steps = num_accepted.to(torch.long)[rows] - 1
    picked = intermediate_states[rows, steps]  # [R, HV, K, V]
    state.index_copy_(0, state_indices.to(torch.long)[rows], cast(picked, state.dtype))
