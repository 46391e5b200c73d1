"""Torch references of Mamba2's selective state update (decode) and chunk scan (prefill), mamba_ssm semantics.

For each processed row n and head h, with state ``S = state[slot_n, h]`` of shape ``[headdim, dstate]``
and ``g = h // (nheads // ngroups)`` the head's B/C group:

    dt   = dt[n, h] (+ dt_bias[h]);  dt = softplus(dt) if dt_softplus       # [headdim]
    S    = S * exp(A[h] * dt[:, None]) + (dt * x[n, h])[:, None] * B[n, g][None, :]
    out  = S @ C[n, g]  (+ D[h] * x[n, h]);  out = out * silu(z[n, h]) if z is given

A verify runs L such steps per row (keeping the state after each); the chunk scan runs every token of a
packed prefill batch through the same recurrence (``chunk_scan_reference``). Computed in float32, or float64
when any input is float64 (the tests' ground truth). Reads the slot indices on the host, so it synchronises
on an accelerator; the Triton kernels do not.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import snapshots
from kernels.dtypes import compute_dtype
from kernels.padding import live_rows_and_slots


def selective_state_update_reference(
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
) -> None:
    """One decode step of every row, or a verify's L steps; updates ``state`` (unless disabled), writes ``out``
    and ``intermediate_states`` in place.

    state [num_slots, nheads, headdim, dstate]; x, dt, z, out [N, nheads, headdim] (one step) or
    [N, L, nheads, headdim]; A [nheads, headdim, dstate]; B, C [N, (L,) ngroups, dstate]; D, dt_bias
    [nheads, headdim]; state_indices [N] int; intermediate_states [N, L, nheads, headdim, dstate] or None (the
    state after each step, by batch row; skipped rows leave theirs untouched).
    retrieve_parent_token [N, D'] int or None: a tree verify; step t >= 1 of a row (a node) starts from the
    state after step ``retrieve_parent_token[row, t]``, read back from ``intermediate_states``.
    """
    if x.dim() == 3:  # decode: one step per row
        x, dt, B, C, out = (t.unsqueeze(1) for t in (x, dt, B, C, out))
        z = z.unsqueeze(1) if z is not None else None
    ct = compute_dtype(state, x, dt, A, B, C, D, z, dt_bias)
    nheads, ngroups = x.shape[2], B.shape[2]
    heads_per_group = nheads // ngroups

    out.zero_()  # skipped rows keep these zeros
    rows, slots = live_rows_and_slots(state_indices, pad_slot_id, state.shape[0])
    s = state[slots].to(ct)  # [R, nheads, headdim, dstate]
    parents = None
    if retrieve_parent_token is not None:
        if intermediate_states is None or not disable_state_update:
            raise ValueError("mamba2 reference: a tree verify needs intermediate_states and no state update")
        parents = retrieve_parent_token.to(torch.long)[rows]  # [R, D']
    for t in range(x.shape[1]):
        if parents is not None and t > 0:
            # node t starts from its parent node's state, as step parent stored it (a chain's: step t-1)
            assert intermediate_states is not None  # checked above: a tree reads its nodes back from there
            s = intermediate_states[rows, parents[:, t]].to(ct)
        x_r = x[rows, t].to(ct)  # [R, nheads, headdim]
        dt_r = dt[rows, t].to(ct)
        if dt_bias is not None:
            dt_r = dt_r + dt_bias.to(ct)
        if dt_softplus:
            dt_r = F.softplus(dt_r)  # beta 1, linear above 20, as mamba_ssm
        # Each head reads its group's B and C: repeat every group heads_per_group times along the head axis.
        B_r = B[rows, t].to(ct).repeat_interleave(heads_per_group, dim=1)  # [R, nheads, dstate]
        C_r = C[rows, t].to(ct).repeat_interleave(heads_per_group, dim=1)
        decay = torch.exp(A.to(ct) * dt_r.unsqueeze(-1))  # [R, nheads, headdim, dstate]
        s = s * decay + (dt_r * x_r).unsqueeze(-1) * B_r.unsqueeze(2)
        if intermediate_states is not None:
            intermediate_states[rows, t] = s.to(intermediate_states.dtype)
        y = (s * C_r.unsqueeze(2)).sum(-1)  # [R, nheads, headdim]
        if D is not None:
            y = y + D.to(ct) * x_r
        if z is not None:
            y = y * F.silu(z[rows, t].to(ct))
        out[rows, t] = y.to(out.dtype)
    if not disable_state_update:
        state[slots] = s.to(state.dtype)


def chunk_scan_reference(
    *,
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
) -> None:
    """A packed prefill batch; updates ``state`` and writes ``out`` (and ``chunk_states``).

    Row n feeds tokens ``cu_seqlens[n]:cu_seqlens[n+1]`` from ``state[slot_n]`` (zeros where
    ``has_initial_state[n]`` is false). Per token t of head h, group g:

        dt = dt[t, h] (+ dt_bias[h]), softplus-ed if dt_softplus;  S = S * exp(A[h] dt) + dt * x[t, h] (outer) B[t, g]
        out[t, h] = S @ C[t, g] + D[h] x[t, h];  out = out * silu(z[t, h]) if z is given

    x, z, out [T, nheads, headdim]; dt [T, nheads]; A, D, dt_bias [nheads]; B, C [T, ngroups, dstate];
    state [num_slots, nheads, headdim, dstate]; chunk_states [cdiv(T, chunk_size), nheads, headdim, dstate]
    or None, filled on the global grid of :mod:`kernels.mamba2.chunk_grid` (zeros where no processed row
    owns an entry). Tokens of skipped rows and past ``cu_seqlens[-1]`` output zeros. Each row runs in blocks of
    :data:`_BLOCK` tokens, the recurrence summed in closed form inside a block (:func:`_scan_block`); the
    tests check it against the decode step, token by token.
    """
    ct = compute_dtype(state, x, dt, A, B, C, D, z, dt_bias)
    nheads, ngroups = x.shape[1], B.shape[1]
    heads_per_group = nheads // ngroups
    out.zero_()
    h = chunk_states
    if h is not None:
        h.zero_()
    rows, slots = live_rows_and_slots(state_indices, pad_slot_id, state.shape[0])
    cu = cu_seqlens.tolist()
    h0 = has_initial_state.tolist() if has_initial_state is not None else None
    # per-token factors of every token at once; the blocks below carry only the state
    d = dt.to(ct) + (dt_bias.to(ct) if dt_bias is not None else 0)  # [T, nheads]
    if dt_softplus:
        d = F.softplus(d)
    log_decay = A.to(ct) * d  # [T, nheads]: S is scaled by exp of it at each token
    dx = d[:, :, None] * x.to(ct)  # [T, nheads, headdim]
    Bh = B.to(ct).repeat_interleave(heads_per_group, dim=1)  # [T, nheads, dstate]: each head its group's
    Ch = C.to(ct).repeat_interleave(heads_per_group, dim=1)
    y = torch.zeros(x.shape, dtype=ct, device=x.device)
    snaps = snapshots.active()
    for n, slot in zip(rows.tolist(), slots.tolist(), strict=True):
        s = state[slot].to(ct) if h0 is None or h0[n] else torch.zeros(state.shape[1:], dtype=ct, device=x.device)
        if h is not None and n == 0 and h.shape[0]:
            h[0] = s.to(h.dtype)  # entry 0: the first row's initial state
        wanted = snaps.tokens(slot, cu[n + 1] - cu[n]) if snaps is not None else None
        kept = {cu[n] + wanted - 1} if wanted is not None else set()  # the token after which kernels.snapshots asks
        for a in range(cu[n], cu[n + 1], _BLOCK):
            e = min(a + _BLOCK, cu[n + 1])
            # tokens of this block that end a chunk of the grid over the flattened batch (entry (t + 1) / C)
            grid = [
                t
                for t in range(a, e)
                if (t + 1) % chunk_size == 0 and h is not None and (t + 1) // chunk_size < h.shape[0]
            ]
            marks = sorted({*grid, *(t for t in kept if a <= t < e)})
            y[a:e], after = _scan_block(s, log_decay[a:e], dx[a:e], Bh[a:e], Ch[a:e], [t - a for t in marks])
            at = dict(zip(marks, after[:-1], strict=True))
            for t in grid:
                if h is not None:  # (grid is empty without it)
                    h[(t + 1) // chunk_size] = at[t].to(h.dtype)
            for t in kept & at.keys():
                assert snaps is not None  # kept is empty without it
                snaps.ssm[slot] = at[t].clone()
            s = after[-1]
        if cu[n + 1] > cu[n]:
            state[slot] = s.to(state.dtype)
    if D is not None:
        y = y + D.to(ct)[:, None] * x.to(ct)
    if z is not None:
        y = y * F.silu(z.to(ct))
    for n in rows.tolist():  # tokens of skipped rows and past the last row keep their zeros
        out[cu[n] : cu[n + 1]] = y[cu[n] : cu[n + 1]].to(out.dtype)


_BLOCK = 64
"""Tokens per block of :func:`_scan_block`: bounds its ``[L, L, nheads]`` decay matrix."""


def _scan_block(
    s0: torch.Tensor, log_decay: torch.Tensor, dx: torch.Tensor, B: torch.Tensor, C: torch.Tensor, at: list[int]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """L tokens of one row from state ``s0`` ``[nheads, headdim, dstate]``, the recurrence written out: with
    ``c_t = log_decay[0] + ... + log_decay[t]`` (``[L, nheads]``),

        S_t = exp(c_t) S_0 + sum_{j <= t} exp(c_t - c_j) dx_j (outer) B_j,     y_t = S_t @ C_t

    dx ``[L, nheads, headdim]``, B, C ``[L, nheads, dstate]``. Returns y ``[L, nheads, headdim]`` (before D and
    the gate) and the states after the tokens ``at`` and after the last one."""
    L = log_decay.shape[0]
    c = log_decay.cumsum(0)  # [L, nheads]
    causal = torch.ones(L, L, dtype=torch.bool, device=c.device).tril()[:, :, None]  # j <= t
    seg = (c[:, None, :] - c[None, :, :]).masked_fill(~causal, float("-inf"))  # [L(t), L(j), nheads]
    w = seg.exp()  # exp(c_t - c_j) for j <= t, else 0
    cb = torch.einsum("thn,jhn->tjh", C, B)  # C_t . B_j
    y = torch.einsum("tjh,jhp->thp", w * cb, dx) + c.exp()[:, :, None] * torch.einsum("thn,hpn->thp", C, s0)
    states = [c[t].exp()[:, None, None] * s0 + torch.einsum("jh,jhp,jhn->hpn", w[t], dx, B) for t in (*at, L - 1)]
    return y, states
