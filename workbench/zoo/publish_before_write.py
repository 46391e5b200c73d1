"""publish_before_write: a prefix is published as cached when its step is scheduled, not when the step has
written it; the request is aborted in between, and the checkpoint names a state that never came to be
(vLLM PR 56525)."""

from __future__ import annotations

from typing import Any

from workbench.layer_names import GDN
from workbench.traces.model import Trace
from workbench.traces.replay import TraceDivergence, TraceReplayer
from workbench.traces.script import scripted
from workbench.zoo._prefix import prefix_case

EXPLANATION = (
    "A prefix cache may only offer a state once the step that computes it has run. vLLM's scheduler "
    "recorded the blocks of a scheduled prefill chunk as cached when it scheduled them; if the request was "
    "aborted (a client disconnect, a stop string) before that step committed, the blocks stayed published "
    "although their state was never written, and a later request with the same prefix could hit them and "
    "start from whatever the slot held. Here request 0 prefills the first 4 tokens of an 8-token prompt; "
    "its second chunk is scheduled and the 8-token prefix published, but the request is aborted and the "
    "step runs without it; request 1 shares the prompt. The replay knows each request's tokens in its state "
    "after every step and refuses the checkpoint at the step that publishes it: 8 tokens claimed, 4 "
    "written. The fix (PR 56525) publishes a prefix only after the step that writes it has committed, and "
    "drops it on abort; request 1 then prefills its prompt."
)

PROMPT = [23, 8, 150, 4, 61, 61, 9, 2]


def plan(fixed: bool) -> list[dict[str, Any]]:
    """Request 0's first chunk; its abort with the 8-token prefix published (unfixed) or not; request 1."""
    aborted: dict[str, Any] = {"mode": "idle", "finish": [0]}
    if not fixed:
        aborted["metadata"] = {"checkpoints": [{"request": 0, "tokens": len(PROMPT), "slot": 1}]}
    return [
        {"mode": "extend", "rows": {0: 4}, "tokens": {0: PROMPT[:4]}},
        aborted,
        {"mode": "extend", "rows": {1: len(PROMPT)}, "tokens": {1: PROMPT}},
        {"mode": "decode", "rows": [1], "finish": [1]},
    ]


def scenario_trace(fixed: bool) -> Trace:
    return scripted("vllm", GDN, plan(fixed), num_slots=6, buckets={"decode": [1, 2, 4]}, tokens=True)


def reading(rep: TraceReplayer, d: TraceDivergence) -> tuple[bool, str]:
    """This bug: a checkpoint published for more tokens than the request's state holds."""
    if d.kind != "prefix" or d.field != "checkpoint" or "published before it is written" not in d.detail:
        return False, ""
    ran = [s.step for s in rep.trace.steps[: d.step + 1] if any(r.id == d.request for r in s.rows)]
    return True, f"request {d.request} last ran at step {ran[-1] if ran else None}; step {d.step} did not run it"


CASE = prefix_case(
    scenario_trace=scenario_trace,
    reading=reading,
    name="publish_before_write",
    title="a prefix published at schedule time: the request aborts and the checkpoint was never written",
    issue="vLLM PR 56525",
    profile="vllm",
    explanation=EXPLANATION,
    steps="a scripted 4-step trace with token ids, GDN layer (small, seed 0), 6 slots, decode buckets 1, 2, 4: "
    "request 0 prefills 4 of its 8 prompt tokens; at the next step it is aborted while its 8-token prefix is "
    "published (unfixed); request 1 prefills the same prompt; each checkpoint checked against the tokens in state",
)
