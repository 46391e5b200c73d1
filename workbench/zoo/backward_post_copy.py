"""backward_post_copy: after a step, the state copy that should move a request's state forward runs
backwards, and the block state it copies from replaces the running state the step computed (vLLM issue
53505)."""

from __future__ import annotations

from typing import Any

from workbench.layer_names import GDN
from workbench.traces.model import Trace
from workbench.traces.replay import TraceDivergence, TraceReplayer
from workbench.traces.script import scripted
from workbench.zoo import _harness as h
from workbench.zoo._prefix import prefix_case

EXPLANATION = (
    "In vLLM's align mode a request's recurrent state lives in the block of its current position, and the "
    "state at each block boundary stays in its block as the prefix checkpoint. Two copies move it: before a "
    "step, the pre-copy carries the running state forward into the block the step will write; after a "
    "speculative step, the post-copy moves the accepted state to its aligned block. In issue 53505 the "
    "post-copy computed a destination before its source: after the pre-copy had already moved the state "
    "forward, it copied the older block's state back over the running one, and the request continued from "
    "a state missing its latest tokens (per-token degeneration under MTP). Here request 0 prefills 8 tokens "
    "and its block-boundary state is kept in slot 4; two decodes follow, and after the second one the "
    "post-copy runs from slot 4 onto the running slot (unfixed). The replay checks every copy before "
    "making it: a copy after the forward may not write a live request's running slot. The fix orders the "
    "copies so that the post-copy never runs backwards."
)

PROMPT = [5, 5, 81, 7, 19, 203, 44, 8]
BLOCK_SLOT = 4


def plan(fixed: bool) -> list[dict[str, Any]]:
    """Request 0's prompt with its boundary state kept in slot 4; two decodes, the second followed by the
    backwards post-copy (unfixed); a last decode."""
    boundary = {
        "copies_after": [[1, BLOCK_SLOT]],
        "checkpoints": [{"request": 0, "tokens": len(PROMPT), "slot": BLOCK_SLOT}],
    }
    second: dict[str, Any] = {"mode": "decode", "rows": [0]}
    if not fixed:
        second["metadata"] = {"copies_after": [[BLOCK_SLOT, 1]]}
    return [
        {"mode": "extend", "rows": {0: len(PROMPT)}, "tokens": {0: PROMPT}, "metadata": boundary},
        {"mode": "decode", "rows": [0]},
        second,
        {"mode": "decode", "rows": [0], "finish": [0]},
    ]


def scenario_trace(fixed: bool) -> Trace:
    return scripted("vllm", GDN, plan(fixed), num_slots=6, buckets={"decode": [1, 2, 4]}, tokens=True)


def reading(rep: TraceReplayer, d: TraceDivergence) -> tuple[bool, str]:
    """This bug: a copy after the forward onto a live request's running slot, from one of its checkpoints."""
    if d.kind != "prefix" or d.field != "copy" or "replacing the state its step computed" not in d.detail:
        return False, ""
    md = rep.trace.steps[d.step].metadata or {}
    src = next((p[0] for p in md.get("copies_after", []) if p[1] == d.slot), None)
    cp = rep.book.is_live(src) if src is not None else None
    if cp is None:
        return False, ""
    held = h.tokens_in_state(rep.trace, cp.request, d.step)
    return True, f"the copy brings back slot {src}'s {len(cp.tokens)}-token state over the {held} tokens the step left"


CASE = prefix_case(
    scenario_trace=scenario_trace,
    reading=reading,
    name="backward_post_copy",
    title="a post-copy runs backwards and replaces the running state with an older block's",
    issue="vLLM issue 53505",
    profile="vllm",
    explanation=EXPLANATION,
    lives_in="copies",
    records="copies and checkpoints",
    steps="a scripted 4-step trace with token ids, GDN layer (small, seed 0), 6 slots, decode buckets 1, 2, 4: "
    "request 0 prefills 8 tokens, its boundary state copied into slot 4 and published; two decodes, the "
    "second followed by a copy from slot 4 onto its running slot (unfixed); a last decode",
)
