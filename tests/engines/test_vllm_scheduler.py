"""vLLM 0.33.0's own scheduler as a trace source (``workbench.engines.vllm_scheduler``, issue 29): the traces it
writes are whole (a symbolic replay below follows every slot's owner and the prefix of tokens each state is
of, as the replay's rules say), read back, and replay clean with hits and verified checkpoints, mixed steps
with verify rows among them.

Needs vLLM 0.33.0 installed (``make engines``; ``make test-engines`` runs these); skipped, with the reason,
where it is not.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from workbench.engines.versions import EngineError, check_supported

try:
    check_supported("vllm")
except EngineError as e:
    pytest.skip(f"vllm is not importable here: {e}", allow_module_level=True)

from workbench.engines.scheduler_base import SchedulerTrace, WorkloadSettings  # noqa: E402
from workbench.engines.vllm_scheduler import DRIVER_STANDINS, run_vllm_scheduler  # noqa: E402

pytestmark = pytest.mark.engines

BLOCK = 16


# -- a symbolic replay: owners and state labels, slot by slot ------------------------------------------
@dataclass
class Symbolic:
    """Follows a trace's slots as the replay does, with a label for each slot's state instead of numbers:
    the token ids it is the state after (``None``: unknown, ``("x",)``: a rejected draft's). Every breach of
    the format's rules (and of the relaxed ones of issue 29: a checkpoint on the block its request still
    fills, kept live when the request moves on) is a line in ``errors``; ``counts`` says what was seen."""

    d: int  # slots per request
    owner: dict[int, int] = field(default_factory=dict)  # slot -> request whose window holds it
    window: dict[int, list[int]] = field(default_factory=dict)
    pending: dict[int, int] = field(default_factory=dict)  # slot -> request that keeps it for a post-copy
    live: dict[int, tuple[int, ...]] = field(default_factory=dict)  # slot -> the prefix its checkpoint holds
    label: dict[int, tuple[Any, ...] | None] = field(default_factory=dict)
    history: dict[int, list[int]] = field(default_factory=dict)  # request -> the ids in its state
    accepted: dict[int, int] = field(default_factory=dict)  # request -> the count its next verify reads
    errors: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    n: int = -1

    def err(self, msg: str) -> None:
        self.errors.append(f"step {self.n}: {msg}")

    def taken(self, slot: int) -> bool:
        return slot in self.owner or slot in self.pending or slot in self.live

    def step(self, s: dict[str, Any]) -> None:
        self.n, md, rows = s["step"], s.get("metadata") or {}, s["rows"]
        self.unique(rows)
        for slot in md.get("evict", []):
            if self.live.pop(slot, None) is None:
                self.err(f"evict {slot}: no live checkpoint")
        by_id = {r["id"]: r for r in rows}
        for rid in s["admit"]:
            self.admit(rid, by_id[rid])
        for hit in md.get("hits", []):
            self.hit(hit, by_id.get(hit["request"]), s["admit"])
        self.copies_before(md.get("copies_before", []), md.get("moves", []), s["admit"])
        for mv in md.get("moves", []):
            self.move(mv)
        reads = iter(md.get("num_accepted_tokens") or [])
        for r in rows:
            self.forward(r, reads)
        for r in rows:
            kept = r["accepted"] if r["kind"] == "verify" else r["new_tokens"]
            self.history[r["id"]].extend(r["tokens"][:kept])
            self.accepted[r["id"]] = r["accepted"] if r["kind"] == "verify" else 1
        for src, dst in md.get("copies_after", []):
            self.copy_after(src, dst)
        for cp in md.get("checkpoints", []):
            self.checkpoint(cp["request"], cp["tokens"], cp["slot"])
        for rid in s["finish"]:
            for slot in self.window.pop(rid):
                del self.owner[slot]
            for slot in [x for x, o in self.pending.items() if o == rid]:
                del self.pending[slot]

    def unique(self, rows: list[dict[str, Any]]) -> None:
        for key in ("id", "req_pool_index"):
            values = [r[key] for r in rows]
            if len(set(values)) != len(values):
                self.err(f"{key} repeats: {values}")
        slots = [x for r in rows for x in r.get("slots", [r["slot"]])]
        if len(set(slots)) != len(slots):
            self.err(f"a slot is in two rows: {slots}")

    def admit(self, rid: int, row: dict[str, Any]) -> None:
        slots = row.get("slots", [row["slot"]])
        for slot in slots:
            if self.taken(slot) or slot == 0:
                self.err(f"admit {rid}: slot {slot} is not free")
            self.owner[slot] = rid
        self.window[rid], self.history[rid], self.accepted[rid] = list(slots), [], 1

    def hit(self, hit: dict[str, Any], row: dict[str, Any] | None, admitted: list[int]) -> None:
        rid, n, slot = hit["request"], hit["tokens"], hit["slot"]
        if slot not in self.live:
            self.err(f"hit of {rid} on slot {slot}: no live checkpoint")
            return
        if len(self.live[slot]) != n or rid not in admitted or row is None or row["cached_tokens"] != n:
            self.err(f"hit of {rid} ({n} tokens) on a checkpoint of {len(self.live[slot])}")
        self.history[rid] = list(self.live[slot])
        self.counts["hits"] += 1

    def copies_before(self, pairs: list[list[int]], moves: list[dict[str, Any]], admitted: list[int]) -> None:
        writable = {x for rid in admitted for x in self.window[rid]}
        writable |= {mv["slots"][0] if "slots" in mv else mv["slot"] for mv in moves}
        for src, dst in pairs:
            if src == dst or (src not in self.owner and src not in self.live):
                self.err(f"copies_before {src} -> {dst}: a self-copy or nothing to read")
            if dst in self.live or dst not in writable:
                self.err(f"copies_before {src} -> {dst}: writes a checkpoint or a slot no admission or move takes")
            self.label[dst] = self.label.get(src)

    def move(self, mv: dict[str, Any]) -> None:
        rid = mv["request"]
        new, old, keep = mv.get("slots", [mv.get("slot")]), self.window[rid], mv.get("keep", [])
        for slot in new:
            if slot not in old and self.taken(slot):
                self.err(f"move of {rid} into slot {slot}, which is taken")
        for slot in old:
            if slot in new:
                continue
            del self.owner[slot]
            if slot in keep:
                self.pending[slot] = rid
            elif slot in self.live:
                self.counts["moved_off_a_checkpoint"] += 1
        if any(slot in new or slot not in old for slot in keep):
            self.err(f"move of {rid}: keep {keep} is not what it leaves")
        for slot in new:
            self.owner[slot] = rid
        self.window[rid], self.accepted[rid] = list(new), 1

    def forward(self, r: dict[str, Any], reads: Any) -> None:
        rid, slots = r["id"], r.get("slots", [r["slot"]])
        have = tuple(self.history[rid])
        if slots != self.window[rid] or r["slot"] != slots[0]:
            self.err(f"row of {rid}: slots {slots}, its window {self.window[rid]}")
        if r["cached_tokens"] != len(have) or r["seq_len"] != r["cached_tokens"] + r["new_tokens"]:
            self.err(f"row of {rid}: cached_tokens {r['cached_tokens']}, its state holds {len(have)}")
        if len(r["tokens"]) != r["new_tokens"]:
            self.err(f"row of {rid}: {len(r['tokens'])} token ids for {r['new_tokens']} tokens")
        if any(slot in self.live for slot in slots):
            self.err(f"row of {rid} writes a live checkpoint in {slots}")
        verify = r["kind"] == "verify"
        read = slots[self.accepted[rid] - 1] if verify else slots[0]
        if (verify or r["cached_tokens"]) and self.label.get(read) != have:
            self.err(f"row of {rid} reads slot {read}, which holds another state than its {len(have)} tokens")
        if verify:
            recorded = next(reads, None)
            if recorded != self.accepted[rid] or r["new_tokens"] != self.d:
                self.err(f"verify of {rid}: num_accepted_tokens {recorded}, the rules say {self.accepted[rid]}")
            for t in range(self.d):
                self.label[slots[t]] = (*have, *r["tokens"][: t + 1]) if t < r["accepted"] else ("x",)
        else:
            self.label[read] = (*have, *r["tokens"])
        self.counts[f"rows_{r['kind']}"] += 1

    def copy_after(self, src: int, dst: int) -> None:
        o = self.owner.get(dst)
        own = o is not None and dst == self.window[o][0] and src == self.window[o][self.accepted[o] - 1]
        if src == dst or dst in self.live or (o is not None and not own):
            self.err(f"copies_after {src} -> {dst}: a self-copy, or writes a checkpoint or a running slot")
        if own and o is not None:
            self.accepted[o] = 1
        self.label[dst] = self.label.get(src)
        self.counts["post_copy_own" if own else "post_copy_left"] += 1

    def checkpoint(self, rid: int, n: int, slot: int) -> None:
        have = self.history[rid]
        o = self.owner.get(slot)
        if n > len(have) or n % BLOCK or (o is not None and o != rid) or (o == rid and n != len(have)):
            self.err(f"checkpoint of {rid} ({n} tokens) on slot {slot}: its state holds {len(have)}, owner {o}")
        if self.label.get(slot) != tuple(have[:n]):
            self.err(f"checkpoint of {rid} ({n} tokens) on slot {slot}: the slot holds another state")
        else:
            self.counts["checkpoints_verified"] += 1
        self.counts["checkpoints_on_running_block"] += o == rid
        self.pending.pop(slot, None)
        self.live[slot] = tuple(have[:n])


def symbolic(trace: SchedulerTrace) -> Symbolic:
    h = trace.header
    sym = Symbolic(h["draft_tokens"] if "target_verify" in h["buckets"] else 1)
    for s in trace.steps:
        sym.step(s)
    return sym


# -- runs ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run300() -> SchedulerTrace:
    return run_vllm_scheduler(steps=300, seed=0, spec=2, prefix_cache="align")


def test_the_header_names_the_engine_and_its_conventions(run300):
    import vllm

    h = run300.header
    assert (h["profile"], h["layer"], h["draft_tokens"], h["accepted"]) == ("vllm", "gdn", 2, "tokens")
    assert h["engine"]["name"] == "vllm" and h["engine"]["version"] == vllm.__version__ == "0.33.0"
    assert h["num_slots"] == 1200 and "zero_on_alloc" not in h  # vLLM does not zero mamba blocks
    assert set(h["buckets"]) == {"decode", "target_verify"} and h["buckets"]["target_verify"][-1] >= 16
    assert len(run300.notes) == 3 + len(DRIVER_STANDINS)


def test_300_steps_are_whole_slot_by_slot_with_hits_and_checkpoints(run300):
    sym = symbolic(run300)
    assert not sym.errors, sym.errors[:5]
    st = run300.stats
    assert st["steps"] + st["empty_steps"] == 300 and len(run300.steps) == st["steps"] >= 290
    assert sym.counts["hits"] == st["hits"] >= 60
    assert sym.counts["checkpoints_verified"] == st["published"] >= 150
    assert sym.counts["checkpoints_on_running_block"] >= 50  # vLLM publishes the block a chunk fills
    assert sym.counts["post_copy_left"] >= 50 and sym.counts["post_copy_own"] >= 5


def test_mixed_steps_hold_verify_rows_in_the_runners_order(run300):
    mixed = [s for s in run300.steps if s["mode"] == "mixed"]
    with_verify = [s for s in mixed if any(r["kind"] == "verify" for r in s["rows"])]
    assert len(with_verify) >= 60 and run300.stats["steps_verify_with_others"] == len(with_verify)
    for s in with_verify:
        kinds = [r["kind"] for r in s["rows"]]
        assert kinds == sorted(kinds, key=lambda k: k != "verify")  # Model Runner V2: verify rows lead
        md = s["metadata"]
        spec, rest = md["spec_state_indices_tensor"], md["non_spec_state_indices_tensor"]
        assert spec == [r["slots"] for r in s["rows"] if r["kind"] == "verify"]
        assert rest == [r["slot"] for r in s["rows"] if r["kind"] != "verify"]
        assert md["num_spec_decodes"] == len(spec)
    verify = next(s for s in run300.steps if s["mode"] == "target_verify")
    assert verify["metadata"]["non_spec_state_indices_tensor"] is None


def test_the_trace_reads_writes_and_replays_clean(run300, tmp_path):
    from workbench.traces.format import read_trace, write_trace
    from workbench.traces.replay import replay_trace

    lines = list(run300.lines())
    trace = read_trace(lines)
    assert len(trace) == len(run300.steps) and trace.header.engine is not None
    path = tmp_path / "vllm.jsonl"
    write_trace(trace, path)
    assert read_trace(path) == trace
    head = read_trace(lines[:91])  # 90 steps: a minute's replay on a slow CPU
    result = replay_trace(head)
    assert result.ok, result.summary()
    assert result.hits >= 20 and result.verified == result.checkpoints >= 60
    assert any(s.mode == "mixed" and any(r.kind == "verify" for r in s.rows) for s in head.steps)


def test_an_mtp_drafter_of_two_tokens_windows_three_blocks_and_replays_clean():
    from workbench.traces.format import read_trace
    from workbench.traces.replay import replay_trace

    trace = run_vllm_scheduler(steps=300, seed=2, spec=3)  # the measured deployment: D = 3
    sym = symbolic(trace)
    assert not sym.errors, sym.errors[:5]
    assert trace.header["draft_tokens"] == 3 and all(len(r["slots"]) == 3 for s in trace.steps for r in s["rows"])
    assert sym.counts["checkpoints_verified"] == trace.stats["published"] and trace.stats["precopies_self"] >= 10
    result = replay_trace(read_trace(list(trace.lines())[:41]))
    assert result.ok and result.verified == result.checkpoints > 0, result.summary()


def test_the_replay_reads_what_the_driver_recorded():
    from workbench.traces.format import read_trace
    from workbench.traces.replay import replay_trace

    trace = run_vllm_scheduler(steps=20, seed=0)
    lines = list(trace.lines())
    at, step = next((i, s) for i, s in enumerate(trace.steps) if (s["metadata"] or {}).get("hits"))
    broken = json.loads(json.dumps(step))
    hit = broken["metadata"]["hits"][0]
    broken["metadata"]["copies_before"] = [c for c in broken["metadata"]["copies_before"] if c[0] != hit["slot"]]
    lines[at + 1] = json.dumps(broken)
    result = replay_trace(read_trace(lines[: at + 2]))
    assert not result.ok and result.divergences[0].step == step["step"]


def test_a_small_pool_evicts_and_preempts_and_stays_whole():
    trace = run_vllm_scheduler(steps=300, seed=0, num_blocks=90)
    sym = symbolic(trace)
    assert not sym.errors, sym.errors[:5]
    assert trace.stats["evicted"] >= 50 and trace.stats["preempted"] >= 1
    evicted = sum(len((s["metadata"] or {}).get("evict", [])) for s in trace.steps)
    assert evicted == trace.stats["evicted"] - trace.stats["evictions_not_live"]


def test_without_speculation_each_request_has_one_block():
    trace = run_vllm_scheduler(steps=120, seed=1, spec=0)
    sym = symbolic(trace)
    assert not sym.errors, sym.errors[:5]
    assert "target_verify" not in trace.header["buckets"]
    assert {r["kind"] for s in trace.steps for r in s["rows"]} == {"decode", "extend"}
    moves = [mv for s in trace.steps for mv in (s["metadata"] or {}).get("moves", [])]
    assert moves and all(set(mv) == {"request", "slot"} for mv in moves)
    assert sym.counts["hits"] >= 10


def test_a_seed_is_one_trace():
    settings = WorkloadSettings(first_burst=3)
    a, b = (list(run_vllm_scheduler(steps=40, seed=5, workload=settings).lines()) for _ in range(2))
    assert a == b
    assert a != list(run_vllm_scheduler(steps=40, seed=6, workload=settings).lines())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prefix_cache": "none"}, "mamba_cache_mode='align' only"),
        ({"layer": "mamba2"}, "GDN builder only"),
        ({"steps": 0}, "steps = 0"),
        ({"spec": 20}, "block of at least D = 20"),
        ({"spec": 1}, "D >= 2"),
    ],
)
def test_what_the_driver_does_not_run_is_refused_by_name(kwargs, message):
    with pytest.raises(EngineError, match=message):
        run_vllm_scheduler(**{"steps": 5, **kwargs})
