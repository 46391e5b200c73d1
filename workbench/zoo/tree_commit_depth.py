"""tree_commit_depth: a tree verify commits the node at the accepted path's depth instead of the path's
last node (sglang PR 27463)."""

from __future__ import annotations

from workbench.traces.model import Trace
from workbench.traces.replay import TraceDivergence, TraceReplayer
from workbench.zoo import _tree
from workbench.zoo._prefix import prefix_case

EXPLANATION = (
    "After a verify, sglang copies one intermediate state back into each request's slot: the state after the "
    "last token it accepted. With a chain of drafts that is step `accept_lens - 1`, the depth of the last "
    "accepted token. With a tree (`--speculative-eagle-topk` above 1) the sampler accepts a root-first path "
    "through the tree and reports it in `accept_index` `[bs, spec_steps + 1]` as global node ids (`b * D + "
    "node`); the node at depth k of the path is not node k. Before PR 27463 the mamba commit of spec v2 still "
    "read the depth, so when the path took a later sibling the slot got the state of another branch: tokens "
    "the request never kept. Here two requests verify 4-node trees; request 0 accepts the path [0, 2] (the "
    "root's second child), request 1 the path [0, 1, 2] of its own tree, where depth and node agree. Unfixed, "
    "the engine's `last_correct_step_indices` are the depths (1 and 2); the replay checks them against the "
    "paths in `accept_index`, commits what the engine committed, and compares the slot with the float64 "
    "recurrence along the path. The fix gathers the last node from `accept_index` (`accept_index[b, "
    "accept_len - 1] - b * D`)."
)

TREES = ((-1, 0, 0, 1), (-1, 0, 1, 1))
PATHS = ((0, 2), (0, 1, 2))


def scenario_trace(fixed: bool) -> Trace:
    """The prefill, the tree verify with the engine's committed nodes (the depths unfixed, the paths' last
    nodes fixed), a decode from the committed states."""
    committed = [p[-1] for p in PATHS] if fixed else [len(p) - 1 for p in PATHS]
    kept = tuple(len(p) for p in PATHS)
    steps = [
        _tree.prefill(),
        _tree.verify(TREES, PATHS, {"last_correct_step_indices": committed}),
        _tree.decode(kept),
    ]
    return _tree.trace(steps)


def reading(rep: TraceReplayer, d: TraceDivergence) -> tuple[bool, str]:
    """This bug: a verify step whose engine committed a node that is not its accepted path's last."""
    step = rep.trace.steps[d.step]
    if step.mode != "target_verify" or d.field != "accept":
        return False, ""
    committed = (step.metadata or {}).get("last_correct_step_indices") or []
    depths = [r.accepted - 1 for r in step.rows if r.accepted is not None]
    if committed != depths:
        return False, "the engine's committed nodes are not the paths' depths"
    return True, f"verify step {d.step} committed nodes {committed}, the depths of the accepted paths"


CASE = prefix_case(
    scenario_trace=scenario_trace,
    reading=reading,
    records="accept_index and last_correct_step_indices",
    lives_in="commit after verify",
    name="tree_commit_depth",
    title="a tree verify commits the node at the path's depth, another branch's state",
    issue="sglang PR 27463",
    profile="sglang",
    explanation=EXPLANATION,
    steps="a hand-written 3-step trace with token ids, GDN layer (small, seed 0), 6 slots, decode and verify "
    "buckets 1, 2, D=4, topk 2: two requests prefill 6 tokens; they verify the trees [-1, 0, 0, 1] and "
    "[-1, 0, 1, 1], accepting the paths [0, 2] and [0, 1, 2], the engine's committed nodes recorded "
    "(unfixed: the depths 1 and 2); a decode; commits checked against the paths, states against float64",
)
