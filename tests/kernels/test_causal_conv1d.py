"""causal_conv1d.update / varlen: the conformance matrix (``kernels.testing``), the reference against
F.conv1d, and what the matrix does not cover (widths, no bias or activation, verify windows against
stepwise decode, extreme pre-activations, strided inputs, argument errors, the custom ops, the cost models).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _kernel_helpers import IMPLS, OpLog, conformance, opcheck_mutations

from kernels import causal_conv1d as cc
from kernels.cost import Cost
from kernels.testing import cu_seqlens, make_case

# --- float64 reference: conformance and semantics ---------------------------------------------------


@pytest.mark.parametrize("run", conformance("causal_conv1d.update", "causal_conv1d.varlen"), ids=str)
def test_conforms(run):
    run.check()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "width,bias,activation,convention", [(2, True, "silu", "sglang-ascend"), (3, False, None, "vllm")]
)
def test_update_other_widths_without_bias_or_activation(impl, width, bias, activation, convention):
    """Kernel widths 2 and 3, no bias, no activation; D tokens per row with both the windows and the pool
    written."""
    case = make_case("causal_conv1d.update", "verify", convention=convention, rows=2, padded=1, shapes={"width": width})
    case.args.update(activation=activation, disable_state_update=False, **({} if bias else {"bias": None}))
    res = case.check(case.run(impl=impl))
    assert res.ok, res.summary()


def test_update_reference_is_a_causal_convolution():
    """Independent check of the reference semantics against F.conv1d on the unrolled sequence."""
    N, L, dim, W, num_slots = 2, 3, 4, 4, 3
    x = torch.randn(N, L, dim, dtype=torch.float64)
    weight = torch.randn(dim, W, dtype=torch.float64)
    bias = torch.randn(dim, dtype=torch.float64)
    pool = torch.randn(num_slots, dim, W - 1, dtype=torch.float64)
    idx = torch.tensor([2, 0])
    before = pool.clone()
    out = cc.update(x, pool, weight, bias, state_indices=idx, activation="silu", impl="reference")
    for n, slot in enumerate(idx.tolist()):
        seq = torch.cat([before[slot], x[n].T], dim=1)  # [dim, W-1+L]
        expected = F.silu(F.conv1d(seq.unsqueeze(0), weight.unsqueeze(1), bias, groups=dim))[0].T  # [L, dim]
        torch.testing.assert_close(out[n], expected)
        torch.testing.assert_close(pool[slot], seq[:, -(W - 1) :])


def test_varlen_reference_is_a_causal_convolution():
    """Independent check: initial state or zeros, then F.conv1d; short sequences keep older inputs."""
    dim, W = 3, 4
    x = torch.randn(4, dim, dtype=torch.float64)
    weight, pool = torch.randn(dim, W, dtype=torch.float64), torch.randn(3, dim, W - 1, dtype=torch.float64)
    before = pool.clone()
    out = cc.varlen(
        x,
        weight,
        conv_state=pool,
        state_indices=torch.tensor([1, 2]),
        has_initial_state=torch.tensor([False, True]),
        cu_seqlens=cu_seqlens([3, 1]),
        impl="reference",
    )
    seq0 = torch.cat([torch.zeros(dim, W - 1, dtype=torch.float64), x[0:3].T], dim=1)
    seq1 = torch.cat([before[2], x[3:4].T], dim=1)
    for seq, (bos, eos), slot in ((seq0, (0, 3), 1), (seq1, (3, 4), 2)):
        expected = F.conv1d(seq.unsqueeze(0), weight.unsqueeze(1), groups=dim)[0].T
        torch.testing.assert_close(out[bos:eos], expected)
        torch.testing.assert_close(pool[slot], seq[:, -(W - 1) :])
    torch.testing.assert_close(pool[2][:, :2], before[2][:, 1:])  # 1 token: two older inputs stay
    assert torch.equal(pool[0], before[0])


# --- beyond the matrix --------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_verify_windows_equal_stepwise_decode(impl):
    """Window t of a D-token verify equals the state after t+1 decode steps; outputs agree too."""
    case = make_case("causal_conv1d.update", "verify", convention="sglang", rows=2, padded=1, shapes={"D": 2})
    verify = case.run(impl=impl)
    res = case.check(verify)
    assert res.ok, res.summary()
    assert torch.equal(verify.args["conv_state"], case.args["conv_state"]), "disable_state_update changed the pool"

    step = case.fresh()
    x, pool, inter = step.args["x"], step.args["conv_state"], verify.args["intermediate_conv_windows"]
    rows = {n: slot for n, slot in enumerate(step.args["state_indices"].tolist()) if n < case.rows}
    kw = {n: step.args[n] for n in ("weight", "bias", "state_indices", "activation", "pad_slot_id")}
    for t in range(x.shape[1]):
        out = cc.update(x[:, t : t + 1], pool, **kw, impl=impl)
        torch.testing.assert_close(verify.args["out"][:, t], out[:, 0], atol=1e-6, rtol=1e-6)
        for n, slot in rows.items():
            assert torch.equal(inter[n, t], pool[slot]), f"row {n}: window {t} != state after step {t}"


@pytest.mark.parametrize("impl", IMPLS)
def test_silu_of_extreme_values(impl):
    """Pre-activations far beyond exp's float32 range: silu saturates cleanly (no overflow, no NaN)."""
    dim, W = 4, 2
    x = torch.tensor([[[-200.0, -90.0, 90.0, 200.0]]])
    weight, pool = torch.ones(dim, W), torch.zeros(2, dim, W - 1)
    out = cc.update(x, pool, weight, state_indices=torch.tensor([1]), activation="silu", impl=impl)
    torch.testing.assert_close(out, F.silu(x.double()).float(), atol=1e-30, rtol=1e-6)


def test_triton_follows_strides():
    """Channels-last conv pool (vLLM's layout), x sliced out of a wider projection, transposed weight."""
    N, L, dim, W, num_slots = 2, 2, 5, 4, 4
    x = torch.randn(N, L, 3 * dim)[..., dim : 2 * dim]
    weight = torch.randn(W, dim).T
    pool = torch.randn(num_slots, W - 1, dim).transpose(1, 2)
    idx = torch.tensor([3, 1], dtype=torch.int32)
    ref_pool = pool.contiguous()
    inter, ref_inter = torch.zeros(N, L, dim, W - 1), torch.zeros(N, L, dim, W - 1)
    out = cc.update(x, pool, weight, state_indices=idx, intermediate_conv_windows=inter, impl="triton")
    ref = cc.update(
        x.contiguous(),
        ref_pool,
        weight.contiguous(),
        state_indices=idx,
        intermediate_conv_windows=ref_inter,
        impl="reference",
    )
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(inter, ref_inter)
    assert torch.equal(pool, ref_pool)


def test_auto_is_reference_on_cpu():
    x, weight = torch.randn(2, 1, 3), torch.randn(3, 4)
    pool = torch.randn(3, 3, 3)
    idx = torch.tensor([1, 2])
    p1, p2 = pool.clone(), pool.clone()
    a = cc.update(x, p1, weight, state_indices=idx, impl="auto")
    b = cc.update(x, p2, weight, state_indices=idx, impl="reference")
    assert torch.equal(a, b) and torch.equal(p1, p2)


# --- custom op, validation, cost ------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_each_call_is_one_custom_op(impl):
    x, weight, pool = torch.randn(2, 1, 3), torch.randn(3, 4), torch.randn(3, 3, 3)
    idx = torch.tensor([1, -1])
    out = torch.empty_like(x)
    with OpLog() as log:
        cc.update(x, pool, weight, state_indices=idx, out=out, impl=impl)
    assert log.ops == ["linattn.causal_conv1d_update.default"]

    xs = torch.randn(3, 3)
    outs = torch.empty_like(xs)
    cu, init = cu_seqlens([1, 2]), torch.tensor([True, False])
    with OpLog() as log:
        cc.varlen(
            xs,
            weight,
            conv_state=pool,
            state_indices=idx,
            has_initial_state=init,
            cu_seqlens=cu,
            out=outs,
            impl=impl,
        )
    assert log.ops == ["linattn.causal_conv1d_varlen.default"]


def test_custom_op_schema_declares_the_mutations():
    x, weight, pool = torch.randn(2, 2, 3), torch.randn(3, 4), torch.randn(3, 3, 3)
    idx = torch.tensor([2, 1])
    inter, out = torch.zeros(2, 2, 3, 3), torch.zeros(2, 2, 3)
    args = (x, pool, weight, None, idx, inter, out, "silu", False, -1, "reference")
    opcheck_mutations(torch.ops.linattn.causal_conv1d_update.default, args)


def _update_kwargs():
    return dict(
        x=torch.randn(2, 1, 4),
        conv_state=torch.randn(3, 4, 2),
        weight=torch.randn(4, 3),
        bias=torch.randn(4),
        state_indices=torch.tensor([0, 1], dtype=torch.int32),
    )


BAD_UPDATE = [
    ("x", lambda kw: kw["x"][:, 0], r"x must be \[N, L, dim\]"),
    ("x dtype", lambda kw: kw["x"].long(), r"x must be floating point"),
    ("weight", lambda kw: kw["weight"][:, :1], r"W = weight.shape\[1\] must be >= 2"),
    ("weight dim", lambda kw: torch.randn(5, 3), r"weight must have shape \[4, 3\]"),
    ("bias", lambda kw: torch.randn(3), r"bias must have shape \[4\]"),
    ("conv_state", lambda kw: torch.randn(3, 4, 3), r"conv_state must have shape \[3, 4, 2\]"),
    ("conv_state dtype", lambda kw: kw["conv_state"].int(), r"conv_state must have dtype"),
    ("state_indices", lambda kw: torch.tensor([0, 1, 2]), r"state_indices must have shape \[2\]"),
    ("state_indices dtype", lambda kw: torch.tensor([0.0, 1.0]), r"state_indices must have dtype"),
    ("out", lambda kw: torch.empty(2, 2, 4), r"out must have shape \[2, 1, 4\]"),
    ("intermediate_conv_windows", lambda kw: torch.empty(2, 1, 4, 3), r"intermediate_conv_windows must"),
]


@pytest.mark.parametrize("name,make,match", BAD_UPDATE, ids=[b[0] for b in BAD_UPDATE])
def test_update_rejects_bad_inputs(name, make, match):
    kw = _update_kwargs()
    kw[name.split()[0]] = make(kw)
    with pytest.raises(ValueError, match=match):
        cc.update(**kw)


def test_update_rejects_bad_options():
    kw = _update_kwargs()
    with pytest.raises(ValueError, match="activation must be one of"):
        cc.update(**kw, activation="relu")
    with pytest.raises(ValueError, match="pad_slot_id must be an int or None"):
        cc.update(**kw, pad_slot_id=True)
    with pytest.raises(ValueError, match="impl must be one of"):
        cc.update(**kw, impl="cuda")
    with pytest.raises(ValueError, match="out must not share memory with x"):
        cc.update(**kw, out=kw["x"])
    with pytest.raises(IndexError, match="state_indices: row 1 has slot 7"):
        cc.update(**{**kw, "state_indices": torch.tensor([0, 7])}, impl="reference")


def test_varlen_rejects_bad_inputs():
    x, weight, pool = torch.randn(3, 4), torch.randn(4, 3), torch.randn(3, 4, 2)
    ok = dict(
        conv_state=pool,
        state_indices=torch.tensor([0, 1]),
        has_initial_state=torch.tensor([True, False]),
        cu_seqlens=cu_seqlens([1, 2]),
    )
    with pytest.raises(ValueError, match=r"x must be \[T, dim\]"):
        cc.varlen(x[None], weight, **ok)
    with pytest.raises(ValueError, match=r"state_indices must have shape \[2\]"):
        cc.varlen(x, weight, **{**ok, "state_indices": torch.tensor([0])})
    with pytest.raises(ValueError, match=r"has_initial_state must have dtype"):
        cc.varlen(x, weight, **{**ok, "has_initial_state": torch.tensor([1, 0])})
    with pytest.raises(ValueError, match=r"cu_seqlens must have dtype"):
        cc.varlen(x, weight, **{**ok, "cu_seqlens": torch.tensor([0.0, 1.0, 3.0])})
    with pytest.raises(ValueError, match=r"cu_seqlens must be a 1-D tensor"):
        cc.varlen(x, weight, **{**ok, "cu_seqlens": torch.zeros(1, 3, dtype=torch.int32)})


def test_costs():
    # decode, fp16 x/out/weights/state, no bias, 1 token: x+out 2*2*8*2, weight 8*4*2, state 2*8*3*2 in+out.
    c = cc.update_cost(2, 1, 8, 4, torch.float16, has_bias=False, activation=None)
    assert c == Cost(bytes=2 * 2 * 8 * 2 + 8 * 4 * 2 + 2 * (2 * 8 * 3 * 2), flops=2 * 8 * 8)
    verify = cc.update_cost(2, 3, 8, 4, torch.float16, intermediate=True, state_update=False)
    assert verify.bytes > cc.update_cost(2, 3, 8, 4, torch.float16, state_update=False).bytes
    v = cc.varlen_cost(10, 2, 8, 4, torch.bfloat16)
    assert v.flops == 10 * 8 * (2 * 4 + 1 + 4) and v.intensity > 0
