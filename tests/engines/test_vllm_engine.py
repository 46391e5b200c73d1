"""vLLM 0.33.0's real GDN and Mamba2 metadata builders (its adapter, ``adapter_class("vllm")`` from the engines'
registry) against the workbench's vllm profile: exact padded rows, capture, eager and replay on random batches
of every mode. The adapter's module is imported by name for its internals alone (``STANDINS``).

Needs vLLM 0.33.0 installed (``make engines``; ``make test-engines`` runs these); skipped, with the reason,
where it is not. Where the engine and the profile differ, an ``xfail(strict=True)`` names the difference.
"""

from __future__ import annotations

import random

import pytest
import torch

from workbench.batch import Batch
from workbench.engines import adapter_class
from workbench.engines.base import EngineAdapter
from workbench.engines.versions import EngineError
from workbench.metadata import Metadata, MetadataBuffers, build_metadata
from workbench.pool import StatePool

try:
    Adapter = adapter_class("vllm")  # the registry's adapter of the installed release
except EngineError as e:
    pytest.skip(f"vllm is not importable here: {e}", allow_module_level=True)

from workbench.engines.vllm_0_33_0 import STANDINS  # noqa: E402  (the module's internals: its stand-ins)

pytestmark = pytest.mark.engines

LAYERS = ("gdn", "mamba2")
BUCKETS = (1, 2, 4, 8, 16)
SEEDS = range(6)

IDLE_ONE_TOKEN = (
    "idle replay, query_start_loc: vLLM's runner runs an idle step as execute_dummy_batch, one dummy request "
    "of one token (qsl [0, 1, 1, ...], on the null block) through build_for_cudagraph_capture; the vllm profile "
    "pads every row, zero tokens (qsl [0, 0, ...])"
)


# -- inputs ---------------------------------------------------------------------------------------------
def shuffled_pool(slots_per_request: int = 1, seed: int = 0, num_slots: int = 400) -> StatePool:
    """A vllm-profile pool whose rows own scattered slots: allocate, free every third, allocate again."""
    pool = StatePool(num_slots, "vllm", slots_per_request=slots_per_request)
    rows = pool.alloc(40).tolist()
    pool.free(rows[seed % 3 :: 3])
    pool.alloc(6)
    return pool


def pick_rows(pool: StatePool, rng: random.Random, n: int) -> list[int]:
    return rng.sample(pool.live_rows, n)


def random_batch(mode: str, pool: StatePool, rng: random.Random, draft_tokens: int, max_rows: int) -> Batch:
    """A batch of ``mode`` on ``pool``'s live rows, sizes and lengths drawn from ``rng``."""
    n = rng.randint(1, max_rows)
    rows = pick_rows(pool, rng, n)
    if mode == "decode":
        return Batch.decode(rows, [rng.randint(1, 4000) for _ in rows])
    if mode == "target_verify":
        accepted = None if rng.random() < 0.3 else [rng.randint(1, draft_tokens) for _ in rows]
        seq = [rng.randint(draft_tokens, 4000) for _ in rows]
        return Batch.target_verify(rows, seq, draft_tokens, num_accepted_tokens=accepted)
    ext = [rng.choice([1, 1, 2, rng.randint(3, 300)]) for _ in rows]
    pre = [rng.choice([0, rng.randint(1, 500)]) for _ in rows]
    return Batch.extend(rows, ext, pre)


def adapter(pool: StatePool, layer: str, draft_tokens: int = 2) -> EngineAdapter:
    return Adapter(pool, BUCKETS, draft_tokens, layer=layer)


def assert_fields_equal(engine: Metadata, workbench: Metadata, fields: tuple[str, ...], what: str) -> None:
    """Every field in ``fields`` equal in shape, dtype and values, else one line naming the first that is not."""
    for name in fields:
        e, w = getattr(engine, name), getattr(workbench, name)
        assert e is not None and w is not None, (
            f"{what}: {name} missing (engine {e is not None}, profile {w is not None})"
        )
        assert e.dtype == w.dtype and e.shape == w.shape, (
            f"{what}: {name} {e.dtype}{list(e.shape)} vs {w.dtype}{list(w.shape)}"
        )
        assert torch.equal(e, w), f"{what}: {name} engine {e.tolist()} vs profile {w.tolist()}"
    assert engine.raw_batch_size == workbench.raw_batch_size and engine.batch_size == workbench.batch_size


# -- exact rows -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layer", LAYERS)
def test_a_padded_decode_of_5_in_bucket_8_has_the_null_block_and_a_flat_tail(layer: str) -> None:
    pool = StatePool(64, "vllm")
    rows = pool.alloc(5)  # slots 1..5
    meta = adapter(pool, layer).replay(Batch.decode(rows, [7, 12, 30, 5, 9]), 8)
    assert meta.state_indices.tolist() == [1, 2, 3, 4, 5, 0, 0, 0]
    assert meta.query_start_loc.tolist() == [0, 1, 2, 3, 4, 5, 5, 5, 5]
    assert meta.state_indices.dtype == meta.query_start_loc.dtype == torch.int32
    assert (meta.bucket, meta.raw_batch_size, meta.seq_lens.tolist()) == (8, 5, [7, 12, 30, 5, 9, 0, 0, 0])


@pytest.mark.parametrize("layer", LAYERS)
def test_a_padded_verify_keeps_one_block_per_draft_position_and_pads_with_the_null_block(layer: str) -> None:
    pool = StatePool(64, "vllm", slots_per_request=3)
    rows = pool.alloc(3)  # slots [1,2,3], [4,5,6], [7,8,9]
    batch = Batch.target_verify(rows, [20, 33, 9], 3, num_accepted_tokens=[1, 3, 2])
    meta = adapter(pool, layer, draft_tokens=3).replay(batch, 4)
    assert meta.state_indices.tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [0, 0, 0]]
    assert meta.query_start_loc.tolist() == [0, 3, 6, 9, 9]
    assert meta.num_accepted_tokens is not None and meta.num_accepted_tokens.tolist() == [1, 3, 2, 1]


@pytest.mark.parametrize("layer", LAYERS)
def test_the_engine_output_is_a_copy_not_the_builders_buffer(layer: str) -> None:
    pool = StatePool(64, "vllm")
    eng = adapter(pool, layer)
    first = eng.replay(Batch.decode(pool.alloc(2), [3, 4]), 2)
    eng.replay(Batch.decode(pool.alloc(2), [5, 6]), 2)
    assert first.state_indices.tolist() == [1, 2]
    assert eng.builder is not None and type(eng.builder).__name__ == eng.default_class_name


# -- capture --------------------------------------------------------------------------------------------
def _capture_case(layer: str, mode: str, bucket: int) -> tuple[Metadata, Metadata, tuple[str, ...]]:
    """(engine's capture, the profile's capture state, the compared fields but num_accepted_tokens)."""
    d = 3 if mode == "target_verify" else 1
    pool = StatePool(64, "vllm", slots_per_request=d)
    eng = adapter(pool, layer, draft_tokens=max(d, 2))
    profile = MetadataBuffers(pool, mode, BUCKETS, draft_tokens=d).reset_for_capture(bucket).clone()
    fields = tuple(f for f in eng.compared_fields(mode) if f != "num_accepted_tokens")
    return eng.capture(mode, bucket), profile, fields


@pytest.mark.parametrize("bucket", (1, 8))
@pytest.mark.parametrize("mode", ("decode", "target_verify"))
@pytest.mark.parametrize("layer", LAYERS)
def test_capture_runs_every_row_on_the_null_block_like_the_profile(layer: str, mode: str, bucket: int) -> None:
    engine, profile, fields = _capture_case(layer, mode, bucket)
    assert_fields_equal(engine, profile, fields, f"{layer} capture {mode} bucket {bucket}")
    assert int(engine.state_indices.abs().sum()) == 0


@pytest.mark.parametrize("layer", LAYERS)
def test_capture_num_accepted_tokens_matches_the_profile(layer: str) -> None:
    """Was a difference (the profile filled 1): vLLM's build_for_cudagraph_capture sets D on every row, and
    now so does ``MetadataBuffers.reset_for_capture``."""
    engine, profile, _ = _capture_case(layer, "target_verify", 2)
    assert engine.num_accepted_tokens is not None and engine.num_accepted_tokens.tolist() == [3, 3]
    assert_fields_equal(engine, profile, ("num_accepted_tokens",), f"{layer} capture verify")


# -- eager and replay against the profile ---------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", ("decode", "target_verify", "extend"))
@pytest.mark.parametrize("layer", LAYERS)
def test_eager_matches_the_profile_on_random_batches(layer: str, mode: str, seed: int) -> None:
    rng = random.Random(seed)
    d = rng.choice([2, 3, 4]) if mode == "target_verify" else 1
    pool = shuffled_pool(d, seed)
    eng = adapter(pool, layer, draft_tokens=max(d, 2))
    for _ in range(10):
        batch = random_batch(mode, pool, rng, d, max_rows=24)
        what = f"{layer} eager {mode} seed {seed} rows {batch.req_pool_indices.tolist()}"
        assert_fields_equal(eng.eager(batch), build_metadata(batch, pool, bucket=None), eng.compared_fields(mode), what)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", ("decode", "target_verify"))
@pytest.mark.parametrize("layer", LAYERS)
def test_replay_matches_the_profile_on_random_batches(layer: str, mode: str, seed: int) -> None:
    rng = random.Random(100 + seed)
    d = rng.choice([2, 3, 4]) if mode == "target_verify" else 1
    pool = shuffled_pool(d, seed)
    eng = adapter(pool, layer, draft_tokens=max(d, 2))
    for _ in range(10):
        batch = random_batch(mode, pool, rng, d, max_rows=BUCKETS[-1])
        bucket = min(b for b in BUCKETS if b >= batch.raw_batch_size)
        what = f"{layer} replay {mode} bucket {bucket} seed {seed}"
        profile = build_metadata(batch, pool, bucket, buckets=BUCKETS)
        assert_fields_equal(eng.replay(batch, bucket), profile, eng.compared_fields(mode), what)


@pytest.mark.parametrize(
    "layer", [pytest.param("gdn", marks=pytest.mark.xfail(strict=True, reason=IDLE_ONE_TOKEN)), "mamba2"]
)
def test_idle_replay_matches_the_profile(layer: str) -> None:
    """Mamba2 computes no decode query_start_loc (it is the runner's, compared by GDN's line), so its
    compared fields agree; GDN restages the runner's one-token dummy row."""
    pool = shuffled_pool()
    eng = adapter(pool, layer)
    profile = build_metadata(Batch.idle(), pool, 4, buckets=BUCKETS)
    assert_fields_equal(eng.replay(Batch.idle(), 4), profile, eng.compared_fields("idle"), f"{layer} idle")


@pytest.mark.parametrize("layer", LAYERS)
def test_an_eager_idle_step_builds_nothing(layer: str) -> None:
    meta = adapter(shuffled_pool(), layer).eager(Batch.idle())
    assert (meta.batch_size, meta.query_start_loc.tolist()) == (0, [0])


@pytest.mark.parametrize("layer", LAYERS)
def test_an_extend_step_is_put_back_in_the_batchs_order(layer: str) -> None:
    """The runner moves short extends first and first chunks last; each row keeps its own values."""
    pool = StatePool(64, "vllm")
    rows = pool.alloc(4).tolist()  # slots 1..4
    batch = Batch.extend(rows, [30, 1, 5, 1], [0, 10, 7, 0])
    meta = adapter(pool, layer).eager(batch)
    assert meta.state_indices.tolist() == [1, 2, 3, 4]
    assert meta.query_start_loc.tolist() == [0, 30, 31, 36, 37]
    assert meta.has_initial_state.tolist() == [False, True, True, False]


# -- refusals -------------------------------------------------------------------------------------------
def test_refusals_name_the_problem() -> None:
    pool = StatePool(64, "vllm")
    eng = adapter(pool, "gdn")
    with pytest.raises(EngineError, match="bucket 3 is not captured"):
        eng.replay(Batch.decode(pool.alloc(1), [4]), 3)
    with pytest.raises(EngineError, match="extend runs eagerly"):
        eng.replay(Batch.extend(pool.alloc(1), [4]), 1)
    with pytest.raises(EngineError, match="slots_per_request"):
        eng.eager(Batch.target_verify(pool.alloc(1), [4], 2))
    with pytest.raises(EngineError, match="profile"):
        Adapter(StatePool(64, "sglang"), BUCKETS)


def test_the_stand_ins_are_few_and_each_says_why() -> None:
    assert len(STANDINS) == 3
    assert all(name.startswith("vllm.") and len(why) > 40 for name, why in STANDINS)
