"""Bad inputs at the public Python boundaries: one exact line naming the argument, the value and the range.

The machine's memory is patched to 24 GiB where a message quotes it.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench import Batch, DeviceUnavailable, MetadataBuffers, MetadataError, StatePool, build_metadata, limits
from workbench.devices import DeviceStatus, _triton
from workbench.layers import GatedDeltaNetLayer, GDNConfig
from workbench.pool import LowestFirst
from workbench.runner import GraphRunner


@pytest.fixture
def machine_24gib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "host_memory_bytes", lambda: 24 * 2**30)


def message(fn, *args, error=MetadataError, **kwargs) -> str:
    with pytest.raises(error) as info:
        fn(*args, **kwargs)
    return str(info.value)


# -- StatePool ----------------------------------------------------------------------------------------------------
def test_pool_too_large_for_memory(machine_24gib) -> None:
    assert message(StatePool, 10_000_000_000) == (
        "num_slots=10000000000 needs 37 GiB for a slot mapping of 10,000,000,000 rows of 4 B; "
        "this machine has 24 GiB free"
    )
    assert message(StatePool, 100, max_requests=2**40, slots_per_request=2) == (
        "max_requests=1099511627776 needs 8.0 TiB for a slot mapping of 1,099,511,627,777 rows of 8 B; "
        "this machine has 24 GiB free"
    )


def test_pool_devices() -> None:
    """Devices go through ``canonical_device``: a bad one is a DeviceUnavailable naming it, with torch's reason."""
    assert message(StatePool, 8, device="nope", error=DeviceUnavailable).startswith(
        "device 'nope': torch cannot allocate there (Expected one of cpu, cuda, "
    )
    assert message(StatePool, 8, device="", error=DeviceUnavailable) == (
        "device '': torch cannot allocate there (Device string must not be empty)"
    )
    if not torch.cuda.is_available():
        assert message(StatePool, 8, device="cuda", error=DeviceUnavailable) == (
            "device 'cuda': torch cannot allocate there (Torch not compiled with CUDA enabled)"
        )


def test_large_pool_is_cheap_and_lowest_first() -> None:
    """10^8 slots: no per-slot Python list (the old pool took 33 s and 9 GB); slots still lowest-first."""
    pool = StatePool(100_000_000)
    rows = pool.alloc(3)
    assert pool.mapping[rows, 0].tolist() == [1, 2, 3]
    pool.free(rows[1:2])
    assert pool.mapping[pool.alloc(1), 0].tolist() == [2]
    assert pool.num_free == 100_000_000 - 1 - 3


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 30),
    reserved=st.integers(0, 30),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=20),
)
def test_lowest_first_matches_a_sorted_list(n: int, reserved: int, ops: list[tuple[bool, int]]) -> None:
    """The lazy free list hands out exactly what the old sorted list did."""
    lazy, model = LowestFirst(n, reserved), [m for m in range(n) if m != reserved]
    held: list[int] = []
    for take, k in ops:
        if take:
            k = min(k, len(model))
            model.sort()
            want, model = model[:k], model[k:]
            assert lazy.take(k) == want
            held += want
        else:
            back, held = held[:k], held[k:]
            lazy.give(back)
            model += back
        assert len(lazy) == len(model) and lazy.sorted() == sorted(model)


# -- Batch ----------------------------------------------------------------------------------------------------------
def test_batch_int32_overflow() -> None:
    assert message(Batch.decode, [1, 2], [99999999999, 1]) == (
        "seq_lens[0] = 99999999999: does not fit int32 (range [-2147483648, 2147483647])"
    )
    # an int64 tensor used to wrap silently on .to(int32): 2**32 + 5 became 5
    assert message(Batch.decode, torch.tensor([1, 2]), torch.tensor([7, 2**32 + 5])) == (
        "seq_lens[1] = 4294967301: does not fit int32 (range [-2147483648, 2147483647])"
    )
    assert message(Batch.decode, [2**63], [1]) == (
        "req_pool_indices[0] = 9223372036854775808: does not fit int64 "
        "(range [-9223372036854775808, 9223372036854775807])"
    )
    assert message(Batch.extend, [1, 2], [2_000_000_000, 2_000_000_000]) == (
        "extend_lens: 4,000,000,000 tokens in one step; the total must fit int32 (max 2,147,483,647)"
    )
    assert message(Batch.extend, [1], [2_000_000_000], [2_000_000_000]) == (
        "prefix_lens[0] + extend_lens[0] = 4,000,000,000: a sequence length must fit int32 (max 2,147,483,647)"
    )
    assert message(Batch.target_verify, [1, 2], [5, 5], 2_000_000_000) == (
        "draft_tokens=2000000000: 2 requests x 2000000000 tokens = 4,000,000,000 tokens in one step; "
        "the total must fit int32 (max 2,147,483,647)"
    )


def test_batch_shapes_and_types() -> None:
    assert message(Batch.decode, None, [1]) == (
        "req_pool_indices: expected a list of ints or a 1-D integer tensor, got None"
    )
    assert message(Batch.decode, "12", [1]) == (
        "req_pool_indices: expected a list of ints or a 1-D integer tensor, got '12'"
    )
    assert message(Batch.for_capture, "decode", None) == "batch_size must be an int, got None"
    assert message(Batch.for_capture, "decode", 0) == "batch_size = 0: must be in [1, 2,147,483,647]"


def test_capture_batch_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "host_memory_bytes", lambda: 8 * 2**30)
    assert message(Batch.for_capture, "decode", 2**30) == (
        "batch_size=1073741824 needs 12 GiB for 1,073,741,824 capture rows of 12 B; this machine has 8.0 GiB free"
    )
    assert message(Batch.idle, device=True) == "device must be a str, torch.device or CUDA ordinal, got True"


# -- build_metadata / MetadataBuffers ---------------------------------------------------------------------------------
def test_metadata_bucket_memory(machine_24gib) -> None:
    pool = StatePool(10)
    batch = Batch.decode(pool.alloc(2), [3, 4])
    assert message(build_metadata, batch, pool, "auto", buckets=[2_000_000_000]) == (
        "bucket=2000000000 needs 54 GiB for metadata of 2,000,000,000 padded rows; this machine has 24 GiB free"
    )
    assert message(MetadataBuffers, pool, "decode", [1, 2, 4, 2_000_000_000]) == (
        "buckets=[1, 2, 4, 2000000000] needs 108 GiB for metadata of 4,000,000,007 padded rows; "
        "this machine has 24 GiB free"
    )
    assert message(build_metadata, batch, "pool") == "pool must be a workbench.StatePool, got str"
    assert message(MetadataBuffers, pool, "target_verify", [4], 2**30) == (
        "draft_tokens=1073741824: bucket 4 x 1073741824 tokens does not fit int32 query_start_loc (max 2,147,483,647)"
    )


# -- GraphRunner ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def layer() -> GatedDeltaNetLayer:
    return GatedDeltaNetLayer(GDNConfig.small())


def test_runner_arguments(layer) -> None:
    pool = StatePool(10)
    assert message(GraphRunner, object(), pool) == (
        "layer: object is not a workbench layer (it lacks forward, new_state, config, dtype, supported_modes)"
    )
    assert message(GraphRunner, layer, "pool") == "pool must be a workbench.StatePool, got str"
    assert message(GraphRunner, layer, pool, modes="decode") == "modes must be a list of graph modes, got 'decode'"
    assert message(GraphRunner, layer, pool, modes=["decode", "extend"]) == (
        "modes[1] = 'extend': graphs are captured for ('decode', 'target_verify')"
    )
    assert message(GraphRunner, layer, pool, backend="tpu") == (
        "backend must be one of ('auto', 'cuda', 'npu', 'cpu'), got 'tpu'"
    )
    assert message(GraphRunner, layer, pool, draft_tokens=0) == "draft_tokens = 0: must be in [1, 2,147,483,647]"
    assert message(GraphRunner, layer, pool, state_seed=True) == "state_seed must be an int, got True"
    assert message(GraphRunner, layer, pool, validate_metadata="yes") == "validate_metadata must be a bool, got 'yes'"
    assert message(GraphRunner, layer, pool, buckets={"decode": [1], "verify": [2]}) == (
        "buckets: key 'verify' is not a graph mode; keys are ('decode', 'target_verify')"
    )
    assert message(GraphRunner, layer, pool, metadata_backend=int) == (
        "metadata_backend must be a MetadataBackend subclass, got <class 'int'>"
    )
    assert message(GraphRunner, layer, pool, state=torch.zeros(3)) == (
        "state must be a LayerState (layer.new_state(num_slots)), got Tensor"
    )
    assert message(GraphRunner, layer, pool, state=layer.new_state(9)) == (
        "state.conv: shape (9, 80, 3), expected (10, 80, 3) for the pool's 10 slots"
    )


def test_runner_memory(layer, machine_24gib) -> None:
    pool = StatePool(10)
    assert message(GraphRunner, layer, pool, modes=["target_verify"], buckets=[4], draft_tokens=2**27) == (
        "draft_tokens=134217728 needs 64 GiB for static inputs of 536,870,912 tokens; this machine has 24 GiB free"
    )
    assert message(GraphRunner, layer, pool, modes=["target_verify"], buckets=[4], draft_tokens=2**22) == (
        "draft_tokens=4194304 needs 39 GiB for verify buffers for 16,777,216 tokens; this machine has 24 GiB free"
    )
    assert message(GraphRunner, layer, StatePool(30_000_000), modes=["decode"], buckets=[4]) == (
        "pool.num_slots=30000000 needs 70 GiB for a layer state of 30,000,000 slots of 2,496 B; "
        "this machine has 24 GiB free"
    )


# -- doctor: Triton compiled vs interpreted, per device -------------------------------------------------------------
def test_triton_rows_say_compiled_or_interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    import triton

    ver = f"triton {triton.__version__}"
    no_cuda = DeviceStatus("cuda", False, "torch is a CPU build")
    no_npu = DeviceStatus("npu", False, "not probed")
    gpu = DeviceStatus("cuda", True, "1 x NVIDIA H200")

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rows = {d.name: (d.usable, d.detail) for d in _triton(no_cuda, no_npu)}
    assert rows["triton:cpu"] == (True, f"{ver}, interpreted (TRITON_INTERPRET=1): slow, fp32/fp16 only")
    assert rows["triton:cuda"] == (False, "not compiled: cuda unusable (torch is a CPU build)")
    rows = {d.name: (d.usable, d.detail) for d in _triton(gpu, no_npu)}
    assert rows["triton:cuda"] == (True, f"{ver}, interpreted: TRITON_INTERPRET=1 disables compiling")

    monkeypatch.delenv("TRITON_INTERPRET")
    rows = {d.name: (d.usable, d.detail) for d in _triton(no_cuda, no_npu)}
    assert rows["triton:cpu"] == (False, f"{ver} has no compiled CPU backend; set TRITON_INTERPRET=1 to interpret")
    assert not any(usable for usable, _ in rows.values())  # no GPU: nothing compiled
    rows = {d.name: (d.usable, d.detail) for d in _triton(gpu, no_npu)}
    assert rows["triton:cuda"] == (True, f"{ver}, compiled")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: doctor's compiled row on a real GPU")
def test_doctor_on_a_gpu_says_compiled_unless_interpreting() -> None:
    from workbench.devices import devices

    rows = {d.name: d for d in devices(probe_npu=False)}
    assert rows["cuda"].usable and rows["triton:cuda"].usable
    assert ("interpreted" in rows["triton:cuda"].detail) == (__import__("os").environ.get("TRITON_INTERPRET") == "1")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the limit is the device's memory")
def test_pool_limit_on_a_gpu_is_the_free_device_memory() -> None:
    total = torch.cuda.get_device_properties(0).total_memory
    slots = total // 4 + 2  # a mapping larger than the whole card, so larger than its free memory
    text = message(StatePool, slots, device="cuda:0")
    assert text.startswith(f"num_slots={slots} needs ") and "; cuda:0 has " in text and text.endswith(" free")


def test_metadata_buffers_refuse_a_request_row_outside_the_pool():
    """Found by the fuzzer: a row past the pool's mapping reached index_select as an IndexError."""

    pool = StatePool(4, "sglang")
    rows = pool.alloc(2)
    bufs = MetadataBuffers(pool, "decode", buckets=[4])
    before = {k: t.clone() for k, t in bufs.static[4].tensors().items()}
    with pytest.raises(MetadataError, match=r"req_pool_indices\[2\] = 9: out of range, the pool has request rows"):
        bufs.update(Batch.decode([*rows.tolist(), 9], [3, 4, 5]))
    assert all(torch.equal(t, before[k]) for k, t in bufs.static[4].tensors().items())  # nothing written


def test_cli_error_with_a_line_break_character_stays_one_line(capsys):
    """Found by the fuzzer: U+0085 in an argument split argparse's message into two lines."""
    from workbench.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "metadata", "\x85"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "\\x85" in err
