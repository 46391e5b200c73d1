"""The simulator follows vLLM's own scheduler (issue 29): the shape of a simulated vLLM trace (align mode, prefix
caching, verify rows of D = 3 tokens, mixed steps) against the statistics of a 300-step run of vLLM 0.33.0's
real ``Scheduler`` (``tests/fixtures/vllm_0_33_0_scheduler_shape.json``: numbers only, its ``note`` says how
they were produced), each within a stated bound; and the invariants of every row the simulator writes.

The simulated workload mirrors the real run's where the simulator's knobs allow (block 16, D = 3, 16 running
requests, a 256-token budget, each draft kept with probability 0.6, 0.35 arrivals a step, 3 shared system
prompts, follow-ups 0.3, 8..48 output tokens). It differs in the prompts: the real run's system prompts are
77, 150 and 230 tokens and every prompt is a whole system prompt plus 5..90 own tokens; the simulator's
system prompts have lengths drawn in 77..230 and a prompt is the first ``prompt_len`` (82..320) tokens of one
then its own, and a follow-up must fit ``prompt_lens``. So fewer prompts end just past their system prompt,
where the checkpoint others hit lies: the hit rate's bound is one-sided and wide. Four seeds are pooled."""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from workbench.traces.model import Trace, TraceStep
from workbench.traces.simulate import simulate

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_0_33_0_scheduler_shape.json"
D = 3
LIKE_THE_REAL_RUN: dict[str, Any] = dict(
    spec=D,
    mixed=True,
    prefix_cache="align",
    block_size=16,
    chunk_size=256,
    token_budget=256,
    max_running=16,
    accept_rate=0.6,
    arrival_rate=0.35,
    prompt_lens=(82, 320),
    prefix_len=(77, 230),
    shared_prefixes=3,
    followup_rate=0.3,
    output_lens=(8, 48),
)
SEEDS = range(4)


@cache
def real() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


@cache
def traces() -> tuple[Trace, ...]:
    return tuple(simulate("vllm", "gdn", steps=real()["steps"], seed=s, **LIKE_THE_REAL_RUN) for s in SEEDS)


def kinds(step: TraceStep) -> set[str]:
    return {r.kind for r in step.rows if r.kind is not None}


@cache
def shape() -> Counter[str]:
    """The pooled counts of the simulated traces, named as the fixture's."""
    n: Counter[str] = Counter()
    for trace in traces():
        for step in trace.steps:
            if step.mode == "idle":  # the real run records no empty step
                continue
            md = step.metadata or {}
            rows = {r.id: r for r in step.rows}
            n["steps"] += 1
            n["steps_with_verify_rows"] += "verify" in kinds(step)
            n["steps_with_verify_and_extend_rows"] += kinds(step) >= {"verify", "extend"}
            n["steps_in_v2_row_order"] += in_v2_order(step)
            n["admissions"] += len(step.admit)
            n["hits"] += len(md.get("hits", []))
            for c in md.get("checkpoints", []):
                row = rows[c["request"]]
                running = row.slots is not None and c["slot"] == row.slots[0]
                n["published_blocks"] += 1
                n["published_blocks_still_running"] += running
                n["by chunk" if row.kind == "extend" else "by own block" if running else "by post-copy"] += 1
            for r in step.rows:
                n[f"rows {r.kind}"] += 1
                if r.kind == "verify":
                    n[f"kept {r.accepted}"] += 1
    return n


def in_v2_order(step: TraceStep) -> bool:
    """vLLM V2's batch order (``sort_batch_req_ids``): verify rows first, in request order, then the other rows
    by ``(new_tokens != D, new_tokens)``."""
    verify = [r.kind == "verify" for r in step.rows]
    others = [(r.new_tokens != D, r.new_tokens) for r in step.rows if r.kind != "verify"]
    ids = [r.id for r in step.rows if r.kind == "verify"]
    return verify == sorted(verify, reverse=True) and others == sorted(others) and ids == sorted(ids)


def frac(counts: Any, part: str, whole: str) -> float:
    return counts[part] / counts[whole]


# -- the shape, against the real run -------------------------------------------------------------------------
def test_the_fixture_is_the_real_runs_numbers():
    r = real()
    assert r["engine"] == {"name": "vllm", "version": "0.33.0"} and "no engine code" in r["note"]
    assert r["config"]["draft_tokens"] == D and r["config"]["block_size"] == LIKE_THE_REAL_RUN["block_size"]
    assert sum(r["published_by"].values()) == r["published_blocks"]
    assert r["steps_in_v2_row_order"] == r["steps"]


def test_mixed_steps_batch_verify_rows_with_prefill_chunks_about_as_often_as_vllm():
    """Real: 168 of 300 steps (0.56) hold verify rows and prefill chunks together. Bound: within 0.12."""
    both = "steps_with_verify_and_extend_rows"
    sim, want = frac(shape(), both, "steps"), frac(real(), both, "steps")
    assert abs(sim - want) <= 0.12, (sim, want)
    for counts in (shape(), real()):  # with speculation nearly every step verifies
        assert frac(counts, "steps_with_verify_rows", "steps") >= 0.95


def test_about_half_the_published_blocks_are_still_their_requests_running_block():
    """Real: 149 of 299 published blocks (0.50) are the owner's running block when published. Bound: within
    0.08; and each way a block gets published (a chunk filling it, a verify filling its own block, the post-copy
    into the block the window left) within 0.1 of its real share."""
    n, r = shape(), real()
    running = "published_blocks_still_running"
    sim, want = frac(n, running, "published_blocks"), frac(r, running, "published_blocks")
    assert abs(sim - want) <= 0.08, (sim, want)
    by = r["published_by"]
    real_shares = [by[k] / r["published_blocks"] for k in sorted(by)]  # chunk, own block, post-copy (by name)
    sim_shares = [n[k] / n["published_blocks"] for k in ("by chunk", "by own block", "by post-copy")]
    assert all(abs(a - b) <= 0.1 for a, b in zip(sim_shares, real_shares, strict=True)), (sim_shares, real_shares)
    per_step = n["published_blocks"] / n["steps"], r["published_blocks"] / r["steps"]
    assert abs(per_step[0] - per_step[1]) <= 0.25, per_step


def test_admissions_hit_the_shared_prompts_checkpoints():
    """Real: 108 hits in 113 admissions (0.96). Bound: at least 0.5, and at most 0.35 below the real rate
    (the prompts differ: see the module docstring)."""
    sim, want = frac(shape(), "hits", "admissions"), frac(real(), "hits", "admissions")
    assert sim >= 0.5 and want - sim <= 0.35, (sim, want)


def test_verify_rows_keep_tokens_as_the_real_runs_acceptance_did():
    """Each draft kept with probability 0.6 until the first rejection, both sides: the shares of 1, 2, 3
    tokens kept within 0.05."""
    n, kept = shape(), real()["verify_tokens_kept"]
    total = sum(kept.values())
    for k in range(1, D + 1):
        assert abs(n[f"kept {k}"] / n["rows verify"] - kept[str(k)] / total) <= 0.05, k


def test_every_step_lays_its_rows_in_vllm_v2s_order():
    assert shape()["steps_in_v2_row_order"] == shape()["steps"] and real()["steps_in_v2_row_order"] == real()["steps"]


# -- invariants of the rows the simulator writes ----------------------------------------------------------------
MODE_KIND = {"decode": "decode", "target_verify": "verify", "extend": "extend"}
INVARIANT_CONFIGS = [
    dict(profile="vllm", spec=D, mixed=True),
    dict(profile="vllm", spec=2, mixed=True, prefix_cache="align", dp_dummies=True),
    dict(profile="vllm", mixed=True, prefix_cache="align"),
    dict(profile="vllm", spec=2),
    dict(profile="sglang", mixed=True, prefix_cache="extra_buffer"),
    dict(profile="sglang-ascend", spec=3, prefix_cache="no_buffer"),
    dict(profile="sglang", layer="mamba2", prefill=False),
]


@pytest.mark.parametrize("kw", INVARIANT_CONFIGS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_every_row_has_its_kind_and_verify_rows_their_d_tokens_and_tokens_kept(kw: dict[str, Any]):
    trace = simulate(steps=150, seed=3, **kw)
    d = trace.header.draft_tokens
    mixed_verify = 0
    for step in trace.steps:
        for r in step.rows:
            assert r.kind in ("decode", "verify", "extend"), (step.step, r)
            if step.mode != "mixed":
                assert r.kind == MODE_KIND[step.mode], (step.step, r)
            if r.kind == "verify":
                assert r.new_tokens == d and r.accepted is not None and 1 <= r.accepted <= d, (step.step, r)
                assert r.seq_len == r.cached_tokens + d
            else:
                assert r.accepted is None
            if r.kind == "decode":
                assert r.new_tokens == 1
        if step.mode == "mixed":
            assert "extend" in kinds(step) and kinds(step) & {"decode", "verify"}, step.step
            assert not kinds(step) >= {"decode", "verify"}  # a decode-phase request verifies under speculation
            mixed_verify += "verify" in kinds(step)
    assert (mixed_verify > 0) == (kw.get("mixed", False) and kw.get("spec", 0) > 0)


def test_vllm_mixed_steps_with_speculation_replay_clean():
    from workbench.traces.replay import replay_trace

    trace = simulate("vllm", steps=30, seed=1, spec=D, mixed=True, max_running=8)
    assert any(s.mode == "mixed" and "verify" in kinds(s) for s in trace.steps)
    result = replay_trace(trace)
    assert result.ok, str(result)


@pytest.mark.parametrize("profile", ["sglang", "sglang-ascend"])
def test_sglang_keeps_its_mixed_steps_free_of_verify_rows(profile: str):
    """sglang 0.5.23 keeps mixed chunked prefill on under EAGLE; a mixed step degrades the running requests
    to 1-token decode tails, so no verify row sits beside a prefill chunk."""
    trace = simulate(profile, steps=60, seed=2, mixed=True, spec=D)
    mixed = [s for s in trace.steps if s.mode == "mixed"]
    assert mixed and not any("verify" in kinds(s) for s in mixed)
    assert any("decode" in kinds(s) for s in mixed)


@pytest.mark.parametrize("profile", ["sglang", "sglang-ascend", "vllm"])
def test_the_header_says_whether_the_engine_zeroes_a_slot_it_hands_out(profile: str, tmp_path: Path) -> None:
    """sglang clears a fresh running slot (``mamba_needs_clear``), vLLM 0.33.0 does not: the simulated header says
    so, the file keeps it, and the replay of a prefix-cache trace (hits copied onto cleared slots) stays clean."""
    from workbench.profiles import PROFILES
    from workbench.traces.format import read_trace, write_trace
    from workbench.traces.replay import replay_trace

    cache = PROFILES[profile].prefix_caches[0]
    trace = simulate(profile, steps=40, seed=3, prefix_cache=cache, max_running=4)
    assert trace.header.zero_on_alloc is (profile != "vllm")
    path = tmp_path / "t.jsonl"
    write_trace(trace, path)
    assert ('"zero_on_alloc":true' in path.read_text().splitlines()[0]) is (profile != "vllm")
    back = read_trace(path)
    assert back.header.zero_on_alloc is trace.header.zero_on_alloc
    result = replay_trace(back)
    assert result.ok and any(s.metadata and s.metadata.get("hits") for s in back.steps), str(result)
