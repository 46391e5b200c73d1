"""sglang's mixed steps under speculation, in the simulator: ``simulate("sglang", mixed=True, spec=D)``.

sglang 0.5.23 keeps mixed chunked prefill under chain EAGLE / MTP (``supports_mixed_chunk()`` is true for
EAGLE, EAGLE3, DFLASH and DSPARK: ``arg_groups/speculative_hook.py`` and ``speculative/spec_info.py``), and
"mixed steps degrade running requests to a plain 1-token decode". A run of its real scheduler under EAGLE with
mixed chunk has every MIXED step so: the extend rows first, then the running requests as 1-token decode rows
(the pending bonus token: ``seq_len = cached + 1``, and the request's next row starts one token further), never
a verify row beside a prefill row, never a tracked decode tail (extra_buffer); a step without a prefill is a
pure verify step. vLLM's mixed steps keep their verify rows."""

from __future__ import annotations

from collections import Counter
from functools import cache
from typing import Any

import pytest

from workbench.traces.model import Trace, TraceRow, TraceStep
from workbench.traces.simulate import SimConfig, simulate

D = 3
PREFIX_CACHES = [None, "no_buffer", "extra_buffer"]


@cache
def sim(profile: str = "sglang", prefix_cache: str | None = None, spec: int = D, steps: int = 150) -> Trace:
    return simulate(profile, steps=steps, seed=5, spec=spec, mixed=True, prefix_cache=prefix_cache)


def kinds(step: TraceStep) -> list[str | None]:
    return [r.kind for r in step.rows]


def tails(step: TraceStep) -> list[tuple[int, TraceRow]]:
    return [(i, r) for i, r in enumerate(step.rows) if r.kind == "decode"]


# -- the config takes it -------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["sglang", "sglang-ascend"])
@pytest.mark.parametrize("prefix_cache", PREFIX_CACHES)
def test_the_config_no_longer_refuses_mixed_steps_with_speculation(profile: str, prefix_cache: str | None):
    c = SimConfig(profile, mixed=True, spec=D, prefix_cache=prefix_cache)
    assert c.mixed_tails and c.plan.draft_tokens == D and "target_verify" in c.plan.buckets


# -- the steps -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["sglang", "sglang-ascend"])
@pytest.mark.parametrize("prefix_cache", PREFIX_CACHES)
def test_a_mixed_step_is_its_extend_rows_then_one_token_decode_tails(profile: str, prefix_cache: str | None):
    trace = sim(profile, prefix_cache)
    modes = Counter(s.mode for s in trace.steps)
    assert modes["mixed"] >= 20 and modes["target_verify"] >= 20 and modes["decode"] == 0, modes
    for step in trace.steps:
        if step.mode != "mixed":
            continue
        k = kinds(step)
        assert "verify" not in k, step.step  # sglang never verifies beside a prefill
        n_ext = k.count("extend")
        assert n_ext >= 1 and k == ["extend"] * n_ext + ["decode"] * (len(k) - n_ext), (step.step, k)
        for _, r in tails(step):
            assert r.new_tokens == 1 and r.seq_len == r.cached_tokens + 1 and r.accepted is None, (step.step, r)
            assert r.tokens is None if prefix_cache is None else r.tokens is not None and len(r.tokens) == 1


def test_steps_without_prefill_verify_as_without_mixed():
    for step in sim().steps:
        if step.mode == "target_verify":
            assert set(kinds(step)) == {"verify"}
            assert all(r.new_tokens == D and r.accepted is not None for r in step.rows), step.step
        assert sum(r.new_tokens for r in step.rows) <= SimConfig().token_budget, step.step


@pytest.mark.parametrize("prefix_cache", PREFIX_CACHES)
def test_each_requests_rows_continue_its_token_count(prefix_cache: str | None):
    """A row starts where the request's last one left its state: an extend chunk ``new_tokens`` on, a decode
    tail one on (the pending token), a verify ``accepted`` on; a verify follows a tail, and a tail a verify."""
    after: dict[int, int] = {}
    follows: Counter[tuple[str | None, str | None]] = Counter()
    last_kind: dict[int, str | None] = {}
    for step in sim(prefix_cache=prefix_cache).steps:
        for r in step.rows:
            if r.id in after:
                assert r.cached_tokens == after[r.id], (step.step, r)
                follows[last_kind[r.id], r.kind] += 1
            kept = {"extend": r.new_tokens, "decode": 1, "verify": r.accepted}[r.kind or ""]
            assert kept is not None
            after[r.id], last_kind[r.id] = r.cached_tokens + kept, r.kind
        for rid in step.finish:
            after.pop(rid, None)
    assert follows["decode", "verify"] and follows["verify", "decode"] and follows["extend", "decode"], follows


def test_extra_buffer_never_tracks_a_decode_tail():
    trace = sim(prefix_cache="extra_buffer")
    mixed_tracked = verify_tracked = 0
    for step in trace.steps:
        meta: dict[str, Any] = step.metadata or {}
        if step.mode == "target_verify" and "mamba_steps_to_track" in meta:
            verify_tracked += any(s >= 0 for s in meta["mamba_steps_to_track"])
        if step.mode != "mixed" or "mamba_track_mask" not in meta:
            continue
        mixed_tracked += 1
        mask, seqlens = meta["mamba_track_mask"], meta["mamba_track_seqlens"]
        assert len(mask) == len(step.rows)
        for i, r in tails(step):
            assert not mask[i] and seqlens[i] == -1, (step.step, r)
            tracked = [c for c in meta.get("copies_after", []) if c[0] == r.slot]
            assert not tracked, (step.step, r)  # no track copy out of a tail's running slot
    assert mixed_tracked and verify_tracked, (mixed_tracked, verify_tracked)


def test_vllms_mixed_steps_keep_their_verify_rows():
    trace = simulate("vllm", steps=60, seed=5, spec=D, mixed=True)
    mixed = [s for s in trace.steps if s.mode == "mixed"]
    assert mixed and any("verify" in kinds(s) for s in mixed)
    assert not any("decode" in kinds(s) and "verify" in kinds(s) for s in mixed)
    assert not SimConfig("vllm", mixed=True, spec=D).mixed_tails


# -- the replay --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("profile", "prefix_cache"),
    [("sglang", None), ("sglang", "no_buffer"), ("sglang", "extra_buffer"), ("sglang-ascend", "extra_buffer")],
)
def test_the_trace_replays_clean(profile: str, prefix_cache: str | None):
    from workbench.traces.replay import replay_trace

    trace = sim(profile, prefix_cache)
    assert any(s.mode == "mixed" and tails(s) for s in trace.steps)
    result = replay_trace(trace)
    assert result.ok, str(result)
