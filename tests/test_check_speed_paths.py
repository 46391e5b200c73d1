"""The paths that make a checked trace cheap (issue 33) keep what they replace: the kernels' direct call of the
torch reference, the CPU recorder's direct replay of a custom op's function, lazy capture, the replay's
inference mode."""

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import kernels.causal_conv1d as conv1d
from kernels import dispatch
from workbench import Batch, StatePool, get_profile
from workbench.errors import MetadataError
from workbench.graphs import get_backend
from workbench.layers import GatedDeltaNetLayer, GDNConfig
from workbench.measure.integrity import changed_slots, snapshot
from workbench.runner import GraphRunner
from workbench.traces.replay import TraceReplayer, replay_trace
from workbench.traces.simulate import simulate


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class _PassThrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        return func(*args, **(kwargs or {}))


def _conv_call(**over):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 1, 8, generator=g)
    state = torch.randn(5, 8, 3, generator=g)
    args = dict(state_indices=torch.tensor([1, 2, 4], dtype=torch.int32), activation="silu", impl="reference")
    args.update(over)
    return x, state, torch.randn(8, 4, generator=g), torch.randn(8, generator=g), args


def _count_direct(monkeypatch) -> list[str]:
    """Names of the ops ``call_op`` ran by their function (its direct path)."""
    seen: list[str] = []
    for op, fn in list(dispatch._DIRECT.items()):

        def spy(*a, _fn=fn, _name=op._qualname, **k):  # noqa: ANN001, ANN202
            seen.append(_name)
            return _fn(*a, **k)

        monkeypatch.setitem(dispatch._DIRECT, op, spy)
    return seen


def test_the_reference_on_the_cpu_skips_the_dispatcher_and_gives_the_same_bytes(monkeypatch):
    direct = _count_direct(monkeypatch)
    x, state, w, b, args = _conv_call()
    s1 = state.clone()
    out1 = conv1d.update(x, s1, w, b, **args)
    assert direct == ["linattn::causal_conv1d_update"]
    with _Ops() as log:  # a dispatch mode active: the dispatcher runs the op, one op per call
        s2 = state.clone()
        out2 = conv1d.update(x, s2, w, b, **args)
    custom = [op for op in log.ops if op.startswith("linattn.")]
    assert custom == ["linattn.causal_conv1d_update.default"] and direct == ["linattn::causal_conv1d_update"]
    assert torch.equal(out1, out2) and torch.equal(s1, s2)


@pytest.mark.parametrize("why", ["function mode", "gradient", "compiling"])
def test_whatever_could_tell_takes_the_dispatcher(monkeypatch, why):
    direct = _count_direct(monkeypatch)
    x, state, w, b, args = _conv_call()
    if why == "function mode":
        with _PassThrough():
            conv1d.update(x, state, w, b, **args)
    elif why == "gradient":
        w.requires_grad_(True)
        conv1d.update(x, state, w.detach() * 1 + w * 0, b, **args)
    else:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        conv1d.update(x, state, w, b, **args)
    assert direct == []


def test_the_recorder_replays_a_custom_op_by_its_function_and_still_holds_one_op():
    x, state, w, b, args = _conv_call()
    cpu = get_backend("cpu")
    out = torch.empty_like(x)

    def step():
        return conv1d.update(x, state, w, b, out=out, **args)

    graph = cpu.capture(step, warmup=0)
    custom = [r for r in graph.ops if r.name.startswith("linattn.")]
    assert [r.name for r in custom] == ["linattn.causal_conv1d_update.default"] and custom[0].replay == "in place"
    want_state = state.clone()
    want = conv1d.update(x, want_state, w, b, **args)
    graph.replay()
    assert torch.equal(graph.outputs, want) and torch.equal(state, want_state)


def _runner(profile: str = "sglang") -> GraphRunner:
    pool = StatePool(24, profile, slots_per_request=get_profile(profile).slots_per_request(2))
    layer = GatedDeltaNetLayer(GDNConfig.small(), seed=3, impl="reference")
    return GraphRunner(layer, pool, buckets=[1, 2, 4], draft_tokens=2, backend="cpu", state=layer.new_state(24, seed=7))


def test_lazy_capture_captures_each_bucket_at_its_first_replay_and_writes_only_the_dummy_slot():
    runner = _runner()
    before = snapshot(runner.state.tensors())
    runner.capture(progress=False, lazy=True, now=[("decode", 2)])
    assert runner.captured == [("decode", 2)]
    assert {s for _, s in changed_slots(before, runner.state.tensors())} <= {runner.pool.profile.dummy_slot}
    rows = runner.pool.alloc(3)
    x = torch.randn(3, runner.layer.config.hidden_size)
    eager = _runner()
    eager.pool.alloc(3)
    before = snapshot(runner.state.tensors())
    res = runner.replay(Batch.decode(rows, [5, 6, 7]), x)
    assert res.replayed and res.bucket == 4 and runner.captured == [("decode", 2), ("decode", 4)]
    changed = {s for _, s in changed_slots(before, runner.state.tensors())}
    live = {slot for row in rows.tolist() for slot in runner.pool.slots_of(row)}
    assert changed <= {*live, runner.pool.profile.dummy_slot}
    want = eager.eager(Batch.decode(rows, [5, 6, 7]), x)
    assert torch.allclose(res.output, want.output, atol=1e-6)
    assert runner.graph("target_verify", 1) is not None and ("target_verify", 1) in runner.captured


def test_capture_refuses_what_lazy_capture_cannot_take():
    runner = _runner()
    with pytest.raises(MetadataError, match="now: only with lazy=True"):
        runner.capture(progress=False, now=[("decode", 1)])
    with pytest.raises(MetadataError, match=r"now: \('decode', 3\) is not a \(mode, bucket\)"):
        runner.capture(progress=False, lazy=True, now=[("decode", 3)])
    with pytest.raises(MetadataError, match="lazy must be a bool"):
        runner.capture(progress=False, lazy="yes")  # type: ignore[arg-type]
    runner.capture(progress=False)  # eager capture: every bucket, as before
    assert len(runner.captured) == 6
    with pytest.raises(Exception, match="is not captured"):
        runner.graph("decode", 3)


def test_a_trace_captures_only_the_buckets_its_steps_replay():
    trace = simulate("sglang", "gdn", steps=40, seed=0)  # the CLI's default: no verify step
    replayer = TraceReplayer(trace)
    assert replayer.runner.captured and all(m == "decode" for m, _ in replayer.runner.captured)
    assert replayer.run().ok
    assert all(m == "decode" for m, _ in replayer.runner.captured)


def test_a_replay_leaves_the_runner_usable_outside_inference_mode():
    trace = simulate("sglang", "gdn", steps=30, seed=0, spec=2)
    replayer = TraceReplayer(trace)
    assert replayer.run().ok
    assert not replayer.runner.state.ssm.is_inference() and not replayer.shadow.ssm.is_inference()
    for meta in replayer.runner.meta_backend.buffers["target_verify"].static.values():
        for t in meta.tensors().values():  # the metadata backend's tensors stay ordinary: a notebook may write them
            assert not t.is_inference()
            t.copy_(t.clone())
    assert replay_trace(trace).ok
