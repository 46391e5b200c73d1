"""What a replayed step hands its checkers: :class:`StepContext`.

The replay (:mod:`~workbench.traces.replay`) builds one per step and passes it to the prefix-cache checks
(:mod:`~workbench.traces.checkpoints`) and the track checks (:mod:`~workbench.traces.tracking`), which read
the step's facts here instead of reaching into the replayer. Built at the step's start; once the forward
has run, :meth:`StepContext.after_forward` adds what it ran on and left (the batch, the inputs, the states
before it, a verify's intermediate states).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch

from kernels.snapshots import Snapshots
from workbench.batch import Batch
from workbench.layers import Intermediate, LayerState
from workbench.pool import StatePool
from workbench.traces.model import TraceRow, TraceStep, accepted_paths, node_path, row_parents, tokens_after


class VerifiedIntermediates(NamedTuple):
    """A verify step's rows (request-pool rows, in batch order) with the runner's and the float64 reference's
    intermediate states (``[rows, D, ...]``), for sglang's tracking at commit."""

    rows: list[int]
    runner: Intermediate
    reference: Intermediate


@dataclass(frozen=True)
class StepContext:
    """One step of a replay as its checkers see it.

    ``state`` (the runner's float32 pool) and ``shadow`` (the float64 pool the reference advances) are the
    replay's own, written in place by copies, moves and tracks. ``live`` (request id -> request-pool row) and
    ``accepted`` (vLLM: request id -> tokens accepted at its last verify; a move or a post-copy resets it,
    :meth:`reset_accepted`) are the replay's mappings, seen live. ``layer`` is the runner's layer,
    ``reference`` its float64 twin.

    After the forward (:meth:`after_forward`; None or empty before, or when the step ran none): ``batch``,
    ``inputs`` (``[tokens, hidden]``), ``before`` (the runner's and the shadow's states before the step: the
    stand-in for the kernel's chunk states), ``taken`` (the states the runner's and the shadow's references
    handed out as they passed them: :mod:`kernels.snapshots`, asked for the rows tracked from the chunk
    states), ``read_columns`` (vLLM verify: request id -> the column of its window it read) and ``verified``
    (a verify's intermediate states; sglang only).

    ``accepted_unit``: the header's ``accepted`` (what a verify row's ``accepted`` counts): :meth:`kept`
    reads a row's through it. ``topk``: the header's (above 1: the verify rows' drafts are trees, and a
    verify row keeps the tokens of its accepted path, :meth:`path`).
    """

    step: TraceStep
    pool: StatePool
    state: LayerState
    shadow: LayerState
    layer: Any
    reference: Any
    draft_tokens: int
    live: Mapping[int, int]
    accepted: dict[int, int]
    batch: Batch | None = None
    inputs: torch.Tensor | None = None
    before: tuple[LayerState, LayerState] | None = None
    taken: tuple[Snapshots, Snapshots] | None = None
    read_columns: Mapping[int, int] = field(default_factory=dict)
    verified: VerifiedIntermediates | None = None
    accepted_unit: str = "tokens"
    topk: int = 1

    def after_forward(
        self,
        *,
        batch: Batch | None,
        inputs: torch.Tensor | None,
        before: tuple[LayerState, LayerState] | None,
        read_columns: Mapping[int, int],
        verified: VerifiedIntermediates | None,
        taken: tuple[Snapshots, Snapshots] | None = None,
    ) -> StepContext:
        """This step with what its forward ran on and left."""
        return replace(
            self, batch=batch, inputs=inputs, before=before, taken=taken, read_columns=dict(read_columns),
            verified=verified,
        )  # fmt: skip

    @property
    def dummy_slot(self) -> int:
        return self.pool.profile.dummy_slot

    def owner(self, slot: int) -> int | None:
        """The live request that owns ``slot`` now (None: no live request does)."""
        return next((rid for rid, row in self.live.items() if slot in self.pool.slots_of(row)), None)

    def slots_of(self, request: int) -> list[int]:
        """The slots live ``request`` owns, in column order."""
        return self.pool.slots_of(self.live[request])

    def in_pool(self, slot: int) -> bool:
        """``slot`` is a real slot of the pool: not the dummy (null) slot, not past the pool."""
        return slot != self.dummy_slot and 0 <= slot < self.pool.num_slots

    def kept(self, row: TraceRow) -> int:
        """Tokens verify row ``row`` of this step keeps (1..D), its ``accepted`` read in the header's unit."""
        return row.kept(self.accepted_unit)

    def path(self, row: TraceRow) -> tuple[int, ...]:
        """The root-first draft nodes verify row ``row`` accepted (its kept tokens, in order): the step's
        ``accept_index``, or a chain's first :meth:`kept` nodes."""
        return accepted_paths(self.step, self.accepted_unit)[row.id]

    @staticmethod
    def node_path(row: TraceRow, node: int) -> tuple[int, ...]:
        """The root-first nodes from verify row ``row``'s root to ``node`` in its draft tree (a chain's
        ``0..node``): the tokens whose state node ``node`` holds."""
        return node_path(row_parents(row), node)

    def held_after(self, row: TraceRow) -> int:
        """Tokens in ``row``'s request's state after the step: a verify row's kept ones, any other row's all."""
        return tokens_after(row, self.step.kind_of(row), self.accepted_unit)

    def reset_accepted(self, request: int) -> None:
        """vLLM: the request's next verify reads the first slot of its window (a pre-copy or post-copy moved
        its state there)."""
        self.accepted[request] = 1


__all__ = ["StepContext", "VerifiedIntermediates"]
