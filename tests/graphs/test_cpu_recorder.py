"""The cpu recorder behaves like a device graph where it matters: static tensors, frozen host Python,
host syncs refused, mutations replayed, nothing allocated at replay."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

from workbench.errors import CaptureError
from workbench.graphs import CpuBackend, get_backend
from workbench.graphs.base import TensorMeta


@pytest.fixture
def cpu() -> CpuBackend:
    return CpuBackend()


# --- custom ops used below (registered once per session) ---------------------------------------------


@torch.library.custom_op("wbtest::decay_accumulate", mutates_args=("acc",))
def decay_accumulate(x: torch.Tensor, acc: torch.Tensor, decay: float) -> None:
    """acc <- decay * acc + x.exp().sum(-1, keepdim): several aten ops inside, one op outside."""
    acc.mul_(decay)
    acc.add_(x.exp().sum(dim=-1, keepdim=True))


@torch.library.custom_op("wbtest::gated_mix", mutates_args=())
def gated_mix(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(g) * x + (1 - torch.sigmoid(g)) * x.flip(-1)


@torch.library.custom_op("wbtest::host_peek", mutates_args=())
def host_peek(x: torch.Tensor) -> torch.Tensor:
    n = int(x.sum().item())  # a host read inside the kernel wrapper: fine eagerly, not in a graph
    return x * n


def _eager_ops(x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A mix of ops whose replay paths differ (out=, rerun+copy, views, reductions, gathers)."""
    h = torch.softmax(x @ w, dim=-1)
    n = F.layer_norm(h, h.shape[-1:])
    vals, arg = n.max(dim=-1)
    c = torch.cumsum(n, dim=0)
    gathered = c[idx]
    cat = torch.cat([gathered, h[: idx.numel()]], dim=-1)
    masked = torch.where(cat > 0, cat, cat * 0.1)
    t = masked.t().contiguous()
    return h, vals, arg, c, gathered, masked.sum(dim=0), t, x.to(torch.float64).exp()


# --- replay matches eager --------------------------------------------------------------------------


def test_replay_matches_eager_bitwise_after_inputs_change(cpu: CpuBackend) -> None:
    x, w = torch.randn(6, 5), torch.randn(5, 7)
    idx = torch.tensor([4, 0, 2])
    g = cpu.capture(lambda: _eager_ops(x, w, idx))
    for _ in range(3):
        x.copy_(torch.randn(6, 5))
        w.copy_(torch.randn(5, 7))
        idx.copy_(torch.randint(0, 6, (3,)))
        g.replay()
        expected = _eager_ops(x, w, idx)
        for got, want in zip(g.outputs, expected, strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch.equal(got, want)


def test_out_variants_are_used_where_they_exist(cpu: CpuBackend) -> None:
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    g = cpu.capture(lambda: torch.relu(x @ w))
    assert [(op.name, op.replay) for op in g.ops] == [("aten.mm.default", "out="), ("aten.relu.default", "out=")]


def test_outputs_are_the_same_objects_each_replay(cpu: CpuBackend) -> None:
    x = torch.randn(4, 4)
    returned = {}

    def fn() -> dict[str, torch.Tensor]:
        returned["y"] = (x * 2).sum(dim=0)
        returned["z"] = x.exp()
        return dict(returned)

    g = cpu.capture(fn)
    outs = g.outputs
    assert outs["y"] is returned["y"] and outs["z"] is returned["z"]
    ptrs = {k: v.data_ptr() for k, v in outs.items()}
    for _ in range(3):
        x.normal_()
        g.replay()
        assert g.outputs is outs
        assert {k: v.data_ptr() for k, v in g.outputs.items()} == ptrs
        assert torch.equal(outs["y"], (x * 2).sum(dim=0))


def test_python_side_effects_run_only_at_capture(cpu: CpuBackend) -> None:
    x = torch.ones(3)
    calls = []

    def fn() -> torch.Tensor:
        calls.append(1)
        scale = 2.0 if len(calls) < 10 else 3.0  # a host decision: frozen at capture
        return x * scale

    g = cpu.capture(fn, warmup=2)
    assert len(calls) == 3  # two warm-ups and the capture
    for _ in range(20):
        g.replay()
    assert len(calls) == 3
    assert torch.equal(g.outputs, torch.full((3,), 2.0))


# --- host syncs and other things a graph cannot hold ------------------------------------------------


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda t: t.sum().item(), id="item"),
        pytest.param(lambda t: t.tolist(), id="tolist"),
        pytest.param(lambda t: bool(t[0] > 0), id="bool"),
        pytest.param(lambda t: int(t[0]), id="int"),
        pytest.param(lambda t: float(t.max()), id="float"),
        pytest.param(lambda t: torch.equal(t, t), id="equal"),
    ],
)
def test_host_sync_in_capture_raises_naming_the_op(cpu: CpuBackend, read) -> None:
    x = torch.arange(4.0)

    def fn() -> torch.Tensor:
        read(x)
        return x + 1

    with pytest.raises(CaptureError, match=r"aten\.(_local_scalar_dense|equal)") as info:
        cpu.capture(fn, warmup=0)
    assert "test_cpu_recorder.py" in str(info.value)  # the source line is named
    assert _get_current_dispatch_mode() is None  # the recorder did not stay pushed
    assert torch.equal(cpu.capture(lambda: x + 1).outputs, x + 1)  # and capturing works again


@pytest.mark.parametrize(
    ("read", "what"),
    [
        (lambda t: t.cpu(), "Tensor.cpu"),
        (lambda t: t.numpy(), "Tensor.numpy"),
        (lambda t: repr(t), "printing"),
        (lambda t: f"{t}", "formatting"),
    ],
    ids=["cpu", "numpy", "repr", "format"],
)
def test_host_reads_that_skip_the_dispatcher_raise(cpu: CpuBackend, read, what: str) -> None:
    x = torch.arange(4.0)

    def fn() -> torch.Tensor:
        read(x)
        return x * 2

    with pytest.raises(CaptureError, match=what):
        cpu.capture(fn, warmup=0)


def test_host_sync_inside_a_custom_op_is_noted_and_replays(cpu: CpuBackend) -> None:
    x = torch.ones(3)
    assert torch.equal(host_peek(x), x * 3)  # fine eagerly
    g = cpu.capture(lambda: host_peek(x))
    (rec,) = [op for op in g.ops if "host_peek" in op.name]
    assert "syncs with the host" in rec.note and "device kernel must not" in rec.note
    x.copy_(torch.tensor([2.0, 0.5, 1.0]))  # the op re-runs whole, with the values of the moment
    g.replay()
    assert torch.equal(g.outputs, host_peek(x))


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda x, i: x.nonzero(), id="nonzero"),
        pytest.param(lambda x, i: x[x > 0], id="mask-index"),
        pytest.param(lambda x, i: torch.unique(i), id="unique"),
    ],
)
def test_data_dependent_shapes_raise(cpu: CpuBackend, fn) -> None:
    x, i = torch.randn(5), torch.tensor([1, 1, 3])
    with pytest.raises(CaptureError, match="data-dependent output shape"):
        cpu.capture(lambda: fn(x, i), warmup=0)


def test_integer_indexing_is_fine(cpu: CpuBackend) -> None:
    x, i = torch.randn(5, 2), torch.tensor([4, 0])
    g = cpu.capture(lambda: x[i])
    i.copy_(torch.tensor([1, 3]))
    g.replay()
    assert torch.equal(g.outputs, x[torch.tensor([1, 3])])


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda x: x + torch.randn(3), id="randn"),
        pytest.param(lambda x: x * torch.rand_like(x), id="rand_like"),
        pytest.param(lambda x: F.dropout(x, 0.5, training=True), id="dropout"),
    ],
)
def test_randomness_raises(cpu: CpuBackend, fn) -> None:
    x = torch.ones(3)
    with pytest.raises(CaptureError, match="random numbers during capture"):
        cpu.capture(lambda: fn(x), warmup=0)


@torch.library.custom_op("wbtest::noisy", mutates_args=())
def noisy(x: torch.Tensor) -> torch.Tensor:
    return x + torch.randn_like(x)


def test_randomness_inside_a_custom_op_raises(cpu: CpuBackend) -> None:
    x = torch.ones(3)
    with pytest.raises(CaptureError, match=r"random numbers during capture: wbtest\.noisy"):
        cpu.capture(lambda: noisy(x), warmup=0)


def test_seeded_op_that_draws_nothing_is_fine(cpu: CpuBackend) -> None:
    # sdpa's cpu kernel is tagged nondeterministic_seeded (dropout), but with dropout_p=0 it draws nothing.
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    g = cpu.capture(lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.0))
    q.normal_()
    g.replay()
    assert torch.equal(g.outputs, F.scaled_dot_product_attention(q, k, v, dropout_p=0.0))


def test_fn_must_return_tensors(cpu: CpuBackend) -> None:
    x = torch.ones(2)
    with pytest.raises(CaptureError, match="must return tensors"):
        cpu.capture(lambda: (x * 2, 3))
    assert cpu.capture(lambda: (x.mul_(1.0), None)[1]).outputs is None


def test_captures_do_not_nest(cpu: CpuBackend) -> None:
    x = torch.ones(2)
    with pytest.raises(CaptureError, match="do not nest"):
        cpu.capture(lambda: cpu.capture(lambda: x * 2).outputs, warmup=0)


def test_bad_warmup(cpu: CpuBackend) -> None:
    with pytest.raises(ValueError, match="warmup"):
        cpu.capture(lambda: torch.ones(1), warmup=-1)


# --- mutation, state, views ---------------------------------------------------------------------------


def _decode_step(pool: torch.Tensor, idx: torch.Tensor, x: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """A recurrent decode step: gather state slots, update, scatter back, count steps."""
    s = pool.index_select(0, idx)
    s = s * 0.9 + x.unsqueeze(-1) * x.unsqueeze(-2)
    pool.index_copy_(0, idx, s)
    steps.add_(1)
    pool[0].fill_(0.0)  # the null slot stays zero (a view, mutated in place)
    return (s * x.unsqueeze(-2)).sum(-1)


def test_in_place_state_advances_each_replay_as_eager(cpu: CpuBackend) -> None:
    pool, idx, x, steps = (
        torch.randn(5, 3, 3),
        torch.tensor([2, 4]),
        torch.randn(2, 3),
        torch.zeros((), dtype=torch.long),
    )
    eager_pool, eager_steps = pool.clone(), steps.clone()
    g = cpu.capture(lambda: _decode_step(pool, idx, x, steps), warmup=2)
    for _ in range(2):  # warm-ups ran for real; the capture itself must not have advanced anything
        _decode_step(eager_pool, idx, x, eager_steps)
    assert torch.equal(pool, eager_pool) and int(steps) == 2
    for _ in range(4):
        x.normal_()
        idx.copy_(torch.randperm(4)[:2] + 1)
        g.replay()
        want = _decode_step(eager_pool, idx, x, eager_steps)
        assert torch.equal(g.outputs, want)
        assert torch.equal(pool, eager_pool) and torch.equal(steps, eager_steps)
    assert int(steps) == 6
    kinds = {op.name: op.replay for op in g.ops}
    assert kinds["aten.index_copy_.default"] == "in place"
    assert kinds["aten.fill_.Scalar"] == "in place"
    assert {op.name: op.mutates for op in g.ops}["aten.index_copy_.default"] == ("self",)


def test_capture_leaves_pre_existing_tensors_unchanged(cpu: CpuBackend) -> None:
    state = torch.arange(4.0)
    before = state.clone()
    g = cpu.capture(lambda: state.mul_(2).add_(1), warmup=0)
    assert torch.equal(state, before)  # as on a device: capture runs nothing
    g.replay()
    assert torch.equal(state, before * 2 + 1)


def test_failed_capture_restores_mutated_tensors(cpu: CpuBackend) -> None:
    state = torch.arange(4.0)

    def fn() -> torch.Tensor:
        state.add_(10)
        return state.sum().item()

    with pytest.raises(CaptureError):
        cpu.capture(fn, warmup=0)
    assert torch.equal(state, torch.arange(4.0))


def test_views_made_in_capture_alias_the_right_storage(cpu: CpuBackend) -> None:
    x = torch.randn(4, 6)

    def fn() -> tuple[torch.Tensor, ...]:
        col = x[:, 1]  # a view of the static input, used later
        y = col * 3
        return y, y[1:], y.view(2, 2), x.t()

    g = cpu.capture(fn)
    y, tail, sq, xt = g.outputs
    x.normal_()
    g.replay()
    assert torch.equal(y, x[:, 1] * 3)
    assert torch.equal(tail, y[1:]) and torch.equal(sq, y.view(2, 2))
    assert tail.untyped_storage()._cdata == y.untyped_storage()._cdata
    assert xt.untyped_storage()._cdata == x.untyped_storage()._cdata
    assert [op.replay for op in g.ops if op.name in ("aten.select.int", "aten.slice.Tensor", "aten.view.default")] == [
        "view"
    ] * 3


# --- custom ops ------------------------------------------------------------------------------------------


def test_custom_op_is_one_recorded_op_and_its_mutation_replays(cpu: CpuBackend) -> None:
    x, acc = torch.randn(2, 5), torch.zeros(2, 1)
    g = cpu.capture(lambda: decay_accumulate(x, acc, 0.5), warmup=0)
    assert [op.name for op in g.ops] == ["wbtest.decay_accumulate.default"]  # no inner exp/sum/mul_/add_
    (op,) = g.ops
    assert op.mutates == ("acc",) and op.replay == "in place"
    assert op.inputs == (TensorMeta((2, 5), torch.float32), TensorMeta((2, 1), torch.float32))
    expected = torch.zeros(2, 1)
    for _ in range(3):
        x.normal_()
        g.replay()
        expected = expected * 0.5 + x.exp().sum(-1, keepdim=True)
        assert torch.equal(acc, expected)


def test_custom_op_with_fresh_output(cpu: CpuBackend) -> None:
    x, gate = torch.randn(3, 4), torch.randn(3, 4)
    g = cpu.capture(lambda: gated_mix(x, gate) + 1)
    assert [op.name for op in g.ops] == ["wbtest.gated_mix.default", "aten.add.Tensor"]
    out, ptr = g.outputs, g.outputs.data_ptr()
    gate.normal_()
    g.replay()
    assert g.outputs is out and out.data_ptr() == ptr
    assert torch.equal(out, gated_mix(x, gate) + 1)


def test_ops_and_summary_list_the_recorded_ops(cpu: CpuBackend) -> None:
    x = torch.randn(3, 4)
    g = cpu.capture(lambda: (x * 2).sum(dim=0))
    assert [op.name for op in g.ops] == ["aten.mul.Tensor", "aten.sum.dim_IntList"]
    assert g.ops[0].inputs == (TensorMeta((3, 4), torch.float32),)
    assert g.ops[1].outputs == (TensorMeta((4,), torch.float32),)
    assert all("test_cpu_recorder.py" in op.source for op in g.ops)
    text = g.summary()
    assert "aten.mul.Tensor" in text and "aten.sum.dim_IntList" in text and "float32[3,4]" in text
    assert text.splitlines()[0].split() == ["#", "op", "inputs", "mutates", "outputs", "replay", "source"]


# --- memory ----------------------------------------------------------------------------------------------


def _live_tensors() -> int:
    gc.collect()
    return sum(issubclass(type(o), torch.Tensor) for o in gc.get_objects())


@pytest.mark.slow  # many replays to see memory settle
def test_replay_allocates_nothing_that_survives(cpu: CpuBackend) -> None:
    pool, idx, x, steps = (
        torch.randn(5, 3, 3),
        torch.tensor([1, 3]),
        torch.randn(2, 3),
        torch.zeros((), dtype=torch.long),
    )
    w = torch.randn(6, 6)

    def fn() -> tuple[torch.Tensor, ...]:
        out = _decode_step(pool, idx, x, steps)
        return out, torch.softmax(out.repeat(1, 2) @ w, -1), x.to(torch.float64)

    g = cpu.capture(fn)
    g.replay()
    storages = [(t.untyped_storage()._cdata, t.data_ptr()) for t in g.outputs]
    live = _live_tensors()
    for _ in range(5):
        g.replay()
    assert _live_tensors() == live
    assert [(t.untyped_storage()._cdata, t.data_ptr()) for t in g.outputs] == storages


def test_reset_then_replay_raises(cpu: CpuBackend) -> None:
    g = cpu.capture(lambda: torch.ones(2) * 2)
    g.reset()
    assert g.ops == []
    with pytest.raises(CaptureError, match="after reset"):
        g.replay()


def test_inference_mode_capture_replays(cpu: CpuBackend) -> None:
    with torch.inference_mode():
        state = torch.zeros(3)
        x = torch.ones(3)
        g = cpu.capture(lambda: state.add_(x), warmup=0)
    g.replay()
    g.replay()
    assert torch.equal(state, torch.full((3,), 2.0))


def test_get_backend_cpu_capture_roundtrip() -> None:
    backend = get_backend("cpu")
    assert backend.new_pool() is None
    x = torch.zeros(4)
    g = backend.capture(lambda: x * 2 + 1, pool=backend.new_pool())
    x.copy_(torch.arange(4.0))
    g.replay()
    assert torch.equal(g.outputs, torch.tensor([1.0, 3.0, 5.0, 7.0]))
    assert "cpu" in repr(g) and "live" in repr(g)
