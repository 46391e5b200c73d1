"""Where a replayed step first went wrong: :class:`TraceDivergence`, its closed set of kinds.

Below the replay (:mod:`~workbench.traces.replay`, which re-exports both names) and its checkers
(:mod:`~workbench.traces.checkpoints`, :mod:`~workbench.traces.tracking`), so they build divergences
without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench import html
from workbench.traces.model import TraceStep

DIVERGENCE_KINDS = ("metadata", "invariant", "tokens", "state", "output", "foreign", "padded", "prefix", "error")
"""Every ``TraceDivergence.kind``, a closed set (see :class:`TraceDivergence`)."""


@dataclass(frozen=True)
class TraceDivergence:
    """Where a step first went wrong.

    ``kind``: ``"metadata"`` (the recorded metadata differs from what the workbench builds),
    ``"invariant"`` (the recorded metadata breaks the profile's rules), ``"tokens"`` (a row's
    ``cached_tokens`` or ``seq_len`` does not follow from its request's history: ``traces.ledger``),
    ``"state"`` (a live request's state is off its float64 recurrence), ``"output"``, ``"foreign"`` (a
    slot changed that no row of the step owns: a live request's that sat the step out, or one no live
    request owns), ``"padded"`` (a padded output row is not zero), ``"prefix"`` (a prefix cache's eviction,
    hit, copy or checkpoint is wrong: ``field`` says which; :mod:`workbench.traces.checkpoints`), or
    ``"error"`` (the step raised).
    """

    step: int
    kind: str
    field: str
    detail: str
    request: int | None = None
    row: int | None = None
    slot: int | None = None
    expected: Any = None
    got: Any = None

    def __post_init__(self) -> None:
        if self.kind not in DIVERGENCE_KINDS:
            raise ValueError(f"kind: {self.kind!r} is not one of {DIVERGENCE_KINDS}")

    def __str__(self) -> str:
        where = [f"step {self.step}", self.kind, self.field]
        where += [f"request {self.request}"] if self.request is not None else []
        where += [f"row {self.row}"] if self.row is not None else []
        where += [f"slot {self.slot}"] if self.slot is not None else []
        if self.expected is not None:
            values = f"; expected {self.expected}, got {self.got}"
        elif isinstance(self.got, float):  # a state or output check: its largest error
            values = f"; off by {self.got:.3g}"
        else:
            values = f"; got {self.got}" if self.got is not None else ""
        return f"{': '.join(where[:2])}: {', '.join(where[2:])}: {self.detail}{values}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (expected and got as numbers, lists or text)."""
        return {**self.__dict__, "expected": _jsonable(self.expected), "got": _jsonable(self.got)}

    def _repr_html_(self) -> str:
        facts = {k: getattr(self, k) for k in ("step", "kind", "field", "request", "row", "slot", "expected", "got")}
        return html.block(html.facts(facts), html.note(self.detail), title="First divergence")


def prefix_divergence(
    step: TraceStep,
    field: str,
    detail: str,
    request: int | None = None,
    slot: int | None = None,
    expected: Any = None,
    got: Any = None,
) -> TraceDivergence:
    """A ``"prefix"`` divergence of ``step`` (an eviction, hit, move, copy, track or checkpoint: ``field``)."""
    return TraceDivergence(step.step, "prefix", field, detail, request=request, slot=slot, expected=expected, got=got)


def _jsonable(value: Any) -> Any:
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)


__all__ = ["DIVERGENCE_KINDS", "TraceDivergence", "prefix_divergence"]
