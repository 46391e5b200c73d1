"""vLLM's align mode with speculation (``simulate(..., prefix_cache="align", spec=D)``): each request owns a
window of D blocks that slides with the block of its last scheduled token (the pre-copy), and a verify whose
accepted tokens reach a block's end copies the state of exactly that position into the block (the post-copy,
``postprocess_mamba``). The audit re-derives every window, copy and checkpoint from the rows alone; the
replay checks each checkpoint against the float64 state of exactly its prefix; each way of getting a copy
wrong is caught at its step."""

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from workbench.traces.model import Trace, TraceRow, TraceStep
from workbench.traces.replay import replay_trace
from workbench.traces.simulate import SimulationError, simulate

BS = 16


def run(spec: int, seed: int = 0, steps: int = 150, **kw: Any) -> Trace:
    return simulate("vllm", "gdn", steps=steps, seed=seed, spec=spec, prefix_cache="align", **kw)


class Audit:
    """vLLM 0.33.0's rules (``preprocess_mamba``, ``postprocess_mamba_fused_kernel``, the block-table window,
    ``MambaManager.cache_blocks``' timing: a block holding its boundary state is published in the step that
    gave it that state, still the running block), re-derived from a trace's rows and metadata alone."""

    def __init__(self, d: int, bs: int) -> None:
        self.d, self.bs = d, bs
        self.window: dict[int, list[int]] = {}  # request -> its D slots: blocks curr .. curr + D - 1
        self.curr: dict[int, int] = {}
        self.accepted: dict[int, int] = {}  # vLLM's num_accepted_tokens for the request's next step
        self.pending: dict[int, int] = {}  # request -> the block curr - 1 it left, held for the post-copy
        self.live: set[int] = set()  # checkpoint slots
        self.n: Counter[str] = Counter()

    def step(self, step: TraceStep) -> None:
        meta = step.metadata or {}
        self.live -= set(meta.get("evict", []))
        cps = {c["slot"]: c for c in meta.get("checkpoints", [])}
        moves = {mv["request"]: mv for mv in meta.get("moves", [])}
        for r in step.rows:
            self.slide(step, r, moves.get(r.id), meta.get("copies_before", []), cps)
        allowed: dict[int, dict[str, int]] = {}  # slot -> the checkpoint this step may publish there
        after: list[list[int]] = []
        for r in step.rows:
            self.forward(step, r, after, allowed, cps)
        assert meta.get("copies_after", []) == after, f"step {step.step}: the post-copies"
        for slot, c in cps.items():
            assert allowed.get(slot) == c, f"step {step.step}: checkpoint {c} is none the rules publish"
        self.live |= set(cps)
        for rid in step.finish:
            for table in (self.window, self.curr, self.accepted, self.pending):
                table.pop(rid, None)
        self.n["steps"] += 1

    def slide(self, step: TraceStep, r: TraceRow, mv: dict[str, Any] | None, before: list[list[int]], cps) -> None:
        """Before the forward: the row's window, slid (with its pre-copy) when its last token enters a new block."""
        d = self.d
        assert r.slots is not None and len(r.slots) == d and r.slots[0] == r.slot
        assert r.kind == ("verify" if r.accepted is not None else "extend"), r
        here = (r.cached_tokens + r.new_tokens - 1) // self.bs  # the block of the last scheduled token
        if r.id in step.admit:
            self.window[r.id], self.curr[r.id], self.accepted[r.id] = list(r.slots), here, 1
            assert mv is None
            return
        curr = self.curr[r.id]
        if here == curr:
            assert mv is None and list(r.slots) == self.window[r.id], f"step {step.step}: moved without a move"
            return
        old = self.window[r.id]
        assert mv is not None and mv["slots"] == list(r.slots) and here > curr
        for j in range(here, curr + d):  # blocks both windows hold keep their slots
            assert r.slots[j - here] == old[j - curr]
        src = old[self.accepted[r.id] - 1]  # the pre-copy: the state where the last step left it
        assert src == r.slots[0] or [src, r.slots[0]] in before, f"step {step.step}: no pre-copy"
        left = old[0]
        if "keep" in mv:
            assert mv["keep"] == [left]  # published at this step only after its post-copy (below)
            self.pending[r.id] = left
            self.n["kept for a post-copy"] += 1
        else:
            assert left not in cps, f"step {step.step}: a block is published as it fills, not as the window leaves"
            self.n["left as a live checkpoint"] += left in self.live
        self.window[r.id], self.curr[r.id], self.accepted[r.id] = list(r.slots), here, 1
        self.n["slides"] += 1

    def forward(self, step: TraceStep, r: TraceRow, after: list[list[int]], allowed: dict, cps) -> None:
        """After the forward: the post-copy a verify's accepted tokens call for, and the checkpoints that may
        follow (a block the row filled, running; the block left, after its post-copy)."""
        n, d, bs = self.n, self.d, self.bs
        window = self.window[r.id]
        if r.kind != "verify":
            self.accepted[r.id] = 1
            if r.seq_len % bs == 0 and r.id not in step.finish:  # filled its block: published, still running
                allowed[window[0]] = {"request": r.id, "tokens": r.seq_len, "slot": window[0]}
                n["published as a chunk filled it"] += window[0] in cps
            return
        assert r.accepted is not None and 1 <= r.accepted <= d
        running, new = r.cached_tokens + 1, r.cached_tokens + r.accepted
        aligned = new // bs * bs
        self.accepted[r.id] = r.accepted
        if aligned < running:
            return
        bias, dest = aligned - running, aligned // bs - 1
        if dest == self.curr[r.id]:  # within the request's own block: it then reads it there
            assert bias == d - 1 and r.accepted == d
            after.append([window[bias], window[0]])
            self.accepted[r.id] = 1
            n["post-copies into the own block"] += 1
            if r.id not in step.finish:
                allowed[window[0]] = {"request": r.id, "tokens": aligned, "slot": window[0]}
                n["published running after a post-copy"] += window[0] in cps
            return
        assert dest == self.curr[r.id] - 1 and r.id in self.pending, f"step {step.step}: no block for the post-copy"
        slot = self.pending.pop(r.id)
        after.append([window[bias], slot])
        n["post-copies into the block left"] += 1
        allowed[slot] = {"request": r.id, "tokens": aligned, "slot": slot}
        n["published after a post-copy"] += slot in cps


def audit(trace: Trace, bs: int = BS) -> Counter[str]:
    """Walk the trace with :class:`Audit`; count what happened."""
    a = Audit(trace.header.draft_tokens, bs)
    for step in trace.steps:
        a.step(step)
    return a.n


@pytest.mark.parametrize(("spec", "seed", "mixed"), [(2, 0, False), (3, 1, False), (4, 2, False), (3, 3, True)])
def test_windows_copies_and_checkpoints_follow_vllm_and_replay_clean(spec, seed, mixed):
    trace = run(spec, seed, mixed=mixed)
    assert mixed == any(s.mode == "mixed" and any(r.kind == "verify" for r in s.rows) for s in trace.steps)
    n = audit(trace)
    assert n["slides"] > 20 and n["kept for a post-copy"] > 0 and n["post-copies into the block left"] > 0
    assert n["published as a chunk filled it"] > 0 and n["published after a post-copy"] > 0
    assert n["left as a live checkpoint"] > 0
    result = replay_trace(trace)
    assert result.ok, str(result)
    assert result.checkpoints == result.verified > 0 and result.hits > 0


def test_a_verify_that_accepts_every_draft_up_to_a_block_end_copies_within_its_own_block():
    hits = Counter()
    for seed in range(6):
        hits += audit(run(2, seed, steps=200, accept_rate=0.95))
    assert hits["post-copies into the own block"] > 0 and hits["published running after a post-copy"] > 0


def _first_step_with(trace: Trace, key: str, pick) -> int:
    return next(i for i, s in enumerate(trace.steps) if any(pick(x) for x in (s.metadata or {}).get(key, [])))


def _edit(trace: Trace, i: int, **changes: Any) -> Trace:
    md = dict(trace.steps[i].metadata or {})
    md.update(changes)
    steps = list(trace.steps)
    steps[i] = replace(steps[i], metadata=md)
    return Trace(trace.header, steps)


def test_a_post_copy_from_the_wrong_draft_step_is_a_checkpoint_off_its_prefix():
    trace = run(3, 0)
    cp_slots = {c["slot"] for s in trace.steps for c in (s.metadata or {}).get("checkpoints", [])}
    i = _first_step_with(trace, "copies_after", lambda p: p[1] in cp_slots)
    step = trace.steps[i]
    pair = next(p for p in step.metadata["copies_after"] if p[1] in cp_slots)
    row = next(r for r in step.rows if pair[0] in r.slots)
    k = row.slots.index(pair[0])
    wrong = row.slots[k + 1] if k + 1 < len(row.slots) else row.slots[k - 1]
    bad = _edit(trace, i, copies_after=[[wrong, pair[1]] if p == pair else p for p in step.metadata["copies_after"]])
    d = replay_trace(bad).first
    assert d is not None and d.step == i and d.field == "checkpoint", d
    assert "off the float64 state after exactly its first" in d.detail


def test_a_slide_without_its_pre_copy_leaves_the_runner_behind():
    trace = run(2, 0)
    i = _first_step_with(trace, "moves", lambda mv: True)
    step = trace.steps[i]
    mv = step.metadata["moves"][0]
    kept = [p for p in step.metadata.get("copies_before", []) if p[1] != mv["slots"][0]]
    if len(kept) == len(step.metadata.get("copies_before", [])):
        pytest.skip("this slide needed no copy (the state was in the new first block already)")
    d = replay_trace(_edit(trace, i, copies_before=kept)).first
    assert d is not None and d.step == i and d.kind in ("state", "output"), d  # read from the new block's bytes


def test_a_post_copy_onto_the_running_block_from_an_older_one_is_refused():
    """vLLM issue 53505's shape: the copy after the step writes the running block from a block the window
    left (a checkpoint), replacing the state the step computed."""
    trace = run(2, 0)
    live: dict[int, int] = {}  # checkpoint slot -> the step that published it
    for i, step in enumerate(trace.steps):
        md = step.metadata or {}
        for slot in md.get("evict", []):
            live.pop(slot, None)
        older = [slot for slot, j in live.items() if j < i]
        if step.mode == "target_verify" and older:
            break
        live.update({c["slot"]: i for c in md.get("checkpoints", [])})
    row = step.rows[0]
    d = replay_trace(_edit(trace, i, copies_after=[[older[0], row.slots[0]]])).first
    assert d is not None and d.step == i and d.field == "copy", d
    assert "replacing the state its step computed" in d.detail


def test_a_keep_of_a_block_the_window_does_not_leave_is_named():
    trace = run(2, 0)
    i = _first_step_with(trace, "moves", lambda mv: True)
    mv = trace.steps[i].metadata["moves"][0]
    bad = _edit(trace, i, moves=[{**mv, "keep": [mv["slots"][-1]]}] + trace.steps[i].metadata["moves"][1:])
    d = replay_trace(bad).first
    assert d is not None and d.step == i and d.field == "move" and "is not a slot the request leaves" in d.detail, d


def test_a_row_naming_other_slots_than_its_moves_leave_is_named():
    trace = run(2, 0)
    i = _first_step_with(trace, "moves", lambda mv: True)
    step = trace.steps[i]
    k = next(k for k, r in enumerate(step.rows) if r.id == step.metadata["moves"][0]["request"])
    rows = list(step.rows)
    rows[k] = replace(rows[k], slots=(rows[k].slots[0], *reversed(rows[k].slots[1:])))
    if rows[k].slots == step.rows[k].slots:
        rows[k] = replace(rows[k], slots=(*step.rows[k].slots[:-1], trace.header.num_slots - 1))
    steps = list(trace.steps)
    steps[i] = replace(step, rows=tuple(rows))
    d = replay_trace(Trace(trace.header, steps)).first
    assert d is not None and d.step == i and d.field == "slots" and "the request owns" in d.detail, d


@pytest.mark.parametrize(
    ("kw", "field", "value"),
    [(dict(spec=3, block_size=2, chunk_size=8), "block_size", "2")],
)
def test_refusals_name_the_field_and_value(kw, field, value):
    kw = {"spec": 2, **kw}
    with pytest.raises(SimulationError, match=f"{field} = {value}"):
        simulate("vllm", "gdn", steps=5, prefix_cache="align", **kw)
