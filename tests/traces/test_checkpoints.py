"""Prefix-cache checks of the replay (``workbench.traces.checkpoints``): a correct no_buffer trace verifies
every checkpoint and hit against the float64 state of exactly its prefix; each way of getting it wrong is
caught at its step, naming the request and the slot."""

from dataclasses import replace

import pytest
import torch

from workbench.traces.checkpoints import EMBED_VOCAB, embed_tokens, embedding_table
from workbench.traces.model import Trace, TraceHeader, TraceRow, TraceStep
from workbench.traces.replay import TraceReplayer, replay_trace

PROMPT = (5, 9, 2, 7, 7, 1)
HEADER = TraceHeader("sglang", "gdn", 6, {"decode": [1, 2, 4]}, 2, None)


def row(rid, rpi, slot, cached, tokens, accepted=None):
    return TraceRow(rid, rpi, slot, cached + len(tokens), len(tokens), cached, accepted, tuple(tokens))


def steps() -> list[TraceStep]:
    """Request 0 prefills PROMPT, the cache copies its state into slot 2; request 1 shares the prompt, hits
    it and copies it into its own slot 3; both decode; request 0 finishes and donates its slot 1."""
    return [
        TraceStep(
            0, "extend", (row(0, 1, 1, 0, PROMPT),), (0,), (),
            {"copies_after": [[1, 2]], "checkpoints": [{"request": 0, "tokens": 6, "slot": 2}]},
        ),
        TraceStep(
            1, "extend", (row(1, 2, 3, 6, (4, 4, 8)),), (1,), (),
            {"hits": [{"request": 1, "tokens": 6, "slot": 2}], "copies_before": [[2, 3]]},
        ),
        TraceStep(
            2, "decode", (row(0, 1, 1, 6, (3,)), row(1, 2, 3, 9, (3,))), (), (0,),
            {"checkpoints": [{"request": 0, "tokens": 7, "slot": 1}]},
        ),
        TraceStep(3, "decode", (row(1, 2, 3, 10, (6,)),), (), (1,), None),
    ]  # fmt: skip


def with_metadata(body: list[TraceStep], i: int, **changes) -> list[TraceStep]:
    md = dict(body[i].metadata or {})
    for key, value in changes.items():
        if value is None:
            md.pop(key, None)
        else:
            md[key] = value
    body[i] = replace(body[i], metadata=md or None)
    return body


def first(body: list[TraceStep]):
    res = replay_trace(Trace(HEADER, body))
    assert not res.ok and res.first is not None, res
    return res.first


def test_a_correct_trace_verifies_every_checkpoint_and_hit():
    res = replay_trace(Trace(HEADER, steps()), stop_at_first=False)
    assert res.ok, res
    assert (res.hits, res.checkpoints, res.verified) == (1, 2, 2)
    assert "prefix cache: 1 hit(s), 2 checkpoint(s) published, 2 verified" in res.summary()
    assert res.to_dict()["verified"] == 2


def test_a_hit_continues_from_the_same_state_as_the_request_it_shares_with():
    rep = TraceReplayer(Trace(HEADER, steps()))
    for s in steps()[:2]:
        assert rep.step(s) == []
    conv, ssm = rep.book.prefix_state(PROMPT)
    assert torch.allclose(rep.runner.state.ssm[2].double(), ssm, atol=1e-5)  # the checkpoint
    assert 2 in rep.pool.held_slots and 2 in rep.book.live
    assert rep.book.history[1] == [*PROMPT, 4, 4, 8]  # the hit gave request 1 its prefix


def test_the_donated_slot_stays_held_after_its_request_finishes():
    rep = TraceReplayer(Trace(HEADER, steps()))
    for s in steps()[:3]:
        rep.step(s)
    assert 1 in rep.pool.held_slots and rep.owner(1) is None
    assert rep.book.live[1].tokens == (*PROMPT, 3)


def test_a_hit_without_its_copy_reads_the_previous_tenant():
    d = first(with_metadata(steps(), 1, copies_before=None))
    assert (d.step, d.kind, d.request, d.slot) == (1, "state", 1, 3)


def test_a_checkpoint_of_fewer_tokens_than_its_slot_holds_is_caught():
    body = with_metadata(steps(), 0, checkpoints=[{"request": 0, "tokens": 5, "slot": 2}])
    body = with_metadata(body, 1, hits=[{"request": 1, "tokens": 5, "slot": 2}])
    d = first(body)
    assert (d.step, d.kind, d.field, d.request, d.slot) == (0, "prefix", "checkpoint", 0, 2)
    assert "off the float64 state after exactly its first 5 tokens" in d.detail and d.got > 1e-3


@pytest.mark.parametrize(
    ("step", "changes", "where", "says"),
    [
        (0, {"checkpoints": [{"request": 0, "tokens": 7, "slot": 2}]}, "checkpoint", "published before it is written"),
        (0, {"checkpoints": [{"request": 0, "tokens": 5, "slot": 1}]}, "checkpoint",
         "running slot of request 0, which keeps running: its state holds 6 tokens, not exactly the checkpoint's 5"),
        (0, {"checkpoints": [{"request": 0, "tokens": 6, "slot": 0}]}, "checkpoint", "the dummy slot"),
        (0, {"copies_after": [[1, 1]]}, "copy", "the copy overlaps itself"),
        (0, {"copies_after": [[1, 0]]}, "copy", "dummy (null) slot"),
        (0, {"copies_after": [[4, 2]]}, "copy", "holds neither a live request's state nor a checkpoint"),
        (1, {"hits": [{"request": 1, "tokens": 6, "slot": 4}]}, "hit", "no live checkpoint there"),
        (1, {"hits": [{"request": 1, "tokens": 5, "slot": 2}]}, "hit", "the checkpoint holds 6 tokens, the hit"),
        (1, {"copies_before": [[2, 1]]}, "copy", "writes request 0's slot"),
        (1, {"evict": [2]}, "hit", "no live checkpoint there"),
        (1, {"evict": [4]}, "evict", "slot 4 holds no live checkpoint"),
        (2, {"copies_before": [[1, 2]]}, "copy", "overwrites the live checkpoint in slot 2 (request 0, 6 tokens)"),
    ],
    ids=["early", "running-slot", "dummy", "overlap", "null-copy", "freed-source", "no-checkpoint", "wrong-length",
         "cow-into-other", "evicted-then-hit", "evict-nothing", "overwrite-checkpoint"],
)  # fmt: skip
def test_each_wrong_move_is_named_at_its_step(step, changes, where, says):
    d = first(with_metadata(steps(), step, **changes))
    assert (d.step, d.kind, d.field) == (step, "prefix", where), d
    assert says in d.detail, d.detail


def test_checkpoints_need_token_ids():
    body = steps()
    body[0] = replace(body[0], rows=(replace(body[0].rows[0], tokens=None),))
    d = first(body)
    assert d.field == "checkpoint" and "token ids are not all in the trace" in d.detail


def test_a_forward_that_writes_a_checkpoint_slot_is_foreign():
    """A stale row pointing at a checkpoint's slot changes it: the replay says whose prefix it was."""
    from workbench.zoo.dp_dummy_rows import PersistentBatchRows

    body = [*steps()[:3], TraceStep(3, "idle")]
    rep = TraceReplayer(Trace(HEADER, body), metadata_backend=PersistentBatchRows)
    for s in body[:3]:
        assert rep.step(s) == []
    rep.runner.meta_backend.__dict__["_rows"][0] = 2  # a stale row left pointing at the checkpoint's slot
    found = rep.step(body[3])
    assert found and found[0].kind == "foreign" and found[0].slot == 2
    assert "the checkpoint of request 0's first 6 tokens" in found[0].detail


def test_embedding_is_fixed_and_never_zero():
    a, b = embedding_table(8, torch.float32), embedding_table(8, torch.float32)
    assert torch.equal(a, b) and a.shape == (EMBED_VOCAB, 8) and (a != 0).all()
    assert torch.equal(embed_tokens(a, [1, EMBED_VOCAB + 1]), a[[1, 1]])


def tracked(body: list[TraceStep], mask, slots, lengths) -> list[TraceStep]:
    """Step 0 with sglang's track fields (request 0's prompt tracked into slot 2 by the copy 1 -> 2)."""
    return with_metadata(body, 0, mamba_track_mask=mask, mamba_track_indices=slots, mamba_track_seqlens=lengths)


def test_sglang_track_fields_that_agree_with_the_copies_pass():
    res = replay_trace(Trace(HEADER, tracked(steps(), [True], [2], [6])), stop_at_first=False)
    assert res.ok, res


@pytest.mark.parametrize(
    ("mask", "slots", "lengths", "says"),
    [
        ([True], [4], [6], "tracked into slot 4, but no copy 1 -> 4 after the step"),
        ([True], [2], [5], "mamba_track_seqlens[0] = 5, but the state holds 6 tokens"),
        ([False], [2], [6], "untracked, but mamba_track_seqlens[0] = 6 (want -1)"),
        ([True, False], [2], [6], "must each be a list of one entry per row (1)"),
    ],
    ids=["no-copy", "wrong-length", "untracked-length", "shape"],
)
def test_sglang_track_fields_that_disagree_are_named(mask, slots, lengths, says):
    d = first(tracked(steps(), mask, slots, lengths))
    assert (d.step, d.kind, d.field) == (0, "prefix", "track") and says in d.detail, d


def align_steps() -> list[TraceStep]:
    """vLLM align: request 0 prefills a 4-token block, then its decode starts the next block: the state is
    copied forward into slot 3 (the pre-copy), the request moves there, and slot 1 (the state after exactly
    the 4 tokens) is published as the block's checkpoint."""
    return [
        TraceStep(0, "extend", (row(0, 1, 1, 0, (5, 9, 2, 7)),), (0,), (), None),
        TraceStep(
            1, "decode", (row(0, 1, 3, 4, (3,)),), (), (),
            {"copies_before": [[1, 3]], "moves": [{"request": 0, "slot": 3}],
             "checkpoints": [{"request": 0, "tokens": 4, "slot": 1}]},
        ),
        TraceStep(2, "decode", (row(0, 1, 3, 5, (8,)),), (), (0,), None),
    ]  # fmt: skip


def test_a_move_to_the_next_block_keeps_the_old_one_as_its_checkpoint():
    header = replace(HEADER, profile="vllm")
    rep = TraceReplayer(Trace(header, align_steps()))
    res = rep.run(stop_at_first=False)
    assert res.ok and (res.checkpoints, res.verified) == (1, 1), res
    assert 1 in rep.pool.held_slots and rep.book.live[1].tokens == (5, 9, 2, 7)


@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"copies_before": [[1, 4]], "moves": [{"request": 0, "slot": 4}]}, "move", "the request's row names slot 3"),
        ({"copies_before": None}, "state", ""),  # moved without the pre-copy: the new block's bytes are read
        ({"moves": [{"request": 7, "slot": 3}]}, "move", "the request is not live in this step"),
        ({"copies_before": [[1, 4]]}, "copy", "into the slot a request moves to"),
    ],
    ids=["wrong-slot", "no-pre-copy", "not-live", "copy-elsewhere"],
)
def test_a_wrong_move_is_named(changes, field, says):
    body = with_metadata(align_steps(), 1, **changes)
    res = replay_trace(Trace(replace(HEADER, profile="vllm"), body))
    d = res.first
    assert d is not None and d.step == 1 and field in (d.field, d.kind) and says in d.detail, res


def test_a_stale_claim_on_a_slot_a_copy_once_filled_is_still_recomputed():
    """Slot 2 got the state of PROMPT by a copy; the checkpoint is evicted, request 1 (the same prompt) is
    admitted to slot 2 and decodes once, and as it finishes its slot is published as its first 6 tokens
    (the claim the copy once fit, but the slot holds 7): the check recomputes it and finds it off, instead of
    trusting the old copy."""
    claim = {"checkpoints": [{"request": 1, "tokens": 6, "slot": 2}]}  # the same 6 ids the copy once held
    body = steps()[:1] + [
        TraceStep(1, "extend", (row(1, 2, 2, 0, PROMPT),), (1,), (0,), {"evict": [2]}),
        TraceStep(2, "decode", (row(1, 2, 2, 6, (3,)),), (), (1,), claim),  # but its state holds 7 tokens
    ]
    rep = TraceReplayer(Trace(HEADER, body))
    assert rep.step(body[0]) == [] and rep.step(body[1]) == []
    rep.book.record.forget_prefixes()  # as if the prefix had left the cache of recomputed states
    (d,) = rep.step(body[2])
    assert (d.step, d.field) == (2, "checkpoint") and "off the float64 state" in d.detail, d


VERIFY_HEADER = TraceHeader("sglang", "gdn", 6, {"decode": [1, 2], "target_verify": [1, 2]}, 3, None)


def verify_steps(step_to_track: int = 1, accepted: int = 3, into: int = 2, mode: str = "target_verify"):
    """sglang, tracking at commit: request 0 prefills PROMPT (6 tokens) and verifies 3 drafts, all accepted;
    the track boundary at 8 tokens lies inside them, so draft step 8 - 6 - 1 = 1's intermediate state goes to
    track slot 2; as the request finishes, slot 2 is donated as the checkpoint of its first 8 tokens."""
    track = {"mamba_track_indices": [into], "mamba_steps_to_track": [step_to_track]}
    drafts = (4, 4, 8) if mode == "target_verify" else (4,)
    return [
        TraceStep(0, "extend", (row(0, 1, 1, 0, PROMPT),), (0,), (), None),
        TraceStep(1, mode, (row(0, 1, 1, 6, drafts, accepted if mode == "target_verify" else None),), (), (), track),
        TraceStep(
            2, "decode", (row(0, 1, 1, 6 + accepted, (3,)),), (), (0,),
            {"checkpoints": [{"request": 0, "tokens": 8, "slot": 2}]},
        ),
    ]  # fmt: skip


def test_a_verify_tracked_at_commit_publishes_the_state_of_exactly_the_boundary():
    rep = TraceReplayer(Trace(VERIFY_HEADER, verify_steps()))
    res = rep.run(stop_at_first=False)
    assert res.ok and (res.checkpoints, res.verified) == (1, 1), res
    assert rep.book.live[2].tokens == (*PROMPT, 4, 4)


@pytest.mark.parametrize(
    ("kw", "step", "field", "says"),
    [
        (dict(step_to_track=2), 2, "checkpoint", "off the float64 state after exactly its first 8 tokens"),
        (dict(step_to_track=3), 1, "track", "past the verify's 3 draft steps"),
        (dict(accepted=1), 1, "track", "draft step 1 was not accepted (1 accepted)"),
        (dict(into=1), 1, "track", "writes the running slot of request 0"),
        (dict(into=0), 1, "track", "writes the dummy (null) slot"),
        (dict(mode="decode"), 1, "track", "only a target_verify step tracks at commit"),
    ],
    ids=["off-by-one", "past-D", "not-accepted", "running-slot", "dummy", "not-a-verify"],
)
def test_a_wrong_verify_track_is_named(kw, step, field, says):
    body = verify_steps(**kw)
    if kw.get("accepted") == 1:  # the checkpoint may not claim more than the state holds: keep it at 7
        body[2] = replace(body[2], metadata={"checkpoints": [{"request": 0, "tokens": 7, "slot": 2}]})
    res = replay_trace(Trace(VERIFY_HEADER, body))
    d = res.first
    assert d is not None and (d.step, d.field) == (step, field) and says in d.detail, res


def test_verify_track_fields_of_the_wrong_length_are_named():
    body = with_metadata(verify_steps(), 1, mamba_steps_to_track=[1, -1])
    d = replay_trace(Trace(VERIFY_HEADER, body)).first
    assert d is not None and d.field == "track" and "one entry per row (1)" in d.detail, d


LONG = tuple(range(40, 60))  # 20 token ids
LONG2 = tuple(range(70, 92))  # 22


def h_steps(**track):
    """sglang, tracking inside a chunk: request 0 prefills 20 tokens in one chunk with C = 8; its tracked
    position is the last chunk boundary, 16 (20 % 8 != 0: the kernel's chunk state h[0 + 20 // 8] = h[2], the
    state after 16 tokens), into track slot 2; the conv window is input positions 13, 14, 15; as the request
    finishes slot 2 is donated as the checkpoint of its first 16 tokens."""
    md = {
        "mamba_chunk_size": 8,
        "mamba_track_mask": [True],
        "mamba_track_indices": [2],
        "mamba_track_seqlens": [20],
        "track_ssm_h_src": [2],
        "track_ssm_h_dst": [2],
        "track_conv_indices": [[13, 14, 15]],
        **track,
    }
    return [
        TraceStep(0, "extend", (row(0, 1, 1, 0, LONG),), (0,), (), {k: v for k, v in md.items() if v is not None}),
        TraceStep(1, "decode", (row(0, 1, 1, 20, (3,)),), (), (0,),
                  {"checkpoints": [{"request": 0, "tokens": 16, "slot": 2}]}),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "track",
    [dict(), dict(mamba_track_seqlens=[17]), dict(track_ssm_h_src=None, track_ssm_h_dst=None, track_conv_indices=None)],
    ids=["seq-end", "forced-h", "fields-not-recorded"],
)
def test_a_position_tracked_inside_a_chunk_is_the_state_after_exactly_its_prefix(track):
    """sglang records the chunk's end (or the position + 1, forcing the h path) as the tracked length; both
    floor to the same chunk state."""
    rep = TraceReplayer(Trace(HEADER, h_steps(**track)))
    res = rep.run(stop_at_first=False)
    assert res.ok and (res.checkpoints, res.verified) == (1, 1), res
    assert rep.book.live[2].tokens == LONG[:16]


@pytest.mark.parametrize(
    ("track", "says"),
    [
        (dict(track_ssm_h_src=[1]), "track_ssm_h_src[0] = 1, but its state after 20 tokens floored to C = 8 is h[2]"),
        (dict(track_ssm_h_dst=[3]), "track_ssm_h_dst[0] = 3, but no row tracked from h goes to slot 3"),
        (dict(track_conv_indices=[[14, 15, 16]]), "track_conv_indices[0] = [14, 15, 16], but its window"),
        (dict(mamba_track_indices=[1], track_ssm_h_dst=[1]), "writes the running slot of request 0"),
        (dict(track_ssm_h_src=[7]), "h[7] is past the step's 3 chunk states"),
    ],
    ids=["h-index", "h-dst", "conv-window", "running-slot", "past-grid"],
)
def test_a_wrong_chunk_track_is_named_at_its_step(track, says):
    found = replay_trace(Trace(HEADER, h_steps(**track)), stop_at_first=False).divergences
    assert found and found[0].step == 0, found
    assert any((d.step, d.field) == (0, "track") and says in d.detail for d in found), found


def test_a_global_chunk_grid_index_reads_another_rows_chunk_and_its_checkpoint_is_off():
    """Two rows in one extend step (20 and 22 tokens, C = 8): GDN's h is one grid per sequence, so row 1's
    state after 16 tokens is h[3 + 2] = h[5]; an index computed on one grid over the flattened batch,
    (20 + 16) // 8 = 4, is row 1's state after 8 tokens (the shape of sglang issue 31833, there for Mamba2):
    named at the step, and the checkpoint published from it is off the float64 state of its 16 tokens."""
    md = {
        "mamba_chunk_size": 8,
        "mamba_track_mask": [False, True],
        "mamba_track_indices": [4, 2],
        "mamba_track_seqlens": [-1, 22],
        "track_ssm_h_src": [4],
        "track_ssm_h_dst": [2],
    }
    body = [
        TraceStep(0, "extend", (row(0, 1, 1, 0, LONG), row(1, 2, 3, 0, LONG2)), (0, 1), (), md),
        TraceStep(1, "decode", (row(0, 1, 1, 20, (3,)), row(1, 2, 3, 22, (5,))), (), (0, 1),
                  {"checkpoints": [{"request": 1, "tokens": 16, "slot": 2}]}),
    ]  # fmt: skip
    found = replay_trace(Trace(HEADER, body), stop_at_first=False).divergences
    assert found[0].step == 0 and "track_ssm_h_src[0] = 4" in found[0].detail and "is h[5]" in found[0].detail
    assert any(d.step == 1 and d.field == "checkpoint" and "off the float64 state" in d.detail for d in found)
    md["track_ssm_h_src"] = [5]
    assert replay_trace(Trace(HEADER, body), stop_at_first=False).ok


# -- Mamba2: one chunk grid over the flattened batch, and the recompute path off it ---------------------------
def mamba2_grid_trace(**track):
    """Three rows of 20, 20 and 12 tokens in one Mamba2 extend step, C = 16 (``workbench.zoo.mamba2_chunk_grid``'s
    fixed plan): row 0's 16 tokens end on the grid (h[1]), row 1's at flattened position 36, off it
    (recomputed); both published as checkpoints of 16 tokens. ``track`` overrides the step's fields."""
    from workbench.traces.script import scripted
    from workbench.zoo.mamba2_chunk_grid import plan

    steps = plan(fixed=True)
    md = steps[0]["metadata"]
    md.update(track)
    steps[0]["metadata"] = {k: v for k, v in md.items() if v is not None}
    return scripted("sglang", "mamba2", steps, num_slots=8, buckets={"decode": [1, 2, 4]}, tokens=True)


@pytest.mark.parametrize(
    "track",
    [
        dict(),
        {
            k: None
            for k in (
                "track_ssm_h_src",
                "track_ssm_h_dst",
                "track_ssm_seq_idx",
                "track_ssm_end_locs",
                "track_ssm_recompute_dst",
            )
        },
    ],  # fmt: skip
    ids=["recorded", "not-recorded"],
)
def test_mamba2_rows_on_and_off_the_batch_grid_publish_exact_checkpoints(track):
    res = replay_trace(mamba2_grid_trace(**track), stop_at_first=False)
    assert res.ok and (res.checkpoints, res.verified) == (2, 2), res


@pytest.mark.parametrize(
    ("track", "says"),
    [
        (dict(track_ssm_end_locs=[37]), "track_ssm_end_locs[0] = 37 recompute row 1's state after 17 tokens"),
        (dict(track_ssm_seq_idx=[2], track_ssm_end_locs=[36]), "name no position of its rows"),
        (dict(track_ssm_h_src=[2]), "is h[1] (one grid over the flattened batch, row 0 starts at token 0; h[2] is row"),
        (dict(track_ssm_seq_idx=[], track_ssm_end_locs=[], track_ssm_recompute_dst=[]), "off the grid), but no entry"),
        (dict(track_ssm_recompute_dst=[6, 5]), "track_ssm_seq_idx, track_ssm_end_locs, track_ssm_recompute_dst: lists"),
    ],
    ids=["end-off-by-one", "past-its-rows", "h-index", "recompute-missing", "ragged"],
)  # fmt: skip
def test_a_wrong_mamba2_grid_track_is_named_at_its_step(track, says):
    found = replay_trace(mamba2_grid_trace(**track), stop_at_first=False).divergences
    assert any((d.step, d.field) == (0, "track") and says in d.detail for d in found), found


@pytest.mark.parametrize(
    "finals,ok",
    [(dict(), True), (dict(track_ssm_final_src=[1], track_ssm_final_dst=[2]), True),
     (dict(track_ssm_final_src=[1], track_ssm_final_dst=[3]), False), (dict(track_ssm_final_src=[1]), False)],
    ids=["not-recorded", "recorded", "wrong-slot", "ragged"],
)  # fmt: skip
def test_sglang_final_state_lists_name_the_chunk_end_copies(finals, ok):
    """A row tracked at its chunk's end (16 tokens, C = 8: on the chunk boundary) copies its running slot 1
    into track slot 2; ``track_ssm_final_src`` / ``_dst`` name that copy."""
    md = {"mamba_chunk_size": 8, "mamba_track_mask": [True], "mamba_track_indices": [2], "mamba_track_seqlens": [16],
          "copies_after": [[1, 2]], **finals}  # fmt: skip
    body = [
        TraceStep(0, "extend", (row(0, 1, 1, 0, LONG[:16]),), (0,), (), md),
        TraceStep(1, "decode", (row(0, 1, 1, 16, (3,)),), (), (0,),
                  {"checkpoints": [{"request": 0, "tokens": 16, "slot": 2}]}),
    ]  # fmt: skip
    res = replay_trace(Trace(HEADER, body), stop_at_first=False)
    assert res.ok is ok, res.divergences
    if not ok:
        assert any(d.step == 0 and "track_ssm_final_src, track_ssm_final_dst" in d.detail for d in res.divergences)
