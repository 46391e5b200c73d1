"""running_block_publish: vLLM's align mode publishes the block a prefill chunk fills while it is still the
request's running block; a scheduler or worker that then forgets the move (the pre-copy into a fresh block)
keeps writing the published block, and a later hit starts from a state ahead of its prefix (vLLM 0.33.0,
``MambaManager.cache_blocks``)."""

from __future__ import annotations

from typing import Any

from workbench.layer_names import GDN
from workbench.traces.model import Trace, TraceHeader, TraceRow, TraceStep
from workbench.traces.replay import TraceDivergence, TraceReplayer
from workbench.zoo import _harness as h
from workbench.zoo._prefix import prefix_case

EXPLANATION = (
    "In vLLM's align mode (mamba_cache_mode='align') a request's recurrent state lives in the block of "
    "its position. vLLM 0.33.0's MambaManager.cache_blocks hashes the block a prefill chunk fills at "
    "schedule time, so the block is published in the very step that fills it, while it is still the "
    "request's running block: in a 300-step run of vLLM 0.33.0's own scheduler on the CPU, 149 of 299 "
    "published blocks (about half) were. That is safe only because the request moves before its next "
    "token: the worker pre-copies the state into the block of its new position and runs there, and the "
    "published block stays the checkpoint. A scheduler or worker that publishes at schedule time but "
    "forgets the move keeps writing the published block, and every later hit on it starts from a state "
    "that has seen tokens its prefix has not. vLLM 0.33.0 itself moves: this is the failure its "
    "schedule-time publish leaves open to a port or a reimplementation, not a filed bug. Here request 0's "
    "first chunk fills a 4-token block (slot 1), published in that step; request 1 shares the prompt and "
    "hits the block in the next step, the step its owner leaves it; request 2 hits it one step later. "
    "Unfixed, request 0 runs its second chunk on slot 1: the replay names the forward that writes the "
    "live checkpoint, and measures the block against the float64 state of its 4 tokens. Fixed, the "
    "pre-copy 1 -> 2 and the move run before the forward, the hit in that step reads the block before the "
    "forward too, and both hits start from exactly the block's prefix."
)

SHARED = (31, 7, 88, 2)
"""One block (4 tokens here; vLLM's mamba block is hundreds of tokens): the prompts' shared prefix."""
OWN = {0: (14, 9), 1: (50, 3, 3), 2: (6,)}
"""Each request's own prompt tokens after the shared block."""
DECODES = {0: (120, 121), 1: (130, 131), 2: (140,)}
"""The tokens each request decodes, in order."""
BLOCK_SLOT, MOVED_TO = 1, 2
HEADER = TraceHeader("vllm", GDN, 6, {"decode": [1, 2, 4]}, 2, None)


def _row(rid: int, slot: int, cached: int, tokens: tuple[int, ...], kind: str | None = None) -> TraceRow:
    """Request ``rid``'s row (its request-pool row is ``rid + 1``) feeding ``tokens`` after ``cached``."""
    return TraceRow(rid, rid + 1, slot, cached + len(tokens), len(tokens), cached, None, tokens, kind=kind)


def plan(fixed: bool) -> list[TraceStep]:
    """Request 0's first chunk fills the shared block, published on its running slot; its second chunk beside
    request 1's hit on the block (after the pre-copy and move, fixed; on the block itself, unfixed); a step
    of decodes beside request 2's hit; a last decode of each."""
    n, block = len(SHARED), {"request": 0, "tokens": len(SHARED), "slot": BLOCK_SLOT}
    own0 = MOVED_TO if fixed else BLOCK_SLOT  # where request 0 runs after the block it filled
    second: dict[str, Any] = {
        "hits": [{"request": 1, "tokens": n, "slot": BLOCK_SLOT}],
        "copies_before": [[BLOCK_SLOT, 3]],  # request 1's copy of the block, read before the forward
    }
    if fixed:  # the align-mode move: the pre-copy into a fresh block, where request 0 runs from now on
        second["copies_before"].append([BLOCK_SLOT, MOVED_TO])
        second["moves"] = [{"request": 0, "slot": MOVED_TO}]
    third = {"hits": [{"request": 2, "tokens": n, "slot": BLOCK_SLOT}], "copies_before": [[BLOCK_SLOT, 4]]}
    at = {rid: n + len(OWN[rid]) for rid in OWN}  # tokens in each state after its prompt
    return [
        TraceStep(0, "extend", (_row(0, BLOCK_SLOT, 0, SHARED),), (0,), (), {"checkpoints": [block]}),
        TraceStep(1, "extend", (_row(0, own0, n, OWN[0]), _row(1, 3, n, OWN[1])), (1,), (), second),
        TraceStep(
            2, "mixed",
            (_row(0, own0, at[0], DECODES[0][:1], "decode"), _row(1, 3, at[1], DECODES[1][:1], "decode"),
             _row(2, 4, n, OWN[2], "extend")),
            (2,), (), third,
        ),
        TraceStep(
            3, "decode",
            (_row(0, own0, at[0] + 1, DECODES[0][1:]), _row(1, 3, at[1] + 1, DECODES[1][1:]),
             _row(2, 4, at[2], DECODES[2])),
            (), (0, 1, 2), None,
        ),
    ]  # fmt: skip


def scenario_trace(fixed: bool) -> Trace:
    return Trace(HEADER, plan(fixed))


def reading(rep: TraceReplayer, d: TraceDivergence) -> tuple[bool, str]:
    """This bug: a request's forward writes the block it published while it ran on it, without the move
    that step owed it; what the block then holds, and the hits that read it after."""
    if d.kind != "prefix" or d.field != "checkpoints" or "wrote its published checkpoint" not in d.detail:
        return False, ""
    slot = d.slot
    cp = rep.book.is_live(slot) if slot is not None else None
    if slot is None or cp is None or d.request is None or cp.request != d.request or cp.step >= d.step:
        return False, ""
    moved = [m for m in (rep.trace.steps[d.step].metadata or {}).get("moves", []) if m.get("request") == d.request]
    if moved:
        return False, f"request {d.request} moves at step {d.step}"
    claimed, held = len(cp.tokens), h.tokens_in_state(rep.trace, d.request, d.step)
    off = rep.book.record.compare(rep.runner.state, slot, cp.tokens)
    how = f", {off[0]} off the float64 state of its {claimed} by {off[1]:.3g}" if off is not None else ""
    later = [
        (s.step, hit["request"])
        for s in rep.trace.steps[d.step + 1 :]
        for hit in (s.metadata or {}).get("hits", [])
        if hit["slot"] == slot
    ]
    hits = "; ".join(
        f"request {r}'s {claimed}-token hit at step {t} reads {_written_by(rep.trace, d.request, slot, t)} tokens"
        for t, r in later
    )
    return True, (
        f"request {d.request} published slot {slot} as its first {claimed} tokens at step {cp.step} and did not "
        f"move off it: after step {d.step} the block holds {held} tokens (expected {claimed}, got {held}){how}"
        + (f"; {hits}" if hits else "")
    )


def _written_by(trace: Trace, rid: int, slot: int, step: int) -> int:
    """Tokens in ``slot`` as step ``step`` begins, when ``rid`` kept running on it: its state after the last
    earlier step whose row of ``rid`` names the slot (hits read before the forward)."""
    ran = [s.step for s in trace.steps[:step] if any(r.id == rid and r.slot == slot for r in s.rows)]
    return h.tokens_in_state(trace, rid, ran[-1]) if ran else 0


CASE = prefix_case(
    scenario_trace=scenario_trace,
    reading=reading,
    name="running_block_publish",
    title="a block published while it still runs: the request never moves off it and overwrites the checkpoint",
    issue="vLLM 0.33.0 align, cache_blocks",
    profile="vllm",
    explanation=EXPLANATION,
    lives_in="bookkeeping and moves",
    records="checkpoints, hits, copies and moves",
    steps="a hand-written 4-step vLLM align trace with token ids, GDN layer (small, seed 0), 6 slots, decode "
    "buckets 1, 2, 4: request 0's first chunk fills a 4-token block (slot 1), published in that step; its "
    "second chunk runs on the block (unfixed) or after the pre-copy and move to slot 2 (fixed), beside request "
    "1's hit on the block; request 2 hits it at the next step; each checkpoint and hit against float64",
)
