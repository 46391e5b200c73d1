"""The zoo's cross-step cases: each replays a scripted serving trace and names the step, the request, the slot
and what the case reads off the first divergence; a user's backend that fails another way is not credited
with the bug."""

import json
from dataclasses import replace

import pytest

from workbench import zoo
from workbench.backends import MetadataBackend
from workbench.traces.replay import TraceDivergence
from workbench.zoo import chunk_initial_state, dp_dummy_rows, slot_reuse
from workbench.zoo.result import TraceEvidence, ZooResult

TRACE_CASES = ("slot_reuse", "dp_dummy_rows", "chunk_initial_state")


def traces(result: ZooResult) -> list[TraceEvidence]:
    found = [e for e in result.evidence if isinstance(e, TraceEvidence)]
    assert found and len(found) == len(result.evidence), result.evidence
    return found


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[ZooResult, ZooResult]]:
    return {b.case: (b, f) for b, f in zoo.run_all(TRACE_CASES)}


def test_fixed_runs_replay_every_step_clean(runs):
    for name in TRACE_CASES:
        _, fixed = runs[name]
        for e in traces(fixed):
            assert not e.broken and e.steps == e.total >= 4 and e.divergence is None
            assert "every request on its float64 recurrence" in e.summary()


def test_slot_reuse_names_the_new_tenant_and_the_previous_one(runs):
    broken, _ = runs["slot_reuse"]
    (e,) = traces(broken)
    d = e.divergence
    plan = slot_reuse.scenario_trace("vllm")
    admitting = next(s for s in plan.steps if 1 in s.admit)
    slot_of = {r.id: r.slot for s in plan.steps for r in s.rows}
    # request 1's first chunk, on the slot request 0 freed, is where the recurrence breaks: not before
    assert (d.step, d.request, d.kind) == (admitting.step, 1, "state")
    assert d.slot == slot_of[1] == slot_of[0]
    assert e.matches and e.steps == admitting.step + 1
    assert "last held request 0, whose final state request 1 started from" in e.facts
    assert isinstance(d.got, float) and d.got > 1e-3


def test_slot_reuse_without_reuse_is_clean_even_for_the_early_read():
    """On a fresh (zeroed) pool the early read is harmless: only the reuse shows it."""
    first_tenant_only = slot_reuse.scenario_trace("vllm")
    first_tenant_only.steps = first_tenant_only.steps[:3]
    from workbench.zoo import _harness as h

    e = h.replay_trace(
        first_tenant_only, slot_reuse.ReadsSlotFirst, "cpu", what="x", reading=slot_reuse.reading, boot_zeroed=True
    )
    assert not e.broken and e.steps == 3


def test_dp_dummy_rows_both_ways_stale_rows_write(runs):
    broken, _ = runs["dp_dummy_rows"]
    condensed, dummy = traces(broken)
    # the condensed batch: the padded row 3 still names request 3's freed slot
    plan = dp_dummy_rows.scenario_traces("vllm")["condensed batch"]
    freed = next(r.slot for r in plan.steps[1].rows if r.id == 3)
    d = condensed.divergence
    assert (d.step, d.kind, d.slot, d.request) == (2, "foreign", freed, None)
    assert "a slot no live request owns" in d.detail and "padded row(s) [3] of the bucket-4 graph" in condensed.facts
    assert "request 3 had freed it" in condensed.facts
    # the DP dummy step: its one padded row names request 0's slot while request 0 sits the step out
    plan = dp_dummy_rows.scenario_traces("vllm")["DP dummy run"]
    slot0 = next(r.slot for r in plan.steps[1].rows if r.id == 0)
    d = dummy.divergence
    assert (d.step, d.kind, d.slot) == (2, "foreign", slot0) and plan.steps[2].mode == "idle"
    assert "the slot of request 0, which is not in this step" in d.detail
    assert "padded row(s) [0] of the bucket-1 graph (0 live)" in dummy.facts
    assert condensed.matches and dummy.matches


def test_chunk_initial_state_names_the_lone_later_chunk(runs):
    broken, _ = runs["chunk_initial_state"]
    (e,) = traces(broken)
    d = e.divergence
    assert (d.step, d.request, d.kind) == (1, 0, "state") and e.matches
    assert "chunk 2 of request 0 (tokens 8..16, 8 already in its state) ran alone in its step" in e.facts


@pytest.mark.parametrize("profile", ["sglang", "sglang-ascend", "vllm"])
@pytest.mark.parametrize("name", TRACE_CASES)
def test_each_profile_the_broken_reproduces_and_the_base_backend_is_clean(name, profile):
    case = zoo.get(name)
    assert case.run_with(case.variant(False), profile=profile).status == "reproduced"
    assert case.run_with(MetadataBackend, profile=profile).status == "clean"


class _DropsDecodeRows(MetadataBackend):
    """A backend broken another way: every live decode row gets the padding sentinel (the kernels skip it)."""

    def init_forward_metadata_out_graph(self, batch, in_capture=False):
        meta = super().init_forward_metadata_out_graph(batch, in_capture=in_capture)
        if not in_capture:
            meta.state_indices[: batch.raw_batch_size] = self.pool.profile.sentinel
        return meta


@pytest.mark.parametrize("name", TRACE_CASES)
def test_another_failure_is_not_credited_with_this_bug(name):
    res = zoo.get(name).run_with(_DropsDecodeRows, profile="vllm")
    assert res.status == "other failure", res
    assert all(not e.matches for e in traces(res) if e.broken)


def test_evidence_is_json_ready_and_says_no_step_ran():
    d = TraceDivergence(3, "state", "ssm", "state off reference", request=1, row=0, slot=2, got=0.5)
    e = TraceEvidence("t", 4, 6, d, True, "why")
    back = json.loads(json.dumps(e.to_dict()))
    assert back["divergence"]["slot"] == 2 and back["matches"] is True and back["total"] == 6
    assert e.summary() == "t: step 3: state: ssm, request 1, row 0, slot 2: state off reference; off by 0.5; why"
    assert TraceEvidence("t", 0, 6).broken and "no step ran" in TraceEvidence("t", 0, 6).summary()
    assert not TraceEvidence("t", 6, 6).broken
    res = ZooResult("c", "i", False, (TraceEvidence("t", 4, 6, d, False, ""),), "e", mechanism=("TraceEvidence",))
    assert res.broken and not res.reproduced and res.status == "other failure"


def test_chunk_reading_needs_a_continuing_chunk():
    rep_trace = chunk_initial_state.scenario_trace("vllm")

    class Rep:
        trace = rep_trace

    first = TraceDivergence(0, "state", "ssm", "x", request=0, row=0, slot=1)
    assert chunk_initial_state.reading(Rep(), first) == (False, "request 0's first chunk (no initial state to lose)")
    decode = TraceDivergence(3, "state", "ssm", "x", request=0, row=0, slot=1)
    assert chunk_initial_state.reading(Rep(), decode) == (False, "")


# -- prefix caching: the cache's bookkeeping, checked against the float64 state of exactly each prefix ---------
PREFIX_CASES = {
    "prefix_over_reuse": (
        2,
        "checkpoint",
        "off the float64 state after exactly its first 8 tokens",
        "holds request 0's 10 tokens",
    ),
    "publish_before_write": (
        1,
        "checkpoint",
        "published before it is written: the request's state holds 4 tokens",
        "step 1 did not run it",
    ),
    "unwritten_track_slot": (
        0,
        "checkpoint",
        "off the float64 state after exactly its first 8 tokens",
        "no copy of step 0 wrote slot 5",
    ),
    "stale_track_mask": (
        1,
        "track",
        "mamba_track_seqlens[0] = 8, but the state holds 10 tokens",
        "carries the track fields of extend step 0",
    ),
    "mamba2_chunk_grid": (
        0,
        "track",
        "track_ssm_h_src[1] = 3, but h[3] is row 2's state after 8 tokens",
        "request 1's first 16 tokens (slot 5) is off the float64 state of exactly them by",
    ),
    "backward_post_copy": (
        2,
        "copy",
        "writes the running slot of request 0",
        "slot 4's 8-token state over the 10 tokens",
    ),
    "running_block_publish": (
        1,
        "checkpoints",
        "request 0's forward writes slot 1, the live checkpoint of request 0's first 4 tokens (published at step 0)",
        "after step 1 the block holds 6 tokens (expected 4, got 6)",
    ),
}


@pytest.mark.parametrize("name", list(PREFIX_CASES))
def test_prefix_cache_cases_name_the_checkpoint_or_copy(name):
    step, field, detail, facts = PREFIX_CASES[name]
    case = zoo.get(name)
    assert case.subject is None and "workbench trace check" in case.why_not
    broken, fixed = case.run(False), case.run(True)
    (e,) = traces(broken)
    d = e.divergence
    assert (d.step, d.kind, d.field) == (step, "prefix", field), d
    assert detail in d.detail and e.matches and facts in e.facts, e.summary()
    (f,) = traces(fixed)
    assert not f.broken and f.steps == f.total
    assert broken.reproduced and not fixed.broken


def test_prefix_cases_each_break_in_their_own_way():
    """No two prefix cases are the same bug: each one's reading refuses the others' first divergences."""
    from importlib import import_module

    from workbench.traces.replay import TraceReplayer

    firsts = {}
    for name in PREFIX_CASES:
        mod = import_module(f"workbench.zoo.{name}")
        rep = TraceReplayer(mod.scenario_trace(False))
        firsts[name] = (rep, rep.run().first)
    for name in PREFIX_CASES:
        mod = import_module(f"workbench.zoo.{name}")
        for other, (rep, d) in firsts.items():
            assert mod.reading(rep, d)[0] is (other == name), (name, other)


def test_running_block_publish_the_hit_as_its_owner_moves_off_the_block_reads_it_before_the_forward():
    """vLLM 0.33.0 publishes the block a chunk fills while it still runs (``MambaManager.cache_blocks``).
    Fixed: request 1 hits the block in the step its owner pre-copies out of it and moves, request 2 a step
    later; every hit and the checkpoint verified, the block left to the cache. Unfixed: no move, so the owner's
    forward writes its own live checkpoint, and the block a later hit reads is ahead of its 4 tokens."""
    from workbench.traces.replay import TraceReplayer
    from workbench.zoo import running_block_publish as case

    rep = TraceReplayer(case.scenario_trace(True))
    res = rep.run(stop_at_first=False)
    assert res.ok and (res.hits, res.checkpoints, res.verified) == (2, 1, 1), str(res)
    assert rep.owner(case.BLOCK_SLOT) is None and rep.book.live[case.BLOCK_SLOT].tokens == case.SHARED

    broken, fixed = case.CASE.run(False), case.CASE.run(True)
    assert broken.status == "reproduced" and fixed.status == "clean"
    (e,) = traces(broken)
    d = e.divergence
    assert (d.step, d.kind, d.field, d.request, d.slot) == (1, "prefix", "checkpoints", 0, case.BLOCK_SLOT), d
    assert e.matches and "did not move off it" in e.facts and "request 2's 4-token hit at step 2 reads 6" in e.facts
    assert "off the float64 state of its 4 by" in e.facts, e.facts
    # the reading credits only the forgotten move: at a step that moves the owner, or another field, it is not
    moved = TraceReplayer(case.scenario_trace(True))
    assert moved.step(moved.trace.steps[0]) == []
    assert case.reading(moved, d) == (False, "request 0 moves at step 1")
    assert case.reading(rep, replace(d, field="checkpoint")) == (False, "")
