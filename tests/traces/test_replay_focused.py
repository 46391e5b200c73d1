"""workbench.traces.replay on tiny scripted traces, fast (issue 27): every check the replay makes, each read
off its divergence (kind, field, step, request, row, slot, expected, got): recorded metadata (a field off by
one, a recording that holds only some fields, a bucket not captured), the float64 shadow (foreign writes,
states off), verify accepts (sglang and vLLM), token counts, input errors; and what the result says.

Each fixture replays one trace once (a capture and a few steps: well under a second each)."""

from __future__ import annotations

import time
from dataclasses import FrozenInstanceError, replace

import pytest
import torch

from workbench.backends import MetadataBackend
from workbench.batch import Batch
from workbench.metadata import Metadata
from workbench.traces import Trace, TraceHeader
from workbench.traces.replay import (
    PhaseTimer,
    TraceDivergence,
    TraceInputError,
    TraceReplayer,
    TraceResult,
    make_layer,
    replay_trace,
)
from workbench.traces.script import scripted


# -- what a divergence and a result say (no replay) ---------------------------------------------------------
def test_a_divergence_renders_its_facts():
    full = TraceDivergence(3, "metadata", "seq_lens", "off", request=7, row=1, slot=4, expected=5, got=6)
    assert str(full) == "step 3: metadata: seq_lens, request 7, row 1, slot 4: off; expected 5, got 6"
    assert str(TraceDivergence(0, "state", "ssm", "state off reference", got=0.01234)) == (
        "step 0: state: ssm: state off reference; off by 0.0123"
    )
    assert str(TraceDivergence(2, "metadata", "bucket", "not captured", got=3)) == (
        "step 2: metadata: bucket: not captured; got 3"
    )
    assert (
        str(TraceDivergence(1, "error", "decode", "RuntimeError: boom")) == "step 1: error: decode: RuntimeError: boom"
    )
    assert str(TraceDivergence(1, "prefix", "slots", "x", row=0, expected=[1], got=[2])).endswith(
        "row 0: x; expected [1], got [2]"
    )
    with pytest.raises(FrozenInstanceError):
        full.step = 4  # type: ignore[misc]
    d = TraceDivergence(1, "metadata", "state_indices", "x", expected=(1, [2, 3]), got=torch.tensor([1]))
    assert d.to_dict() == {
        "step": 1, "kind": "metadata", "field": "state_indices", "detail": "x", "request": None, "row": None,
        "slot": None, "expected": [1, [2, 3]], "got": "tensor([1])",
    }  # fmt: skip


def test_a_result_is_ok_only_when_a_step_ran_and_none_diverged():
    header = TraceHeader("vllm", "gdn", 5, {"decode": [1]}, 2, None)
    res = TraceResult(header)
    assert not res.ok and res.first is None and res.divergences == []
    counts = ("steps", "graph_steps", "eager_steps", "idle_steps", "hits", "checkpoints", "verified", "budget_bytes")
    assert [getattr(res, c) for c in counts] == [0] * 8 and res.seconds == dict.fromkeys(res.seconds, 0.0)
    assert res.summary().startswith(
        "FAIL: vllm gdn: 0 steps (0 graph, 0 eager, 0 idle) in 0.0 s: the trace replays nothing"
    )
    res.steps, res.graph_steps, res.eager_steps, res.idle_steps = 3, 1, 1, 1
    res.seconds["replay"] = 0.25
    assert res.ok and res.summary() == (
        "OK: vllm gdn: 3 steps (1 graph, 1 eager, 1 idle) in 0.2 s, every request on its float64 recurrence, "
        "nothing foreign written"
    )
    res.hits = 1  # a hit alone, a checkpoint alone: either is prefix-cache work to report
    assert "; prefix cache: 1 hit(s), 0 checkpoint(s) published, 0 verified against" in res.summary()
    res.hits, res.checkpoints = 0, 1
    assert "; prefix cache: 0 hit(s), 1 checkpoint(s) published" in res.summary()
    res.hits, res.checkpoints, res.verified = 1, 2, 2
    assert "; prefix cache: 1 hit(s), 2 checkpoint(s) published, 2 verified against" in res.summary()
    first = TraceDivergence(2, "state", "ssm", "state off reference", got=0.5)
    res.divergences = [first, TraceDivergence(2, "output", "output", "o")]
    assert not res.ok and res.first is first
    assert res.summary().endswith("; first divergence: step 2: state: ssm: state off reference; off by 0.5")
    assert str(res).splitlines() == [str(first), "step 2: output: output: o", res.summary()]
    d = res.to_dict()
    assert d["ok"] is False and (d["profile"], d["layer"], d["steps"]) == ("vllm", "gdn", 3)
    assert (d["graph_steps"], d["eager_steps"], d["idle_steps"], d["hits"], d["checkpoints"], d["verified"]) == (
        1, 1, 1, 1, 2, 2,
    )  # fmt: skip
    assert d["divergences"][0]["got"] == 0.5 and d["seconds"]["replay"] == 0.25 and d["memory_budget_bytes"] == 0
    res.seconds["check"] = 1 / 3
    assert res.to_dict()["seconds"]["check"] == 0.333


def test_make_layer_names_the_two_layers_seeded_with_zero():
    from workbench.layers import GatedDeltaNetLayer, GDNConfig, Mamba2Config, Mamba2Layer

    for name, want in (
        ("gdn", GatedDeltaNetLayer(GDNConfig.small(), seed=0)),
        ("mamba2", Mamba2Layer(Mamba2Config.small(), seed=0)),
    ):  # noqa: E501
        got = make_layer(name)
        assert type(got) is type(want) and got.config == want.config
        assert got.weights.keys() == want.weights.keys()
        assert all(torch.equal(got.weights[k], want.weights[k]) for k in want.weights)
    with pytest.raises(TraceInputError, match=r"^layer: 'mamba' is not one of \('gdn', 'mamba2', 'kda'\)"):
        make_layer("mamba")


# -- a clean trace: every mode, a finish and a reuse ---------------------------------------------------------
CLEAN_STEPS = [
    {"mode": "extend", "rows": {0: 3, 1: 2}},
    {"mode": "decode", "rows": [0, 1]},  # graph, bucket 2
    {"mode": "extend", "rows": {2: 4}},
    {"mode": "decode", "rows": [0, 1, 2], "finish": [1]},  # above the largest bucket: eager
    {"mode": "idle"},  # the decode graph with no live row
    {"mode": "mixed", "rows": {0: 1, 3: 2}},  # request 3 takes request 1's row and slot
    {"mode": "decode", "rows": [3]},  # graph, bucket 1
]


class Laps(PhaseTimer):
    """A timer that keeps every phase's seconds in the order the replay reports them."""

    def __init__(self) -> None:
        super().__init__()
        self.laps: list[tuple[str, float]] = []

    def lap(self, phase: str, seconds: float) -> None:
        super().lap(phase, seconds)
        self.laps.append((phase, seconds))


@pytest.fixture(scope="module")
def clean():
    trace = scripted("sglang", "gdn", CLEAN_STEPS, num_slots=5, buckets={"decode": [1, 2]})
    replayer = TraceReplayer(trace, timer=Laps())
    calls: list[tuple[int, int]] = []
    t0 = time.perf_counter()
    result = replayer.run(progress=lambda done, total: calls.append((done, total)))
    return trace, replayer, result, calls, time.perf_counter() - t0


def test_a_clean_trace_replays_every_mode(clean):
    trace, replayer, result, calls, wall = clean
    assert result.ok, str(result)
    assert (result.steps, result.graph_steps, result.eager_steps, result.idle_steps) == (7, 2, 4, 1)
    assert result.summary().startswith("OK: sglang gdn: 7 steps (2 graph, 4 eager, 1 idle) in ")
    assert calls == [(i, 7) for i in range(1, 8)]
    assert result.budget_bytes == replayer.budget.total > 0
    assert replayer.seed == 0 and replayer.max_divergences == 20 and replayer.zero_on_alloc is False


def test_the_replayer_keeps_who_held_each_slot(clean):
    trace, replayer, result, calls, wall = clean
    assert replayer.live == {0: 1, 2: 3, 3: 2}  # request id -> request-pool row
    assert replayer.tenants == {1: [0], 2: [1, 3], 3: [2]}
    assert [replayer.owner(s) for s in range(5)] == [None, 0, 3, 2, None]
    assert (replayer.previous_tenant(2, 3), replayer.previous_tenant(2, 1), replayer.previous_tenant(4, 0)) == (
        1,
        None,
        None,
    )
    assert replayer.previous_tenant(2, 9) == 3  # a request that never held the slot: the last tenant


def test_each_phase_is_timed_within_the_wall_time(clean):
    trace, replayer, result, calls, wall = clean
    assert set(result.seconds) == {"metadata", "replay", "reference", "check", "prefix"}
    assert all(0 <= s <= wall for s in result.seconds.values()) and result.seconds["replay"] > 0
    assert result.seconds["reference"] > 0 and result.seconds["check"] > 0
    assert result.seconds["metadata"] > 0 and result.seconds["prefix"] > 0  # measured every step, if briefly
    laps = replayer.timer.laps
    assert all(0 <= t <= wall for _, t in laps) and replayer.timer.seconds is result.seconds
    assert [p for p, _ in laps if p in ("replay", "reference", "check")] == ["replay", "reference", "check"] * 7
    assert sum(t for p, t in laps if p == "replay") == pytest.approx(result.seconds["replay"])
    # each step: its evictions, its hits and copies, the metadata check, the forward, then its checkpoints
    assert [p for p, _ in laps[:7]] == ["prefix", "prefix", "metadata", "replay", "reference", "check", "prefix"]


def test_a_replay_without_a_timer_reads_no_clock(monkeypatch):
    import workbench.traces.replay as replay_module

    def no_clock() -> float:
        raise AssertionError("the replay read the clock")

    trace = scripted("sglang", "gdn", CLEAN_STEPS[:3], num_slots=5, buckets={"decode": [1, 2]})
    replayer = TraceReplayer(trace)
    monkeypatch.setattr(replay_module.time, "perf_counter", no_clock)
    result = replayer.run()
    monkeypatch.undo()
    assert result.ok and replayer.timer is None and result.seconds == dict.fromkeys(result.seconds, 0.0)
    timed = replay_trace(trace)  # the CLI's: timed by phase
    assert timed.ok and timed.seconds["replay"] > 0


def test_steps_the_trace_cannot_run_are_input_errors(clean):
    trace, replayer, result, calls, wall = clean
    last = trace.steps[-1]  # decode [3], request 3 at row 2 slot 2
    row = last.rows[0]
    with pytest.raises(TraceInputError, match=r"^step 6: admit: request 3 is already live"):
        replayer.step(replace(last, admit=(3,)))
    with pytest.raises(TraceInputError, match=r"^step 6: admit: request 9 has no row in the step that admits it"):
        replayer.step(replace(last, admit=(9,)))
    with pytest.raises(TraceInputError, match=r"^step 6: rows: request 8 is not live at row 2"):
        replayer.step(replace(last, rows=(replace(row, id=8),)))
    with pytest.raises(TraceInputError, match=r"^step 6: rows: request 3 is not live at row 4"):
        replayer.step(replace(last, rows=(replace(row, req_pool_index=4),)))
    two = replace(row, new_tokens=2, seq_len=row.cached_tokens + 2)  # its counts add up; a decode has 1 token
    with pytest.raises(TraceInputError, match=r"^step 6: step 6 row 0 \(request 3\): new_tokens=2 in a decode row"):
        replayer.step(replace(last, rows=(two,)))


def test_a_trace_of_no_steps_is_never_ok():
    trace = scripted("sglang", "gdn", [], num_slots=3, buckets={"decode": [1]})
    result = replay_trace(trace)
    assert not result.ok and result.steps == 0 and result.first is None


# -- recorded metadata: a dump's fields checked against the profile, any subset of them ----------------------
def _full(rows, bucket: int | None = 4) -> dict:
    """Everything an engine dump of an sglang decode step holds, padded to ``bucket`` (None: unpadded)."""
    pad = 0 if bucket is None else bucket - len(rows)
    offsets = list(range(len(rows) + 1))
    return {
        "bucket": bucket,
        "state_indices": [r.slot for r in rows] + [-1] * pad,
        "query_start_loc": offsets + [offsets[-1]] * pad,
        "seq_lens": [r.seq_len for r in rows] + [1] * pad,
        "req_pool_indices": [r.req_pool_index for r in rows] + [0] * pad,
        "has_initial_state": [True] * len(rows) + [False] * pad,
    }


def _only(*names: str, bucket: int | None = None):
    return lambda rows: {k: v for k, v in _full(rows, bucket).items() if k in names}


def _changed(name: str, at: int, value=None, delta: int = 0, names=None):
    def make(rows):
        md = _full(rows) if names is None else _only(*names, bucket=4)(rows)
        md[name] = list(md[name])
        md[name][at] = md[name][at] + delta if value is None else value
        return md

    return make


RECORDINGS = {  # step -> (what the dump holds, its metadata from the step's rows, the divergences: kind, field,
    # row, request, slot)
    1: ("every field as built", _full, []),
    2: ("seq_lens off by one", _changed("seq_lens", 1, delta=1), [("metadata", "seq_lens", 1, 1, None)]),
    3: ("a padded row on a live slot", _changed("state_indices", 3, 1), [("invariant", "state_indices", 3, None, None), ("metadata", "state_indices", 3, None, 1)]),  # noqa: E501
    4: ("only state_indices", _only("state_indices"), []),
    5: ("only query_start_loc", _only("query_start_loc"), []),
    6: ("bucket alone", _only("bucket", bucket=4), []),
    7: ("a bucket not captured", lambda rows: {"bucket": 5}, [("metadata", "bucket", None, None, None)]),
    8: ("not a list of ints", _changed("state_indices", 0, "one", names=("bucket", "state_indices")), [("metadata", "state_indices", None, None, None)]),  # noqa: E501
    9: ("only req_pool_indices", _only("req_pool_indices"), []),
    10: ("only has_initial_state", _only("has_initial_state"), []),
    11: ("only seq_lens", _only("seq_lens"), []),
    12: ("no field the replay checks", lambda rows: {"spec_sequence_masks": [False] * 3, "num_prefill_tokens": 0}, []),
    13: ("a shorter state_indices", lambda rows: {"bucket": 4, "state_indices": [r.slot for r in rows]}, [("invariant", "state_indices", None, None, None), ("metadata", "state_indices", None, None, None)]),  # noqa: E501
    14: ("a live row's request row off", _changed("req_pool_indices", 0, delta=1), [("invariant", "state_indices", 0, None, None), ("metadata", "req_pool_indices", 0, 0, None)]),  # noqa: E501
    15: ("bucket and state_indices", _only("bucket", "state_indices", bucket=4), []),
    16: ("seq_lens padded with a live value", _changed("seq_lens", 3, 5), [("invariant", "seq_lens", 3, None, None), ("metadata", "seq_lens", 3, None, None)]),  # noqa: E501
    17: ("two fields off: the first is named", lambda rows: _changed("has_initial_state", 0, False)(rows) | {"seq_lens": [rows[0].seq_len + 1, *_full(rows)["seq_lens"][1:]]}, [("invariant", "has_initial_state", 0, None, None), ("metadata", "seq_lens", 0, 0, None)]),  # noqa: E501
    18: ("vLLM's accepted counts in an sglang decode", lambda rows: {"num_accepted_tokens": [1, 1, 1]}, [("metadata", "num_accepted_tokens", None, None, None)]),  # noqa: E501
}  # fmt: skip


@pytest.fixture(scope="module")
def recorded():
    steps = [{"mode": "extend", "rows": {0: 3, 1: 2, 2: 4}}] + [{"mode": "decode", "rows": [0, 1, 2]}] * len(RECORDINGS)
    steps += [
        {"mode": "idle"},
        {"mode": "idle"},
        {"mode": "extend", "rows": {3: 2}},
        {"mode": "extend", "rows": {3: 1}},
        {"mode": "decode", "rows": [0]},
        {"mode": "decode", "rows": [0]},
        {"mode": "decode", "rows": [3]},
    ]
    trace = scripted("sglang", "gdn", steps, num_slots=6, buckets={"decode": [1, 2, 4]})
    out = list(trace.steps)
    for index, (_, make, _) in RECORDINGS.items():
        out[index] = replace(out[index], metadata=make(out[index].rows))
    base = len(RECORDINGS) + 1
    idle, idle5, ext, ext2, dec, dec2, dec3 = range(base, base + 7)
    out[idle] = replace(out[idle], metadata={"bucket": 1, "state_indices": [-1], "query_start_loc": [0, 0]})
    out[idle5] = replace(out[idle5], metadata={"bucket": 5})  # the idle step runs the decode graphs: not captured
    out[ext] = replace(out[ext], metadata={"bucket": None, "state_indices": [4], "has_initial_state": [False]})
    out[ext2] = replace(out[ext2], metadata={"has_initial_state": [False]})  # a chunk that forgets its state
    row = out[dec].rows[0]
    out[dec] = replace(out[dec], rows=(replace(row, seq_len=row.seq_len + 1),))  # a count off its history
    out[dec2] = replace(out[dec2], rows=(replace(out[dec2].rows[0], slots=(4,)),))  # names a slot it does not own
    row = out[dec3].rows[0]
    out[dec3] = replace(out[dec3], rows=(replace(row, cached_tokens=0, seq_len=1),))  # its state thrown away
    result = replay_trace(Trace(trace.header, out), stop_at_first=False)
    return Trace(trace.header, out), result


@pytest.mark.parametrize("index", list(RECORDINGS), ids=[r[0] for r in RECORDINGS.values()])
def test_a_recording_is_checked_field_by_field(recorded, index):
    trace, result = recorded
    found = [(d.kind, d.field, d.row, d.request, d.slot) for d in result.divergences if d.step == index]
    assert found == RECORDINGS[index][2], [str(d) for d in result.divergences if d.step == index]


def test_a_recorded_value_off_by_one_is_a_metadata_divergence_naming_the_field(recorded):
    trace, result = recorded
    (d,) = [d for d in result.divergences if d.step == 2]
    row = trace.steps[2].rows[1]
    assert (d.expected, d.got) == (row.seq_len, row.seq_len + 1)
    assert d.detail == "the recorded value is not what the profile builds for this step"
    assert str(d) == (
        f"step 2: metadata: seq_lens, request 1, row 1: the recorded value is not what the profile builds for this "
        f"step; expected {row.seq_len}, got {row.seq_len + 1}"
    )


def test_what_each_other_recorded_divergence_says(recorded):
    trace, result = recorded
    by_step = {}
    for d in result.divergences:
        by_step.setdefault(d.step, []).append(d)
    inv, meta = by_step[3]
    assert "padded row holds [1], expected the sentinel -1" in inv.detail and inv.expected is None
    assert (meta.expected, meta.got) == (-1, 1)
    (bucket,) = by_step[7]
    assert bucket.got == 5 and bucket.expected is None and "bucket 5 was not captured" in bucket.detail
    (text,) = by_step[8]
    assert text.detail.startswith("not a tensor of torch.int32: ")
    padded = by_step[16][1]
    assert (padded.expected, padded.got) == (1, 5)
    short = by_step[13][1]
    assert (short.expected, short.got, short.row, short.slot) == ([4], [3], None, None)
    request_row = by_step[14][1]
    assert request_row.got == request_row.expected + 1


def test_graph_eager_and_idle_steps_of_the_recorded_trace(recorded):
    trace, result = recorded
    n = len(RECORDINGS)
    # every decode step replays its graph (a recording changes nothing the runner does) but the one whose
    # count is off its history, which builds no batch
    assert (result.steps, result.graph_steps, result.eager_steps, result.idle_steps) == (n + 8, n + 2, 3, 2)


def test_recorded_idle_and_extend_steps(recorded):
    trace, result = recorded
    base = len(RECORDINGS) + 1
    assert [d for d in result.divergences if d.step in (base, base + 2)] == []
    (idle,) = [d for d in result.divergences if d.step == base + 1]
    assert (idle.kind, idle.field, idle.got) == ("metadata", "bucket", 5)
    (forgot,) = [d for d in result.divergences if d.step == base + 3]
    assert (forgot.kind, forgot.field, forgot.row, forgot.request, forgot.expected, forgot.got) == (
        "metadata", "has_initial_state", 0, 3, True, False,
    )  # fmt: skip


def test_token_counts_and_slots_off_the_history(recorded):
    trace, result = recorded
    base = len(RECORDINGS) + 5
    (count,) = [d for d in result.divergences if d.step == base]
    assert (count.kind, count.field, count.request, count.row) == ("tokens", "seq_len", 0, 0)
    assert count.got == count.expected + 1
    (slots,) = [d for d in result.divergences if d.step == base + 1]
    assert (slots.kind, slots.field, slots.request, slots.row) == ("prefix", "slots", 0, 0)
    assert slots.detail == "rows[0].slots = [4], but after the step's moves the request owns [1]"
    (thrown,) = [d for d in result.divergences if d.step == base + 2]
    assert (thrown.kind, thrown.field, thrown.request, thrown.expected, thrown.got) == (
        "tokens",
        "cached_tokens",
        3,
        3,
        0,
    )
    assert len(result.divergences) == sum(len(r[2]) for r in RECORDINGS.values()) + 5


# -- a backend that writes where it must not --------------------------------------------------------------
class WritesForeignSlots(MetadataBackend):
    """Every extend's first row runs on another slot: the request owning slot 1 if there is one in the pool
    and it is not this row's, else the free slot 4; every decode raises."""

    def init_forward_metadata(self, batch: Batch) -> Metadata:
        meta = super().init_forward_metadata(batch)
        if batch.mode == "extend":
            meta.state_indices[0] = 4 if int(meta.state_indices[0]) == 1 else 1
        return meta

    def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
        if not in_capture:
            raise RuntimeError("boom")
        return super().init_forward_metadata_out_graph(batch, in_capture)


@pytest.fixture(scope="module")
def broken():
    steps = [{"mode": "extend", "rows": {0: 2, 1: 2}}, {"mode": "decode", "rows": [0, 1]}]
    steps += [{"mode": "extend", "rows": {1: 1}}] * 7
    trace = scripted("sglang", "gdn", steps, num_slots=5, buckets={"decode": [2]})
    return trace, replay_trace(trace, metadata_backend=WritesForeignSlots, stop_at_first=False)


def test_a_foreign_write_names_the_slot_and_whose_it_is(broken):
    trace, result = broken
    first = [d for d in result.divergences if d.step == 0]
    assert [(d.kind, d.field, d.slot) for d in first] == [
        ("foreign", "conv", 4),
        ("foreign", "ssm", 4),
        ("state", "conv", 1),
    ]
    assert first[0].detail == "foreign slot changed: a slot no live request owns" and first[0].request is None
    assert (first[2].request, first[2].row, first[2].detail) == (0, 0, "state off reference") and first[2].got > 0
    later = [d for d in result.divergences if d.step == 2]
    assert later[0].kind == "foreign" and later[0].slot == 1
    assert later[0].detail == "foreign slot changed: the slot of request 0, which is not in this step"


def test_a_step_that_raises_is_an_error_divergence_and_the_replay_goes_on(broken):
    trace, result = broken
    (error,) = [d for d in result.divergences if d.step == 1]
    assert (error.kind, error.field, error.detail) == ("error", "decode", "RuntimeError: boom")
    assert result.steps == 9  # every step ran, not stopped at the first


def test_at_most_twenty_divergences_are_kept_three_per_step(broken):
    trace, result = broken
    assert len(result.divergences) == 20
    per_step = [sum(d.step == s for d in result.divergences) for s in range(9)]
    assert per_step[:7] == [3, 1, 3, 3, 3, 3, 3] and sum(per_step) == 20
    stopped = replay_trace(trace, metadata_backend=WritesForeignSlots)
    assert (
        stopped.steps == 1
        and len(stopped.divergences) == 3
        and stopped.summary().startswith("FAIL: sglang gdn: 1 steps")
    )


# -- a slot read before its tenant's first write: zeroed on allocation or not ----------------------------------
class ReadsReusedSlots(MetadataBackend):
    """vLLM PR 56524: every extend row reads its slot as initial state."""

    def init_forward_metadata(self, batch: Batch) -> Metadata:
        meta = super().init_forward_metadata(batch)
        meta.has_initial_state = torch.ones_like(meta.has_initial_state)
        return meta


def test_zero_on_alloc_hides_a_read_of_a_fresh_slot():
    steps = [{"mode": "extend", "rows": {0: 2}}, {"mode": "extend", "rows": {1: 2}}]
    trace = scripted("sglang", "gdn", steps, num_slots=3, buckets={"decode": [1]})
    seeded = TraceReplayer(trace, metadata_backend=ReadsReusedSlots)
    result = seeded.run()  # stops at the first step that diverges
    assert result.steps == 1 and result.first is not None
    assert (result.first.kind, result.first.request, result.first.slot) == ("state", 0, 1)
    zeroed = TraceReplayer(trace, metadata_backend=ReadsReusedSlots, zero_on_alloc=True)
    assert zeroed.step(trace.steps[0]) == [] and zeroed.result.ok
    assert replay_trace(trace, metadata_backend=ReadsReusedSlots, zero_on_alloc=True).ok
    assert not replay_trace(trace, metadata_backend=ReadsReusedSlots).ok


def test_a_replay_past_the_free_memory_is_refused_before_it_allocates(monkeypatch):
    from workbench import limits
    from workbench.errors import MetadataError

    monkeypatch.setattr(limits, "host_memory_bytes", lambda: 1024)
    trace = scripted("sglang", "gdn", [{"mode": "extend", "rows": {0: 2}}], num_slots=3, buckets={"decode": [1]})
    with pytest.raises(MetadataError, match="for a replay of this trace"):
        TraceReplayer(trace)


# -- verify: sglang scatters the accepted step back, vLLM reads the slot of its last accepted draft ------------
@pytest.mark.parametrize("profile", ["sglang", "vllm"])
def test_verify_steps_accept_on_the_runner_and_the_shadow_alike(profile):
    steps = [
        {"mode": "extend", "rows": {0: 3, 1: 2}},
        {"mode": "target_verify", "rows": {0: 1, 1: 2}},
        {"mode": "target_verify", "rows": {0: 2, 1: 1}},
        {"mode": "target_verify", "rows": {1: 2}, "finish": [1]},
        {"mode": "target_verify", "rows": {0: 1}},
        {"mode": "target_verify", "rows": {0: 2}},
    ]
    trace = scripted(profile, "gdn", steps, num_slots=7, buckets={"decode": [2], "target_verify": [1, 2]})
    replayer = TraceReplayer(trace)
    replayer.step(trace.steps[0])
    assert replayer.read_columns == {} and replayer.verified_intermediates is None
    replayer.step(trace.steps[1])
    if profile == "vllm":
        assert replayer.read_columns == {0: 0, 1: 0} and replayer.accepted == {0: 1, 1: 2}
        assert replayer.verified_intermediates is None
    else:
        rows, got, want = replayer.verified_intermediates
        assert rows == [1, 2] and got.ssm.shape[:2] == (2, 2) and want.ssm.dtype == torch.float64
    replayer.step(trace.steps[2])
    if profile == "vllm":
        assert replayer.read_columns == {0: 0, 1: 1}  # request 1 accepted 2: it reads its second slot
    replayer.step(trace.steps[3])
    if profile == "vllm":
        assert replayer.accepted == {0: 2}  # request 1 finished
    replayer.step(trace.steps[4])
    if profile == "vllm":
        assert replayer.read_columns == {0: 1}
    assert replayer.result.ok, str(replayer.result)
    assert (replayer.result.graph_steps, replayer.result.eager_steps) == (4, 1)
    for slot in replayer.pool.slots_of(replayer.live[0]):  # the runner's state of request 0 goes astray
        replayer.runner.state.ssm[slot] += 1.0
    found = replayer.step(trace.steps[5])
    assert found and found[0].kind == "state" and (found[0].request, found[0].row) == (0, 0), [str(d) for d in found]


def test_an_accept_off_the_shadow_is_a_state_divergence(monkeypatch):
    steps = [{"mode": "extend", "rows": {0: 3, 1: 2}}, {"mode": "target_verify", "rows": {1: 1, 0: 2}}]
    trace = scripted("sglang", "gdn", steps, num_slots=4, buckets={"decode": [2], "target_verify": [2]})
    replayer = TraceReplayer(trace)
    assert replayer.step(trace.steps[0]) == []
    monkeypatch.setattr(replayer.runner, "accept", lambda counts: None)  # the runner keeps the last draft's state
    found = replayer.step(trace.steps[1])
    assert [(d.kind, d.field, d.request, d.row) for d in found] == [("state", "accept", 1, 0)]  # the first row off
    assert found[0].detail == "the accepted state is off its float64 recurrence"


def test_a_vllm_admission_the_pool_cannot_place_is_an_input_error(capfd):
    steps = [{"mode": "extend", "rows": {0: 3}}, {"mode": "target_verify", "rows": {0: 1}}]
    trace = scripted("vllm", "gdn", steps, num_slots=5, buckets={"decode": [1], "target_verify": [1]})
    step = trace.steps[0]
    moved = replace(step, rows=(replace(step.rows[0], slot=3),))  # the pool hands out slots 1 and 2 first
    replayer = TraceReplayer(trace)
    assert capfd.readouterr() == ("", "")  # the capture runs without a progress bar
    with pytest.raises(TraceInputError, match=r"^step 0: admit: request 0 at row 1 slot 3: a pool of D slots per "):
        replayer.step(moved)


def test_rows_are_placed_where_the_trace_says_and_fed_their_token_ids():
    """An engine need not hand out the lowest free slot: request 0 on slot 3 replays there. Two rows with the
    same token ids in one step are the same computation: their states end equal."""
    steps = [{"mode": "extend", "rows": {0: 3, 1: 3}, "tokens": {0: [5, 6, 7], 1: [5, 6, 7]}}]
    trace = scripted("sglang", "gdn", steps, num_slots=4, buckets={"decode": [1]}, tokens=True)
    step = trace.steps[0]
    moved = replace(step, rows=(replace(step.rows[0], slot=3), step.rows[1]))
    replayer = TraceReplayer(Trace(trace.header, [moved]))
    assert replayer.step(moved) == [] and replayer.owner(3) == 0 and replayer.owner(1) is None
    state = replayer.runner.state
    for pool in (state.ssm, state.conv):  # equal up to the order of a batched product's sums
        assert torch.allclose(pool[3], pool[2], atol=1e-5, rtol=1e-4)


# -- a prefix cache's work: hits, copies and checkpoints, and a write into a checkpoint ----------------------
class WritesTheCheckpoint(MetadataBackend):
    """Request 2's extend (on slot 3) runs on slot 1, where request 0's checkpoint lives."""

    def init_forward_metadata(self, batch: Batch) -> Metadata:
        meta = super().init_forward_metadata(batch)
        if batch.mode == "extend" and int(meta.state_indices[0]) == 3:
            meta.state_indices[0] = 1
        return meta


def test_prefix_cache_work_is_counted_and_a_checkpoint_overwritten_is_named():
    steps = [
        {"mode": "extend", "rows": {0: 4}, "tokens": {0: [9, 8, 7, 6]},
         "metadata": {"copies_after": [[1, 4]], "checkpoints": [{"request": 0, "tokens": 4, "slot": 4}]}},
        {"mode": "extend", "rows": {1: 2}, "cached": {1: 4},
         "metadata": {"hits": [{"request": 1, "tokens": 4, "slot": 4}], "copies_before": [[4, 2]]}},
        {"mode": "decode", "rows": [0, 1], "finish": [0],
         "metadata": {"checkpoints": [{"request": 0, "tokens": 5, "slot": 1}]}},
        {"mode": "extend", "rows": {2: 3}, "metadata": {"evict": [4]}},
    ]  # fmt: skip
    trace = scripted("sglang", "gdn", steps, num_slots=5, buckets={"decode": [2]}, tokens=True)
    result = replay_trace(trace, metadata_backend=WritesTheCheckpoint, stop_at_first=False)
    assert (result.steps, result.hits, result.checkpoints, result.verified) == (4, 1, 2, 2)
    assert {d.step for d in result.divergences} == {3}  # the cache's work was right; the last step is not
    first = result.divergences[0]
    assert (first.kind, first.slot) == ("foreign", 1)
    assert first.detail == "foreign slot changed: the checkpoint of request 0's first 5 tokens"
    assert "prefix cache: 1 hit(s), 2 checkpoint(s) published, 2 verified" in result.summary()


# -- the replay's small helpers --------------------------------------------------------------------------
def test_the_first_row_that_differs():
    from workbench.traces.replay import _first_row_difference

    a = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    assert _first_row_difference(a, a.clone()) is None
    assert _first_row_difference(a, torch.tensor([1, 2, 9, 8], dtype=torch.int32)) == (2, 3, 9)
    assert _first_row_difference(a, a[:3]) == (None, [4], [3])
    two = torch.tensor([[1, 2], [3, 4], [5, 6]])
    other = two.clone()
    other[1, 1] = 0
    other[2, 0] = 0
    assert _first_row_difference(two, other) == (1, [3, 4], [3, 0])


def test_the_slot_of_a_row_the_tokens_of_a_batch_and_the_first_row_off_the_shadow():
    from types import SimpleNamespace

    from workbench.traces.replay import _first_off_row, _slot_of, _tokens

    flat = SimpleNamespace(state_indices=torch.tensor([3, 1, -1]))
    assert [_slot_of(flat.state_indices, r) for r in (0, 1, 2, 3, None)] == [3, 1, -1, None, None]
    wide = SimpleNamespace(state_indices=torch.tensor([[5, 6], [7, 8]]))
    assert [_slot_of(wide.state_indices, r) for r in (0, 1, 2)] == [5, 7, None]
    assert _slot_of(torch.tensor(3), 0) is None
    assert _tokens(Batch.idle()) == 0 and _tokens(Batch.decode([1, 2], [3, 4])) == 2
    assert _tokens(Batch.extend([1, 2], [3, 4])) == 7 and _tokens(Batch.target_verify([1, 2, 3], [5, 5, 5], 4)) == 12
    # the first row whose state at its first slot is off the shadow's (float64, cast to the state's dtype)
    state = SimpleNamespace(ssm=torch.arange(10.0).view(10, 1, 1))
    shadow = SimpleNamespace(ssm=torch.arange(10.0, dtype=torch.float64).view(10, 1, 1))
    assert _first_off_row(state, shadow, wide) is None  # type: ignore[arg-type]
    shadow.ssm[8] = 100.0  # a row's second slot is not compared
    assert _first_off_row(state, shadow, wide) is None  # type: ignore[arg-type]
    shadow.ssm[7] += 1.0
    assert _first_off_row(state, shadow, wide) == 1  # type: ignore[arg-type]
    state.ssm[5] = float("nan")
    assert _first_off_row(state, shadow, wide) == 0  # type: ignore[arg-type]
    two = SimpleNamespace(state_indices=torch.tensor([3, 1]))
    assert _first_off_row(state, shadow, two) is None  # type: ignore[arg-type]
    assert _first_off_row(state, shadow, SimpleNamespace(state_indices=torch.tensor([], dtype=torch.long))) is None  # type: ignore[arg-type]


def test_a_divergence_kind_is_one_of_the_closed_set():
    from workbench.measure.integrity import IntegrityReport
    from workbench.traces.replay import DIVERGENCE_KINDS, TraceDivergence

    assert TraceDivergence(0, "tokens", "seq_len", "x").kind in DIVERGENCE_KINDS
    with pytest.raises(ValueError, match="kind: 'state off reference' is not one of"):
        TraceDivergence(0, "state off reference", "ssm", "x")
    # every problem list of an integrity report maps to a kind of the set, read from its typed fields
    from dataclasses import fields

    from workbench.measure.integrity import OutputMismatch, RowMismatch, SlotChange, StateMismatch
    from workbench.traces.replay import REPORT_PROBLEMS, _report_problems

    lists = {f.name for f in fields(IntegrityReport) if f.name not in ("atol", "rtol")}
    assert set(REPORT_PROBLEMS) == lists and {k for k, _ in REPORT_PROBLEMS.values()} <= set(DIVERGENCE_KINDS)
    report = IntegrityReport(
        changed_slots=[SlotChange("ssm", 1)],
        state_mismatches=[StateMismatch("ssm", 2, 0.5)],
        intermediate_mismatches=[RowMismatch("ssm", 0, 0.5)],
        output_mismatches=[OutputMismatch(0, 0.5)],
        nonzero_padded_outputs=[3],
    )
    assert list(_report_problems(report)) == [
        ("changed_slots", "ssm", 1, "slot 1", None),
        ("state_mismatches", "ssm", 2, "slot 2", 0.5),
        ("intermediate_mismatches", "ssm", None, "row 0", 0.5),
        ("output_mismatches", "output", None, "token 0", 0.5),
        ("nonzero_padded_outputs", "output", None, "token 3", None),
    ]
    # in the report's own order, each with the words it has for it
    assert [REPORT_PROBLEMS[name][1] for name, *_ in _report_problems(report)] == [p[0] for p in report.problems()]
