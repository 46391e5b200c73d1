"""workbench.traces.replay: simulated traces replay clean on every profile; a recorded trace whose metadata
was altered is caught at the right step and row; a backend that reads a reused slot's old state is caught
at the step the new request first runs; a trace that replays nothing is never OK."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from workbench.backends import MetadataBackend
from workbench.batch import Batch
from workbench.metadata import Metadata, build_metadata
from workbench.traces import Trace, TraceStep
from workbench.traces.replay import TraceReplayer, replay_trace
from workbench.traces.simulate import new_pool, simulate, to_batch

SMALL = {"buckets": [1, 2, 4, 8], "max_running": 10}


@pytest.mark.parametrize(
    ("profile", "layer", "options"),
    [
        ("sglang", "gdn", {"spec": 2}),
        ("sglang-ascend", "gdn", {"mixed": True, "dp_dummies": True}),
        ("vllm", "gdn", {"spec": 2}),
        ("vllm", "gdn", {"mixed": True}),
        ("sglang", "mamba2", {"dp_dummies": True}),
    ],
)
def test_simulated_traces_replay_clean(profile: str, layer: str, options: dict) -> None:
    trace = simulate(profile, layer, steps=40, seed=3, **SMALL, **options)
    result = replay_trace(trace)
    assert result.ok, str(result)
    assert result.steps == 40 and result.graph_steps > 0
    assert result.summary().startswith(f"OK: {profile} {layer}: 40 steps")


def test_a_trace_that_replays_nothing_is_never_ok() -> None:
    trace = simulate("sglang", "gdn", steps=3, seed=0, **SMALL)
    empty = Trace(trace.header, [])
    result = replay_trace(empty)
    assert not result.ok and result.summary().startswith("FAIL: sglang gdn: 0 steps")


def _recorded(trace: Trace, index: int, profile: str) -> tuple[TraceStep, dict]:
    """The trace's step ``index`` with the metadata the workbench builds for it, as a recording would hold."""
    pool = new_pool(trace.header)
    replayer_pool_steps = trace.steps[: index + 1]
    for step in replayer_pool_steps[:-1]:  # the pool as it stands at the step
        for rid in step.admit:
            row = next(r for r in step.rows if r.id == rid)
            pool.alloc_at(row.req_pool_index, [row.slot])
        done = [r.req_pool_index for r in step.rows if r.id in step.finish]
        pool.free(done)
    step = trace.steps[index]
    for rid in step.admit:
        row = next(r for r in step.rows if r.id == rid)
        pool.alloc_at(row.req_pool_index, [row.slot])
    batch = to_batch(step, profile, trace.header.draft_tokens)
    bucket = min(b for b in trace.header.buckets["decode"] if b >= batch.raw_batch_size)
    meta = build_metadata(batch, pool, bucket=bucket, buckets=trace.header.buckets["decode"])
    return step, {
        "bucket": bucket,
        "state_indices": meta.state_indices.tolist(),
        "query_start_loc": meta.query_start_loc.tolist(),
    }


def _decode_step_with_padding(trace: Trace) -> int:
    for i, step in enumerate(trace.steps):
        r = len(step.rows)
        if step.mode == "decode" and 2 <= r < 8 and r not in trace.header.buckets["decode"]:
            return i
    raise AssertionError("no padded decode step with two or more rows")


ALTERATIONS = {
    "a padded row points at a live slot": lambda md, r: md["state_indices"].__setitem__(r, md["state_indices"][0]),
    "two live rows on one slot": lambda md, r: md["state_indices"].__setitem__(1, md["state_indices"][0]),
    "query_start_loc off by one": lambda md, r: md["query_start_loc"].__setitem__(r, md["query_start_loc"][r] + 1),
}


@pytest.mark.parametrize("what", list(ALTERATIONS))
def test_altered_metadata_is_caught_at_its_step_and_row(what: str) -> None:
    trace = simulate("sglang", "gdn", steps=60, seed=5, **SMALL)
    index = _decode_step_with_padding(trace)
    step, md = _recorded(trace, index, "sglang")
    live = len(step.rows)
    clean = Trace(trace.header, [*trace.steps[:index], replace(step, metadata=md), *trace.steps[index + 1 :]])
    assert replay_trace(clean).ok  # the recorded metadata as the workbench builds it: nothing to report
    bad = {k: list(v) for k, v in md.items() if isinstance(v, list)} | {"bucket": md["bucket"]}
    ALTERATIONS[what](bad, live)
    altered = Trace(trace.header, [*trace.steps[:index], replace(step, metadata=bad), *trace.steps[index + 1 :]])
    result = replay_trace(altered)
    first = result.first
    assert not result.ok and first is not None and first.step == step.step, str(result)
    assert first.kind in ("invariant", "metadata")
    expected_row = {"a padded row points at a live slot": live, "two live rows on one slot": 1}.get(what)
    if expected_row is not None:
        assert first.row == expected_row or f"[{expected_row}]" in first.detail or f"row {expected_row}" in first.detail


def test_a_stale_row_past_the_live_batch_is_caught() -> None:
    """A padded row that carries a request the step does not run (a stale block-table row, vLLM 37728)."""
    trace = simulate("sglang", "gdn", steps=60, seed=5, **SMALL)
    index = _decode_step_with_padding(trace)
    step, md = _recorded(trace, index, "sglang")
    live_slots = {r.slot for r in step.rows}
    stale = next(s for s in range(1, trace.header.num_slots) if s not in live_slots)
    md["state_indices"][len(step.rows)] = stale
    result = replay_trace(Trace(trace.header, [*trace.steps[:index], replace(step, metadata=md)]))
    assert not result.ok and result.first is not None and result.first.step == step.step, str(result)


class ReadsReusedSlots(MetadataBackend):
    """A backend with vLLM PR 56524's bug: every extend row reads its slot as initial state, so a request on
    a reused slot starts from its previous tenant's state."""

    def init_forward_metadata(self, batch: Batch) -> Metadata:
        meta = super().init_forward_metadata(batch)
        meta.has_initial_state = torch.ones_like(meta.has_initial_state)
        return meta


def test_a_reused_slot_read_as_initial_state_is_caught_where_the_new_request_runs() -> None:
    trace = simulate("sglang", "gdn", steps=120, seed=7, **SMALL)
    owners: dict[int, int] = {}
    first_reuse = None
    for step in trace.steps:
        for row in step.rows:
            if row.id in step.admit and row.slot in owners and owners[row.slot] != row.id and first_reuse is None:
                first_reuse = (step.step, row.id)
            owners.setdefault(row.slot, row.id) if row.id in step.admit else None
            if row.id in step.admit:
                owners[row.slot] = row.id
    assert first_reuse is not None, "the simulation reused no slot"
    clean = replay_trace(trace)
    assert clean.ok, str(clean)
    # sglang clears a slot it hands out (the header's zero_on_alloc): the stale read finds zeros, benign there
    assert trace.header.zero_on_alloc and replay_trace(trace, metadata_backend=ReadsReusedSlots).ok
    result = replay_trace(trace, metadata_backend=ReadsReusedSlots, zero_on_alloc=False)  # an engine that does not
    first = result.first
    assert first is not None and first.kind in ("state", "output"), str(result)
    # the pool starts seeded (never zeros), so the bug shows at the first extend of all, before any reuse
    first_extend = next(s.step for s in trace.steps if s.mode in ("extend", "mixed"))
    assert first.step == first_extend <= first_reuse[0]


def test_the_replayer_steps_one_at_a_time() -> None:
    trace = simulate("vllm", "gdn", steps=10, seed=1, **SMALL)
    replayer = TraceReplayer(trace)
    for step in trace.steps[:5]:
        assert replayer.step(step) == []
    assert replayer.result.steps == 5 and replayer.result.ok


def test_the_baseline_runs_the_calls_of_the_steps_done_and_in_chunks_gives_the_same_bits() -> None:
    from workbench.bench.trace import CpuPhases, Float64Baseline, record_shadow

    trace = simulate("sglang", "gdn", steps=24, seed=3, spec=2)
    timer = CpuPhases()
    replayer = TraceReplayer(trace, timer=timer)
    calls = record_shadow(replayer, timer)
    replayer.run(progress=timer.step_done, stop_at_first=False)
    steps = [c.step for c in calls]
    fed = {i for i, st in enumerate(trace.steps) if sum(r.new_tokens for r in st.rows)}
    assert steps == sorted(steps) and set(steps) == fed and 23 in fed  # every step with tokens, in order
    assert {c.kind for c in calls} == {"forward", "accept"}  # the verifies' commits too
    chunked, whole = (Float64Baseline(replayer.ref, trace.header, calls) for _ in range(2))
    chunked.advance(10)
    assert chunked.done == sum(s < 10 for s in steps) and 0 < chunked.done < len(calls)
    chunked.advance(10)  # nothing more for the same steps
    assert chunked.done == sum(s < 10 for s in steps) and chunked.cpu_s > 0
    for k in (17, 24):
        chunked.advance(k)
    whole.advance(24)
    assert chunked.done == whole.done == len(calls)
    got, want = chunked.state.tensors(), whole.state.tensors()
    assert set(got) == set(want)
    for name, t in got.items():
        assert t.dtype == torch.float64 and torch.equal(t, want[name]) and not t.isnan().any(), name


@pytest.mark.slow  # simulates, replays and checks a trace with the calibrator: seconds
def test_bench_trace_runs_the_baseline_between_the_checks_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    import workbench.bench.trace as bench

    advanced: list[int] = []
    real = bench.Float64Baseline.advance

    def advance(self, steps: int) -> None:
        advanced.append(steps)
        real(self, steps)

    monkeypatch.setattr(bench.Float64Baseline, "advance", advance)
    monkeypatch.setattr(bench, "PAIR_EVERY", 25)
    m = bench.measure("default", 60)
    assert m["ok"] and m["paired_every"] == 25
    assert advanced == [25, 50, 60, 60]  # during the check, then once after its last step
    assert m["baseline_calls"] == m["shadow_calls"] > 0 and m["baseline_cpu_s"] > 0


@pytest.mark.slow  # runs the trace benchmark on each of the CLI's trace kinds
def test_bench_trace_checks_each_cli_trace_against_the_float64_recurrence(
    capsys: pytest.CaptureFixture, tmp_path
) -> None:
    from workbench.bench.trace import WORKLOADS, run
    from workbench.traces.replay import PHASES

    res = run(steps=30, ratio_steps=30, json_path=str(tmp_path / "trace.json"))
    out = capsys.readouterr().out
    assert "1 torch thread" in out and "float64 recurrence" in out and (tmp_path / "trace.json").is_file()
    assert "at the run's quietest moment" in out and "goals: default 30-step check" in out
    assert [r.impl for r in res] == list(WORKLOADS) and all(r.mode == "check" and r.median_us > 0 for r in res)
    figures = res.meta["workloads"]
    assert set(figures) == set(WORKLOADS) and res.meta["goals"]["ratio_steps"] == 30
    for m in figures.values():
        assert m["ok"] and m["steps"] == 30 and m["divergences"] == 0
        assert m["check_cpu_s"] > 0 and m["check_wall_s"] > 0 and m["baseline_cpu_s"] > 0
        # the ratio of the rounded seconds lies within their rounding of the exact one
        c, b, half = m["check_cpu_s"], m["baseline_cpu_s"], 0.0005
        assert (c - half) / (b + half) - 0.001 <= m["ratio"] <= (c + half) / (b - half) + 0.001
        # the subject (the replay phase) and the checking split the ratio between them
        r = m["phases_cpu_s"]["replay"]
        assert (r - half) / (b + half) - 0.001 <= m["subject_ratio"] <= (r + half) / (b - half) + 0.001
        assert m["subject_ratio"] + m["checking_ratio"] == pytest.approx(m["ratio"], abs=0.002)
        assert set(m["phases_cpu_s"]) == set(PHASES)
        assert abs(sum(m["phases_cpu_s"].values()) + m["other_cpu_s"] - c) < 0.01
        assert "--steps 30 --out F; workbench trace check F" in m["command"]
        # calibrated: scaled to the run's quietest calibrator sample (at most what was measured around it)
        assert m["quiet_check_cpu_s"] <= m["check_cpu_s"] + 0.001 and m["quiet_baseline_cpu_s"] > 0
        assert m["quiet_per_10k_s"] == pytest.approx(m["quiet_check_cpu_s"] * 10_000 / 30, rel=0.01)
    goals, default = res.meta["goals"], res.meta["ratio_run"]
    assert goals["ratio_floor_default"] == pytest.approx(1 + default["subject_ratio"], abs=0.001)
    assert f"the floor of a check beside the float64 recurrence at {goals['ratio_floor_default']:.2f}x" in out
    calibration = res.meta["calibration"]
    assert calibration["best_s"] == min(calibration["samples_s"]) and len(calibration["samples_s"]) >= 3
    assert figures["mamba2"]["command"].startswith("workbench trace run --layer mamba2")
