"""GraphRunner on the CPU recorder: replay equals eager, nothing lost, capture writes only the dummy slot."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench import Batch, CaptureError, StatePool, get_profile
from workbench.layers import GatedDeltaNetLayer, GDNConfig, KDAConfig, KDALayer, Mamba2Config, Mamba2Layer, make_layer
from workbench.measure.integrity import changed_slots, snapshot
from workbench.runner import GraphRunner

PROFILES = ["sglang", "sglang-ascend", "vllm"]
BUCKETS = [1, 2, 4, 8]
D = 2
NUM_SLOTS = 24


def make_runner(profile, layer=None, **kw):
    spr = get_profile(profile).slots_per_request(D)
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
    prof = captured.pool.profile
    slots = {slot for _, slot in captured.capture_changes}
    assert len(captured.captured) == 2 * len(BUCKETS)
    if prof.kernel_pad_slot_id is not None and prof.kernel_pad_slot_id >= prof.dummy_slot:
        assert slots == set()  # vLLM: the kernels skip slot 0 (the null block), so capture writes nothing
    else:
        assert slots == {prof.dummy_slot}  # sglang: warm-up really runs the kernels on the dummy slot


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
        assert not cmp.replayed and "above the largest" in cmp.reason
    else:
        assert cmp.replayed and cmp.bucket == min(b for b in BUCKETS if b >= max(raw, 1))
    assert cmp.bitwise_equal, (cmp.max_output_diff, cmp.max_state_diff)


def test_replay_keeps_every_static_address(captured):
    """Replays write into the tensors the graph recorded: outputs, metadata buffers, inputs, state."""
    rows = captured.free_rows[:3]
    x = torch.randn(3, captured.layer.config.hidden_size)
    captured.replay(Batch.decode(rows, [4, 5, 6]), x)  # first (bucket, raw_bs) use caches its views
    graph = captured.graph("decode", 4)
    meta = captured.meta_backend.buffers["decode"].static[4]

    def addresses():
        return (
            [graph.outputs.data_ptr(), captured.static_x["decode"].data_ptr()]
            + [t.data_ptr() for t in meta.tensors().values()]
            + [t.data_ptr() for t in captured.state.tensors().values()]
        )

    before, views = addresses(), len(captured.meta_backend.buffers["decode"]._views)
    out1 = captured.replay(Batch.decode(rows, [5, 6, 7]), torch.randn_like(x)).output.clone()
    out2 = captured.replay(Batch.decode(rows, [5, 6, 7]), torch.randn_like(x)).output
    assert addresses() == before and len(captured.meta_backend.buffers["decode"]._views) == views
    assert not torch.equal(out1, out2)  # the same tensor, overwritten with the new step


@pytest.mark.parametrize("layer", ["gdn", "mamba2", "kda"])
@pytest.mark.parametrize("profile", ["sglang", "sglang-ascend"])
@pytest.mark.parametrize("raw", [3, BUCKETS[-1] + 1], ids=["replayed", "eager-fallback"])
def test_verify_then_accept_equals_decoding_one_by_one(profile, raw, layer):
    chosen = make_layer(layer, seed=3, impl="reference")
    runner = make_runner(profile, layer=chosen)
    runner.capture(progress=False)
    rows = runner.pool.alloc(raw)
    x = torch.randn(raw * D, runner.layer.config.hidden_size)
    acc = [int(a) for a in torch.randint(1, D + 1, (raw,))]
    ref_state = runner.state.clone()
    res = runner.replay(Batch.target_verify(rows, [9] * raw, D), x)
    assert res.replayed == (raw <= BUCKETS[-1])
    runner.accept(acc)
    # reference: decode the accepted tokens of each request one by one, eagerly
    ref = make_runner(profile, layer=chosen)
    ref.state = ref_state
    ref.pool = runner.pool
    ref.meta_backend.pool = runner.pool
    xs = x.view(raw, D, -1)
    for step in range(D):
        live = [i for i in range(raw) if acc[i] > step]
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
    assert runner.modes == ("decode", "target_verify")
    runner.capture(progress=False)
    rows = runner.pool.alloc(5)
    cmp = runner.compare(Batch.decode(rows, [3, 4, 5, 6, 7]), torch.randn(5, layer.config.hidden_size))
    assert cmp.replayed and cmp.bucket == 8 and cmp.integrity.ok and cmp.bitwise_equal


# the interpreted Triton chunk scan over three runners is slow; the reference twin stays in `make test-fast`
@pytest.mark.parametrize("impl", ["reference", pytest.param("triton", marks=pytest.mark.slow)])
def test_mamba2_prefill_in_chunks_equals_one_pass_and_decode_steps(impl):
    """Two rows of 6 prompt tokens, three ways on the same random pool: one extend, two chunks (2 + 4, the
    second from the state the first left), one token then five decodes. Same states, same outputs; every
    other slot bitwise unchanged."""
    layer = Mamba2Layer(Mamba2Config.small(), seed=1, impl=impl)
    x = torch.randn(2, 6, layer.config.hidden_size, generator=torch.Generator().manual_seed(5))
    runners = [make_runner("sglang", layer=layer) for _ in range(3)]
    before = snapshot(runners[0].state.tensors())
    rows = [r.pool.alloc(2) for r in runners][0]
    one, two, dec = runners
    out_one = one.eager(Batch.extend(rows, [6, 6], [0, 0]), x.reshape(12, -1)).output.view(2, 6, -1)
    a = two.eager(Batch.extend(rows, [2, 2], [0, 0]), x[:, :2].reshape(4, -1)).output.view(2, 2, -1)
    b = two.eager(Batch.extend(rows, [4, 4], [2, 2]), x[:, 2:].reshape(8, -1)).output.view(2, 4, -1)
    outs = [dec.eager(Batch.extend(rows, [1, 1], [0, 0]), x[:, 0]).output]
    outs += [dec.eager(Batch.decode(rows, [t + 1, t + 1]), x[:, t]).output for t in range(1, 6)]
    torch.testing.assert_close(torch.cat([a, b], dim=1), out_one, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.stack(outs, dim=1), out_one, atol=1e-5, rtol=1e-4)
    slots = [int(s) for s in one.pool.mapping[rows, 0]]
    for other in (two, dec):
        for name, t in other.state.tensors().items():
            torch.testing.assert_close(t, one.state.tensors()[name], atol=1e-5, rtol=1e-4)
    changed = {(c.tensor, c.slot) for c in changed_slots(before, one.state.tensors())}
    assert changed == {(name, s) for name in ("conv", "ssm") for s in slots}


def test_integrity_catches_a_corrupting_step():
    """A step that writes a foreign slot must be reported (the check can fail)."""
    runner = make_runner("sglang", modes=["decode"])
    runner.capture(progress=False)
    rows = runner.pool.alloc(2)
    victim = runner.pool.free_slots()[0]
    orig = runner.graph("decode", 2).replay

    def corrupting_replay():
        orig()
        runner.state.ssm[victim] += 1.0

    runner.graph("decode", 2).replay = corrupting_replay
    cmp = runner.compare(Batch.decode(rows, [3, 4]), torch.randn(2, runner.layer.config.hidden_size))
    assert ("ssm", victim) in cmp.integrity.changed_slots and not cmp.integrity.ok


def test_accept_refuses_out_of_range_counts():
    runner = make_runner("sglang", modes=["target_verify"])
    runner.capture(progress=False)
    rows = runner.pool.alloc(2)
    runner.replay(Batch.target_verify(rows, [5, 5], D), torch.randn(2 * D, runner.layer.config.hidden_size))
    before = runner.state.clone()
    for bad, msg in (([1, 0], r"num_accepted\[1\] = 0"), ([1, D + 1], rf"num_accepted\[1\] = {D + 1}"), ([1], "shape")):
        with pytest.raises(ValueError, match=msg):
            runner.accept(bad)
    for name, t in runner.state.tensors().items():
        assert torch.equal(t, before.tensors()[name]), name  # nothing half-written


@pytest.mark.parametrize(
    "layer_cls,config", [(GatedDeltaNetLayer, GDNConfig), (Mamba2Layer, Mamba2Config), (KDALayer, KDAConfig)]
)
def test_vllm_decode_only_runner_needs_no_spec_slots(layer_cls, config):
    pool = StatePool(NUM_SLOTS, "vllm")  # one slot per request: fine when no verify graph is captured
    layer = layer_cls(config.small(), seed=2, impl="reference")
    runner = GraphRunner(
        layer, pool, buckets=BUCKETS, modes=["decode"], backend="cpu", state=layer.new_state(NUM_SLOTS, seed=4)
    )
    runner.capture(progress=False)
    rows = pool.alloc(5)
    cmp = runner.compare(Batch.decode(rows, [3] * 5), torch.randn(5, layer.config.hidden_size))
    assert cmp.ok and cmp.bucket == 8


def test_validate_metadata_flag_catches_an_unallocated_request():
    runner = make_runner("sglang", modes=["decode"], validate_metadata=True)
    runner.capture(progress=False)
    rows = runner.pool.alloc(2)
    runner.pool.free(rows[1:])  # a stale request the scheduler still sends
    x = torch.randn(2, runner.layer.config.hidden_size)
    with pytest.raises(ValueError, match=r"not an allocated request|dummy slot"):
        runner.replay(Batch.decode(rows, [3, 4]), x)


def test_integrity_reports_a_wrong_live_output():
    runner = make_runner("sglang", modes=["decode"])
    runner.capture(progress=False)
    rows = runner.pool.alloc(3)
    graph = runner.graph("decode", 4)
    orig = graph.replay

    def off_by_a_bit():
        orig()
        graph.outputs[1] += 1e-2  # a live row
        graph.outputs[3] += 1.0  # a padded row

    graph.replay = off_by_a_bit
    cmp = runner.compare(Batch.decode(rows, [3, 4, 5]), torch.randn(3, runner.layer.config.hidden_size))
    assert [t for t, _ in cmp.integrity.output_mismatches] == [1]
    assert cmp.integrity.nonzero_padded_outputs == [3]
    assert not cmp.bitwise_equal and not cmp.ok


def test_capture_progress_bar_keeps_quiet_in_a_log(capsys):
    # stderr is no terminal here (as in `make demo > log`): no carriage-return updates go into it
    layer = GatedDeltaNetLayer(GDNConfig.small(), impl="reference")
    runner = GraphRunner(layer, StatePool(8, "sglang"), buckets=[1, 2], modes=["decode"], backend="cpu")
    runner.capture(progress=True)
    assert runner.captured == [("decode", 1), ("decode", 2)]
    err = capsys.readouterr().err
    assert "capture (cpu)" not in err and "\r" not in err


def test_profile_argument_must_match_the_pool():
    pool = StatePool(8, "sglang")
    layer = GatedDeltaNetLayer(GDNConfig.small(), impl="reference")
    assert GraphRunner(layer, pool, "sglang", buckets=[1], backend="cpu").pool is pool
    with pytest.raises(ValueError, match="profile: 'vllm' given, but the pool follows 'sglang'"):
        GraphRunner(layer, pool, "vllm", buckets=[1], backend="cpu")


@pytest.mark.slow  # Triton interpreter through capture and replay
def test_triton_kernels_capture_and_replay_in_the_interpreter():
    """The Triton path (interpreter on the CPU) through the recorder: each kernel is one recorded op."""
    layer = GatedDeltaNetLayer(GDNConfig.small(), seed=5, impl="triton")
    runner = make_runner("sglang", layer=layer, modes=["decode"])
    runner.capture(progress=False)
    names = [op.name for op in runner.graph("decode", 2).ops]
    assert names.count("linattn.gdn_recurrent.default") == 1
    assert names.count("linattn.causal_conv1d_update.default") == 1
    rows = runner.pool.alloc(2)
    cmp = runner.compare(Batch.decode(rows, [4, 5]), torch.randn(2, layer.config.hidden_size))
    assert cmp.ok, (cmp.bitwise_equal, str(cmp.integrity))


def test_runner_shows_layer_profile_backend_buckets_and_what_is_captured():
    from html.parser import HTMLParser

    runner = make_runner("vllm", modes=["decode"])
    before = repr(runner)
    assert before == (
        "GraphRunner(GatedDeltaNetLayer, profile='vllm', backend='cpu', buckets decode [1, 2, 4, 8], captured 0/4)"
    )
    runner.capture(progress=False)
    assert repr(runner).endswith("captured 4/4)")

    class Rows(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[tuple[str, list[str]]] = []

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.rows.append((dict(attrs).get("class", ""), []))

        def handle_data(self, data):
            if self.rows and data.strip():
                self.rows[-1][1].append(data.strip())

    page = runner._repr_html_()
    scan = Rows()
    scan.feed(page)
    assert "GraphRunner" in page and "vllm" in page and "GatedDeltaNetLayer" in page
    assert scan.rows[1:] == [("wb-ok", ["decode", "[1, 2, 4, 8]", "4/4"])]  # header row, then one per mode


def test_compare_replay_takes_the_runner_itself():
    """``GraphRunner.compare`` is ``workbench.runner.compare_replay`` on the runner (no protocol between)."""
    from workbench.runner import compare_replay

    runner = make_runner("sglang", modes=["decode"])
    runner.capture(progress=False)
    rows = runner.pool.alloc(3)
    cmp = compare_replay(runner, Batch.decode(rows, [3, 4, 5]), torch.randn(3, runner.layer.config.hidden_size))
    assert cmp.ok and cmp.bucket == 4 and cmp.raw_batch_size == 3


# -- draft trees (sglang's topk > 1) ----------------------------------------------------------------------
def tree_runner(profile="sglang", layer="gdn"):
    pool = StatePool(NUM_SLOTS, profile)
    chosen = make_layer(layer, seed=3, impl="reference")
    state = chosen.new_state(NUM_SLOTS, seed=7)
    runner = GraphRunner(chosen, pool, buckets=[1, 2, 4], draft_tokens=4, backend="cpu", state=state, tree=True)
    runner.capture(progress=False)
    return runner


@pytest.mark.parametrize("layer", ["gdn", "mamba2", "kda"])
def test_a_tree_verify_replays_and_commits_each_rows_last_accepted_node(layer):
    from workbench.metadata import DraftTree

    runner = tree_runner(layer=layer)
    assert "draft trees" in repr(runner) and "tree" in runner._repr_html_()
    rows = runner.pool.alloc(3)
    tree = DraftTree.from_parents([[-1, 0, 0, 1], [-1, 0, 0, 2], [-1, 0, 1, 2]])
    x = torch.randn(3 * 4, runner.layer.config.hidden_size)
    eager = runner.eager(Batch.target_verify(rows, [9] * 3, 4, tree=tree), x).output.clone()
    res = runner.replay(Batch.target_verify(rows, [9] * 3, 4, tree=tree), x)
    assert res.replayed and res.bucket == 4
    torch.testing.assert_close(res.output, eager)  # the graph read the rows' trees from its static buffers
    inter = runner.last_intermediate
    assert inter is not None
    # paths [0, 1, 3], [0, 2] and [0]: sglang's accept_index of global ids b * D + node
    runner.accept([3, 2, 1], accept_index=[[0, 1, 3], [4, 6, -1], [8, -1, -1]])
    slots = [runner.pool.slots_of(int(r))[0] for r in rows]
    for b, (slot, node) in enumerate(zip(slots, [3, 2, 0], strict=True)):
        assert torch.equal(runner.state.ssm[slot], inter.ssm[b, node].to(runner.state.ssm.dtype))
        assert torch.equal(runner.state.conv[slot], inter.conv[b, node].to(runner.state.conv.dtype))
    runner.accept([1, 1, 1], accepted_steps=[1, 1, 2])  # the engine's commit nodes, given directly
    assert torch.equal(runner.state.ssm[slots[2]], inter.ssm[2, 2].to(runner.state.ssm.dtype))


def test_tree_runners_refuse_what_does_not_fit():
    from workbench.errors import MetadataError
    from workbench.metadata import DraftTree

    with pytest.raises(MetadataError, match=r"tree: profile 'vllm' verifies chains only \(vLLM removed tree drafts\)"):
        GraphRunner(make_layer("gdn"), StatePool(NUM_SLOTS, "vllm", slots_per_request=4), draft_tokens=4, tree=True)
    runner = tree_runner()
    rows = runner.pool.alloc(2)
    x = torch.randn(2 * 4, runner.layer.config.hidden_size)
    with pytest.raises(MetadataError, match="tree"):  # a chain batch on tree buffers: no links to read
        runner.replay(Batch.target_verify(rows, [9, 9], 4), x)
    runner.replay(Batch.target_verify(rows, [9, 9], 4, tree=DraftTree.from_parents([[-1, 0, 0, 1]] * 2)), x)
    before = runner.state.clone()
    with pytest.raises(MetadataError, match=r"accept_index\[1, 1\] = 2: not a node of row 1 \(global ids 4..7\)"):
        runner.accept([3, 2], accept_index=[[0, 1, 3], [4, 2, -1]])
    with pytest.raises(MetadataError, match=r"accepted_steps\[0\] = 4: must be in 0..D-1=3"):
        runner.accept([1, 1], accepted_steps=[4, 0])
    with pytest.raises(MetadataError, match="not both"):
        runner.accept([1, 1], accept_index=[[0], [4]], accepted_steps=[0, 0])
    for name, t in runner.state.tensors().items():
        assert torch.equal(t, before.tensors()[name]), name  # nothing half-written
    chains = make_runner("vllm")
    chains.capture(progress=False)
    vrows = chains.pool.alloc(1)
    chains.replay(Batch.target_verify(vrows, [9], D, num_accepted_tokens=[1]), torch.randn(D, 32))
    with pytest.raises(MetadataError, match="accept_index: profile 'vllm' commits chains by count"):
        chains.accept([1], accept_index=[[0, 1]])
