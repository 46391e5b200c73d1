"""The prefix-cache rules a real scheduler needs (issue 29; vLLM 0.33.0's ``MambaManager.cache_blocks`` hashes
the block a chunk fills at schedule time, while it is still the request's running block):

* a checkpoint may be published on the slot its request still runs on when, after the step, the request's
  state there holds exactly the checkpoint's tokens;
* it stays live when the request moves on (the move does not free it: the cache holds it);
* the owner's later forward onto that slot, while it is a live checkpoint, is a divergence (``checkpoints``);
* a hit on it in the very step its owner moves off (or copies out of) it is legal: hits and ``copies_before``
  all read before the forward.

Each rule's legal trace replays clean with every checkpoint verified against the float64 state of exactly its
prefix; its broken twin diverges where it breaks. The traces are written step by step (vLLM align, one slot a
request, then a window of D = 2 blocks under speculation)."""

from __future__ import annotations

from dataclasses import replace

from workbench.traces.model import Trace, TraceHeader, TraceRow, TraceStep
from workbench.traces.replay import TraceReplayer, replay_trace

PROMPT = (5, 9, 2, 7)
HEADER = TraceHeader("vllm", "gdn", 8, {"decode": [1, 2]}, 2, None)


def row(rid, rpi, slot, cached, tokens, accepted=None, slots=None, kind=None) -> TraceRow:
    return TraceRow(rid, rpi, slot, cached + len(tokens), len(tokens), cached, accepted, tuple(tokens), slots, kind)


def align_steps() -> list[TraceStep]:
    """Request 0 prefills a 4-token block on slot 1 and publishes it as it fills it (still its running slot).
    Its next token starts a new block: the pre-copy 1 -> 2 and the move to slot 2, in the very step request 1
    hits the block and copies it into its own slot 3. Request 0 finishes; later request 2 hits the block,
    which stayed live after the move."""
    return [
        TraceStep(0, "extend", (row(0, 1, 1, 0, PROMPT),), (0,), (),
                  {"checkpoints": [{"request": 0, "tokens": 4, "slot": 1}]}),
        TraceStep(1, "mixed", (row(0, 1, 2, 4, (3,), kind="decode"), row(1, 2, 3, 4, (4, 4), kind="extend")), (1,), (),
                  {"hits": [{"request": 1, "tokens": 4, "slot": 1}], "copies_before": [[1, 3], [1, 2]],
                   "moves": [{"request": 0, "slot": 2}]}),
        TraceStep(2, "decode", (row(0, 1, 2, 5, (8,)), row(1, 2, 3, 6, (6,))), (), (0,), None),
        TraceStep(3, "extend", (row(2, 3, 4, 4, (1, 1, 1)),), (2,), (),
                  {"hits": [{"request": 2, "tokens": 4, "slot": 1}], "copies_before": [[1, 4]]}),
    ]  # fmt: skip


def first(body: list[TraceStep], header: TraceHeader = HEADER):
    res = replay_trace(Trace(header, body))
    assert not res.ok and res.first is not None, res
    return res.first


def test_a_block_published_while_it_runs_is_hit_as_its_owner_leaves_it_and_stays_live():
    rep = TraceReplayer(Trace(HEADER, align_steps()))
    res = rep.run(stop_at_first=False)
    assert res.ok, str(res)
    assert (res.hits, res.checkpoints, res.verified) == (2, 1, 1)
    assert 1 in rep.pool.held_slots and rep.owner(1) is None and rep.book.live[1].tokens == PROMPT


def test_the_move_off_a_published_block_holds_it():
    body = align_steps()
    rep = TraceReplayer(Trace(HEADER, body))
    assert rep.step(body[0]) == []
    assert rep.owner(1) == 0 and 1 in rep.book.live and 1 not in rep.pool.held_slots  # live, still running
    assert rep.step(body[1]) == []
    assert rep.owner(1) is None and 1 in rep.pool.held_slots and 1 not in rep.pool.free_slots()


def test_twin_a_running_block_of_more_tokens_than_the_checkpoint_is_refused():
    body = align_steps()
    body[0] = replace(body[0], metadata={"checkpoints": [{"request": 0, "tokens": 3, "slot": 1}]})
    d = first(body)
    assert (d.step, d.kind, d.field, d.request, d.slot) == (0, "prefix", "checkpoint", 0, 1), d
    assert "its state holds 4 tokens, not exactly the checkpoint's 3" in d.detail and (d.expected, d.got) == (4, 3)


def test_twin_the_owner_writing_its_live_checkpoint_is_a_divergence():
    """Without its move, request 0's next token is written onto the block it published."""
    body = align_steps()[:2]
    body[1] = replace(
        body[1],
        rows=(row(0, 1, 1, 4, (3,), kind="decode"), body[1].rows[1]),
        metadata={"hits": [{"request": 1, "tokens": 4, "slot": 1}], "copies_before": [[1, 3]]},
    )
    d = first(body)
    assert (d.step, d.kind, d.field, d.request, d.slot) == (1, "prefix", "checkpoints", 0, 1), d
    assert d.detail == (
        "request 0's forward writes slot 1, the live checkpoint of request 0's first 4 tokens (published at step 0): "
        "the request wrote its published checkpoint"
    )


def test_twin_a_block_published_only_as_its_owner_leaves_it_is_not_there_for_the_hit():
    """Publishing after the forward of the step that moves off the block is too late for a hit in that step."""
    body = align_steps()
    body[0] = replace(body[0], metadata=None)
    body[1] = replace(
        body[1], metadata={**(body[1].metadata or {}), "checkpoints": [{"request": 0, "tokens": 4, "slot": 1}]}
    )
    d = first(body)
    assert (d.step, d.kind, d.field, d.request, d.slot) == (1, "prefix", "hit", 1, 1), d
    assert "no live checkpoint there" in d.detail


def test_twin_an_evicted_block_is_no_longer_hit():
    body = align_steps()
    body[2] = replace(body[2], metadata={"evict": [1]})
    d = first(body)
    assert (d.step, d.kind, d.field, d.request, d.slot) == (3, "prefix", "hit", 2, 1), d


def test_a_copy_into_a_published_running_block_is_refused():
    body = align_steps()[:2]
    body[1] = replace(body[1], metadata={**(body[1].metadata or {}), "copies_before": [[3, 1], [1, 3], [1, 2]]})
    d = first(body)
    assert (d.step, d.field) == (1, "copy") and "overwrites the live checkpoint in slot 1" in d.detail, d


# -- a window of D blocks (vLLM align with speculation) -------------------------------------------------------
SPEC = TraceHeader("vllm", "gdn", 10, {"decode": [1, 2], "target_verify": [1, 2]}, 2, None)


def window_steps() -> list[TraceStep]:
    """Request 0 (window [1, 2]) prefills a block; the state is in its first column, slot 1, published as it
    fills it. Its verify slides the window to [2, 5]: the pre-copy 1 -> 2, slot 1 left (and held as the live
    checkpoint), in the very step request 1 (window [3, 4]) hits slot 1 and copies it into its first block."""
    return [
        TraceStep(0, "extend", (row(0, 1, 1, 0, PROMPT, slots=(1, 2)),), (0,), (),
                  {"checkpoints": [{"request": 0, "tokens": 4, "slot": 1}]}),
        TraceStep(1, "mixed",
                  (row(0, 1, 2, 4, (3, 6), accepted=2, slots=(2, 5), kind="verify"),
                   row(1, 2, 3, 4, (4, 4), slots=(3, 4), kind="extend")), (1,), (),
                  {"hits": [{"request": 1, "tokens": 4, "slot": 1}], "copies_before": [[1, 3], [1, 2]],
                   "moves": [{"request": 0, "slots": [2, 5]}]}),
        TraceStep(2, "target_verify", (row(0, 1, 2, 6, (1, 2), accepted=1, slots=(2, 5)),), (), (0,), None),
    ]  # fmt: skip


def test_a_window_block_published_while_it_runs_is_hit_in_the_step_the_window_leaves_it():
    rep = TraceReplayer(Trace(SPEC, window_steps()))
    res = rep.run(stop_at_first=False)
    assert res.ok, str(res)
    assert (res.hits, res.checkpoints, res.verified) == (1, 1, 1)
    assert 1 in rep.pool.held_slots and rep.book.live[1].tokens == PROMPT


def test_twin_a_window_column_that_does_not_hold_the_state_is_not_published():
    body = window_steps()
    body[0] = replace(body[0], metadata={"checkpoints": [{"request": 0, "tokens": 4, "slot": 2}]})
    d = first(body, SPEC)
    assert (d.step, d.field, d.slot) == (0, "checkpoint", 2), d
    assert "slot 2 is a slot of request 0's window that does not hold its state (slot 1 does)" in d.detail


def test_twin_a_verify_on_the_window_that_holds_its_published_block_writes_it():
    body = window_steps()[:2]
    body[1] = replace(
        body[1],
        rows=(row(0, 1, 1, 4, (3, 6), accepted=2, slots=(1, 2), kind="verify"), body[1].rows[1]),
        metadata={"hits": [{"request": 1, "tokens": 4, "slot": 1}], "copies_before": [[1, 3]]},
    )
    d = first(body, SPEC)
    assert (d.step, d.field, d.request, d.slot) == (1, "checkpoints", 0, 1), d
