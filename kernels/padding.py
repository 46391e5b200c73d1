"""The padding rule every kernel follows, and what the torch references build on it.

A row ``i`` is *skipped* (no state read, no state write, output zeros) iff
``pad_slot_id is not None and state_indices[i] <= pad_slot_id``. One parameter covers every engine
convention: which engine passes which ``pad_slot_id``, what its padded rows carry and which slot is its
dummy is written in :data:`kernels.conventions.CONVENTIONS`. With ``pad_slot_id=None`` nothing is skipped:
padded rows point at the dummy slot and are really processed there (several rows may then write it
concurrently; nobody reads it).

The torch references and the ops' argument checks use :func:`skipped_rows`; the Triton kernels test
``slot > pad_slot_id`` on the device. A reference that indexes the pool reads its rows through
:func:`live_rows_and_slots` or :func:`host_rows`, which refuse a processed row whose slot is outside the pool:
a Python or torch index of -1 (sglang's sentinel, passed under a convention that skips nothing) would
otherwise be the pool's last slot.
"""

from __future__ import annotations

import torch


def skipped_rows(state_indices: torch.Tensor, pad_slot_id: int | None) -> torch.Tensor:
    """Bool mask [N]: rows that touch no state slot under the padding rule above."""
    if pad_slot_id is None:
        return torch.zeros_like(state_indices, dtype=torch.bool)
    return state_indices <= pad_slot_id


def live_rows_and_slots(
    state_indices: torch.Tensor, pad_slot_id: int | None, num_slots: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows that are processed under the padding rule, and their slots (int64), checked against the pool.

    Raises IndexError naming the first processed row whose slot is outside ``[0, num_slots)``. Reads
    ``state_indices`` on the host: for the torch references only.
    """
    slots, skipped = host_rows(state_indices, pad_slot_id, num_slots)
    rows = [row for row, skip in enumerate(skipped) if not skip]
    # built from host lists: on a handful of rows a torch mask, nonzero and bounds check cost ten small calls
    device = state_indices.device
    live = [slots[row] for row in rows]
    return torch.tensor(rows, dtype=torch.long, device=device), torch.tensor(live, dtype=torch.long, device=device)


def _outside_the_pool(row: int, slot: int, num_slots: int, pad_slot_id: int | None) -> IndexError:
    return IndexError(
        f"state_indices: row {row} has slot {slot}, outside the pool [0, {num_slots}) "
        f"and not skipped under pad_slot_id={pad_slot_id}"
    )


def host_rows(state_indices: torch.Tensor, pad_slot_id: int | None, num_slots: int) -> tuple[list[int], list[bool]]:
    """``(slots, skipped)`` per row as host lists, every processed row's slot checked against the pool.

    For a reference that indexes the pool with Python ints (``state[slot]``): an unchecked -1 there is the
    last slot. Raises the IndexError of :func:`live_rows_and_slots`.
    """
    slots: list[int] = state_indices.tolist()
    skipped = [False] * len(slots) if pad_slot_id is None else [slot <= pad_slot_id for slot in slots]
    for row, slot in enumerate(slots):
        if not skipped[row] and not 0 <= slot < num_slots:
            raise _outside_the_pool(row, slot, num_slots, pad_slot_id)
    return slots, skipped
