"""GraphRunner on the CPU recorder: replay equals eager, nothing lost, capture writes only the dummy slot."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench import Batch, CaptureError, StatePool
from workbench.graphs.runner import GraphRunner
from workbench.layers import GatedDeltaNetLayer, GDNConfig, Mamba2Config, Mamba2Layer
from workbench.measure.integrity import changed_slots, snapshot

PROFILES = ["sglang", "sglang-ascend", "vllm"]
BUCKETS = [1, 2, 4, 8]
D = 2
NUM_SLOTS = 24


def make_runner(profile, layer=None, **kw):
    spr = D if profile == "vllm" else 1
    pool = StatePool(NUM_SLOTS, profile, slots_per_request=spr)
    layer = layer or GatedDeltaNetLayer(GDNConfig.small(), seed=3, impl="reference")
    state = layer.new_state(NUM_SLOTS, seed=7)  # random, never zeros: a lost write shows
    runner = GraphRunner(layer, pool, buckets=BUCKETS, draft_tokens=D, backend="cpu", state=state, **kw)
    return runner


@pytest.fixture(scope="module", params=PROFILES)
def captured(request):
    torch.manual_seed(0)
    runner = make_runner(request.param)
    before = snapshot(runner.state.tensors())
    runner.capture(progress=False)
    runner.capture_changes = changed_slots(before, runner.state.tensors())
    rows = runner.pool.alloc(runner.pool.capacity)
    runner.free_rows = rows
    return runner


def test_capture_touches_only_the_dummy_slot(captured):
    dummy = captured.pool.profile.dummy_slot
    assert all(slot == dummy for _, slot in captured.capture_changes), captured.capture_changes
    assert len(captured.graphs) == 2 * len(BUCKETS)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_replay_equals_eager_and_integrity(captured, data):
    mode = data.draw(st.sampled_from(["decode", "target_verify", "idle"]))
    raw = 0 if mode == "idle" else data.draw(st.integers(1, BUCKETS[-1] + 2))
    pick = data.draw(st.permutations(list(range(captured.free_rows.numel()))))[:raw]
    rows = captured.free_rows[list(pick)] if raw else captured.free_rows[:0]
    seq = [int(s) for s in torch.randint(1, 100, (raw,))]
    if mode == "decode":
        batch, n = Batch.decode(rows, seq), raw
    elif mode == "target_verify":
        acc = [int(a) for a in torch.randint(1, D + 1, (raw,))]
        batch, n = Batch.target_verify(rows, seq, D, num_accepted_tokens=acc), raw * D
    else:
        batch, n = Batch.idle(), 0
    x = torch.randn(n, captured.layer.config.hidden_size)
    cmp = captured.compare(batch, x)
    assert cmp.integrity.ok, str(cmp.integrity)
    if raw > BUCKETS[-1]:
        assert not cmp.replayed and "above the largest" in cmp.details["reason"]
    else:
        assert cmp.replayed and cmp.bucket == min(b for b in BUCKETS if b >= max(raw, 1))
    assert cmp.bitwise_equal, (cmp.max_output_diff, cmp.max_state_diff)


def test_replay_reuses_output_tensor_and_allocates_nothing(captured):
    rows = captured.free_rows[:3]
    x = torch.randn(3, captured.layer.config.hidden_size)
    a = captured.replay(Batch.decode(rows, [4, 5, 6]), x)
    ptr = a.output.data_ptr()
    b = captured.replay(Batch.decode(rows, [5, 6, 7]), torch.randn_like(x))
    assert b.output.data_ptr() == ptr and b.replayed
    assert not torch.equal(a.output, torch.zeros_like(a.output))


def test_verify_then_accept_equals_decoding_one_by_one():
    runner = make_runner("sglang")
    runner.capture(progress=False)
    rows = runner.pool.alloc(3)
    x = torch.randn(3 * D, runner.layer.config.hidden_size)
    acc = [1, 2, 2]
    ref_state = runner.state.clone()
    runner.replay(Batch.target_verify(rows, [9, 9, 9], D), x)
    runner.accept(acc)
    # reference: decode the accepted tokens of each request one by one, eagerly
    ref = make_runner("sglang")
    ref.state = ref_state
    ref.pool = runner.pool
    ref.meta_backend.pool = runner.pool
    xs = x.view(3, D, -1)
    for step in range(D):
        live = [i for i in range(3) if acc[i] > step]
        ref.eager(Batch.decode(rows[live], [9] * len(live)), xs[live, step])
    for name, t in runner.state.tensors().items():
        torch.testing.assert_close(t, ref.state.tensors()[name], atol=1e-5, rtol=1e-4)


def test_host_sync_in_a_step_is_refused_at_capture():
    class Syncing(GatedDeltaNetLayer):
        def forward(self, x, meta, state, intermediate=None):
            if int(meta.query_start_loc[-1]) > 0:  # a host read: a device graph cannot hold it
                pass
            return super().forward(x, meta, state, intermediate)

    layer = Syncing(GDNConfig.small(), impl="reference")
    runner = make_runner("sglang", layer=layer, modes=["decode"])
    with pytest.raises(CaptureError, match="_local_scalar_dense|host"):
        runner.capture(progress=False)


def test_mamba2_decode_replay_clean():
    layer = Mamba2Layer(Mamba2Config.small(), seed=1, impl="reference")
    runner = make_runner("sglang", layer=layer)
    assert runner.modes == ("decode",)
    runner.capture(progress=False)
    rows = runner.pool.alloc(5)
    cmp = runner.compare(Batch.decode(rows, [3, 4, 5, 6, 7]), torch.randn(5, layer.config.hidden_size))
    assert cmp.replayed and cmp.bucket == 8 and cmp.integrity.ok and cmp.bitwise_equal


def test_integrity_catches_a_corrupting_step():
    """A step that writes a foreign slot must be reported (the check can fail)."""
    runner = make_runner("sglang", modes=["decode"])
    runner.capture(progress=False)
    rows = runner.pool.alloc(2)
    victim = runner.pool.free_slots()[0]
    orig = runner.graphs[("decode", 2)].replay

    def corrupting_replay():
        orig()
        runner.state.ssm[victim] += 1.0

    runner.graphs[("decode", 2)].replay = corrupting_replay
    cmp = runner.compare(Batch.decode(rows, [3, 4]), torch.randn(2, runner.layer.config.hidden_size))
    assert ("ssm", victim) in cmp.integrity.changed_slots and not cmp.integrity.ok
