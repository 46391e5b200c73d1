"""Hand-written traces (``workbench.traces.script.scripted``): token accounting across steps, rows and slots
from a real pool (reuse after a finish), every bad step named; and what the replayer says of slots."""

import pytest

from workbench.traces.format import read_trace, write_trace
from workbench.traces.replay import TraceReplayer, replay_trace
from workbench.traces.script import scripted
from workbench.traces.simulate import SimulationError

BUCKETS = {"decode": [1, 2, 4]}


def test_tokens_are_counted_across_steps_and_slots_are_reused():
    t = scripted(
        "sglang",
        "gdn",
        [
            {"mode": "extend", "rows": {0: 8}},
            {"mode": "extend", "rows": {0: 4, 1: 3}},
            {"mode": "decode", "rows": [1, 0], "finish": [0]},
            {"mode": "extend", "rows": {2: 5}},
            {"mode": "idle"},
        ],
        num_slots=4,
        buckets=BUCKETS,
    )
    rows = [[(r.id, r.cached_tokens, r.new_tokens, r.seq_len) for r in s.rows] for s in t.steps]
    assert rows == [[(0, 0, 8, 8)], [(0, 8, 4, 12), (1, 0, 3, 3)], [(1, 3, 1, 4), (0, 12, 1, 13)], [(2, 0, 5, 5)], []]
    assert [s.admit for s in t.steps] == [(0,), (1,), (), (2,), ()]
    assert t.steps[2].finish == (0,)
    slot = {r.id: (r.req_pool_index, r.slot) for s in t.steps for r in s.rows}
    assert slot[2] == slot[0] != slot[1]  # request 2 got the row and slot request 0 freed
    assert replay_trace(t).ok


def test_verify_rows_count_accepted_tokens():
    t = scripted(
        "sglang",
        "gdn",
        [
            {"mode": "extend", "rows": {0: 4}},
            {"mode": "target_verify", "rows": {0: 1}},
            {"mode": "target_verify", "rows": {0: 2}},
        ],
        num_slots=3,
        buckets={"decode": [1, 2], "target_verify": [1, 2]},
        draft_tokens=2,
    )
    verify = [(r.cached_tokens, r.new_tokens, r.seq_len, r.accepted) for s in t.steps[1:] for r in s.rows]
    assert verify == [(4, 2, 6, 1), (5, 2, 7, 2)]
    assert replay_trace(t).ok


def test_every_row_has_its_kind_and_a_mixed_step_may_hold_verify_rows():
    t = scripted(
        "vllm",
        "gdn",
        [
            {"mode": "extend", "rows": {0: 4}},
            {"mode": "mixed", "rows": {0: 1, 1: 5}},  # a one-token decode beside a chunk (the old reading)
            {"mode": "mixed", "rows": {0: ("verify", 2), 1: ("extend", 3), 2: 4}},  # vLLM: verify rows first
            {"mode": "target_verify", "rows": {0: 1, 1: 2}},
            {"mode": "decode", "rows": [2]},
        ],
        num_slots=9,
        buckets={"decode": [1, 2, 4], "target_verify": [1, 2, 4]},
        draft_tokens=2,
    )
    got = [[(r.id, r.kind, r.cached_tokens, r.new_tokens, r.accepted) for r in s.rows] for s in t.steps]
    assert got == [
        [(0, "extend", 0, 4, None)],
        [(0, "decode", 4, 1, None), (1, "extend", 0, 5, None)],
        [(0, "verify", 5, 2, 2), (1, "extend", 5, 3, None), (2, "extend", 0, 4, None)],
        [(0, "verify", 7, 2, 1), (1, "verify", 8, 2, 2)],
        [(2, "decode", 4, 1, None)],
    ]
    result = replay_trace(t)
    assert result.ok, str(result)


@pytest.mark.parametrize(
    ("row", "message"),
    [(("verify", 3), "('verify', 3)"), (("decode", 2), "('decode', 2)"), (("prefill", 2), "('prefill', 2)")],
)
def test_a_bad_mixed_row_is_named(row, message):
    with pytest.raises(SimulationError) as err:
        scripted("vllm", "gdn", [{"mode": "mixed", "rows": {0: row}}], num_slots=9, buckets=BUCKETS, draft_tokens=2)
    assert f"steps[0]: rows[0] = {message}: a mixed row is new_tokens, or (kind, n)" in str(err.value)


def test_a_scripted_trace_round_trips_through_the_file(tmp_path):
    t = scripted(
        "vllm",
        "gdn",
        [{"mode": "extend", "rows": {0: 3}}, {"mode": "decode", "rows": [0]}],
        num_slots=3,
        buckets=BUCKETS,
    )
    path = tmp_path / "t.jsonl"
    write_trace(t, path)
    back = read_trace(path)
    assert back.header == t.header and back.steps == t.steps


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([{"mode": "prefill", "rows": {0: 2}}], "steps[0]: mode = 'prefill'"),
        ([{"mode": "decode", "rows": [0], "when": 1}], "steps[0]: unknown key 'when'"),
        ([{"mode": "extend", "rows": [0]}], "steps[0]: rows = [0]: a extend step needs {request id: new_tokens"),
        ([{"mode": "extend", "rows": {0: 0}}], "steps[0]: rows[0] = 0"),
        ([{"mode": "decode", "rows": [-1]}], "steps[0]: rows = [-1]: must be a list of request ids"),
        ([{"mode": "idle", "rows": [0]}], "an idle step has no rows"),
        ([{"mode": "target_verify", "rows": {0: 3}}], "rows[0] = 3: accepted must be in 1..D=2"),
        (
            [{"mode": "extend", "rows": {0: 2}, "finish": [0]}, {"mode": "decode", "rows": [0]}],
            "steps[1]: request 0 finished",
        ),
        ([{"mode": "extend", "rows": {0: 2}, "finish": [1]}], "steps[0]: finish: request 1 is not live"),
        ([{"mode": "extend", "rows": {0: 2, 1: 2, 2: 2}}], "steps[0]: request 2: the pool of 3 slots is full"),
    ],
    ids=[
        "mode",
        "key",
        "rows-shape",
        "zero-tokens",
        "negative-id",
        "idle-rows",
        "accepted",
        "finished",
        "finish",
        "full",
    ],
)
def test_bad_steps_are_named(steps, message):
    with pytest.raises(SimulationError, match=None) as err:
        scripted("sglang", "gdn", steps, num_slots=3, buckets=BUCKETS)
    assert message in str(err.value)


def test_bad_layer_and_pool_are_named():
    with pytest.raises(SimulationError, match="layer = 'rwkv'"):
        scripted("sglang", "rwkv", [], num_slots=3, buckets=BUCKETS)
    with pytest.raises(SimulationError, match="num_slots = 1"):
        scripted("sglang", "gdn", [], num_slots=1, buckets=BUCKETS)


def test_replayer_knows_tenants_owners_and_zeroes_on_alloc():
    t = scripted(
        "vllm",
        "gdn",
        [
            {"mode": "extend", "rows": {0: 3}},
            {"mode": "decode", "rows": [0], "finish": [0]},
            {"mode": "extend", "rows": {1: 2}},
        ],
        num_slots=3,
        buckets=BUCKETS,
    )
    slot = t.steps[0].rows[0].slot
    rep = TraceReplayer(t)
    rep.step(t.steps[0])
    rep.step(t.steps[1])
    assert rep.owner(slot) is None and rep.previous_tenant(slot, 0) is None
    before = rep.runner.state.ssm[slot].clone()
    rep.step(t.steps[2])
    assert rep.owner(slot) == 1 and rep.previous_tenant(slot, 1) == 0 and rep.tenants[slot] == [0, 1]
    assert before.abs().sum() > 0  # request 0 left its state there ...
    zeroing = TraceReplayer(t, zero_on_alloc=True)
    for s in t.steps[:2]:
        zeroing.step(s)
    left = zeroing.runner.state.ssm[slot].clone()
    zeroing._admit(t.steps[2])  # ... which an allocator that zeroes removes at admission, in both pools
    assert left.abs().sum() > 0 and zeroing.runner.state.ssm[slot].abs().sum() == 0
    assert zeroing.shadow.ssm[slot].abs().sum() == 0


def test_token_ids_hits_and_the_cache_work_are_scripted_and_the_pool_follows_them():
    from workbench.traces.script import generated_token

    steps = [
        {"mode": "extend", "rows": {0: 4}, "tokens": {0: [9, 8, 7, 6]},
         "metadata": {"copies_after": [[1, 4]], "checkpoints": [{"request": 0, "tokens": 4, "slot": 4}]}},
        {"mode": "extend", "rows": {1: 2}, "cached": {1: 4},
         "metadata": {"hits": [{"request": 1, "tokens": 4, "slot": 4}], "copies_before": [[4, 2]]}},
        {"mode": "decode", "rows": [0, 1], "finish": [0],
         "metadata": {"checkpoints": [{"request": 0, "tokens": 5, "slot": 1}]}},
        {"mode": "extend", "rows": {2: 3}, "metadata": {"evict": [4]}},
    ]  # fmt: skip
    t = scripted("sglang", "gdn", steps, num_slots=5, buckets=BUCKETS, tokens=True)
    first, hit, decode, after = t.steps
    assert first.rows[0].tokens == (9, 8, 7, 6) and hit.rows[0].cached_tokens == 4
    assert hit.rows[0].tokens == (generated_token(1, 4), generated_token(1, 5))  # positions after the hit
    assert decode.rows[0].tokens == (generated_token(0, 4),)
    # slot 4 is held from step 0 (request 1 got slot 2, not 4); request 0 donated slot 1 at step 2; the
    # eviction at step 3 frees slot 4 again, which is where request 2 lands (slot 1 is still held)
    assert hit.rows[0].slot == 2 and after.rows[0].slot == 3
    res = replay_trace(t)
    assert res.ok and (res.hits, res.checkpoints, res.verified) == (1, 2, 2), res
    with pytest.raises(SimulationError, match=r"tokens\[0\] has 2 ids, the row feeds 4"):
        short = [{"mode": "extend", "rows": {0: 4}, "tokens": {0: [1, 2]}}]
        scripted("sglang", "gdn", short, num_slots=3, buckets=BUCKETS, tokens=True)
    with pytest.raises(SimulationError, match="metadata = 3: must be a mapping"):
        scripted("sglang", "gdn", [{"mode": "idle", "metadata": 3}], num_slots=3, buckets=BUCKETS)
