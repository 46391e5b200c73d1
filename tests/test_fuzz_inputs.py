"""Fuzz the public constructors: any argument either works or raises the workbench's own error (a
WorkbenchError, ValueError/TypeError subclass), never torch's RuntimeError/IndexError/OverflowError.

The machine's memory is patched down to 16 MiB, so huge sizes meet the memory check instead of the allocator.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from workbench import Batch, DraftTree, MetadataBuffers, StatePool, WorkbenchError, build_metadata, limits
from workbench.layers import GatedDeltaNetLayer, GDNConfig, Mamba2Config, Mamba2Layer
from workbench.metadata import parents_from_links
from workbench.runner import GraphRunner

EDGE = [0, 1, 2, 3, -1, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, -(2**63) - 1, 10**12]
ints = st.integers(-2, 12) | st.sampled_from(EDGE)
junk = st.sampled_from([None, True, 1.5, "3", "", b"1", [1], float("nan"), object()])
int_or_junk = ints | junk
int_lists = st.lists(ints, max_size=5) | st.lists(int_or_junk, max_size=3)
tensors = st.builds(
    lambda xs, dtype: torch.tensor(xs, dtype=torch.int64).to(dtype),
    st.lists(st.integers(-(2**40), 2**40) | st.integers(-2, 12), max_size=4),
    st.sampled_from([torch.int64, torch.int32, torch.int16, torch.uint8, torch.float32, torch.bool]),
) | st.builds(lambda: torch.zeros(2, 2, dtype=torch.int64))
lists_or_tensors = int_lists | tensors | junk
devices = st.sampled_from(
    [None, "cpu", "cpu:0", "nope", "", 3, torch.device("cpu"), "meta:x", "cuda", "cuda:7", "npu:0"]
)
profiles = st.sampled_from(["sglang", "sglang-ascend", "vllm", "SGLANG", "", None, 1])
modes = st.sampled_from(["decode", "target_verify", "extend", "idle", "prefill", "", None])
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def small_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "host_memory_bytes", lambda: 16 * 2**20)


def call(fn, *args, **kwargs):
    """``fn(...)``, or None when it raised the workbench's error; anything else fails the test."""
    name = getattr(fn, "__qualname__", str(fn))
    try:
        out = fn(*args, **kwargs)
    except WorkbenchError as e:
        assert isinstance(e, ValueError | TypeError | RuntimeError), type(e)
        assert str(e) and "\n" not in str(e), repr(e)
        event(f"{name}: {type(e).__name__}")  # --hypothesis-show-statistics: how often each path ran
        return None
    event(f"{name}: ok")
    return out


def mostly(draw: st.DrawFn, valid: object, bad: st.SearchStrategy) -> object:
    """``valid`` three times in four, else a draw from ``bad``: most cases get past the first check."""
    return valid if draw(st.integers(0, 3)) else draw(bad)


@SETTINGS
@given(data=st.data())
def test_state_pool(small_machine, data) -> None:
    draw = data.draw
    spr = draw(st.integers(1, 3))
    num_slots = mostly(draw, draw(st.integers(2, 50)), int_or_junk)
    pool = call(
        StatePool,
        num_slots,
        mostly(draw, draw(st.sampled_from(["sglang", "sglang-ascend", "vllm"])), profiles),
        slots_per_request=mostly(draw, spr, int_or_junk),
        max_requests=mostly(draw, None, int_or_junk),
        device=mostly(draw, "cpu", devices),
    )
    if pool is not None:
        n = min(pool.num_free, 3)
        rows = pool.alloc(n)
        assert len(set(pool.owned_slots())) == n * pool.slots_per_request
        assert pool.profile.dummy_slot not in pool.owned_slots()
        pool.free(rows)
        assert pool.num_free == pool.capacity


@SETTINGS
@given(kind=st.sampled_from(["decode", "target_verify", "extend", "idle", "for_capture"]), data=st.data())
def test_batch_constructors(small_machine, kind, data) -> None:
    draw = data.draw
    r = draw(st.integers(0, 5))
    rpi = mostly(draw, draw(st.lists(st.integers(0, 2**40), min_size=r, max_size=r, unique=True)), lists_or_tensors)
    lens = mostly(draw, draw(st.lists(st.integers(1, 2**31 - 1), min_size=r, max_size=r)), lists_or_tensors)
    d = mostly(draw, draw(st.integers(1, 8)), int_or_junk)
    device = mostly(draw, "cpu", devices)
    if kind == "decode":
        batch = call(Batch.decode, rpi, lens, device=device)
    elif kind == "target_verify":
        acc = mostly(draw, None, lists_or_tensors)
        batch = call(Batch.target_verify, rpi, lens, d, num_accepted_tokens=acc, device=device)
    elif kind == "extend":
        pre = mostly(draw, draw(st.lists(st.integers(0, 2**31 - 1), min_size=r, max_size=r)), lists_or_tensors)
        batch = call(Batch.extend, rpi, lens, pre, device=device)
    elif kind == "idle":
        batch = call(Batch.idle, device=device)
    else:
        batch = call(Batch.for_capture, mostly(draw, "decode", modes), mostly(draw, r or 1, int_or_junk), d)
    if batch is not None:
        assert batch.seq_lens.dtype == torch.int32 and batch.req_pool_indices.dtype == torch.int64
        assert bool((batch.seq_lens >= 1).all())


@st.composite
def pools_and_batches(draw: st.DrawFn):
    """A valid pool with some requests, and a batch that is valid or off in one way."""
    profile = draw(st.sampled_from(["sglang", "sglang-ascend", "vllm"]))
    d = draw(st.integers(1, 3))
    spr = d if profile == "vllm" and draw(st.booleans()) else 1
    pool = StatePool(draw(st.integers(2, 40)) * spr + 1, profile, slots_per_request=spr)
    rows = pool.alloc(draw(st.integers(0, min(5, pool.num_free))))
    r = len(rows)
    rpi = mostly(draw, rows.tolist(), int_lists)
    lens = mostly(draw, draw(st.lists(st.integers(1, 9), min_size=r, max_size=r)), int_lists)
    mode = draw(st.sampled_from(["decode", "target_verify", "extend", "idle"]))
    if mode == "decode":
        batch = call(Batch.decode, rpi, lens)
    elif mode == "target_verify":
        tree = DraftTree.random(r, d, draw(st.integers(1, 3)), seed=draw(st.integers(0, 9))) if r else None
        tree = draw(st.sampled_from([None, tree, tree, DraftTree.chain(1, 2), "tree"]))
        batch = call(Batch.target_verify, rpi, lens, mostly(draw, d, ints), tree=tree)
    elif mode == "extend":
        batch = call(Batch.extend, rpi, lens)
    else:
        batch = Batch.idle()
    return pool, (batch if batch is not None else draw(junk)), d


@SETTINGS
@given(
    case=pools_and_batches(),
    bucket=st.sampled_from(["auto", None, "auto", None, "none", 0.5]) | ints,
    buckets=st.none()
    | st.lists(st.integers(1, 12), min_size=1, max_size=4, unique=True).map(sorted)
    | int_lists
    | st.sampled_from([[1, 2, 10**9], [2**31], "1,2"]),
)
def test_build_metadata(small_machine, case, bucket, buckets) -> None:
    pool, batch, _ = case
    meta = call(build_metadata, batch, pool, bucket, buckets=buckets)
    if meta is not None:
        assert meta.batch_size >= meta.raw_batch_size


@SETTINGS
@given(
    case=pools_and_batches(),
    mode=st.sampled_from(["decode", "target_verify"]) | modes,
    buckets=st.none()
    | st.lists(st.integers(1, 12), min_size=1, max_size=4, unique=True).map(sorted)
    | int_lists
    | st.sampled_from([[1, 2, 10**9], [2**31]]),
    d=st.integers(1, 3) | int_or_junk,
    tree=st.booleans() | junk,
)
def test_metadata_buffers(small_machine, case, mode, buckets, d, tree) -> None:
    pool, batch, _ = case
    bufs = call(MetadataBuffers, pool, mode, buckets, d, tree=tree)
    if bufs is not None and hasattr(batch, "raw_batch_size"):
        call(bufs.update, batch)


matrices = (
    st.lists(st.lists(ints, max_size=4), max_size=3)
    | st.lists(st.lists(int_or_junk, max_size=3), max_size=2)
    | st.builds(lambda r, d: torch.zeros(r, d, dtype=torch.int64), st.integers(0, 3), st.integers(0, 5))
    | st.sampled_from([torch.zeros(0, 10**12, dtype=torch.int64), torch.zeros(0, 2**31, dtype=torch.int32)])
    | tensors
    | junk
)


@pytest.mark.slow  # hypothesis; the other constructors' fuzz stays fast
@SETTINGS
@given(data=st.data())
def test_draft_tree_constructors(small_machine, data) -> None:
    draw = data.draw
    r, d = draw(st.integers(0, 4)), draw(st.integers(1, 6))
    good = DraftTree.random(r, d, draw(st.integers(1, 3)), seed=draw(st.integers(0, 99)))
    trees = [
        call(DraftTree.from_parents, mostly(draw, good.parents.tolist() or good.parents, matrices)),
        call(DraftTree.from_links, mostly(draw, good.next_token, matrices), mostly(draw, good.next_sibling, matrices)),
        call(DraftTree.chain, mostly(draw, r, int_or_junk), mostly(draw, d, int_or_junk)),
        call(
            DraftTree.random,
            mostly(draw, r, int_or_junk),
            mostly(draw, d, int_or_junk),
            mostly(draw, 2, int_or_junk),
            seed=mostly(draw, 0, int_or_junk),
            depth=mostly(draw, None, int_or_junk),
        ),
    ]
    call(parents_from_links, draw(matrices), draw(matrices))
    for tree in trees:
        if tree is not None and tree.num_requests:
            assert torch.equal(
                parents_from_links(tree.next_token, tree.next_sibling)[:, 1:].long(), tree.parents[:, 1:]
            )
            last = [draw(st.integers(0, tree.draft_tokens - 1)) for _ in range(tree.num_requests)]
            call(tree.accept_index, mostly(draw, last, lists_or_tensors), mostly(draw, None, int_or_junk))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    case=pools_and_batches(),
    layer_kind=st.sampled_from(["gdn", "mamba2", "junk"]),
    buckets=st.none() | st.lists(st.integers(1, 4), min_size=1, max_size=3, unique=True).map(sorted) | int_lists,
    d=st.integers(1, 3) | int_or_junk,
    run_modes=st.none() | st.lists(st.sampled_from(["decode", "target_verify"]), max_size=2) | st.lists(modes) | junk,
    backend=st.sampled_from(["auto", "cpu", "auto", "cpu", "cuda", "npu", "tpu", None]),
    state_seed=st.none() | st.integers(0, 9) | int_or_junk,
    validate_metadata=st.booleans() | junk,
    tree=st.booleans() | junk,
)
def test_graph_runner(
    small_machine, case, layer_kind, buckets, d, run_modes, backend, state_seed, validate_metadata, tree
):
    pool, _, _ = case
    if layer_kind == "gdn":
        layer = GatedDeltaNetLayer(GDNConfig.small())
    elif layer_kind == "mamba2":
        layer = Mamba2Layer(Mamba2Config.small())
    else:
        layer = object()
    call(
        GraphRunner,
        layer,
        pool,
        buckets=buckets,
        draft_tokens=d,
        modes=run_modes,
        backend=backend,
        state_seed=state_seed,
        validate_metadata=validate_metadata,
        tree=tree,
    )
