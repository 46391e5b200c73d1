"""Mamba2's chunk states: one grid over the whole packed batch, not one grid per sequence.

A varlen SSD scan (mamba_ssm's ``mamba_chunk_scan_combined`` with ``cu_seqlens``, as sglang and vLLM call
it for a prefill batch) cuts the *flattened* tokens into chunks of ``chunk_size``: the batch's ``T`` tokens
give ``cdiv(T, chunk_size)`` chunk states ``h``. Entry ``k >= 1`` is the state entering token ``k *
chunk_size``, of the sequence that token ``k * chunk_size - 1`` belongs to, after its tokens up to there;
entry 0 is the first sequence's initial state. A sequence that starts off the grid has a state on it only
where ``cu_seqlens[b] + tokens`` is a multiple of ``chunk_size``; elsewhere it must be recomputed (sglang's
``track_ssm_seq_idx`` / ``track_ssm_end_locs`` path). Reading ``h`` with per-sequence offsets, as for GDN's
per-sequence chunks, names the wrong state for every sequence but the first (sglang issue 31833).

Plain host functions: the torch reference fills ``h`` with them and the trace replay reads it with them.

>>> cu = [0, 5, 12]              # two rows: 5 and 7 tokens
>>> grid_size(12, 4), [grid_owner(cu, k, 4) for k in range(4)]  # entry 3 would be past the 12 tokens
(3, [(0, 0), (0, 4), (1, 3), None])
>>> grid_index(cu, 1, 3, 4), grid_index(cu, 1, 4, 4), grid_index(cu, 1, 7, 4)  # 4: off it; 7: final
(2, None, None)
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence


def grid_size(num_tokens: int, chunk_size: int) -> int:
    """Entries of ``h`` for ``num_tokens`` packed tokens: ``cdiv(num_tokens, chunk_size)``."""
    return -(-num_tokens // chunk_size)


def grid_owner(
    cu_seqlens: Sequence[int], k: int, chunk_size: int, num_tokens: int | None = None
) -> tuple[int, int] | None:
    """``(row, tokens)``: entry ``k`` of ``h`` is row ``row``'s state after its first ``tokens`` tokens of the
    call (0: its initial state); None where there is no entry ``k`` for ``num_tokens`` packed tokens (default
    ``cu_seqlens[-1]``: the state after the last token is a final state, not an entry) or its token lies past
    ``cu_seqlens[-1]`` (no row's)."""
    total = cu_seqlens[-1] if num_tokens is None else num_tokens
    if not 0 <= k < grid_size(total, chunk_size):
        return None
    if k == 0:
        return (0, 0) if len(cu_seqlens) > 1 else None
    pos = k * chunk_size
    if pos > cu_seqlens[-1]:
        return None
    row = bisect_right(cu_seqlens, pos - 1) - 1  # cu[row] <= pos - 1 < cu[row + 1]: zero-length rows skipped
    return row, pos - cu_seqlens[row]


def grid_index(
    cu_seqlens: Sequence[int], row: int, tokens: int, chunk_size: int, num_tokens: int | None = None
) -> int | None:
    """The entry of ``h`` holding ``row``'s state after its first ``tokens`` tokens of the call, or None when
    no entry does (off the grid: the state must be recomputed; or past the grid of ``num_tokens`` tokens,
    default ``cu_seqlens[-1]``)."""
    pos = cu_seqlens[row] + tokens
    if tokens == 0:
        return 0 if row == 0 else None  # entry cu[row] // C, if on the grid, is the row before's state
    total = cu_seqlens[-1] if num_tokens is None else num_tokens
    return pos // chunk_size if pos % chunk_size == 0 and pos < total else None


__all__ = ["grid_index", "grid_owner", "grid_size"]
