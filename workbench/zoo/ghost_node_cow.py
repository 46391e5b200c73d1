"""ghost_node_cow: a request that leaves nothing to cache is inserted into the radix tree as an empty node
that keeps its state slot, a checkpoint of zero tokens that holds a whole request's state and serves as a
copy-on-write source (sglang PR 35821)."""

from __future__ import annotations

from typing import Any

from workbench.layer_names import GDN
from workbench.traces.model import Trace
from workbench.traces.replay import TraceDivergence, TraceReplayer
from workbench.traces.script import scripted
from workbench.zoo._prefix import prefix_case

EXPLANATION = (
    "When a request finishes, sglang's mamba radix cache inserts its tokens with the request's state slot as "
    "the value of the last node, and frees what it does not keep. A request with nothing to cache "
    "(`cache_len` 0 or None) had its unprotected KV and mamba slots inserted anyway, as a node of key length "
    "0: a ghost whose value is the slot of a whole request's state, while its key says 'no tokens'. A later "
    "`match_prefix` that finds no better value (`best_value_len = 0`) takes that ghost as its copy-on-write "
    "source, and the new request's slot starts from a stale state that belongs to no prefix of its own. PR "
    "35821 (ported from the NPU fix of PR 30451; the same PR clamps the tree verify's track step) frees the "
    "slots and returns early when `cache_len` is 0. Here request 0 prefills 8 tokens and decodes one; as it "
    "finishes, the unfixed cache publishes its running slot 1 as a checkpoint of 0 tokens, and request 1, "
    "sharing no prefix, is admitted with a copy of it. The replay checks every published checkpoint against "
    "the float64 state of exactly its tokens: the state of zero tokens is the empty one, and slot 1 holds 9 "
    "tokens' state. Fixed, nothing is published and request 1 starts from no state."
)

PROMPT = [11, 42, 7, 300, 5, 19, 1, 2]


def plan(fixed: bool) -> list[dict[str, Any]]:
    """Request 0's prompt and one decode, then its finish (unfixed: an empty checkpoint of its slot); request
    1 admitted with a prompt of its own (unfixed: copy-on-write from the ghost)."""
    ghost: dict[str, Any] = {} if fixed else {"metadata": {"checkpoints": [{"request": 0, "tokens": 0, "slot": 1}]}}
    cow: dict[str, Any] = (
        {} if fixed else {"metadata": {"hits": [{"request": 1, "tokens": 0, "slot": 1}], "copies_before": [[1, 2]]}}
    )
    return [
        {"mode": "extend", "rows": {0: len(PROMPT)}, "tokens": {0: PROMPT}},
        {"mode": "decode", "rows": [0], "finish": [0], **ghost},
        {"mode": "extend", "rows": {1: 4}, "tokens": {1: [9, 60, 61, 62]}, **cow},
        {"mode": "decode", "rows": [1], "finish": [1]},
    ]


def scenario_trace(fixed: bool) -> Trace:
    return scripted("sglang", GDN, plan(fixed), num_slots=6, buckets={"decode": [1, 2]}, tokens=True)


def reading(rep: TraceReplayer, d: TraceDivergence) -> tuple[bool, str]:
    """This bug: a checkpoint of zero tokens, the ghost node."""
    step = rep.trace.steps[d.step]
    empty = [c for c in (step.metadata or {}).get("checkpoints", []) if c.get("tokens") == 0]
    if d.kind != "prefix" or d.field != "checkpoint" or not empty:
        return False, ""
    return True, f"step {d.step} publishes slot {empty[0]['slot']} as the checkpoint of 0 tokens (a ghost node)"


CASE = prefix_case(
    scenario_trace=scenario_trace,
    reading=reading,
    records="checkpoints and hits",
    lives_in="insertion at finish",
    name="ghost_node_cow",
    title="a request with nothing to cache leaves an empty ghost node that serves as a copy-on-write source",
    issue="sglang PR 35821",
    profile="sglang",
    explanation=EXPLANATION,
    steps="a scripted 4-step trace with token ids, GDN layer (small, seed 0), 6 slots, decode buckets 1, 2: request "
    "0 prefills 8 tokens and decodes one; as it finishes (unfixed) slot 1 is published as a checkpoint of 0 "
    "tokens; request 1 prefills 4 tokens of its own (unfixed: a 0-token hit copying slot 1 into its slot); "
    "checkpoints against the float64 state of exactly their tokens",
)
