"""sglang 0.5.23's own scheduler as a trace source (``workbench.engines.sglang_scheduler``, issue 29): the traces
it writes are whole (the checks below follow each request's rows, slots and tokens as the format's rules say),
read back, and replay clean with hits and verified checkpoints under both strategies, ``extra_buffer`` with
sglang's track fields; mixed chunk under EAGLE keeps its running requests as one-token rows after the prefill
rows; and ``no_buffer`` with EAGLE and mixed chunk shows sglang's one-token-ahead donation at finish.

Needs sglang 0.5.23 installed (``make engines``; ``make test-engines`` runs these); skipped, with the reason,
where it is not.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from workbench.engines.versions import EngineError, check_supported

try:
    check_supported("sglang")
except EngineError as e:
    pytest.skip(f"sglang is not importable here: {e}", allow_module_level=True)

from workbench.engines.scheduler_base import SchedulerTrace, WorkloadSettings  # noqa: E402
from workbench.engines.sglang_scheduler import DRIVER_STANDINS, run_sglang_scheduler  # noqa: E402

pytestmark = pytest.mark.engines

D = 2


@pytest.fixture(scope="module")
def extra_buffer() -> SchedulerTrace:
    return run_sglang_scheduler(steps=100, seed=0, spec=D, prefix_cache="extra_buffer")


@pytest.fixture(scope="module")
def no_buffer() -> SchedulerTrace:
    return run_sglang_scheduler(steps=100, seed=0, spec=D, prefix_cache="no_buffer")


def whole(trace: SchedulerTrace) -> Counter[str]:
    """Every step follows the format's rules as the engine's rows say them: ids, pool rows and slots unique per
    step; each request's rows continue where its state was (its tokens, its slot and pool row for its life);
    hits start admitted rows; nothing is published onto a slot a live request runs on unless it finishes.
    Returns counts of what was seen; a breach fails the test with its step."""
    d = trace.header["draft_tokens"]
    state: dict[int, tuple[int, int, int]] = {}  # request -> (tokens in its state, slot, pool row)
    counts: Counter[str] = Counter()
    for s in trace.steps:
        rows, md, at = s["rows"], s["metadata"] or {}, f"step {s['step']}"
        for key in ("id", "slot", "req_pool_index"):
            values = [r[key] for r in rows]
            assert len(set(values)) == len(values), f"{at}: {key} repeats: {values}"
        assert all(r["req_pool_index"] >= 1 and r["slot"] >= 1 for r in rows), at
        hits = {h["request"]: h for h in md.get("hits", [])}
        for r in rows:
            counts[f"rows_{r['kind']}"] += 1
            if r["id"] in s["admit"]:
                assert r["id"] not in state and r["kind"] == "extend", at
                want = hits[r["id"]]["tokens"] if r["id"] in hits else 0
                assert r["cached_tokens"] == want, at
            else:
                n, slot, pool_row = state[r["id"]]
                assert (r["cached_tokens"], r["slot"], r["req_pool_index"]) == (n, slot, pool_row), at
            assert len(r["tokens"]) == r["new_tokens"] == (d if r["kind"] == "verify" else r["new_tokens"]), at
            if r["kind"] == "verify":
                assert 0 <= r["accepted"] <= d - 1 and r["seq_len"] == r["cached_tokens"] + d, at
                kept = r["accepted"] + 1
            else:
                assert r["accepted"] is None and r["seq_len"] == r["cached_tokens"] + r["new_tokens"], at
                kept = r["new_tokens"]
                assert r["kind"] != "decode" or r["new_tokens"] == 1, at
            state[r["id"]] = (r["cached_tokens"] + kept, r["slot"], r["req_pool_index"])
        running = {r["slot"]: r["id"] for r in rows if r["id"] not in s["finish"]}
        for cp in md.get("checkpoints", []):
            assert running.get(cp["slot"]) is None, f"{at}: published the running slot of request {cp['request']}"
            counts["checkpoints"] += 1
        counts["hits"] += len(hits)
        if s["mode"] == "mixed":
            kinds = [r["kind"] for r in rows]
            assert kinds == sorted(kinds, key=lambda k: k == "decode"), f"{at}: tails not last: {kinds}"
            counts["mixed"] += 1
        for rid in s["finish"]:
            del state[rid]
    return counts


def test_the_header_names_the_engine_and_its_units(extra_buffer):
    h = extra_buffer.header
    assert h["profile"] == "sglang" and h["engine"]["name"] == "sglang" and h["engine"]["version"] == "0.5.23"
    assert h["accepted"] == "drafts" and h["zero_on_alloc"] is True and h["draft_tokens"] == D
    assert h["num_slots"] == 41 and set(h["buckets"]) == {"decode", "target_verify"}
    assert any(what in note for note in extra_buffer.notes for what, _ in DRIVER_STANDINS)


@pytest.mark.parametrize("strategy", ["extra_buffer", "no_buffer"])
def test_a_trace_is_whole(strategy, extra_buffer, no_buffer):
    trace = extra_buffer if strategy == "extra_buffer" else no_buffer
    counts = whole(trace)
    assert not trace.findings, trace.findings[:3]
    assert trace.stats["toy_checks"] > 500 and trace.stats["toy_mismatches"] == 0
    assert counts["rows_verify"] > 300 and counts["rows_extend"] > 20 and counts["hits"] >= 15
    assert counts["checkpoints"] == trace.stats["checkpoints"] >= 20


def test_extra_buffer_records_the_track_fields_the_forward_uses(extra_buffer):
    extend = [s for s in extra_buffer.steps if s["mode"] == "extend"]
    assert extend and all(len(s["metadata"]["mamba_track_mask"]) == len(s["rows"]) for s in extend)
    tracked = [
        (r, s["metadata"]["mamba_track_seqlens"][i])
        for s in extend
        for i, r in enumerate(s["rows"])
        if s["metadata"]["mamba_track_mask"][i]
    ]
    assert any((n - r["cached_tokens"]) % 64 for r, n in tracked)  # inside a chunk: from the chunk states
    verify = [s for s in extra_buffer.steps if s["mode"] == "target_verify"]
    assert all(set(s["metadata"]) >= {"mamba_track_indices", "mamba_steps_to_track"} for s in verify)
    assert not any("mamba_track_mask" in s["metadata"] for s in verify)
    assert extra_buffer.stats["verify_track_rows"] >= 1


def test_no_buffer_copies_a_running_state_and_donates_a_finished_one(no_buffer):
    stats = no_buffer.stats
    assert stats["published_running"] == stats["copies_after"] >= 10 and stats["published_finished"] >= 10
    assert stats["evict"] == stats["evict_this_step"] + stats["evict_next_step"] >= 10
    assert not any("mamba_track_indices" in (s["metadata"] or {}) for s in no_buffer.steps)


@pytest.mark.parametrize("strategy", ["extra_buffer", "no_buffer"])
def test_the_trace_reads_writes_and_replays_clean(strategy, extra_buffer, no_buffer, tmp_path):
    from workbench.traces.format import read_trace, write_trace
    from workbench.traces.replay import replay_trace

    run = extra_buffer if strategy == "extra_buffer" else no_buffer
    trace = read_trace(list(run.lines()))
    assert len(trace) == len(run.steps) and trace.header.accepted == "drafts" and trace.header.zero_on_alloc
    path = tmp_path / f"{strategy}.jsonl"
    write_trace(trace, path)
    assert read_trace(path) == trace
    result = replay_trace(trace)
    assert result.ok, result.summary()
    assert result.hits >= 15 and result.verified == result.checkpoints >= 20


def test_mixed_chunk_under_eagle_puts_the_running_requests_last_untracked():
    from workbench.traces.format import read_trace
    from workbench.traces.replay import replay_trace

    run = run_sglang_scheduler(steps=60, seed=1, spec=D, prefix_cache="extra_buffer", mixed=True)
    counts = whole(run)
    assert counts["mixed"] >= 10 and not run.findings
    for s in run.steps:
        if s["mode"] == "mixed":
            md = s["metadata"]
            tails = [i for i, r in enumerate(s["rows"]) if r["kind"] == "decode"]
            assert tails and all(md["mamba_track_indices"][i] == -1 for i in tails)
            assert all(not md["mamba_track_mask"][i] and md["mamba_track_seqlens"][i] == -1 for i in tails)
    result = replay_trace(read_trace(list(run.lines())))
    assert result.ok and result.verified == result.checkpoints > 0, result.summary()


def test_no_buffer_eagle_mixed_donates_a_state_one_token_ahead_of_its_key():
    """sglang 0.5.23 (``process_batch_result_prefill``): a running request that finishes as a one-token tail of
    a MIXED step under EAGLE skips ``kv_committed_len += 1`` for the bonus token it just fed, so
    ``release_kv_cache`` inserts a key one token short, while ``no_buffer`` donates its running slot, whose
    state holds that token too. A later hit on the key starts from the wrong state."""
    from workbench.traces.format import read_trace
    from workbench.traces.replay import replay_trace

    run = run_sglang_scheduler(steps=30, seed=0, spec=D, prefix_cache="no_buffer", mixed=True)
    assert run.findings == [
        "step 28: a published checkpoint of request 1: slot 14 holds the state of 295 tokens (hash 400963), the "
        "engine says 294 (hash 723237)"
    ]
    step = next(s for s in run.steps if s["step"] == 28)
    (tail,) = (r for r in step["rows"] if r["id"] == 1)
    assert tail["kind"] == "decode" and tail["seq_len"] == 295 and 1 in step["finish"]
    assert {"request": 1, "tokens": 294, "slot": 14} in step["metadata"]["checkpoints"]
    result = replay_trace(read_trace(list(run.lines())))
    first = result.divergences[0]
    assert not result.ok and (first.step, first.kind, first.request, first.slot) == (28, "prefix", 1, 14)


def test_a_seed_is_one_trace():
    settings = WorkloadSettings(first_burst=3)
    a, b = (list(run_sglang_scheduler(steps=30, seed=5, workload=settings).lines()) for _ in range(2))
    assert a == b
    assert a != list(run_sglang_scheduler(steps=30, seed=6, workload=settings).lines())


def test_without_speculation_decode_rows_track_at_the_interval():
    run = run_sglang_scheduler(steps=60, seed=0, spec=0, prefix_cache="extra_buffer", track_interval=64)
    whole(run)
    assert "target_verify" not in run.header["buckets"] and not run.findings
    assert {r["kind"] for s in run.steps for r in s["rows"]} == {"decode", "extend"}
    decode = [s for s in run.steps if s["mode"] == "decode"]
    tracked = [
        (r, s["metadata"]["mamba_track_seqlens"][i])
        for s in decode
        for i, r in enumerate(s["rows"])
        if s["metadata"]["mamba_track_mask"][i]
    ]
    assert tracked and all(n == r["seq_len"] and n % 64 == 0 for r, n in tracked)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prefix_cache": "extra_buffer_lazy"}, "runs extra_buffer or no_buffer"),
        ({"layer": "mamba2"}, "GDN model"),
        ({"steps": 0}, "steps = 0"),
        ({"spec": 1}, "D >= 2"),
        ({"mixed": "yes"}, "mixed = 'yes'"),
        ({"accept_rate": 2.0}, "accept_rate = 2.0"),
        ({"track_interval": 0}, "track_interval = 0"),
    ],
)
def test_what_the_driver_does_not_run_is_refused_by_name(kwargs: dict[str, Any], message: str):
    with pytest.raises(EngineError, match=message):
        run_sglang_scheduler(**{"steps": 5, **kwargs})
