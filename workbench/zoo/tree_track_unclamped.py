"""tree_track_unclamped: the prefix-cache track step of a tree verify is read one past the accepted path,
from `accept_index`'s -1 padding, and the checkpoint it should fill is published unwritten (sglang PR 35821)."""

from __future__ import annotations

from workbench.traces.model import Trace
from workbench.traces.replay import TraceDivergence, TraceReplayer
from workbench.zoo import _tree
from workbench.zoo._prefix import prefix_case

EXPLANATION = (
    "With `extra_buffer` sglang checkpoints a request's state whenever its tokens cross a multiple of the "
    "track interval, also inside a verify: after the commit it copies the intermediate state of the node that "
    "holds exactly the tokens up to that multiple `tp` into the request's track slot, which the radix cache "
    "then publishes. That node is `accept_index[b, i] - b * D` at depth `i = tp - pre - 1` of the accepted "
    "path (`pre` the tokens before the verify). An index computed one too far reaches past the path when the "
    "multiple is the last accepted token, into the -1 that pads each row of `accept_index`: the step becomes "
    "`-1 - b * D`, no state is copied, and the slot is published as the checkpoint of tokens it never got. PR "
    "35821 clamps the depth by `accept_lens - 1` (ported from the NPU fix of PR 30451; the same PR stops "
    "inserting an empty ghost node as a copy-on-write source). Here two requests prefill 6 tokens and verify "
    "4-node trees; request 1 accepts the path [0, 2], reaching 8 tokens: the multiple of 8 is its last "
    "accepted token, so the track node is the path's node at depth 1, node 2, copied into slot 4 and "
    "published as the checkpoint of its first 8 tokens when it finishes. Unfixed, the recorded "
    "`mamba_steps_to_track` is `accept_index[1, 2] - 4 = -5`. The replay checks each tracked node against the "
    "path, and the checkpoint against the float64 state of exactly its 8 tokens."
)

TREES = ((-1, 0, 0, 1), (-1, 0, 0, 1))
PATHS = ((0, 1), (0, 2))
TRACK = 4


def scenario_trace(fixed: bool) -> Trace:
    """The prefill; the verify, request 1 tracked into slot 4 at commit (its node 2 fixed, -5 unfixed);
    a decode, request 1's track slot published as its 8-token checkpoint as it finishes."""
    step = PATHS[1][1] if fixed else -1 - _tree.D  # unfixed: accept_index[1, 2] = -1, minus b * D
    track = {"mamba_track_indices": [-1, TRACK], "mamba_steps_to_track": [-1, step]}
    kept = tuple(len(p) for p in PATHS)
    publish = {"checkpoints": [{"request": 1, "tokens": 8, "slot": TRACK}]}
    return _tree.trace([_tree.prefill(), _tree.verify(TREES, PATHS, track), _tree.decode(kept, publish)])


def reading(rep: TraceReplayer, d: TraceDivergence) -> tuple[bool, str]:
    """This bug: a verify step whose track node is below -1, read from the padding past the path."""
    step = rep.trace.steps[d.step]
    steps = (step.metadata or {}).get("mamba_steps_to_track") or []
    past = [i for i, s in enumerate(steps) if s < -1]
    if step.mode != "target_verify" or d.field != "track" or not past:
        return False, ""
    return True, f"verify step {d.step}: row {past[0]} tracks node {steps[past[0]]}, read past its accepted path"


CASE = prefix_case(
    scenario_trace=scenario_trace,
    reading=reading,
    records="accept_index and the verify's track fields",
    lives_in="tracking at commit",
    name="tree_track_unclamped",
    title="a tree verify's track node is read past the accepted path and its checkpoint is published unwritten",
    issue="sglang PR 35821",
    profile="sglang",
    explanation=EXPLANATION,
    steps="a hand-written 3-step trace with token ids, GDN layer (small, seed 0), 6 slots, decode and verify "
    "buckets 1, 2, D=4, topk 2: two requests prefill 6 tokens; they verify the tree [-1, 0, 0, 1], accepting "
    "[0, 1] and [0, 2]; request 1 tracked into slot 4 at commit (unfixed: node -5); a decode, slot 4 "
    "published as request 1's 8-token checkpoint; track nodes checked against the paths, checkpoints against "
    "float64",
)
