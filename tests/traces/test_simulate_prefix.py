"""The simulator with sglang's ``no_buffer`` mamba radix cache: shared prompts that really hit, checkpoints
that hold exactly the tokens of the state they copy or donate, evictions of held slots only, copies that
never touch the dummy slot or another request's, a pool that replays the same, and refusals that name the
field. Every trace is audited from its rows and metadata alone, with the real pool's rules."""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

import pytest

from workbench import cli
from workbench.pool import StatePool
from workbench.traces import simulate as sim_module
from workbench.traces import strategies
from workbench.traces.format import read_trace, write_trace
from workbench.traces.model import FINAL_TRACK_FIELDS, PREFIX_KEYS, Trace
from workbench.traces.simulate import SimulationError, simulate

STEPS = 400
CONFIGS = [
    dict(),
    dict(profile="sglang", spec=3),
    dict(profile="sglang-ascend", mixed=True),
    dict(profile="sglang", dp_dummies=True, followup_rate=1.0),
    dict(profile="sglang", num_slots=9, max_cached=4, arrival_rate=1.0),  # tight: admissions evict
    dict(profile="sglang", shared_prefixes=1, prefix_len=(40, 40), chunk_size=8),
    dict(profile="sglang", output_lens=(1, 3), spec=2),  # some finish at their last prefill chunk
    dict(profile="sglang", max_cached=0),
]
IDS = ["-".join(f"{k}={v}" for k, v in c.items()) or "default" for c in CONFIGS]


def run(seed: int = 0, steps: int = STEPS, **kw: Any) -> Trace:
    return simulate(kw.pop("profile", "sglang"), steps=steps, seed=seed, prefix_cache="no_buffer", **kw)


def recorded_prompts(monkeypatch: pytest.MonkeyPatch) -> dict[int, tuple[int, ...]]:
    """Request id -> its prompt, as the simulator admits it (the trace has only the ids each row feeds)."""
    prompts: dict[int, tuple[int, ...]] = {}
    admit = strategies.NoBuffer.admit

    def spy(self: Any, req: Any) -> bool:
        prompts[req.id] = tuple(req.prompt)
        return admit(self, req)

    monkeypatch.setattr(strategies.NoBuffer, "admit", spy)
    return prompts


def audit(trace: Trace, prompts: dict[int, tuple[int, ...]] | None = None) -> Counter[str]:
    """Walk the trace as a replay would, with a real pool; assert every prefix-cache rule; count events.

    Tracks each live request's state as the token ids in it, and each held slot's checkpoint as the ids it
    holds the state of (what a copy or a donation put there)."""
    h = trace.header
    dummy = 0
    pool = StatePool(h.num_slots, h.profile)
    state: dict[int, list[int]] = {}  # live request -> the ids in its state
    slot_of: dict[int, int] = {}  # live request -> its slot
    held: dict[int, tuple[int, ...]] = {}  # held slot -> the ids its checkpoint holds the state of
    own: dict[int, int] = {}  # live request's slot -> request
    used: dict[int, int] = {}  # held slot -> when its checkpoint was last published or hit (LRU)
    clock = 0
    n: Counter[str] = Counter()
    for step in trace.steps:
        meta = step.metadata or {}
        now = {h["slot"] for h in meta.get("hits", [])}  # in use at this step: never evicted at it
        assert set(meta) <= set(PREFIX_KEYS), f"step {step.step}: {sorted(meta)}"
        assert all(meta[k] for k in meta), f"step {step.step}: an empty key is left out"
        assert list(meta) == [k for k in PREFIX_KEYS if k in meta]
        rows = {r.id: r for r in step.rows}
        for slot in meta.get("evict", []):  # before the step: live checkpoints only, free afterwards
            assert slot in held and slot in pool.held_slots, f"step {step.step}: evict {slot} is not held"
            assert slot not in now, f"step {step.step}: evicts {slot}, a hit source of the same step"
            lru = min((t, s) for s, t in used.items() if s not in now)[1]
            assert slot == lru, f"step {step.step}: evicts {slot}, the least recently used is {lru}"
            del held[slot], used[slot]
            pool.release(slot)
            n["evict"] += 1
        for rid in step.admit:
            r = rows[rid]
            assert r.slot != dummy and r.slot not in held and r.slot not in own
            pool.alloc_at(r.req_pool_index, [r.slot])  # the pool refuses a held or owned slot too
            state[rid], slot_of[rid], own[r.slot] = [], r.slot, rid
        hit_of: dict[int, int] = {}
        for hit in meta.get("hits", []):
            rid, length, src = hit["request"], hit["tokens"], hit["slot"]
            assert rid in step.admit, f"step {step.step}: a hit for request {rid}, not admitted here"
            assert src in held, f"step {step.step}: hit source {src} is not a live checkpoint"
            assert len(held[src]) == length and rows[rid].cached_tokens == length
            if prompts is not None:
                assert held[src] == prompts[rid][:length]
            state[rid] = list(held[src])
            hit_of[rid] = src
            used[src], clock = clock, clock + 1
            n["hits"] += 1
        assert [(hit_of[own[d]], d) for _, d in meta.get("copies_before", [])] == [
            tuple(c) for c in meta.get("copies_before", [])
        ], "copy-on-write: each hit's checkpoint into the admitted request's own slot"
        assert len(meta.get("copies_before", [])) == len(hit_of)
        for rid in step.admit:
            if rid not in hit_of:
                assert rows[rid].cached_tokens == 0
        for r in step.rows:
            assert r.tokens is not None and len(r.tokens) == r.new_tokens
            assert r.cached_tokens == len(state[r.id]), f"step {step.step}: request {r.id}'s state"
            if prompts is not None and r.cached_tokens < len(prompts[r.id]):  # a prompt piece
                assert r.tokens == prompts[r.id][r.cached_tokens : r.seq_len]
            kept = r.accepted if step.mode == "target_verify" else r.new_tokens
            state[r.id].extend(r.tokens[:kept])
        copied: dict[int, tuple[int, tuple[int, ...]]] = {}  # destination -> (request, the ids copied)
        for src, dst in meta.get("copies_after", []):  # a running request's state into a new tree slot
            assert src != dst and dst != dummy and src in own and own[src] in rows
            assert own[src] not in step.finish, "a copy only for a request that runs on (a finishing one donates)"
            assert dst not in own and dst not in held and dst not in copied
            pool.hold(dst)
            copied[dst] = (own[src], tuple(state[own[src]]))
            n["copies_after"] += 1
        donated: set[int] = set()
        for c in meta.get("checkpoints", []):
            rid, length, slot = c["request"], c["tokens"], c["slot"]
            assert length == len(state[rid]), "a checkpoint holds exactly the publishing request's state"
            if slot in copied:
                assert copied.pop(slot) == (rid, tuple(state[rid])), "the copy of the publishing request's state"
                if prompts is not None:
                    assert length == len(prompts[rid])  # copied after the last prefill chunk: the prompt
                n["copied checkpoints"] += 1
            else:
                assert slot == slot_of[rid] and rid in step.finish, "no copy: only a finishing request donates"
                donated.add(rid)
                n["donated"] += 1
            assert slot not in held
            held[slot] = tuple(state[rid])
            used[slot], clock = clock, clock + 1
        assert not copied, "every copy after the step publishes a checkpoint"
        for rid in step.finish:
            if rid in donated:
                pool.donate(pool_row(pool, slot_of[rid]))
            else:
                pool.free([pool_row(pool, slot_of[rid])])
            del own[slot_of[rid]], slot_of[rid], state[rid]
        assert set(held) == pool.held_slots and not set(held) & set(own)
        n["steps"] += 1
    n["admitted"] = sum(len(s.admit) for s in trace.steps)
    return n


def pool_row(pool: StatePool, slot: int) -> int:
    return next(row for row in pool.live_rows if pool.slots_of(row) == [slot])


# -- the trace, audited ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", CONFIGS, ids=IDS)
def test_every_hit_copy_checkpoint_and_eviction_follows_the_rules(kw, monkeypatch):
    prompts = recorded_prompts(monkeypatch)
    trace = run(**dict(kw))
    n = audit(trace, prompts)
    assert n["steps"] == STEPS and n["admitted"] > 20
    if kw.get("max_cached") == 0:
        assert n["hits"] == n["copies_after"] == n["donated"] == 0
    else:
        assert n["hits"] > 0 and n["copies_after"] > 0 and n["donated"] > 0


def test_requests_share_prefixes_and_hit_checkpoints_published_earlier(monkeypatch):
    prompts = recorded_prompts(monkeypatch)
    trace = run(steps=600, followup_rate=0.0)
    assert audit(trace, prompts)["hits"] >= 10
    published: list[tuple[int, int, int]] = []  # (step, request, tokens)
    hits = 0
    for step in trace.steps:
        meta = step.metadata or {}
        for hit in meta.get("hits", []):
            rid, length = hit["request"], hit["tokens"]
            assert length <= len(prompts[rid]) - 1, "a hit leaves a prompt token to compute"
            sources = [
                (s, src)
                for s, src, tokens in published
                if tokens == length and prompts[src][:length] == prompts[rid][:length]
            ]
            assert sources, f"step {step.step}: hit of {length} tokens for request {rid}: no earlier checkpoint"
            hits += 1
        for c in meta.get("checkpoints", []):
            published.append((step.step, c["request"], c["tokens"]))
    # without follow-ups, every hit is on a shared system prompt: distinct requests share a prefix
    heads = Counter(p[:4] for p in prompts.values())
    assert hits >= 10 and max(heads.values()) >= len(prompts) // 8


def test_follow_ups_hit_the_state_a_finished_request_donated(monkeypatch):
    prompts = recorded_prompts(monkeypatch)
    trace = run(followup_rate=1.0)
    audit(trace, prompts)
    donated: dict[int, int] = {}  # slot -> its tokens, while held
    on_donated = 0
    for step in trace.steps:
        meta = step.metadata or {}
        for slot in meta.get("evict", []):
            donated.pop(slot, None)
        for hit in meta.get("hits", []):
            on_donated += donated.get(hit["slot"]) == hit["tokens"]
        own = {r.slot: r.id for r in step.rows}
        for c in meta.get("checkpoints", []):
            if own.get(c["slot"]) == c["request"]:
                donated[c["slot"]] = c["tokens"]
            else:
                donated.pop(c["slot"], None)
    assert on_donated > 0


def test_a_full_pool_evicts_checkpoints_for_admissions():
    trace = run(num_slots=7, max_cached=6, arrival_rate=2.0)
    audit(trace)
    for_admission = 0
    for step in trace.steps:
        evicted = set((step.metadata or {}).get("evict", []))
        for r in step.rows:
            for_admission += r.id in step.admit and r.slot in evicted
        if step.metadata:
            assert len(step.metadata.get("evict", [])) <= len(step.metadata.get("checkpoints", [])) + len(step.admit)
    assert for_admission > 0


def test_the_tree_never_holds_more_than_max_cached():
    for max_cached in (1, 3):
        trace = run(max_cached=max_cached)
        held: set[int] = set()
        for step in trace.steps:
            meta = step.metadata or {}
            held -= set(meta.get("evict", []))
            held |= {c["slot"] for c in meta.get("checkpoints", [])}
            assert len(held) <= max_cached


# -- determinism, the file, speed -------------------------------------------------------------------------
def test_same_seed_same_trace():
    a, b, c = run(seed=5, spec=2), run(seed=5, spec=2), run(seed=6, spec=2)
    assert a == b and a.steps != c.steps
    assert all(r.tokens is not None for s in a.steps for r in s.rows)


def test_without_a_prefix_cache_rows_carry_no_tokens_and_steps_no_cache_keys():
    trace = simulate("sglang", steps=200, seed=0)
    assert all(r.tokens is None for s in trace.steps for r in s.rows)
    assert all(s.metadata is None for s in trace.steps)


def test_round_trips_through_the_file(tmp_path):
    trace = run(seed=2, spec=2, dp_dummies=True)
    buf = io.StringIO()
    write_trace(trace, buf)
    assert read_trace(buf.getvalue().splitlines()) == trace
    path = tmp_path / "t.jsonl"
    write_trace(trace, path)
    assert read_trace(path) == trace


def test_two_thousand_steps_simulate_and_keep_the_cache_busy():
    """A long run (its speed is measured by `workbench bench trace`, not asserted here: a shared machine)."""
    trace = run(steps=2000)
    kinds = {k for s in trace.steps for k in (s.metadata or {})}
    assert len(trace) == 2000 and {"hits", "checkpoints", "copies_before", "copies_after", "evict"} <= kinds


# -- refusals ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, field, value",
    [
        (dict(prefix_cache="extra_buffer_lazy"), "prefix_cache", "'extra_buffer_lazy': not built yet"),
        (dict(prefix_cache="align"), "profile", "'sglang'"),
        (dict(prefix_cache="lru"), "prefix_cache", "'lru'"),
        (dict(prefix_cache=1), "prefix_cache", "1"),
        (dict(prefix_cache="no_buffer", profile="vllm"), "profile", "'vllm'"),
        (dict(prefix_cache="no_buffer", layer="mamba2", prefill=False), "prefill", "False"),
        (dict(prefix_cache="no_buffer", prefill=False), "prefill", "False"),
        (dict(prefix_cache="no_buffer", shared_prefixes=0), "shared_prefixes", "0"),
        (dict(prefix_cache="no_buffer", prefix_len=(0, 4)), "prefix_len", r"\(0, 4\)"),
        (dict(prefix_cache="no_buffer", prefix_len=(9, 4)), "prefix_len", r"\(9, 4\)"),
        (dict(prefix_cache="no_buffer", vocab=0), "vocab", "0"),
        (dict(prefix_cache="no_buffer", vocab=True), "vocab", "True"),
        (dict(prefix_cache="no_buffer", followup_rate=1.5), "followup_rate", "1.5"),
        (dict(prefix_cache="no_buffer", max_cached=-1), "max_cached", "-1"),
        (dict(prefix_cache="no_buffer", num_slots=5, max_cached=5), "max_cached", "5"),
        (dict(max_cached=2), "max_cached", "2"),
    ],
)
def test_refusals_name_the_field_and_value(kw, field, value):
    kw = dict(kw)
    with pytest.raises(SimulationError, match=f"{field} = {value}"):
        simulate(kw.pop("profile", "sglang"), kw.pop("layer", "gdn"), steps=5, **kw)


# -- the command line ----------------------------------------------------------------------------------------
@pytest.fixture
def simulated(monkeypatch) -> dict[str, Any]:
    """``workbench trace run`` with its replay stubbed: the keywords the CLI passed to ``simulate`` (the trace
    is still simulated, so a refused value still refuses)."""
    import workbench.traces.replay as replay_module

    seen: dict[str, Any] = {}
    real = sim_module.simulate

    def spy(*args: Any, **kw: Any) -> Trace:
        seen.update(kw)
        return real(*args, **kw)

    class Result:
        ok = True

        def __str__(self) -> str:
            return "replayed"

    monkeypatch.setattr(sim_module, "simulate", spy)
    monkeypatch.setattr(replay_module, "replay_trace", lambda trace, progress=None: Result())
    return seen


def test_cli_passes_the_prefix_cache_through(simulated, capsys):
    seen = simulated
    assert cli.main(["trace", "run", "--steps", "3", "--prefix-cache", "no_buffer"]) == 0
    assert seen["prefix_cache"] == "no_buffer"
    assert cli.main(["trace", "run", "--steps", "3"]) == 0
    assert seen["prefix_cache"] is None


def test_cli_refuses_a_bad_prefix_cache_in_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["trace", "run", "--prefix-cache", "extra_buffer_lazy"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--prefix-cache" in err and "extra_buffer_lazy" in err
    assert cli.main(["trace", "run", "--profile", "vllm", "--prefix-cache", "no_buffer"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "profile = 'vllm'" in err[0]


# -- the replay ----------------------------------------------------------------------------------------------
def test_a_simulated_prefix_cache_trace_replays_clean():
    """Smoke: the replay verifies every checkpoint against the float64 state of exactly its prefix. The pool
    is roomy (no admission needs an evicted slot: the replay admits a step's requests before it runs its
    ``evict``), the tree small (checkpoints evict each other)."""
    from workbench.traces.replay import replay_trace

    trace = run(steps=60, num_slots=48, max_cached=6, output_lens=(1, 8), arrival_rate=0.8)
    n = audit(trace)
    assert n["hits"] and n["donated"] and n["copied checkpoints"] and n["evict"]
    for step in trace.steps:
        evicted = set((step.metadata or {}).get("evict", []))
        assert not any(r.id in step.admit and r.slot in evicted for r in step.rows)
    result = replay_trace(trace)
    assert result.ok, str(result)
    assert result.hits == n["hits"] and result.verified == result.checkpoints == n["donated"] + n["copied checkpoints"]


# -- extra_buffer: ping-pong track buffers -------------------------------------------------------------------
EB_STEPS = 300
EB_CONFIGS = [
    dict(),
    dict(spec=2),
    dict(profile="sglang-ascend", mixed=True),
    dict(dp_dummies=True, followup_rate=1.0),
    dict(num_slots=13, max_cached=3, arrival_rate=1.0, seed=1),  # tight: admissions and donations evict
    dict(cache_chunk=8, track_interval=16, chunk_size=24),
    dict(layer="mamba2"),
    dict(layer="mamba2", mixed=True, seed=2),
]
EB_IDS = ["-".join(f"{k}={v}" for k, v in c.items()) or "default" for c in EB_CONFIGS]


def run_eb(seed: int = 0, steps: int = EB_STEPS, **kw: Any) -> Trace:
    return simulate(kw.pop("profile", "sglang"), steps=steps, seed=seed, prefix_cache="extra_buffer", **kw)


def audit_eb(
    trace: Trace, cache_chunk: int = 16, track_interval: int = 32, prompts: dict[int, tuple[int, ...]] | None = None
) -> Counter[str]:
    """Walk an ``extra_buffer`` trace from its rows and metadata alone; assert the tracking, track-field,
    ping-pong and donation rules; count events."""
    state: dict[int, list[int]] = {}  # live request -> the ids in its state
    slot_of: dict[int, int] = {}  # live request -> its running slot
    pingpong: dict[int, set[int]] = {}  # live request -> its ping-pong slots seen (not donated)
    dsts: dict[int, set[int]] = {}  # request -> every slot it tracked into
    donations: Counter[int] = Counter()  # request -> slots it donated
    last: dict[int, tuple[int, tuple[int, ...]]] = {}  # request -> (slot, ids) of its last tracked copy
    pending: dict[int, int] = {}  # request -> the slot its next tracked copy writes (from mamba_track_indices)
    held: set[int] = set()  # checkpoints' slots
    n: Counter[str] = Counter()
    for step in trace.steps:
        meta = step.metadata or {}
        keys = [*PREFIX_KEYS, *sim_module.TRACK_KEYS]
        assert list(meta) == [k for k in keys if k in meta], f"step {step.step}: {list(meta)}"
        held -= set(meta.get("evict", []))
        for rid in step.admit:
            state[rid], pingpong[rid], dsts[rid] = [], set(), set()
        for hit in meta.get("hits", []):
            assert hit["slot"] in held
            state[hit["request"]] = [-1] * hit["tokens"]  # ids of the hit prefix: not needed here
            n["hits"] += 1
        expected_copies: list[list[int]] = []
        mask: list[bool] = []
        seqlens: list[int] = []
        steps_to_track: list[int] = []  # a verify's draft step tracked at commit, -1 for none
        h_rows: list[tuple[int, Any]] = []  # extend rows tracked inside their chunk (from the chunk states h)
        ats: list[int] = []
        verify = step.mode == "target_verify"
        for r in step.rows:
            assert r.tokens is not None
            slot_of[r.id] = r.slot
            assert r.cached_tokens == len(state[r.id])
            kept = r.accepted if verify else r.new_tokens
            state[r.id].extend(r.tokens[:kept])
            now = len(state[r.id])
            at = now
            if verify:  # crossing a multiple tracks the last one reached, from its draft step's state
                tracked = r.cached_tokens // track_interval != now // track_interval
                at = now // track_interval * track_interval
                n["verify tracks"] += tracked
                n["verify tracks past the boundary"] += tracked and at < now
            elif step.mode == "decode":
                tracked = now % track_interval == 0
                n["decode tracks"] += tracked
            else:  # an extend row (or a mixed step's one-token decode tail: never tracked)
                tracked = r.new_tokens >= cache_chunk and (step.mode == "extend" or r.new_tokens > 1)
                at = r.cached_tokens + r.new_tokens // cache_chunk * cache_chunk  # its last chunk boundary
                n["extend tracks"] += tracked
                inside = tracked and at < now
                n["tracks inside a chunk"] += inside
                if inside:
                    h_rows.append((len(mask), r))
            mask.append(tracked)
            ats.append(at)  # the tokens the tracked state holds
            seqlens.append((now if not verify else at) if tracked else -1)
            steps_to_track.append(at - r.cached_tokens - 1 if tracked else -1)
        rows_by_pos = list(step.rows)
        if any(mask):
            if verify:  # no mask or seqlens (sglang clears them for a verify); no copy: tracked at commit
                assert "mamba_track_mask" not in meta and "mamba_track_seqlens" not in meta
                assert meta["mamba_steps_to_track"] == steps_to_track, f"step {step.step}: steps to track"
            else:
                assert meta["mamba_track_mask"] == mask, f"step {step.step}: the mask follows the rule"
                assert meta["mamba_track_seqlens"] == seqlens, f"step {step.step}: seqlens are each chunk's end"
                assert "mamba_steps_to_track" not in meta
            indices = meta["mamba_track_indices"]
            if h_rows and trace.header.layer == "mamba2":  # one grid over the batch; rows off it recomputed
                qsl = [0]
                for r in step.rows:
                    qsl.append(qsl[-1] + r.new_tokens)
                ends = [(i, qsl[i] + r.new_tokens // cache_chunk * cache_chunk) for i, r in h_rows]
                on, off = (
                    [(i, e) for i, e in ends if e % cache_chunk == 0],
                    [(i, e) for i, e in ends if e % cache_chunk],
                )
                assert meta["mamba_chunk_size"] == cache_chunk
                assert meta.get("track_ssm_h_src", []) == [e // cache_chunk for _, e in on]
                assert meta.get("track_ssm_h_dst", []) == [indices[i] for i, _ in on]
                assert meta.get("track_ssm_seq_idx", []) == [i for i, _ in off]
                assert meta.get("track_ssm_end_locs", []) == [e for _, e in off]
                assert meta.get("track_ssm_recompute_dst", []) == [indices[i] for i, _ in off]
                n["tracks recomputed off the grid"] += len(off)
                assert len(meta["track_conv_indices"]) == sum(mask)
            elif h_rows:  # GDN's h: one grid per sequence, ceil(new_tokens / C) chunk states per row
                offsets = [0]
                for r in step.rows:
                    offsets.append(offsets[-1] + (r.new_tokens - 1) // cache_chunk + 1)
                assert meta["mamba_chunk_size"] == cache_chunk
                assert meta["track_ssm_h_src"] == [offsets[i] + r.new_tokens // cache_chunk for i, r in h_rows]
                assert meta["track_ssm_h_dst"] == [indices[i] for i, _ in h_rows]
                assert "track_ssm_seq_idx" not in meta
                assert len(meta["track_conv_indices"]) == sum(mask)
            else:
                assert "track_ssm_h_src" not in meta and "mamba_chunk_size" not in meta
            assert len(indices) == len(rows_by_pos)
            for r, tracked, idx in zip(rows_by_pos, mask, indices, strict=True):
                assert idx not in slot_of.values() and idx != 0 and idx not in held
                if r.id in pending:
                    assert pending[r.id] == idx, "the next track slot stays until the request tracks"
                if tracked:
                    if not verify and all(hr is not r for _, hr in h_rows):  # the final state: a copy
                        expected_copies.append([r.slot, idx])
                    dsts[r.id].add(idx)
                    pingpong[r.id].add(idx)
                    assert len(pingpong[r.id]) <= 2, f"request {r.id}: more than 2 live ping-pong slots"
                    assert len(dsts[r.id]) <= 2 + donations[r.id]
                    if r.id in last:
                        assert last[r.id][0] != idx, "consecutive tracks alternate (ping-pong)"
                    last[r.id] = (idx, tuple(state[r.id][: ats[rows_by_pos.index(r)]]))
                    pending.pop(r.id, None)
                else:
                    pending[r.id] = idx
        else:
            assert not any(k in meta for k in sim_module.TRACK_KEYS)
        assert meta.get("copies_after", []) == expected_copies, f"step {step.step}: a copy for each tracked row"
        finals = expected_copies if step.mode in ("extend", "mixed") else []  # sglang's lists name the same copies
        assert [list(p) for p in zip(*(meta.get(k, []) for k in FINAL_TRACK_FIELDS), strict=True)] == finals
        n["final-state copies named"] += len(finals)
        assert "copies_before" not in meta or len(meta["copies_before"]) == len(meta.get("hits", []))
        copied_now = {d for _, d in expected_copies}
        for c in meta.get("checkpoints", []):
            rid, length, slot = c["request"], c["tokens"], c["slot"]
            assert rid in last and last[rid][0] == slot, "a checkpoint is the request's last track slot"
            assert length == len(last[rid][1]) <= len(state[rid]), "tokens: the tracked length"
            assert slot != slot_of[rid] and slot not in held, "donated: a track slot, never the running slot"
            if slot in copied_now:  # only the request's own tracking copy wrote it at this step
                assert [slot_of[rid], slot] in expected_copies
            if rid in step.finish:
                n["donated at finish"] += 1
            else:
                n["donated after prefill"] += 1
                if prompts is not None:
                    row = next(r for r in step.rows if r.id == rid)
                    assert row.seq_len == len(prompts[rid]), "inserted after the last prefill chunk"
            pingpong[rid].discard(slot)
            donations[rid] += 1
            held.add(slot)
            del last[rid]  # published: no second checkpoint of it
        for rid in step.finish:
            for table in (state, slot_of, pingpong, last, pending):
                table.pop(rid, None)
        n["steps"] += 1
    n["checkpoints"] = sum(donations.values())
    return n


def test_extra_buffer_same_seed_same_trace():
    a, b, c = run_eb(seed=3, spec=2), run_eb(seed=3, spec=2), run_eb(seed=4, spec=2)
    assert a == b and a.steps != c.steps
    assert any(k in (s.metadata or {}) for s in a.steps for k in sim_module.TRACK_KEYS)


@pytest.mark.parametrize("kw", EB_CONFIGS, ids=EB_IDS)
def test_extra_buffer_tracks_donates_and_records_by_the_rules(kw, monkeypatch):
    prompts = recorded_prompts(monkeypatch)
    kw = dict(kw)
    trace = run_eb(**kw)
    n = audit_eb(trace, kw.get("cache_chunk", 16), kw.get("track_interval", 32), prompts)
    assert n["steps"] == EB_STEPS and n["hits"] > 0 and n["extend tracks"] > 0 and n["tracks inside a chunk"] > 0
    assert n["donated at finish"] > 0 and n["donated after prefill"] > 0
    if kw.get("spec"):  # a verify tracks at commit, also a boundary its accepted tokens step over
        assert n["verify tracks"] > 0 and n["verify tracks past the boundary"] > 0
    elif not kw.get("mixed"):
        assert n["decode tracks"] > 0
    assert n["final-state copies named"] > 0
    if kw.get("layer") == "mamba2":  # rows that start off the batch's grid are recomputed
        assert n["tracks recomputed off the grid"] > 0


def test_extra_buffer_holds_three_slots_per_request_in_the_simulated_pool(monkeypatch):
    """The simulator's own pool: every live request owns one slot and holds two ping-pong slots."""
    seen: list[int] = []
    track = strategies.ExtraBuffer.track

    def spy(self: Any, mode: str, rows: list[Any]) -> None:
        track(self, mode, rows)
        for req, *_ in rows:
            assert len(req.pingpong) == 2 and len(set(req.pingpong)) == 2
            assert set(req.pingpong) <= self.pool.held_slots and req.slot not in req.pingpong
        live = len(self.pool.live_rows)
        assert len(self.pool.held_slots) == 2 * live + len(self.tree)
        seen.append(live)

    monkeypatch.setattr(strategies.ExtraBuffer, "track", spy)
    trace = run_eb(steps=150)
    assert max(seen) > 3 and (trace.header.num_slots - 1) % 3 == 0  # the default pool: 3 slots per request


@pytest.mark.slow  # three whole traces replayed
def test_extra_buffer_traces_replay_clean_with_every_checkpoint_verified():
    from workbench.traces.replay import replay_trace

    configs = (
        dict(seed=2, spec=2, dp_dummies=True),
        dict(seed=3, profile="sglang-ascend", mixed=True),
        dict(seed=0, layer="mamba2"),  # its step 32 records recomputes and no h entries
    )
    for kw in configs:
        kw = dict(kw)
        trace = run_eb(steps=150, **kw)
        n = audit_eb(trace)
        result = replay_trace(trace)
        assert result.ok, str(result)
        assert result.checkpoints == result.verified == n["checkpoints"] > 0
        assert result.hits == n["hits"] > 0
        if kw.get("spec"):
            assert n["verify tracks past the boundary"] > 0


def test_cli_runs_extra_buffer(simulated):
    seen = simulated
    assert cli.main(["trace", "run", "--steps", "3", "--prefix-cache", "extra_buffer"]) == 0
    assert seen["prefix_cache"] == "extra_buffer"


@pytest.mark.parametrize(
    "kw, field, value",
    [
        (dict(prefix_cache="extra_buffer", cache_chunk=0), "cache_chunk", "0"),
        (dict(prefix_cache="extra_buffer", cache_chunk=True), "cache_chunk", "True"),
        (dict(prefix_cache="extra_buffer", cache_chunk=1.5), "cache_chunk", "1.5"),
        (dict(prefix_cache="extra_buffer", track_interval=0), "track_interval", "0"),
        (dict(prefix_cache="extra_buffer", track_interval=24), "track_interval", "24"),
        (dict(prefix_cache="extra_buffer", cache_chunk=8, track_interval=12), "track_interval", "12"),
        (dict(prefix_cache="extra_buffer", num_slots=3), "num_slots", "3"),
        (dict(prefix_cache="no_buffer", cache_chunk=16), "cache_chunk", "16"),
        (dict(track_interval=32), "track_interval", "32"),
        (dict(prefix_cache="extra_buffer", profile="vllm"), "profile", "'vllm'"),
    ],
)
def test_extra_buffer_refusals_name_the_field_and_value(kw, field, value):
    kw = dict(kw)
    with pytest.raises(SimulationError, match=f"{field} = {value}"):
        simulate(kw.pop("profile", "sglang"), "gdn", steps=5, **kw)


# -- vLLM align ----------------------------------------------------------------------------------------------
def run_al(seed: int = 0, steps: int = 300, **kw: Any) -> Trace:
    return simulate("vllm", "gdn", steps=steps, seed=seed, prefix_cache="align", **kw)


def audit_al(trace: Trace, bs: int = 16) -> Counter[str]:
    """Walk an align trace: block-aligned chunks; each block a row fills exactly published in that step while
    it is still the row's running slot (vLLM hashes it at schedule time), and kept live when the request moves
    on; each move with its pre-copy and the rows on the new slot; hits of whole blocks on live checkpoints."""
    n: Counter[str] = Counter()
    slot_of: dict[int, int] = {}
    cached: dict[int, int] = {}
    live: set[int] = set()  # checkpoint slots
    for step in trace.steps:
        meta = step.metadata or {}
        rows = {r.id: r for r in step.rows}
        assert "copies_after" not in meta
        live -= set(meta.get("evict", []))
        hits = {h["request"]: h for h in meta.get("hits", [])}
        for h in hits.values():
            assert h["tokens"] % bs == 0 and h["tokens"] > 0 and rows[h["request"]].cached_tokens == h["tokens"]
            assert [h["slot"], rows[h["request"]].slot] in meta["copies_before"] and h["slot"] in live
            n["hits"] += 1
        for mv in meta.get("moves", []):
            rid, new = mv["request"], mv["slot"]
            old = slot_of[rid]
            assert [old, new] in meta["copies_before"], f"step {step.step}: move without its pre-copy"
            assert rows[rid].slot == new and rid not in step.admit
            c = rows[rid].cached_tokens
            assert c % bs == 0 and c > 0 and cached[rid] == c
            n["moves"] += 1
            n["moves off a live checkpoint"] += old in live  # it stays live: no publish, no free
        moved = {mv["request"] for mv in meta.get("moves", [])}
        for r in step.rows:
            if r.id in slot_of and r.id not in moved:
                assert r.slot == slot_of[r.id], f"step {step.step}: request {r.id} changed slot without a move"
                want_move = r.cached_tokens % bs == 0 and r.cached_tokens > 0 and r.id not in step.admit
                n["skipped moves"] += want_move
            slot_of[r.id], cached[r.id] = r.slot, r.cached_tokens + r.new_tokens
        for c in meta.get("checkpoints", []):
            rid, slot = c["request"], c["slot"]
            assert slot == slot_of[rid] and c["tokens"] == cached[rid] and c["tokens"] % bs == 0, (
                f"step {step.step}: a checkpoint is the running block its row filled exactly at this step"
            )
            assert slot not in live
            live.add(slot)
            n["boundary checkpoints"] += 1
            n["donated at finish"] += rid in step.finish
        for rid in step.finish:
            slot_of.pop(rid, None)
    return n


def test_align_same_seed_same_trace():
    assert run_al(seed=5, steps=120) == run_al(seed=5, steps=120)
    assert run_al(seed=5, steps=120) != run_al(seed=6, steps=120)


@pytest.mark.parametrize("kw", [dict(), dict(mixed=True), dict(block_size=8, chunk_size=24), dict(max_cached=0)])
def test_align_moves_precopy_and_checkpoint_by_the_rules(kw):
    trace = run_al(seed=1, **kw)
    n = audit_al(trace, kw.get("block_size", 16))
    assert n["moves"] > 0
    if kw.get("max_cached") == 0:
        assert n["boundary checkpoints"] == n["hits"] == n["moves off a live checkpoint"] == 0
    else:
        assert n["boundary checkpoints"] > 0 and n["hits"] > 0 and n["moves off a live checkpoint"] > 0


@pytest.mark.parametrize("bs", [16, 8])
def test_align_chunks_end_at_block_boundaries_or_prompt_ends(bs, monkeypatch):
    prompts = recorded_prompts(monkeypatch)
    trace = run_al(seed=2, steps=200, block_size=bs, chunk_size=24)
    checked = tails = 0
    for step in trace.steps:
        if step.mode not in ("extend", "mixed"):
            continue
        for r in step.rows:
            if r.cached_tokens >= len(prompts[r.id]):
                continue  # a decode row of a mixed step
            end = r.cached_tokens + r.new_tokens
            assert end == len(prompts[r.id]) or end % bs == 0, (step.step, r)
            last = (len(prompts[r.id]) - 1) // bs * bs  # vLLM's last cacheable position: a chunk stops there
            assert r.cached_tokens % bs == 0 and not r.cached_tokens < last < end, (step.step, r, last)
            checked += 1
            tails += end == len(prompts[r.id]) and r.cached_tokens == last > 0
    assert tails > 5  # the prompt's tail after its last whole block: a chunk of its own
    assert checked > 20


def test_align_rows_and_metadata_are_vllm_shaped():
    trace = run_al(seed=0, steps=200)
    assert trace.header.profile == "vllm" and "target_verify" not in trace.header.buckets
    keys = {k for s in trace.steps for k in (s.metadata or {})}
    assert {"moves", "copies_before", "checkpoints", "hits"} <= keys and "copies_after" not in keys


def test_align_traces_replay_clean_with_every_checkpoint_verified():
    from workbench.traces.replay import replay_trace

    for kw in (dict(seed=0), dict(seed=3, dp_dummies=True, mixed=True)):
        trace = run_al(steps=150, **kw)
        n = audit_al(trace)
        result = replay_trace(trace)
        assert result.ok, str(result)
        assert result.checkpoints == result.verified == n["boundary checkpoints"] > 0
        assert result.hits == n["hits"] > 0


def test_align_a_request_finishing_as_its_step_fills_a_block_donates_the_published_block():
    from workbench.traces.replay import replay_trace

    trace = run_al(seed=4, steps=120, output_lens=(1, 2))  # some finish at their last prefill chunk
    n = audit_al(trace)
    assert n["donated at finish"] > 0
    result = replay_trace(trace)
    assert result.ok, str(result)
    assert result.checkpoints == result.verified == n["boundary checkpoints"]


def test_cli_runs_align(simulated, capsys):
    seen = simulated
    assert cli.main(["trace", "run", "--profile", "vllm", "--steps", "3", "--prefix-cache", "align"]) == 0
    assert seen["prefix_cache"] == "align"
    capsys.readouterr()
    assert cli.main(["trace", "run", "--profile", "sglang", "--steps", "3", "--prefix-cache", "align"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "profile = 'sglang'" in err[0] and "align" in err[0]


@pytest.mark.parametrize(
    "kw, field, value",
    [
        (dict(profile="sglang-ascend"), "profile", "'sglang-ascend'"),
        (dict(layer="rwkv"), "layer", "'rwkv'"),
        (dict(block_size=0), "block_size", "0"),
        (dict(block_size=True), "block_size", "True"),
        (dict(block_size=64), "block_size", "64"),  # past chunk_size = 32
        (dict(prefix_cache="no_buffer", profile="sglang", block_size=16), "block_size", "16"),
        (dict(prefix_cache="extra_buffer", profile="vllm"), "profile", "'vllm'"),
    ],
)
def test_align_refusals_name_the_field_and_value(kw, field, value):
    kw = dict(kw)
    with pytest.raises(SimulationError, match=f"{field} = {value}"):
        simulate(kw.pop("profile", "vllm"), kw.pop("layer", "gdn"), steps=5, **{"prefix_cache": "align", **kw})
