"""The scheduler simulator: deterministic by seed, slot reuse and fragmentation by themselves, the token
budget, chunked prefill, each engine's mixed-step row order, speculation, idle and DP dummy steps, and every
step as a workbench Batch whose metadata builds on a pool replayed through the same admissions."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from workbench.errors import WorkbenchError
from workbench.metadata import build_metadata
from workbench.traces.model import Trace, TraceRow, TraceStep
from workbench.traces.simulate import iter_batches, new_pool, simulate, slots_per_request, to_batch

CONFIGS = [
    dict(profile="sglang"),
    dict(profile="vllm"),
    dict(profile="sglang-ascend", mixed=True),
    dict(profile="vllm", mixed=True),
    dict(profile="sglang", spec=3, dp_dummies=True),
    dict(profile="vllm", spec=2),
    dict(profile="vllm", spec=4, token_budget=24),
    dict(profile="sglang", layer="mamba2", dp_dummies=True),
    dict(profile="vllm", layer="mamba2"),
]
IDS = ["-".join(f"{k}={v}" for k, v in c.items()) for c in CONFIGS]


def rows_by_request(trace: Trace) -> dict[int, list[tuple[TraceStep, TraceRow]]]:
    out: dict[int, list[tuple[TraceStep, TraceRow]]] = defaultdict(list)
    for step in trace.steps:
        for row in step.rows:
            out[row.id].append((step, row))
    return out


def live_rows_per_step(trace: Trace) -> list[dict[int, TraceRow]]:
    """Request id -> its row, of every live request while each step runs (admitted, not yet finished)."""
    live: dict[int, TraceRow] = {}
    out = []
    for step in trace.steps:
        rows = {r.id: r for r in step.rows}
        for rid in step.admit:
            live[rid] = rows[rid]
        out.append(dict(live))
        for rid in step.finish:
            del live[rid]
    return out


# -- determinism ----------------------------------------------------------------------------------------
def test_same_seed_same_trace_other_seed_other_trace():
    a = simulate("vllm", steps=300, seed=7, spec=2, dp_dummies=True)
    b = simulate("vllm", steps=300, seed=7, spec=2, dp_dummies=True)
    c = simulate("vllm", steps=300, seed=8, spec=2, dp_dummies=True)
    assert a == b
    assert a.steps != c.steps
    assert a.header.seed == 7 and c.header.seed == 8


def test_header_names_what_the_steps_run_on():
    t = simulate("sglang", "gdn", steps=5, spec=3)
    assert (t.header.profile, t.header.layer, t.header.draft_tokens) == ("sglang", "gdn", 3)
    assert sorted(t.header.buckets) == ["decode", "target_verify"]
    assert simulate("vllm", steps=5).header.draft_tokens == 2  # no speculation: the model's default D
    m = simulate("vllm", "mamba2", steps=5)
    assert list(m.header.buckets) == ["decode", "target_verify"]  # Mamba2 captures both, as GDN does
    custom = simulate("sglang", steps=5, buckets=[1, 3, 5])
    assert custom.header.buckets == {"decode": [1, 3, 5], "target_verify": [1, 3, 5]}
    # vLLM verify keeps D slots per request: the header alone rebuilds that pool
    v = simulate("vllm", steps=5, spec=3)
    assert slots_per_request(v.header) == 3 and new_pool(v.header).slots_per_request == 3
    assert slots_per_request(simulate("sglang", steps=5, spec=3).header) == 1
    assert slots_per_request(m.header) == 2  # vLLM: D slots per request wherever the verify graph is captured


# -- the pool: reuse, fragmentation, ownership --------------------------------------------------------------
@pytest.mark.parametrize("profile", ["sglang", "vllm"])
def test_slots_are_reused_and_live_rows_fragment(profile):
    t = simulate(profile, steps=1500, seed=3)
    owners: dict[int, set[int]] = defaultdict(set)
    for step in t.steps:
        for row in step.rows:
            owners[row.slot].add(row.id)
    assert any(len(ids) > 1 for ids in owners.values()), "no slot was ever owned by two requests"
    fragmented = 0
    for live in live_rows_per_step(t):
        rows = sorted(r.req_pool_index for r in live.values())
        if rows and rows != list(range(rows[0], rows[0] + len(rows))):
            fragmented += 1
    assert fragmented > 0, "the live request rows were always contiguous"


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_admissions_rows_and_slots_are_consistent(config):
    t = simulate(steps=800, seed=11, **config)
    dummy = new_pool(t.header).profile.dummy_slot
    finished: set[int] = set()
    for step, live in zip(t.steps, live_rows_per_step(t), strict=True):
        ids = [r.id for r in step.rows]
        assert set(step.admit) <= set(ids), "a request is admitted at the step where it first runs"
        assert not finished & set(ids), "a finished request ran again"
        assert len({r.req_pool_index for r in step.rows}) == len(ids)
        assert len({r.slot for r in live.values()}) == len(live), "two live requests share a slot"
        assert all(r.slot != dummy and r.req_pool_index != 0 for r in step.rows)
        for r in step.rows:  # a request keeps its row and slot while it lives
            assert (live[r.id].req_pool_index, live[r.id].slot) == (r.req_pool_index, r.slot)
        finished |= set(step.finish)
    assert finished, "no request finished"


# -- tokens -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "config",
    [*CONFIGS, dict(profile="sglang", token_budget=8, chunk_size=16), dict(profile="vllm", mixed=True, token_budget=5)],
)
def test_token_budget_and_row_counts(config):
    t = simulate(steps=800, seed=5, **config)
    budget = config.get("token_budget", 64)
    d = t.header.draft_tokens
    for step in t.steps:
        assert sum(r.new_tokens for r in step.rows) <= budget
        for r in step.rows:
            assert r.seq_len == r.cached_tokens + r.new_tokens and r.new_tokens >= 1
            if step.mode == "decode":
                assert r.new_tokens == 1 and r.accepted is None
            if step.mode == "target_verify":
                assert r.new_tokens == d and r.accepted is not None and 1 <= r.accepted <= d
            if step.mode in ("extend", "mixed"):
                assert r.accepted is None and r.new_tokens <= config.get("chunk_size", 32)


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_each_row_starts_where_the_last_one_left_the_state(config):
    """cached_tokens advance by new_tokens (extend, decode) or by the tokens accepted (verify)."""
    t = simulate(steps=800, seed=2, **config)
    for rid, seen in rows_by_request(t).items():
        for (s0, r0), (_, r1) in zip(seen, seen[1:], strict=False):
            advance = r0.accepted if s0.mode == "target_verify" else r0.new_tokens
            assert r1.cached_tokens == r0.cached_tokens + advance, f"request {rid}"


def test_long_prompts_are_prefilled_in_chunks():
    t = simulate("sglang", steps=600, seed=1, chunk_size=16, prompt_lens=(40, 90))
    chunked = 0
    for seen in rows_by_request(t).values():
        ext = [(s, r) for s, r in seen if s.mode == "extend"]
        assert ext[0][1].cached_tokens == 0, "the first chunk starts from no state"
        if len(ext) > 1:
            chunked += 1
            steps = [s.step for s, _ in ext]
            assert steps == sorted(set(steps))
            cached = [r.cached_tokens for _, r in ext]
            assert cached == sorted(cached) and len(set(cached)) == len(cached), "cached_tokens grow"
            assert all(r.new_tokens <= 16 for _, r in ext)
    assert chunked > 10


# -- step kinds -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["sglang", "sglang-ascend", "vllm"])
def test_mixed_steps_keep_each_engines_row_order(profile):
    # every prompt fits one chunk and the budget: a request's first row is its prefill, later rows decodes
    t = simulate(profile, steps=600, seed=4, mixed=True, prompt_lens=(2, 32), chunk_size=32, token_budget=256)
    seen: set[int] = set()
    mixed = 0
    for step in t.steps:
        kinds = ["decode" if r.id in seen else "extend" for r in step.rows]
        if step.mode == "mixed":
            mixed += 1
            assert set(kinds) == {"decode", "extend"}
            first, last = ("decode", "extend") if profile == "vllm" else ("extend", "decode")
            n = kinds.count(first)
            assert kinds == [first] * n + [last] * (len(kinds) - n), f"step {step.step}: {kinds}"
        elif step.mode == "extend":
            assert set(kinds) == {"extend"}
        elif step.mode == "decode":
            assert set(kinds) == {"decode"}
        seen |= {r.id for r in step.rows}
    assert mixed > 50


def test_vllm_lays_one_token_rows_first_in_every_extend_step():
    t = simulate("vllm", steps=1000, seed=9, mixed=True)
    for step in t.steps:
        if step.mode in ("extend", "mixed"):
            ones = [r.new_tokens == 1 for r in step.rows]
            assert ones == sorted(ones, reverse=True), f"step {step.step}"


def test_without_mixed_no_step_mixes_and_prefill_alternates_with_decode():
    t = simulate("sglang", steps=800, seed=6)
    modes = [s.mode for s in t.steps]
    assert "mixed" not in modes and {"extend", "decode"} <= set(modes)
    assert any(a == "extend" and b == "decode" for a, b in zip(modes, modes[1:], strict=False))


def test_spec_steps_verify_every_decode_row_with_accepted_in_range():
    t = simulate("vllm", steps=800, seed=3, spec=3)
    modes = {s.mode for s in t.steps}
    assert "decode" not in modes and "target_verify" in modes
    accepted = [r.accepted for s in t.steps if s.mode == "target_verify" for r in s.rows]
    assert set(accepted) == {1, 2, 3}
    assert set(r.accepted for r in simulate("sglang", steps=300, spec=3, accept_rate=0.0).steps[-1].rows) <= {1, None}


def test_dp_dummy_steps_are_idle_while_requests_live():
    t = simulate("sglang", steps=600, seed=2, dp_dummies=True)
    live = live_rows_per_step(t)
    dummies = [s for s, lv in zip(t.steps, live, strict=True) if s.mode == "idle" and lv]
    assert len(dummies) > 20
    assert all(not s.rows and not s.admit and not s.finish for s in dummies)
    plain = simulate("sglang", steps=600, seed=2)
    assert all(not lv for s, lv in zip(plain.steps, live_rows_per_step(plain), strict=True) if s.mode == "idle")


def test_idle_when_nothing_runs():
    t = simulate("sglang", steps=50, seed=0, arrival_rate=0.0)
    assert {s.mode for s in t.steps} == {"idle"}
    quiet = simulate("vllm", steps=400, seed=0, arrival_rate=0.05)
    assert "idle" in {s.mode for s in quiet.steps}


def test_mamba2_prefills_by_default_and_models_a_decode_instance_without():
    assert "extend" in {s.mode for s in simulate("sglang", "mamba2", steps=300, seed=1).steps}
    t = simulate("sglang", "mamba2", steps=300, seed=1, prefill=False)
    assert {s.mode for s in t.steps} <= {"decode", "idle"}
    firsts = [seen[0][1] for seen in rows_by_request(t).values()]
    assert all(r.cached_tokens >= 2 for r in firsts), "requests arrive prefilled"


def test_some_decode_steps_pass_the_largest_bucket_but_not_most():
    t = simulate("sglang", steps=3000, seed=0)
    largest = t.header.buckets["decode"][-1]
    decodes = [s for s in t.steps if s.mode == "decode"]
    over = sum(len(s.rows) > largest for s in decodes)
    assert 0 < over < len(decodes) / 2


# -- refusals ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(layer="mamba2", mixed=True, prefill=False), ["mixed", "prefill=False"]),
        (dict(layer="mla"), ["layer", "mla"]),
        (dict(profile="trtllm"), ["profile", "trtllm"]),
        (dict(spec=-1), ["spec"]),
        (dict(spec=8, token_budget=4), ["token_budget"]),
        (dict(prompt_lens=(1, 4)), ["prompt_lens"]),
        (dict(output_lens=(5, 2)), ["output_lens"]),
        (dict(arrival_rate=-0.1), ["arrival_rate"]),
        (dict(accept_rate=1.5), ["accept_rate"]),
        (dict(buckets=[4, 2]), ["buckets"]),
        (dict(num_slots=1), ["num_slots"]),
        (dict(mixed="yes"), ["mixed"]),
    ],
)
def test_bad_arguments_are_refused_naming_the_field(kwargs, words):
    with pytest.raises(WorkbenchError) as info:
        simulate(steps=5, **kwargs)
    msg = str(info.value)
    assert all(w in msg for w in words), msg
    assert "\n" not in msg


def test_spec_is_refused_for_a_layer_without_a_verify_step(monkeypatch):
    from workbench.layers import Mamba2Layer

    monkeypatch.setattr(Mamba2Layer, "supported_modes", ("decode", "extend", "idle"))
    with pytest.raises(WorkbenchError, match=r"spec = 2: layer 'mamba2' has no target_verify step"):
        simulate("sglang", "mamba2", steps=5, spec=2)


# -- every step as a Batch, its metadata built --------------------------------------------------------------
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_every_step_converts_and_builds_metadata_on_a_replayed_pool(config):
    t = simulate(steps=250, seed=13, **config)
    h = t.header
    pool = new_pool(h)
    last_accepted: dict[int, int] = {}
    for step, batch in iter_batches(t):
        for rid in step.admit:
            row = next(r for r in step.rows if r.id == rid)
            got = int(pool.alloc(1)[0])
            assert (got, pool.slots_of(got)[0]) == (row.req_pool_index, row.slot)
        assert batch.mode == ("extend" if step.mode == "mixed" else step.mode)
        assert batch.req_pool_indices.tolist() == [r.req_pool_index for r in step.rows]
        assert batch.seq_lens.tolist() == [r.seq_len for r in step.rows]
        if batch.mode == "extend":
            assert batch.extend_lens.tolist() == [r.new_tokens for r in step.rows]
            assert batch.prefix_lens.tolist() == [r.cached_tokens for r in step.rows]
        if batch.mode == "target_verify":
            assert batch.draft_tokens == h.draft_tokens
            if h.profile == "vllm":  # the count accepted at the request's previous verify
                assert batch.num_accepted_tokens.tolist() == [last_accepted.get(r.id, 1) for r in step.rows]
            else:
                assert batch.num_accepted_tokens is None
            last_accepted.update({r.id: r.accepted for r in step.rows})
        meta = build_metadata(batch, pool, bucket=None)
        idx = meta.state_indices
        first = (idx[:, 0] if idx.dim() == 2 else idx).tolist()
        assert first == [r.slot for r in step.rows]
        if step.finish:
            pool.free([next(r.req_pool_index for r in step.rows if r.id == rid) for rid in step.finish])
            for rid in step.finish:
                last_accepted.pop(rid, None)


def test_to_batch_takes_counts_and_refuses_rows_that_do_not_add_up():
    row = TraceRow(id=4, req_pool_index=3, slot=5, seq_len=12, new_tokens=3, cached_tokens=9, accepted=2)
    step = TraceStep(7, "target_verify", (row,))
    assert to_batch(step, "vllm", 3, num_accepted={4: 2}).num_accepted_tokens.tolist() == [2]
    assert to_batch(step, "vllm", 3).num_accepted_tokens.tolist() == [1]
    assert to_batch(step, "sglang", 3).num_accepted_tokens is None
    assert to_batch(TraceStep(0, "idle"), "sglang", 2).raw_batch_size == 0
    bad = TraceStep(8, "decode", (TraceRow(4, 3, 5, seq_len=10, new_tokens=1, cached_tokens=8),))
    with pytest.raises(WorkbenchError, match=r"step 8 row 0 \(request 4\): seq_len=10"):
        to_batch(bad, "sglang", 2)
    with pytest.raises(WorkbenchError, match="must be D=2"):
        to_batch(step, "sglang", 2)
    with pytest.raises(WorkbenchError, match="mode 'prefill'"):
        to_batch(TraceStep(1, "prefill", (row,)), "sglang", 3)


# -- speed ------------------------------------------------------------------------------------------------
def test_ten_thousand_steps_are_quick(capsys):
    t0 = time.perf_counter()
    t = simulate("sglang", steps=10_000, seed=0, dp_dummies=True, spec=2)
    dt = time.perf_counter() - t0
    assert len(t) == 10_000
    with capsys.disabled():
        print(f"\nsimulate: 10,000 steps in {dt:.2f} s ({10_000 / dt:,.0f} steps/s)")
