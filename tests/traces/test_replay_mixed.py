"""Mixed steps with verify rows (issue 29): vLLM 0.33.0's scheduler batches verify rows with prefill chunks,
and its GDN builder splits them (``spec_*`` / ``non_spec_*``). The replay runs such a step as two eager
batches on their disjoint slots, the verify rows (accepted as the profile accepts: vLLM carries the count,
sglang scatters) and then the others, each against the float64 shadow; vLLM's split keys, where recorded,
are compared with what the profile builds for each part; ``accepted`` is read through the header's unit
everywhere; the header's ``zero_on_alloc`` is followed.

Each trace is written here row by row (fresh random inputs: no token ids), so each test says what it runs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from workbench.backends import MetadataBackend
from workbench.batch import Batch
from workbench.metadata import Metadata
from workbench.traces.model import Trace, TraceHeader, TraceRow, TraceStep
from workbench.traces.replay import TraceInputError, TraceReplayer, replay_trace
from workbench.traces.steps import SimulationError, iter_batches, new_pool, split_step, to_batch

D = 3
Plan = list[tuple[str, list[tuple[int, str, int]]]]

# request 3 is admitted at step 1 and sits out steps 2 and 3: a slot no row of those steps owns
PLAN: Plan = [
    ("extend", [(0, "extend", 5), (1, "extend", 4), (2, "extend", 2)]),
    ("mixed", [(0, "verify", 2), (1, "decode", 1), (2, "extend", 2), (3, "extend", 3)]),  # verify first, as vLLM
    ("mixed", [(0, "verify", 3), (2, "verify", 1), (1, "extend", 2)]),
    ("target_verify", [(0, "verify", 1), (2, "verify", 2)]),  # a graph step after the mixed ones
    ("decode", [(1, "decode", 1), (3, "decode", 1)]),
]


def trace_of(profile: str, plan: Plan = PLAN, *, unit: str = "tokens", zero: bool = False) -> Trace:
    """``plan``'s steps (mode, rows of (request, kind, new tokens or tokens kept)) on a pool laid out as the
    replay lays it out; a verify row keeps ``n`` tokens, written as ``n`` (``"tokens"``) or ``n - 1``
    (``"drafts"``); rows carry their kind in mixed steps only."""
    header = TraceHeader(
        profile, "gdn", 20, {"decode": [1, 2], "target_verify": [1, 2]}, D, None, accepted=unit, zero_on_alloc=zero
    )
    pool = new_pool(header)
    placed: dict[int, tuple[int, list[int]]] = {}
    held: dict[int, int] = {}
    steps = []
    for t, (mode, rows) in enumerate(plan):
        out, admit = [], []
        for rid, kind, n in rows:
            if rid not in placed:
                r = int(pool.alloc(1)[0])
                placed[rid], held[rid] = (r, pool.slots_of(r)), 0
                admit.append(rid)
            r, slots = placed[rid]
            cached, new = held[rid], D if kind == "verify" else n
            accepted = (n if unit == "tokens" else n - 1) if kind == "verify" else None
            out.append(
                TraceRow(
                    rid, r, slots[0], cached + new, new, cached, accepted,
                    slots=tuple(slots) if len(slots) > 1 else None, kind=kind if mode == "mixed" else None,
                )
            )  # fmt: skip
            held[rid] = cached + (n if kind == "verify" else new)
        steps.append(TraceStep(t, mode, tuple(out), tuple(admit)))
    return Trace(header, steps)


def slot_of(trace: Trace, request: int) -> int:
    return next(r.slot for s in trace.steps for r in s.rows if r.id == request)


# -- clean ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["vllm", "sglang"])
def test_mixed_steps_with_verify_rows_replay_clean_on_fresh_inputs(profile):
    trace = trace_of(profile)
    assert [s.splits for s in trace.steps] == [False, True, True, False, False]
    for seed in (0, 1):
        res = replay_trace(trace, seed=seed, stop_at_first=False)
        assert res.ok, str(res)
        # the two mixed steps run eagerly (each once, though two batches), the prefill too; verify and decode
        # replay their graphs
        assert (res.steps, res.graph_steps, res.eager_steps) == (5, 2, 3)


def test_vllm_carries_each_verify_rows_count_and_reads_its_column_in_a_mixed_step():
    trace = trace_of("vllm")
    rep = TraceReplayer(trace)
    assert rep.step(trace.steps[0]) == [] and rep.step(trace.steps[1]) == []
    assert rep.read_columns == {0: 0} and rep.accepted == {0: 2}
    assert rep.step(trace.steps[2]) == []
    assert rep.read_columns == {0: 1, 2: 0} and rep.accepted == {0: 3, 2: 1}  # request 0 read its second slot
    assert rep.step(trace.steps[3]) == [] and rep.read_columns == {0: 2, 2: 0}


def test_sglang_scatters_the_verify_rows_of_a_mixed_step_back():
    trace = trace_of("sglang")
    rep = TraceReplayer(trace)
    assert rep.step(trace.steps[0]) == [] and rep.step(trace.steps[1]) == []
    rows, got, want = rep.verified_intermediates
    assert rows == [trace.steps[1].rows[0].req_pool_index] and got.ssm.shape[1] == want.ssm.shape[1] == D
    assert rep.accepted == {} and rep.ledger.tokens == {0: 7, 1: 5, 2: 4, 3: 3}


# -- what goes wrong is named --------------------------------------------------------------------------------
@pytest.mark.parametrize(("profile", "rid"), [("vllm", 0), ("vllm", 2), ("sglang", 0), ("sglang", 2)])
def test_a_state_off_in_either_part_is_named_by_its_request(profile, rid):
    """Request 0 verifies and request 2 extends in step 1: a state gone astray before the step is found in
    whichever batch runs it."""
    trace = trace_of(profile)
    rep = TraceReplayer(trace)
    assert rep.step(trace.steps[0]) == []
    for slot in rep.pool.slots_of(rep.live[rid]):
        # large: the small layer's gates decay a state fast, and the check reads it after the step's tokens
        rep.runner.state.ssm[slot] += 1000.0
    found = rep.step(trace.steps[1])
    assert found and found[0].kind == "state" and found[0].request == rid, [str(d) for d in found]


class VerifyOnAnotherWindow(MetadataBackend):
    """The eager verify batch's first row runs on ``window`` (another request's D slots): a foreign write."""

    window: tuple[int, ...] = ()

    def init_forward_metadata(self, batch: Batch) -> Metadata:
        meta = super().init_forward_metadata(batch)
        if batch.mode == "target_verify":
            meta.state_indices[0] = torch.tensor(self.window, dtype=meta.state_indices.dtype)
        return meta


def test_a_verify_part_that_writes_a_slot_of_a_request_sitting_out_is_foreign():
    """vLLM's verify writes its D slots in the forward (sglang's writes at the accept)."""
    trace = trace_of("vllm")
    window = next(r.slots for s in trace.steps for r in s.rows if r.id == 3)
    backend = type("Bad", (VerifyOnAnotherWindow,), {"window": window})
    rep = TraceReplayer(trace, metadata_backend=backend)
    for s in trace.steps[:2]:
        rep.step(s)  # step 1: request 3 is admitted in this step's extend part; its slot is the verify's too
    found = rep.step(trace.steps[2])  # request 3 sits out; request 0's verify writes its slot
    foreign = [d for d in found if d.kind == "foreign"]
    assert foreign and foreign[0].slot == slot_of(trace, 3), [str(d) for d in found]
    assert "the slot of request 3, which is not in this step" in foreign[0].detail


def test_a_verify_row_whose_next_row_assumes_every_draft_kept_is_a_token_divergence():
    trace = trace_of("vllm")
    step = trace.steps[2]  # request 1's extend continues from 5 tokens; say it held all of request 0's drafts
    bad = replace(step.rows[0], cached_tokens=step.rows[0].cached_tokens + 1, seq_len=step.rows[0].seq_len + 1)
    trace.steps[2] = replace(step, rows=(bad, *step.rows[1:]))
    res = replay_trace(trace)
    assert res.first is not None and (res.first.step, res.first.kind, res.first.field, res.first.request) == (
        2, "tokens", "cached_tokens", 0,
    )  # fmt: skip
    assert (res.first.expected, res.first.got) == (7, 8)


# -- accepted, in the header's unit ---------------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["vllm", "sglang"])
def test_drafts_accepted_read_through_the_unit_replay_as_tokens_kept_do(profile):
    tokens, drafts = trace_of(profile), trace_of(profile, unit="drafts")
    assert [r.accepted for r in drafts.steps[2].rows] == [2, 0, None]
    assert replay_trace(drafts).ok
    rep = TraceReplayer(drafts)
    for s in drafts.steps[:3]:
        assert rep.step(s) == []
    if profile == "vllm":
        assert rep.accepted == {0: 3, 2: 1}  # tokens kept, as with the tokens unit
    assert rep.ledger.tokens == {0: 10, 1: 7, 2: 5, 3: 3}
    misread = Trace(replace(drafts.header, accepted="tokens"), drafts.steps)  # counts of drafts read as tokens
    res = replay_trace(misread)
    assert not res.ok and res.first is not None and res.first.kind == "tokens" and res.first.step == 2, res
    assert replay_trace(tokens).ok


def test_iter_batches_splits_the_mixed_step_and_carries_tokens_kept():
    drafts = trace_of("vllm", unit="drafts")
    got = [(s.step, s.mode, b.mode, b.raw_batch_size) for s, b in iter_batches(drafts)]
    assert got == [
        (0, "extend", "extend", 3), (1, "target_verify", "target_verify", 1), (1, "mixed", "extend", 3),
        (2, "target_verify", "target_verify", 2), (2, "mixed", "extend", 1), (3, "target_verify", "target_verify", 2),
        (4, "decode", "decode", 2),
    ]  # fmt: skip
    batches = [b for _, b in iter_batches(drafts)]
    assert batches[3].num_accepted_tokens.tolist() == [2, 1]  # request 0 kept 2 tokens (1 draft) at step 1
    assert batches[5].num_accepted_tokens.tolist() == [3, 1]


def test_a_split_step_is_two_batches_never_one():
    step = trace_of("vllm").steps[2]
    verify, others = split_step(step)
    assert (verify.mode, [r.id for r in verify.rows]) == ("target_verify", [0, 2])
    assert (others.mode, [r.id for r in others.rows], others.metadata) == ("mixed", [1], None)
    with pytest.raises(SimulationError, match=r"^step 2: a mixed step with verify rows runs as two batches"):
        to_batch(step, "vllm", D)
    drafts = trace_of("vllm", unit="drafts").steps[3]
    with pytest.raises(SimulationError, match=r"accepted=3 \(drafts\), must keep 1..D=3 tokens"):
        to_batch(replace(drafts, rows=(replace(drafts.rows[0], accepted=3),)), "vllm", D, accepted="drafts")


def test_track_fields_in_a_split_step_are_an_input_error():
    trace = trace_of("sglang")
    trace.steps[1] = replace(trace.steps[1], metadata={"mamba_track_mask": [False] * 4})
    rep = TraceReplayer(trace)
    rep.step(trace.steps[0])
    with pytest.raises(TraceInputError, match=r"^step 1: sglang's track fields \(mamba_track_mask\) in a mixed step"):
        rep.step(trace.steps[1])


# -- the split keys: recorded as used, compared where recorded --------------------------------------------------
@pytest.fixture(scope="module")
def recorded_vllm() -> Trace:
    res = replay_trace(trace_of("vllm"), record=True)
    assert res.ok and res.recorded is not None, str(res)
    return res.recorded


def test_a_replay_records_each_step_as_used_and_the_record_checks_clean(recorded_vllm):
    md = [s.metadata or {} for s in recorded_vllm.steps]
    assert md[1] == {
        "bucket": None, "query_start_loc": [0, 3, 4, 6, 9],
        "spec_state_indices_tensor": [[1, 2, 3]], "non_spec_state_indices_tensor": [4, 7, 10],
        "spec_query_start_loc": [0, 3], "non_spec_query_start_loc": [0, 1, 3, 6],
        "num_spec_decodes": 1, "num_decodes": 1, "num_prefills": 2, "num_accepted_tokens": [1],
    }  # fmt: skip
    assert md[2]["num_accepted_tokens"] == [2, 1] and md[2]["spec_state_indices_tensor"] == [[1, 2, 3], [7, 8, 9]]
    assert md[3]["bucket"] == 2 and md[3]["num_accepted_tokens"] == [3, 1] and md[3]["state_indices"][1] == [7, 8, 9]
    assert md[4] == {"bucket": 2, "state_indices": [4, 10], "query_start_loc": [0, 1, 2]}
    assert replay_trace(recorded_vllm, stop_at_first=False).ok


def _tamper(md: dict[str, Any], key: str) -> Any:
    value = md[key]
    if isinstance(value, int):
        return value + 1
    if isinstance(value[-1], list):
        return [*value[:-1], [value[-1][0] + 1, *value[-1][1:]]]
    return [*value[:-1], value[-1] + 1]


SPLIT_TAMPER = [
    (1, "spec_state_indices_tensor"), (1, "non_spec_state_indices_tensor"), (1, "spec_query_start_loc"),
    (1, "non_spec_query_start_loc"), (2, "num_accepted_tokens"), (1, "num_spec_decodes"), (1, "num_decodes"),
    (1, "num_prefills"), (1, "query_start_loc"), (3, "num_accepted_tokens"), (3, "state_indices"),
]  # fmt: skip


@pytest.mark.parametrize(("step", "key"), SPLIT_TAMPER, ids=[f"{s}-{k}" for s, k in SPLIT_TAMPER])
def test_a_wrong_recorded_value_is_a_metadata_divergence_naming_its_key(recorded_vllm, step, key):
    steps = list(recorded_vllm.steps)
    md = dict(steps[step].metadata or {})
    md[key] = _tamper(md, key)
    steps[step] = replace(steps[step], metadata=md)
    res = replay_trace(Trace(recorded_vllm.header, steps), stop_at_first=False)
    found = [(d.step, d.kind) for d in res.divergences if d.field == key]
    assert (step, "metadata") in found, [str(d) for d in res.divergences]


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("bucket", 4, "a mixed step with verify rows runs eagerly: no bucket"),
        ("non_spec_state_indices_tensor", None, "recorded null, but the profile builds it for this step"),
        ("has_initial_state", [True, True, True], "the recorded value is not what the profile builds"),
    ],
)
def test_what_a_split_step_diverges_on_says_so(recorded_vllm, key, value, says):
    steps = list(recorded_vllm.steps)
    steps[1] = replace(steps[1], metadata={**(steps[1].metadata or {}), key: value})
    res = replay_trace(Trace(recorded_vllm.header, steps), stop_at_first=False)
    (d,) = [d for d in res.divergences if d.field == key]
    assert (d.step, d.kind) == (1, "metadata") and says in d.detail, str(d)


def test_sglang_records_the_split_under_the_same_names_and_builds_no_counts():
    res = replay_trace(trace_of("sglang"), record=True)
    assert res.ok and res.recorded is not None
    md = res.recorded.steps[2].metadata or {}
    assert md["spec_state_indices_tensor"] == [1, 3] and "num_accepted_tokens" not in md
    assert replay_trace(res.recorded).ok
    steps = list(res.recorded.steps)
    steps[2] = replace(steps[2], metadata={**md, "num_accepted_tokens": [1, 1]})  # sglang carries no count
    bad = replay_trace(Trace(res.recorded.header, steps))
    assert bad.first is not None and (bad.first.field, bad.first.expected) == ("num_accepted_tokens", "null")


# -- zeroing on allocation, from the header ---------------------------------------------------------------------
class ReadsReusedSlots(MetadataBackend):
    """vLLM PR 56524: every extend row reads its slot as initial state."""

    def init_forward_metadata(self, batch: Batch) -> Metadata:
        meta = super().init_forward_metadata(batch)
        meta.has_initial_state = torch.ones_like(meta.has_initial_state)
        return meta


def test_the_header_says_whether_a_new_slot_is_zeroed_and_the_keyword_overrides_it():
    plain = trace_of("sglang", PLAN[:1])
    zeroed = trace_of("sglang", PLAN[:1], zero=True)
    assert not replay_trace(plain, metadata_backend=ReadsReusedSlots).ok
    assert replay_trace(zeroed, metadata_backend=ReadsReusedSlots).ok
    assert TraceReplayer(zeroed).zero_on_alloc is True and TraceReplayer(plain).zero_on_alloc is False
    assert not replay_trace(zeroed, metadata_backend=ReadsReusedSlots, zero_on_alloc=False).ok
    assert replay_trace(plain, metadata_backend=ReadsReusedSlots, zero_on_alloc=True).ok
