"""States at chosen tokens, handed out by the torch references as they pass them.

A chunked kernel leaves the state at each chunk boundary behind (``h``), and sglang's prefix cache copies one of
them into a track slot. The token-by-token references keep no such states; inside :func:`take_states` they
hand out the ones asked for instead: slot ``s``'s conv window and recurrent state after the first ``n`` tokens
of its row in the call (``wanted = {s: n}``). Taking them is a copy of what the call computes anyway, so the
call's outputs and pools are what they are without it.

Who hands them out, in an extend: ``gated_delta_rule.recurrent``'s reference (the recurrent state, in the pool's
layout and the arithmetic dtype; KDA too; not in a verify, which keeps every step's state already),
``mamba2.chunk_scan``'s (the SSM state) and ``causal_conv1d.varlen``'s (the conv window), in the arithmetic
dtype. The Triton kernels take none: a state not in :attr:`Snapshots.ssm` or :attr:`Snapshots.conv` after the
call was not taken, and must be computed otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch


@dataclass
class Snapshots:
    """What :func:`take_states` asked for (``wanted``: slot -> tokens of its row) and what the references took:
    ``conv[slot]`` ``[dim, W-1]`` and ``ssm[slot]`` (one slot of the pool, its layout), both clones."""

    wanted: dict[int, int]
    conv: dict[int, torch.Tensor] = field(default_factory=dict)
    ssm: dict[int, torch.Tensor] = field(default_factory=dict)

    def tokens(self, slot: int, length: int) -> int | None:
        """How many tokens into a row of ``length`` tokens on ``slot`` a state is wanted; None for no state (none
        asked, or not after one of the row's tokens)."""
        n = self.wanted.get(slot)
        return n if n is not None and 1 <= n <= length else None


_ACTIVE: ContextVar[Snapshots | None] = ContextVar("kernels_snapshots", default=None)


@contextmanager
def take_states(wanted: dict[int, int] | Snapshots) -> Iterator[Snapshots]:
    """Within the block, the references copy slot ``s``'s states after ``wanted[s]`` tokens of its row into the
    :class:`Snapshots` yielded (see the module): a new one, or ``wanted`` itself when it is one."""
    snaps = wanted if isinstance(wanted, Snapshots) else Snapshots(dict(wanted))
    token = _ACTIVE.set(snaps)
    try:
        yield snaps
    finally:
        _ACTIVE.reset(token)


def active() -> Snapshots | None:
    """The innermost :func:`take_states`' :class:`Snapshots`, or None outside one."""
    return _ACTIVE.get()


__all__ = ["Snapshots", "active", "take_states"]
