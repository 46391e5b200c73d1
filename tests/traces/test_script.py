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
