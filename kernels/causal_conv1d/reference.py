"""Torch reference of the short causal convolution (decode, target-verify and varlen prefill).

Readable first: one sequence or one step at a time, computed in float32, or in float64 when any input
is float64 (the tests' ground truth). Works on any device but reads the indices and ``cu_seqlens`` on
the host, so it synchronises on an accelerator; the Triton kernel does not.

Conventions (see ``kernels/causal_conv1d/__init__.py``): channels last, ``conv_state[slot]`` is
``[dim, W-1]`` with the oldest input in column 0, ``weight[c, W-1]`` multiplies the newest input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.dtypes import compute_dtype
from kernels.padding import live_rows_and_slots


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    return F.silu(y) if activation == "silu" else y


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
) -> None:
    """Decode (``L == 1``) / verify (``L == D``) step of every row at once; writes ``out`` in place.

    x [N, L, dim]; conv_state [num_slots, dim, W-1]; weight [dim, W]; bias [dim] or None;
    state_indices [N] int; intermediate_conv_windows [N, L, dim, W-1] or None; out [N, L, dim].
    """
    ct = compute_dtype(x, conv_state, weight, bias)
    w = weight.to(ct)  # [dim, W]
    b = bias.to(ct) if bias is not None else torch.zeros((), dtype=ct, device=x.device)

    # Skipped rows (and only they) keep these zeros: deterministic, never uninitialised memory.
    out.zero_()
    rows, slots = live_rows_and_slots(state_indices, pad_slot_id, conv_state.shape[0])

    window = conv_state[slots].to(ct)  # [R, dim, W-1]: the W-1 previous inputs, oldest first
    for t in range(x.shape[1]):
        full = torch.cat([window, x[rows, t].to(ct).unsqueeze(-1)], dim=-1)  # [R, dim, W]
        y = (full * w).sum(-1) + b
        out[rows, t] = _activate(y, activation).to(out.dtype)
        window = full[..., 1:]  # drop the oldest input
        if intermediate_conv_windows is not None:
            # Indexed by batch row, not by slot: the engine picks the accepted step afterwards.
            intermediate_conv_windows[rows, t] = window.to(intermediate_conv_windows.dtype)
    if not disable_state_update:
        conv_state[slots] = window.to(conv_state.dtype)


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
    w = weight.to(ct)
    b = bias.to(ct) if bias is not None else torch.zeros((), dtype=ct, device=x.device)

    out.zero_()
    rows, slots = live_rows_and_slots(state_indices, pad_slot_id, conv_state.shape[0])
    bounds = cu_seqlens.tolist()
    for row, slot in zip(rows.tolist(), slots.tolist(), strict=True):
        bos, eos = bounds[row], bounds[row + 1]
        if eos == bos:
            continue  # a zero-length row neither outputs nor touches its slot
        if bool(has_initial_state[row]):
            initial = conv_state[slot].to(ct)
        else:
            initial = torch.zeros(dim, W - 1, dtype=ct, device=x.device)
        # The sequence as the convolution sees it: W-1 older inputs, then this sequence's tokens.
        ext = torch.cat([initial, x[bos:eos].to(ct).T], dim=1)  # [dim, W-1+len]
        windows = ext.unfold(1, W, 1)  # [dim, len, W]: windows[:, t] ends at token t
        y = (windows * w.unsqueeze(1)).sum(-1) + b.unsqueeze(-1)  # [dim, len]
        out[bos:eos] = _activate(y, activation).T.to(out.dtype)
        # The last W-1 inputs; for len < W-1 some of them are older state inputs.
        conv_state[slot] = ext[:, -(W - 1) :].to(conv_state.dtype)
