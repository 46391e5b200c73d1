"""What the lab reports: a step (replayed or eager), an accept, the history rows of the heatmap, and the
verdict lines the view draws. A verdict's tick or cross comes from the check it states, never from a flag
set beside it; a fact that is no check (an eager step, a device graph's bitwise result) has neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from workbench.batch import Batch
from workbench.layers import LayerState
from workbench.runner import Comparison


@dataclass(frozen=True)
class Verdict:
    """One line of a result: ``ok`` True (a check that passed), False (one that failed) or None (a fact)."""

    ok: bool | None
    text: str
    key: str = ""


@dataclass
class StepReport:
    """One step: the comparison, what it changed, how it ran and its timings.

    ``before`` and ``inputs`` are kept after a verify step: the accept checks its result against the float64
    reference of that step.
    """

    label: str
    batch: Batch
    comparison: Comparison
    changed: list[int]
    allowed: list[int]
    live_slots: list[int]
    eager_us: float | None = None
    replay_us: float | None = None
    backend: str = "cpu"
    largest_bucket: int = 0
    before: LayerState | None = None
    inputs: torch.Tensor | None = None

    @property
    def clean(self) -> bool:
        return self.comparison.integrity.ok

    @property
    def replayed(self) -> bool:
        return self.comparison.replayed

    def verdicts(self) -> list[Verdict]:
        """How the step ran (eager, or replay vs eager) and its integrity against the float64 reference."""
        cmp = self.comparison
        if not cmp.replayed:
            how = Verdict(
                None,
                f"{self.batch.mode} bs={cmp.raw_batch_size}: eager: batch of {cmp.raw_batch_size} above the largest "
                f"bucket {self.largest_bucket} "
                f"({cmp.reason}); no graph ran",
                "how",
            )
        else:
            text = (
                f"{self.label}: replay == eager bitwise: {cmp.bitwise_equal} "
                f"(max output diff {cmp.max_output_diff:.3g}, max state diff {cmp.max_state_diff:.3g})"
            )
            if cmp.expect_bitwise:  # the CPU recorder reruns the very same kernels: a difference is a bug
                how = Verdict(cmp.bitwise_equal, text, "how")
            else:
                how = Verdict(None, f"{text}; not expected on a {self.backend} graph, which may pick other kernels")
        return [how, Verdict(cmp.integrity.ok, str(cmp.integrity), "integrity")]

    def timing_text(self) -> str:
        """The step's timings in words: eager and replay, or eager alone when no graph ran."""
        if self.eager_us is None:
            return ""
        if self.replay_us is None:
            return f"eager {self.eager_us:.1f} us for this batch on {self.backend} (no graph ran: nothing else to time)"
        ratio = self.eager_us / self.replay_us
        return (
            f"eager {self.eager_us:.1f} us, replay {self.replay_us:.1f} us ({ratio:.2f}x) "
            f"for this batch on {self.backend}"
        )


@dataclass
class AcceptReport:
    """An accept after a verify step, checked against the float64 reference of that step.

    Attributes:
        num_accepted: tokens accepted per live row (1..D).
        changed: slots the accept changed; ``foreign``: those no live row of the step owns.
        accepted_slots: per row, the slot that now holds its accepted state (where the next step reads it:
            the request's slot, or under vLLM's per-draft layout slot ``num_accepted - 1`` of the request).
        holds_accepted_state: per row, that slot's conv window and SSM state match the reference's state
            after ``num_accepted`` tokens. ``errors``: the largest absolute difference per row.
        per_slot: the profile keeps one slot per draft position (vLLM): accept copies nothing.
    """

    num_accepted: list[int]
    changed: list[int]
    foreign: list[int]
    accepted_slots: list[int]
    holds_accepted_state: list[bool]
    errors: list[float]
    per_slot: bool = False
    profile: str = "sglang"

    @property
    def ok(self) -> bool:
        rows = len(self.num_accepted)
        return len(self.holds_accepted_state) == rows and all(self.holds_accepted_state) and not self.foreign

    def verdict(self) -> Verdict:
        holds = len(self.holds_accepted_state) == len(self.num_accepted) and all(self.holds_accepted_state)
        text = f"accepted {self.num_accepted}: slots changed {self.changed}"
        if self.per_slot:
            text += (
                f" ({self.profile} keeps one slot per draft position: accept copies nothing, "
                "the next verify reads slot num_accepted - 1)"
            )
        text += f"; each live slot holds its accepted state: {holds}"
        if holds:
            text += f" (slots {self.accepted_slots} match the float64 reference)"
        else:
            off = [
                f"slot {s} off the float64 reference by {e:.3g}"
                for s, e, h in zip(self.accepted_slots, self.errors, self.holds_accepted_state, strict=True)
                if not h
            ]
            text += f" ({'; '.join(off)})"
        if self.foreign:
            text += f"; slots no live row owns changed: {self.foreign}"
        return Verdict(self.ok, text, "accept")


@dataclass
class HistoryRow:
    """Slots one action changed and the slots it was allowed to change (for the integrity heatmap)."""

    label: str
    changed: list[int]
    allowed: list[int] = field(default_factory=list)
