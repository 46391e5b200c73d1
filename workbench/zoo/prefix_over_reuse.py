"""prefix_over_reuse: a finished request's state is cached under the token count the attention layers keep,
which drops the last partial block, though the state holds every token: a later request that shares the
shorter prefix continues from a state that has seen more (vLLM issue 43559, PR 43650)."""

from __future__ import annotations

from typing import Any

from workbench.layer_names import GDN
from workbench.traces.model import Trace
from workbench.traces.replay import TraceDivergence, TraceReplayer
from workbench.traces.script import scripted
from workbench.zoo import _harness as h
from workbench.zoo._prefix import prefix_case

EXPLANATION = (
    "A prefix cache for a hybrid model caches the attention layers' KV by whole blocks and the recurrent "
    "layers' state beside it. With speculative decoding, vLLM's attention manager dropped the final block "
    "that was only partly accepted, and so cached fewer tokens than were computed; the mamba manager did "
    "not drop it, and the state it kept had seen every token. A later request sharing the shorter prefix "
    "got a hit of that length and a state that had already consumed tokens it had not: about 20% accuracy "
    "lost on the reporter's eval, and one answer in eight empty. Here request 0 feeds an 8-token prompt "
    "and two decode tokens (10 in its state) and, as it finishes, its slot is published as the checkpoint "
    "of its first 8 tokens (two blocks of 4: the attention layers' count); request 1 shares those 8 tokens. "
    "The replay recomputes the state after exactly 8 tokens in float64 and finds the slot off it at the "
    "step that publishes it. The fix (PR 43650) drops the recurrent state's last partial block too: a state "
    "that cannot be cut at a block boundary is not cached, and request 1 computes its prompt itself."
)

SHARED = [11, 42, 7, 300, 5, 19, 1, 2]
BLOCK = 4


def plan(fixed: bool) -> list[dict[str, Any]]:
    """The steps: request 0's prompt, two decodes and its finish (publishing its slot, unfixed); request 1
    sharing the prompt, from a hit (unfixed) or from scratch (fixed)."""
    in_state = len(SHARED) + 2
    kept = in_state // BLOCK * BLOCK  # what the attention layers cache: the partial block dropped
    steps: list[dict[str, Any]] = [
        {"mode": "extend", "rows": {0: len(SHARED)}, "tokens": {0: SHARED}},
        {"mode": "decode", "rows": [0]},
    ]
    if fixed:
        steps.append({"mode": "decode", "rows": [0], "finish": [0]})
        steps.append({"mode": "extend", "rows": {1: kept + 1}, "tokens": {1: [*SHARED, 77]}})
    else:
        publish = {"checkpoints": [{"request": 0, "tokens": kept, "slot": 1}]}
        steps.append({"mode": "decode", "rows": [0], "finish": [0], "metadata": publish})
        hit = {"hits": [{"request": 1, "tokens": kept, "slot": 1}], "copies_before": [[1, 2]]}
        steps.append({"mode": "extend", "rows": {1: 1}, "tokens": {1: [77]}, "cached": {1: kept}, "metadata": hit})
    steps.append({"mode": "decode", "rows": [1], "finish": [1]})
    return steps


def scenario_trace(fixed: bool) -> Trace:
    return scripted("vllm", GDN, plan(fixed), num_slots=6, buckets={"decode": [1, 2, 4]}, tokens=True)


def reading(rep: TraceReplayer, d: TraceDivergence) -> tuple[bool, str]:
    """This bug: a checkpoint off the state of its prefix, and its slot holds more tokens than it claims."""
    if d.kind != "prefix" or d.field != "checkpoint" or "off the float64 state" not in d.detail:
        return False, ""
    claimed = next(c["tokens"] for c in (rep.trace.steps[d.step].metadata or {})["checkpoints"] if c["slot"] == d.slot)
    held = h.tokens_in_state(rep.trace, d.request, d.step) if d.request is not None else 0
    if held <= claimed:
        return False, f"the slot's request has {held} tokens in its state"
    return True, f"the slot holds request {d.request}'s {held} tokens; the checkpoint claims its first {claimed}"


CASE = prefix_case(
    scenario_trace=scenario_trace,
    reading=reading,
    name="prefix_over_reuse",
    title="a cached state holds more tokens than its prefix: a hit continues from tokens it never had",
    issue="vLLM issue 43559, PR 43650",
    profile="vllm",
    explanation=EXPLANATION,
    steps="a scripted 5-step trace with token ids, GDN layer (small, seed 0), 6 slots, decode buckets 1, 2, 4: "
    "request 0 prefills 8 tokens and decodes 2; as it finishes its slot is published as the checkpoint of 8 "
    "tokens (unfixed); request 1 shares the 8 tokens and hits it; each checkpoint recomputed in float64",
)
