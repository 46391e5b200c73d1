"""Torch reference of the short causal convolution (decode, target-verify and varlen prefill).

Readable first: one sequence at a time (prefill), every step of every row at once (decode, verify), in
float32, or in float64 when any input is float64 (the tests' ground truth). Works on any device but reads
the indices and ``cu_seqlens`` on the host, so it synchronises on an accelerator; the Triton kernel does not.

Conventions (see ``kernels/causal_conv1d/__init__.py``): channels last, ``conv_state[slot]`` is
``[dim, W-1]`` with the oldest input in column 0, ``weight[c, W-1]`` multiplies the newest input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import snapshots
from kernels.dtypes import cast, compute_dtype
from kernels.padding import live_rows_and_slots


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    return F.silu(y) if activation == "silu" else y


def _convolve(windows: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``b + sum_j w[c, j] * windows[r, c, t, j]``: windows [R, dim, L, W], w [dim, W] -> [R, dim, L].

    Written as W elementwise multiply-adds, oldest input first (as the Triton kernel accumulates), not as a
    matmul: elementwise arithmetic rounds the same whatever the windows' memory layout, so a tree verify's
    windows (gathered) and a chain's (a strided view) give bit-equal outputs where their values agree."""
    acc = windows[..., 0] * w[:, 0, None]
    for j in range(1, windows.shape[-1]):
        acc = acc + windows[..., j] * w[:, j, None]
    return acc + b.unsqueeze(-1)


def update_reference(
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
) -> None:
    """Decode (``L == 1``) / verify (``L == D``) steps of every row at once; writes ``out`` in place.

    x [N, L, dim]; conv_state [num_slots, dim, W-1]; weight [dim, W]; bias [dim] or None;
    state_indices [N] int; intermediate_conv_windows [N, L, dim, W-1] or None; out [N, L, dim];
    retrieve_parent_token [N, D'] int or None: a tree verify (`_tree_windows`).
    """
    ct = compute_dtype(x, conv_state, weight, bias)
    w = cast(weight, ct)  # [dim, W]
    b = cast(bias, ct) if bias is not None else torch.zeros((), dtype=ct, device=x.device)

    # Skipped rows (and only they) keep these zeros: deterministic, never uninitialised memory.
    out.zero_()
    rows, slots = live_rows_and_slots(state_indices, pad_slot_id, conv_state.shape[0])

    W = weight.shape[1]
    if retrieve_parent_token is not None:
        if intermediate_conv_windows is None or not disable_state_update:
            raise ValueError("causal_conv1d reference: a tree verify needs the intermediate windows, no state update")
        windows = _tree_windows(x, conv_state, intermediate_conv_windows, retrieve_parent_token, rows, slots, ct)
        out[rows] = cast(_activate(_convolve(windows, w, b), activation).transpose(1, 2), out.dtype)
        return
    # Every step at once, as `varlen_reference` does a sequence: W-1 older inputs, then the L new ones.
    ext = torch.cat([cast(conv_state[slots], ct), cast(x[rows], ct).transpose(1, 2)], dim=-1)  # [R, dim, W-1+L]
    # window t is ext[..., t : t+W], times the channel's weights: a length-W dot product; [R, dim, L]
    y = _convolve(ext.unfold(-1, W, 1), w, b)
    out[rows] = cast(_activate(y, activation).transpose(1, 2), out.dtype)
    if intermediate_conv_windows is not None:
        # the window after step t is ext[..., t+1 : t+W]; indexed by batch row, not by slot: the engine
        # picks the accepted step afterwards
        after = ext.unfold(-1, W - 1, 1)[:, :, 1:].transpose(1, 2)  # [R, L, dim, W-1]
        intermediate_conv_windows[rows] = cast(after, intermediate_conv_windows.dtype)
    if not disable_state_update:
        conv_state[slots] = cast(ext[..., -(W - 1) :], conv_state.dtype)


def _tree_windows(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    intermediate_conv_windows: torch.Tensor,
    retrieve_parent_token: torch.Tensor,
    rows: torch.Tensor,
    slots: torch.Tensor,
    ct: torch.dtype,
) -> torch.Tensor:
    """The W-input window of every node of a tree verify, node by node; writes each node's last W-1 inputs to
    ``intermediate_conv_windows[row, t]``. Returns [R, dim, L, W] in ``ct``.

    Node 0 convolves the slot's W-1 inputs and x_0, as a chain's step 0. Node t >= 1 convolves its parent's
    stored window (``intermediate_conv_windows[row, parent[row, t]]``, read back) and x_t: its ancestors'
    inputs, oldest first. A chain's parent t-1 holds exactly the chain's inputs t-W+1 .. t-1."""
    L = x.shape[1]
    parents = retrieve_parent_token.to(torch.long)[rows]  # [R, D']
    windows = []
    for t in range(L):
        # the W-1 older inputs: the slot's (node 0) or the parent's stored window; [R, dim, W-1]
        before = (conv_state[slots] if t == 0 else intermediate_conv_windows[rows, parents[:, t]]).to(ct)
        window = torch.cat([before, x[rows, t].to(ct).unsqueeze(-1)], dim=-1)  # [R, dim, W]
        intermediate_conv_windows[rows, t] = window[..., 1:].to(intermediate_conv_windows.dtype)
        windows.append(window)
    return torch.stack(windows, dim=2)


def varlen_reference(
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
) -> None:
    """Prefill of packed sequences, one sequence at a time; writes ``out`` in place.

    x [T, dim]; weight [dim, W]; bias [dim] or None; conv_state [num_slots, dim, W-1];
    state_indices [N] int; has_initial_state [N] bool; cu_seqlens [N+1] int; out [T, dim].
    Tokens owned by no processed sequence (skipped rows, the tail after ``cu_seqlens[N]``) get zeros.
    """
    ct = compute_dtype(x, conv_state, weight, bias)
    dim, W = weight.shape
    w = cast(weight, ct)
    b = cast(bias, ct) if bias is not None else torch.zeros((), dtype=ct, device=x.device)

    out.zero_()
    rows, slots = live_rows_and_slots(state_indices, pad_slot_id, conv_state.shape[0])
    bounds = cu_seqlens.tolist()
    snaps = snapshots.active()
    for row, slot in zip(rows.tolist(), slots.tolist(), strict=True):
        bos, eos = bounds[row], bounds[row + 1]
        if eos == bos:
            continue  # a zero-length row neither outputs nor touches its slot
        if bool(has_initial_state[row]):
            initial = cast(conv_state[slot], ct)
        else:
            initial = torch.zeros(dim, W - 1, dtype=ct, device=x.device)
        # The sequence as the convolution sees it: W-1 older inputs, then this sequence's tokens.
        ext = torch.cat([initial, cast(x[bos:eos], ct).T], dim=1)  # [dim, W-1+len]
        windows = ext.unfold(1, W, 1)  # [dim, len, W]: windows[:, t] ends at token t
        y = (windows @ w.unsqueeze(-1)).squeeze(-1) + b.unsqueeze(-1)  # [dim, len]: dot products of length W
        out[bos:eos] = cast(_activate(y, activation).T, out.dtype)
        # The last W-1 inputs; for len < W-1 some of them are older state inputs.
        conv_state[slot] = cast(ext[:, -(W - 1) :], conv_state.dtype)
        t = snaps.tokens(slot, eos - bos) if snaps is not None else None
        if snaps is not None and t is not None:  # the window after t tokens (kernels.snapshots)
            snaps.conv[slot] = ext[:, t : t + W - 1].clone()
