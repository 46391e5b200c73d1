"""The chunk states of sglang's extra_buffer tracking, taken as the step's forward passes them
(``kernels.snapshots``; ``tracking.chunk_positions`` says which) instead of a second run of the layer on the row's
first tokens: every one the track checks read is taken, in the runner's pool and the float64 shadow's, and it is
the state the second run computes. Where a kernel hands out none (Triton's) the replay falls back to that run."""

from __future__ import annotations

from functools import cache

import pytest

import kernels.gated_delta_rule.reference as gdn_reference
import workbench.traces.tracking as tracking
from workbench.traces.model import Trace
from workbench.traces.replay import TraceReplayer
from workbench.traces.simulate import simulate


@cache
def extra_buffer_trace(layer: str) -> Trace:
    return simulate("sglang", steps=200, seed=0, prefix_cache="extra_buffer", layer=layer)


def _replay_watching_chunk_states(trace: Trace, monkeypatch) -> tuple[bool, list[tuple[list[bool], list[float]]]]:
    """Replay ``trace``; for each chunk state the track checks read: whether the runner's and the shadow's
    were taken from the forward, and how far each is from the layer run again on the row's first tokens."""
    seen: list[tuple[list[bool], list[float]]] = []
    chunk_state = tracking.TrackChecks.chunk_state

    def watched(self, ctx, b, tokens):
        got = chunk_state(self, ctx, b, tokens)
        slot = ctx.step.rows[b].slot
        taken = [tracking._taken(s, slot, tokens) is not None for s in ctx.taken or (None, None)]
        again = chunk_state(self, ctx.after_forward(
            batch=ctx.batch, inputs=ctx.inputs, before=ctx.before, read_columns=ctx.read_columns,
            verified=ctx.verified, taken=None,
        ), b, tokens)  # fmt: skip
        errors = [
            max(float((a.double() - r.double()).abs().max()) for a, r in zip(pair, rerun, strict=True))
            for pair, rerun in zip(got, again, strict=True)
        ]
        seen.append((taken, errors))
        return got

    monkeypatch.setattr(tracking.TrackChecks, "chunk_state", watched)
    result = TraceReplayer(trace, backend="cpu").run(stop_at_first=False)
    return result.ok, seen


@pytest.mark.parametrize("layer", ["gdn", "mamba2"])
def test_chunk_states_are_taken_from_the_forward_and_equal_a_second_run(layer, monkeypatch):
    ok, seen = _replay_watching_chunk_states(extra_buffer_trace(layer), monkeypatch)
    assert ok
    assert len(seen) >= 10, f"the trace tracked {len(seen)} rows from chunk states"
    assert all(taken == [True, True] for taken, _ in seen), "a chunk state the checks read was not taken"
    runner, shadow = (max(e[i] for _, e in seen) for i in range(2))
    assert shadow <= 1e-12, f"float64 shadow: {shadow:.3g} off the second run"
    assert runner <= 1e-5, f"float32 runner: {runner:.3g} off the second run"


def test_a_kernel_that_hands_out_no_state_has_the_layer_run_again(monkeypatch):
    """As a Triton kernel: the recurrence takes nothing (the conv window alone is no chunk state)."""
    monkeypatch.setattr(gdn_reference, "_kept_at", lambda *args: {})
    ok, seen = _replay_watching_chunk_states(extra_buffer_trace("gdn"), monkeypatch)
    assert ok and seen
    assert all(taken == [False, False] for taken, _ in seen)
    assert all(e == [0.0, 0.0] for _, e in seen)


@pytest.mark.parametrize("layer", ["gdn", "mamba2"])
def test_chunk_positions_are_the_rows_the_checks_track_from_chunk_states(layer):
    """Every step's positions: a row's running slot -> its tokens floored to the chunk, exactly for the rows
    tracked off their chunk's end (the rest take their final state by a copy)."""
    found = 0
    for step in extra_buffer_trace(layer).steps:
        md = step.metadata or {}
        got = tracking.chunk_positions(step)
        if "mamba_chunk_size" not in md or step.mode not in tracking.EXTEND_MODES:
            assert got == {}
            continue
        c = md["mamba_chunk_size"]
        want = {
            row.slot: (n - row.cached_tokens) // c * c
            for row, m, n in zip(step.rows, md["mamba_track_mask"], md["mamba_track_seqlens"], strict=True)
            if m and (n - row.cached_tokens) % c
        }
        assert got == want, f"step {step.step}"
        found += len(got)
    assert found, "no step tracks a row from the chunk states"


def test_malformed_track_fields_ask_for_no_state():
    step = next(s for s in extra_buffer_trace("gdn").steps if tracking.chunk_positions(s))
    md = dict(step.metadata or {})
    for broken in (
        {"mamba_track_seqlens": md["mamba_track_seqlens"][:-1]},
        {"mamba_track_mask": None},
        {"mamba_chunk_size": "16"},
        {"mamba_chunk_size": 0},
    ):
        assert tracking.chunk_positions(step.__class__(**{**vars(step), "metadata": {**md, **broken}})) == {}
