"""unwritten_track_slot: with speculation, the prefill graph never writes the track slot, and the scheduler
commits it as the prompt's checkpoint anyway (sglang PR 32606)."""

from __future__ import annotations

from typing import Any

from workbench.layer_names import GDN
from workbench.traces.model import Trace
from workbench.traces.replay import TraceDivergence, TraceReplayer
from workbench.traces.script import scripted
from workbench.zoo._prefix import prefix_case

EXPLANATION = (
    "sglang's extra_buffer strategy gives each request a track slot beside its running one: the prefill step "
    "copies the state at the tracked length into it, and after the step the scheduler commits the track "
    "slot to the radix tree as that prefix's checkpoint. A prefill CUDA graph registered its track buffers "
    "only when speculative decoding was off; with speculation the graph ran without the track copy while the "
    "scheduler still flipped its ping-pong index and committed the slot, so the tree held a slot nothing "
    "had written (a previous tenant's state, or zeros), and every later hit on the prefix started from it. "
    "Here request 0 prefills an 8-token prompt; the step publishes slot 5 as its checkpoint with no copy "
    "into it (unfixed) or after copying its running slot there (fixed); request 1 shares the prompt and hits "
    "it. The replay recomputes the state after exactly those 8 tokens in float64 and compares the slot at "
    "the step that publishes it. The fix (PRs 34043, 34184) registers the track buffers in the prefill "
    "graph with speculation too."
)

PROMPT = [3, 77, 12, 12, 401, 5, 9, 60]
TRACK = 5


def plan(fixed: bool) -> list[dict[str, Any]]:
    """Request 0's prompt with its track slot committed (copied into first only when fixed); a decode; request
    1 from a hit on it; a decode of both."""
    commit: dict[str, Any] = {"checkpoints": [{"request": 0, "tokens": len(PROMPT), "slot": TRACK}]}
    if fixed:
        commit["copies_after"] = [[1, TRACK]]
    hit = {"hits": [{"request": 1, "tokens": len(PROMPT), "slot": TRACK}], "copies_before": [[TRACK, 2]]}
    return [
        {"mode": "extend", "rows": {0: len(PROMPT)}, "tokens": {0: PROMPT}, "metadata": commit},
        {"mode": "decode", "rows": [0]},
        {"mode": "extend", "rows": {1: 2}, "tokens": {1: [8, 8]}, "cached": {1: len(PROMPT)}, "metadata": hit},
        {"mode": "decode", "rows": [0, 1], "finish": [0, 1]},
    ]


def scenario_trace(fixed: bool) -> Trace:
    return scripted("sglang", GDN, plan(fixed), num_slots=6, buckets={"decode": [1, 2, 4]}, tokens=True)


def reading(rep: TraceReplayer, d: TraceDivergence) -> tuple[bool, str]:
    """This bug: a checkpoint off its prefix, on a slot no copy of the step wrote."""
    if d.kind != "prefix" or d.field != "checkpoint" or "off the float64 state" not in d.detail:
        return False, ""
    step = rep.trace.steps[d.step]
    md = step.metadata or {}
    if any(r.slot == d.slot for r in step.rows):
        return False, f"slot {d.slot} is the running slot of a row of step {d.step}"
    if any(dst == d.slot for _, dst, *_ in md.get("copies_after", [])):
        return False, f"a copy of step {d.step} wrote slot {d.slot}"
    return True, f"no copy of step {d.step} wrote slot {d.slot}: the scheduler committed what it held before"


CASE = prefix_case(
    scenario_trace=scenario_trace,
    reading=reading,
    name="unwritten_track_slot",
    title="a track slot nothing wrote is committed as the prompt's checkpoint",
    issue="sglang PR 32606",
    profile="sglang",
    explanation=EXPLANATION,
    steps="a scripted 4-step trace with token ids, GDN layer (small, seed 0), 6 slots, decode buckets 1, 2, 4: "
    "request 0 prefills 8 tokens and slot 5 is committed as their checkpoint, with no copy into it (unfixed) "
    "or after its running slot is copied there (fixed); request 1 hits it; each checkpoint recomputed in float64",
)
