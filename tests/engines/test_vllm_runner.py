"""vLLM's two model runners in the adapter (``Adapter(..., runner=)``): Model Runner V2's request-state store
of accepted counts against a plain-Python reference, where v1 and v2 agree and where they differ, and a second
KV-cache group (``update_block_table``) against ``build()`` on that group's own block table.

Needs vLLM 0.33.0 installed (``make engines``); skipped, with the reason, where it is not.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from workbench.batch import Batch
from workbench.engines import adapter_class
from workbench.engines.versions import EngineError
from workbench.pool import StatePool

try:
    Adapter = adapter_class("vllm")
except EngineError as e:
    pytest.skip(f"vllm is not importable here: {e}", allow_module_level=True)

from workbench.engines import vllm_0_33_0 as vllm_module  # noqa: E402  (the helpers of both runners)
from workbench.engines.check import engine_check  # noqa: E402

pytestmark = pytest.mark.engines

BUCKETS = (1, 2, 4, 8)
LAYERS = ("gdn", "mamba2")


def pool_of(d: int, seed: int = 0) -> StatePool:
    """A pool of 40 live requests of ``d`` slots each, scattered by frees."""
    pool = StatePool(400, "vllm", slots_per_request=d)
    rows = pool.alloc(40).tolist()
    pool.free(rows[seed % 3 :: 3])
    pool.alloc(6)
    return pool


def make(pool: StatePool, layer: str = "gdn", d: int = 3, **kwargs: Any) -> Any:
    return Adapter(pool, BUCKETS, d, layer=layer, **kwargs)


def accepted(meta: Any) -> list[int]:
    assert meta.num_accepted_tokens is not None
    return [int(v) for v in meta.num_accepted_tokens.tolist()]


# -- the runner parameter -------------------------------------------------------------------------------
def test_v2_is_the_default_and_both_runners_are_named() -> None:
    pool = pool_of(3)
    assert Adapter.RUNNERS == ("v2", "v1")
    assert make(pool).runner == "v2" and make(pool, runner="v1").runner == "v1"
    assert make(pool).accepted is not None and make(pool, runner="v1").accepted is None


def test_an_unknown_runner_is_refused_by_name() -> None:
    with pytest.raises(EngineError, match=r"runner: 'v3'"):
        make(pool_of(3), runner="v3")
    with pytest.raises(EngineError, match=r"runner: 'v3'"):
        engine_check(Adapter, runner="v3", batches=1, replays=1)


def test_an_engine_without_runners_refuses_one_by_name() -> None:
    from workbench.engines.check import _with_runner

    class NoRunners:
        engine = "sglang"

    with pytest.raises(EngineError, match=r"runner: sglang has no model runner.*'v2'"):
        _with_runner(NoRunners, "v2")  # type: ignore[arg-type]


def test_v1_refuses_the_v2_store_by_name() -> None:
    eng = make(pool_of(3), runner="v1")
    with pytest.raises(EngineError, match=r"runner 'v1' keeps no request-state store"):
        eng.postprocess([1], [2])
    with pytest.raises(EngineError, match=r"runner 'v1'"):
        eng.add_request([1])


# -- V2's accepted-count store against a reference --------------------------------------------------------
class Reference:
    """V2's ``num_accepted_tokens_gpu`` in plain Python: ones; ``max(n, 1)`` per row after a step (rows -1
    skipped); 1 for a new request; a verify batch's counts are the previous step's; after each step the
    adapter builds, one sampled token per row."""

    def __init__(self, rows: int) -> None:
        self.store = [1] * rows

    def postprocess(self, rows: list[int], ns: list[int]) -> None:
        for r, n in zip(rows, ns, strict=True):
            if r != -1:
                self.store[r] = n if n > 1 else 1

    def add_request(self, rows: list[int]) -> None:
        for r in rows:
            self.store[r] = 1

    def verify(self, rows: list[int], counts: list[int] | None, bucket: int | None) -> list[int]:
        if counts is not None:
            self.postprocess(rows, counts)
        got = [self.store[r] for r in rows]
        if bucket is not None:
            got += [1] * (bucket - len(rows))
        self.postprocess(rows, [1] * len(rows))  # the step's own outcome, as the adapter assumes it
        return got


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layer", LAYERS)
def test_the_v2_store_matches_the_reference_over_random_steps(layer: str, seed: int) -> None:
    rng = random.Random(seed)
    d = 3
    pool = pool_of(d, seed)
    eng = make(pool, layer, d)
    ref = Reference(pool.mapping.shape[0])
    live = pool.live_rows
    for step in range(60):
        op = rng.choice(["postprocess", "postprocess", "add", "verify", "verify", "verify"])
        rows = rng.sample(live, rng.randint(1, 8))
        if op == "postprocess":
            rows = [r if rng.random() > 0.2 else -1 for r in rows]
            ns = [rng.randint(0, d) for _ in rows]
            eng.postprocess(rows, ns)
            ref.postprocess(rows, ns)
        elif op == "add":
            eng.add_request(rows)
            ref.add_request(rows)
        else:
            counts = None if rng.random() < 0.5 else [rng.randint(1, d) for _ in rows]
            batch = Batch.target_verify(rows, [rng.randint(d, 900) for _ in rows], d, num_accepted_tokens=counts)
            bucket = None if rng.random() < 0.5 else min(b for b in BUCKETS if b >= len(rows))
            meta = eng.eager(batch) if bucket is None else eng.replay(batch, bucket)
            assert accepted(meta) == ref.verify(rows, counts, bucket), f"{layer} step {step} rows {rows}"
        assert eng.accepted.tolist() == ref.store, f"{layer} step {step} ({op})"


@pytest.mark.parametrize("layer", LAYERS)
def test_a_verify_after_a_step_that_sampled_nothing_reads_1(layer: str) -> None:
    """V2's clamp: a chunked prompt samples 0 tokens, postprocess_state stores max(0, 1)."""
    pool = pool_of(3)
    eng = make(pool, layer)
    rows = pool.live_rows[:3]
    eng.postprocess(rows, [0, 3, 2])
    meta = eng.eager(Batch.target_verify(rows, [40, 41, 42], 3))
    assert accepted(meta) == [1, 3, 2]


@pytest.mark.parametrize("layer", LAYERS)
def test_a_new_request_in_a_row_reads_1(layer: str) -> None:
    pool = pool_of(3)
    eng = make(pool, layer)
    rows = pool.live_rows[:2]
    eng.postprocess(rows, [3, 2])
    eng.add_request(rows[:1])
    assert accepted(eng.eager(Batch.target_verify(rows, [40, 41], 3))) == [1, 2]


@pytest.mark.parametrize("layer", LAYERS)
def test_padded_rows_read_1_and_a_step_leaves_1_behind(layer: str) -> None:
    pool = pool_of(3)
    eng = make(pool, layer)
    rows = pool.live_rows[:2]
    eng.postprocess(rows, [3, 2])
    assert accepted(eng.replay(Batch.target_verify(rows, [40, 41], 3), 4)) == [3, 2, 1, 1]
    assert accepted(eng.replay(Batch.target_verify(rows, [43, 44], 3), 4)) == [1, 1, 1, 1]


def test_the_gather_goes_through_the_request_rows_not_the_batch_positions() -> None:
    pool = pool_of(3)
    eng = make(pool)
    a, b, c = pool.live_rows[:3]
    eng.postprocess([a, b, c], [1, 2, 3])
    assert accepted(eng.eager(Batch.target_verify([c, a, b], [9, 9, 9], 3))) == [3, 1, 2]


# -- v1 and v2 -----------------------------------------------------------------------------------------
def _pair(layer: str, d: int, seed: int) -> Iterator[tuple[Any, Any, StatePool]]:
    pool = pool_of(d, seed)
    yield make(pool, layer, d, runner="v1"), make(pool, layer, d, runner="v2"), pool


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode", ("decode", "target_verify", "extend"))
@pytest.mark.parametrize("layer", LAYERS)
def test_v1_and_v2_agree_on_batches_that_carry_their_counts(layer: str, mode: str, seed: int) -> None:
    """Agree: every compared field of decode, extend (V2 orders the rows otherwise, each row's values are
    the same) and verify batches whose counts the batch carries, eager and replay."""
    rng = random.Random(seed)
    d = 3
    ((v1, v2, pool),) = _pair(layer, d, seed)
    for _ in range(15):
        rows = rng.sample(pool.live_rows, rng.randint(1, 8))
        seq = [rng.randint(d, 3000) for _ in rows]
        if mode == "decode":
            batch = Batch.decode(rows, seq)
        elif mode == "target_verify":
            batch = Batch.target_verify(rows, seq, d, num_accepted_tokens=[rng.randint(1, d) for _ in rows])
        else:
            batch = Batch.extend(rows, [rng.choice([1, 1, 2, rng.randint(3, 90)]) for _ in rows],
                                 [rng.choice([0, rng.randint(1, 400)]) for _ in rows])  # fmt: skip
        runs = [(v1.eager(batch), v2.eager(batch))]
        if mode != "extend":
            bucket = min(b for b in BUCKETS if b >= len(rows))
            runs.append((v1.replay(batch, bucket), v2.replay(batch, bucket)))
        for one, two in runs:
            for name in v1.compared_fields(mode):
                assert torch.equal(getattr(one, name), getattr(two, name)), f"{layer} {mode} {name} rows {rows}"


@pytest.mark.parametrize("layer", LAYERS)
def test_v1_and_v2_differ_on_counts_the_batch_does_not_carry(layer: str) -> None:
    """Differ: V2 keeps a count per request-state row between steps (here a step that sampled 3 tokens);
    the v1 adapter takes counts from the batch alone, 1 when it carries none."""
    ((v1, v2, pool),) = _pair(layer, 3, 0)
    rows = pool.live_rows[:2]
    v2.postprocess(rows, [3, 2])
    batch = Batch.target_verify(rows, [50, 60], 3)
    assert accepted(v2.eager(batch)) == [3, 2]
    assert accepted(v1.eager(batch)) == [1, 1]


def test_the_draft_counts_agree_on_verify_rows_and_differ_on_drafts_cut_short() -> None:
    drafts = vllm_module._decode_drafts
    # verify rows: D = 3 tokens, 2 drafts, num_speculative_tokens 2: both runners say 2
    assert drafts("v1", [3, 3], [False, False], [2, 2], 2) == drafts("v2", [3, 3], [False, False], [2, 2], 2) == [2, 2]
    # a prompt chunk: both -1
    assert drafts("v1", [2], [True], [0], 2) == drafts("v2", [2], [True], [0], 2) == [-1]
    # drafts cut short by the token budget (2 scheduled for 2 drafts): V1 demotes the row, V2 keeps its drafts
    assert drafts("v1", [2], [False], [2], 2) == [-1]
    assert drafts("v2", [2], [False], [2], 2) == [2]


@pytest.mark.parametrize("layer", LAYERS)
def test_the_runners_order_an_extend_batch_differently_and_agree_on_its_rows(layer: str) -> None:
    """A one-token first chunk: V1 puts it last (a prefill), V2 first (one token, its sort key)."""
    pool = StatePool(64, "vllm")
    rows = pool.alloc(4).tolist()  # slots 1..4
    batch = Batch.extend(rows, [30, 1, 5, 1], [0, 10, 7, 0])
    assert vllm_module._extend_order(batch) == [1, 2, 0, 3]
    assert vllm_module._extend_order_v2(batch) == [1, 3, 2, 0]
    v1, v2 = make(pool, layer, 2, runner="v1"), make(pool, layer, 2)
    assert (v1._extend_order(batch), v2._extend_order(batch)) == ([1, 2, 0, 3], [1, 3, 2, 0])
    one, two = v1.eager(batch), v2.eager(batch)
    assert two.state_indices.tolist() == one.state_indices.tolist() == [1, 2, 3, 4]
    assert two.query_start_loc.tolist() == one.query_start_loc.tolist() == [0, 30, 31, 36, 37]
    assert two.has_initial_state.tolist() == one.has_initial_state.tolist() == [False, True, True, False]


# -- the second KV-cache group --------------------------------------------------------------------------
VIA = {
    ("gdn", "v2", "decode"): "update_block_table",
    ("gdn", "v2", "target_verify"): "update_block_table",
    ("gdn", "v2", "extend"): "update_block_table",
    ("gdn", "v1", "decode"): "build",
    ("gdn", "v1", "target_verify"): "build",
    ("mamba2", "v2", "decode"): "update_block_table",
    ("mamba2", "v2", "target_verify"): "build",  # Mamba2 turns the reuse off under speculation
    ("mamba2", "v2", "extend"): "update_block_table",
    ("mamba2", "v1", "decode"): "update_block_table",
}


def _batch(mode: str, pool: StatePool, rng: random.Random, d: int, max_rows: int) -> Batch:
    rows = rng.sample(pool.live_rows, rng.randint(1, max_rows))
    seq = [rng.randint(d, 3000) for _ in rows]
    if mode == "decode":
        return Batch.decode(rows, seq)
    if mode == "target_verify":
        return Batch.target_verify(rows, seq, d)
    return Batch.extend(rows, [rng.randint(1, 60) for _ in rows], [rng.choice([0, rng.randint(1, 400)]) for _ in rows])


@pytest.mark.parametrize(("layer", "runner", "mode"), sorted(VIA))
def test_the_second_group_agrees_with_build_on_fresh_random_tables(layer: str, runner: str, mode: str) -> None:
    rng = random.Random(7)
    d = 3
    pool = pool_of(d)
    eng = make(pool, layer, d, runner=runner)
    first_slots = set(pool.mapping.flatten().tolist())
    for i in range(25):
        table = eng.second_block_table(seed=i)
        assert int(table.min()) > 0 and not first_slots & set(table.flatten().tolist())
        batch = _batch(mode, pool, rng, d, 8)
        n = batch.raw_batch_size
        for bucket in (None,) if mode == "extend" else (None, min(b for b in BUCKETS if b >= n)):
            check = eng.second_group(batch, bucket, table)
            assert check.via == VIA[(layer, runner, mode)]
            assert check.difference() is None, f"{layer} {runner} {mode} bucket {bucket}: {check.difference()}"
            # not vacuous: the live rows read the second table's blocks, the first group's never
            field = {
                ("gdn", True): "spec_state_indices_tensor",
                ("gdn", False): "non_spec_state_indices_tensor",
                ("mamba2", True): "state_indices_tensor_d",
            }.get((layer, mode == "target_verify"))
            if mode == "decode" or mode == "target_verify":
                got = check.got[field] if field else check.got["state_indices_tensor_d"]
                assert got is not None
                want = table[batch.req_pool_indices][:, : d if mode == "target_verify" else 1]
                assert got[:n].reshape(n, -1).tolist() == want.tolist()


def _roll_table(monkeypatch: pytest.MonkeyPatch, cls: type) -> None:
    """A wrong block table handed to update_block_table: every request gets the next request's blocks."""
    original = cls.update_block_table

    def wrong(self: Any, metadata: Any, blk_table: torch.Tensor, slot_mapping: torch.Tensor) -> Any:
        return original(self, metadata, blk_table.roll(1, 0), slot_mapping)

    monkeypatch.setattr(cls, "update_block_table", wrong)


@pytest.mark.parametrize("mode", ("decode", "target_verify"))
def test_a_wrong_block_table_is_caught(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    pool = pool_of(3)
    eng = make(pool, "gdn", 3)
    _roll_table(monkeypatch, eng.eng.GDNAttentionMetadataBuilder)
    rows = pool.live_rows[:4]
    batch = Batch.decode(rows, [9] * 4) if mode == "decode" else Batch.target_verify(rows, [9] * 4, 3)
    diff = eng.second_group(batch, 4, eng.second_block_table(1)).difference()
    field = "spec_state_indices_tensor" if mode == "target_verify" else "non_spec_state_indices_tensor"
    assert diff is not None and diff[0] == field and diff[1] == 0


def test_engine_check_reports_the_second_group_by_field_and_call(monkeypatch: pytest.MonkeyPatch) -> None:
    clean = engine_check(Adapter, layer="gdn", batches=15, replays=2).to_dict()
    assert clean["ok"] and clean["runner"] == "v2"
    assert clean["second_group"]["batches"]["target_verify/replay/update_block_table"] == 15
    assert engine_check(Adapter, layer="gdn", batches=3, replays=1, runner="v1").to_dict()["runner"] == "v1"
    _roll_table(monkeypatch, vllm_module.load().GDNAttentionMetadataBuilder)
    result = engine_check(Adapter, layer="gdn", batches=15, replays=2)
    assert not result.ok and result.oracle is not None and result.oracle.ok
    found = result.to_dict()["second_group"]["divergences"]
    fields = {d["field"] for d in found}
    assert "spec_state_indices_tensor (update_block_table)" in fields
    assert "non_spec_state_indices_tensor (update_block_table)" in fields
    assert "update_block_table" in str(result) and "build()" in str(result)
