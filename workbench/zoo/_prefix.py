"""The shape the zoo's prefix-cache cases share: each replays its scripted trace (unfixed or fixed) beside the
float64 shadow and reads the first divergence. Their bugs live in a prefix cache's bookkeeping or copies, not
in a metadata backend or a kernel, so a user's backend is not run through them (``why_not`` says what to run
instead)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workbench.traces.model import Trace
from workbench.traces.replay import TraceDivergence, TraceReplayer
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence, TraceEvidence


def prefix_case(
    *,
    scenario_trace: Callable[[bool], Trace],
    reading: Callable[[TraceReplayer, TraceDivergence], tuple[bool, str]],
    records: str = "checkpoints and hits",
    lives_in: str = "bookkeeping",
    **fields: Any,
) -> ZooCase:
    """A :class:`ZooCase` (``fields``: name, title, issue, profile, explanation, steps) whose run replays
    ``scenario_trace(fixed)`` and credits the first divergence to the case when ``reading`` says so.
    ``records``: what the user's dumped trace must carry for ``workbench trace check`` to see the bug;
    ``lives_in``: the part of the prefix cache it is in."""

    def run(fixed: bool, backend: str) -> list[Evidence]:
        return [h.replay_trace(scenario_trace(fixed), None, backend, what="trace replay", reading=reading)]

    why_not = (
        f"the bug is in the prefix cache's {lives_in}, not in a metadata backend or a kernel: dump your "
        f"engine's trace with its {records} and run `workbench trace check` on it"
    )
    return ZooCase(run_fn=run, mechanism=(TraceEvidence,), why_not=why_not, **fields)
