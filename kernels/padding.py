"""The padding rule every kernel follows, and what the torch references build on it.

A row ``i`` is *skipped* (no state read, no state write, output zeros) iff
``pad_slot_id is not None and state_indices[i] <= pad_slot_id``. One parameter covers the three engine
conventions of the design:

- ``pad_slot_id=-1``  sglang (CUDA): padded rows carry -1; negative indices are skipped.
- ``pad_slot_id=0``   vLLM: slot 0 is the never-allocated null block; indices ``<= 0`` are skipped.
- ``pad_slot_id=None`` sglang on Ascend: nothing is skipped; padded rows point at the dummy slot 0 and
  are really processed there (several rows may then write slot 0 concurrently; nobody reads it).
"""

from __future__ import annotations

import torch


def skipped_rows(state_indices: torch.Tensor, pad_slot_id: int | None) -> torch.Tensor:
    """Bool mask [N]: rows that touch no state slot under the padding rule above."""
    if pad_slot_id is None:
        return torch.zeros_like(state_indices, dtype=torch.bool)
    return state_indices <= pad_slot_id


def live_rows_and_slots(
    indices: torch.Tensor, pad_slot_id: int | None, num_slots: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows that are processed under the padding rule, and their slots (int64), checked against the pool.

    Raises IndexError naming the first processed row whose slot is outside ``[0, num_slots)``. Reads the
    indices on the host: for the torch references only.
    """
    rows = (~skipped_rows(indices, pad_slot_id)).nonzero().squeeze(1)
    slots = indices[rows].long()
    bad = (slots < 0) | (slots >= num_slots)
    if bool(bad.any()):
        row = int(rows[bad.nonzero()[0, 0]])
        raise IndexError(
            f"row {row} has slot {int(indices[row])}, outside the pool [0, {num_slots}) and not skipped "
            f"under pad_slot_id={pad_slot_id}"
        )
    return rows, slots
