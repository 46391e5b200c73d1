"""causal_conv1d.update / varlen: both implementations against a float64 reference, padding, integrity."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _kernel_helpers import (
    TOLERANCES,
    OpLog,
    assert_close,
    assert_pool,
    cu_from_lens,
    make_indices,
    nan_like,
    opcheck_mutations,
)

from kernels import causal_conv1d as cc
from kernels.cost import Cost

# --- update (decode / verify) ---------------------------------------------------------------------

UPDATE_CASES = [
    # impl, dtype, convention, n_live, n_pad, L, dim, W, activation, bias
    ("reference", torch.float32, "sglang", 3, 1, 1, 5, 4, "silu", True),
    ("triton", torch.float32, "sglang", 3, 1, 1, 5, 4, "silu", True),
    ("reference", torch.float32, "vllm", 2, 2, 3, 33, 3, None, False),
    ("triton", torch.float32, "vllm", 2, 2, 3, 33, 3, None, False),
    ("reference", torch.float32, "ascend", 3, 1, 2, 12, 2, "silu", True),
    ("triton", torch.float32, "ascend", 3, 1, 2, 12, 2, "silu", True),
    ("triton", torch.bfloat16, "sglang", 2, 1, 1, 6, 4, "silu", True),
    ("triton", torch.float16, "vllm", 2, 1, 2, 7, 4, None, True),
    ("reference", torch.bfloat16, "ascend", 2, 1, 2, 7, 4, "silu", True),
]


@pytest.mark.parametrize("impl,dtype,convention,n_live,n_pad,L,dim,W,activation,bias", UPDATE_CASES)
def test_update_matches_float64(impl, dtype, convention, n_live, n_pad, L, dim, W, activation, bias):
    num_slots = 6
    idx, pad_slot_id, live_slots, dummy = make_indices(convention, n_live, n_pad, num_slots)
    N = n_live + n_pad
    x = torch.randn(N, L, dim).to(dtype)
    weight = torch.randn(dim, W).to(dtype)
    b = torch.randn(dim).to(dtype) if bias else None
    pool = torch.randn(num_slots, dim, W - 1).to(dtype)
    before = pool.clone()
    inter = torch.full((N, L, dim, W - 1), float("nan"), dtype=dtype)
    out = nan_like(x)

    rows = dict(conv_state_indices=idx, activation=activation, pad_slot_id=pad_slot_id)
    got = cc.update(x, pool, weight, b, intermediate_conv_windows=inter, out=out, impl=impl, **rows)
    assert got is out

    pool64, inter64 = before.double(), torch.zeros(N, L, dim, W - 1, dtype=torch.float64)
    b64 = None if b is None else b.double()
    out64 = cc.update(
        x.double(), pool64, weight.double(), b64, intermediate_conv_windows=inter64, impl="reference", **rows
    )

    tol = TOLERANCES[(impl, dtype)]
    for n in range(N):
        processed = n < n_live or pad_slot_id is None
        if processed:
            assert_close(out[n], out64[n], tol)
            assert_close(inter[n], inter64[n], tol)
        else:
            assert torch.equal(out[n], torch.zeros_like(out[n])), f"padded row {n} output is not zeros"
            assert inter[n].isnan().all(), f"padded row {n} wrote an intermediate window"
    assert_pool(pool, before, pool64, live_slots | dummy, tol)
    if dummy:
        assert not torch.equal(pool[0], before[0]), "the dummy slot 0 was not really processed"


def test_update_reference_is_a_causal_convolution():
    """Independent check of the reference semantics against F.conv1d on the unrolled sequence."""
    N, L, dim, W, num_slots = 2, 3, 4, 4, 3
    x = torch.randn(N, L, dim, dtype=torch.float64)
    weight = torch.randn(dim, W, dtype=torch.float64)
    bias = torch.randn(dim, dtype=torch.float64)
    pool = torch.randn(num_slots, dim, W - 1, dtype=torch.float64)
    idx = torch.tensor([2, 0])
    before = pool.clone()
    out = cc.update(x, pool, weight, bias, conv_state_indices=idx, activation="silu", impl="reference")
    for n, slot in enumerate(idx.tolist()):
        seq = torch.cat([before[slot], x[n].T], dim=1)  # [dim, W-1+L]
        expected = F.silu(F.conv1d(seq.unsqueeze(0), weight.unsqueeze(1), bias, groups=dim))[0].T  # [L, dim]
        torch.testing.assert_close(out[n], expected)
        torch.testing.assert_close(pool[slot], seq[:, -(W - 1) :])


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_verify_windows_equal_stepwise_decode(impl):
    """Window t of a D-token verify equals the state after t+1 decode steps; outputs agree too."""
    D, dim, W, num_slots = 3, 9, 4, 5
    idx, pad_slot_id, live_slots, _ = make_indices("sglang", 2, 1, num_slots)
    N = idx.shape[0]
    x = torch.randn(N, D, dim)
    weight, bias = torch.randn(dim, W), torch.randn(dim)
    pool = torch.randn(num_slots, dim, W - 1)
    before = pool.clone()
    inter = torch.full((N, D, dim, W - 1), float("nan"))
    verify_out = cc.update(
        x,
        pool,
        weight,
        bias,
        conv_state_indices=idx,
        activation="silu",
        intermediate_conv_windows=inter,
        disable_state_update=True,
        pad_slot_id=pad_slot_id,
        impl=impl,
    )
    assert torch.equal(pool, before), "disable_state_update=True changed the pool"

    for t in range(D):
        step = torch.full((N, 1, dim), float("nan"))
        cc.update(
            x[:, t : t + 1],
            pool,
            weight,
            bias,
            conv_state_indices=idx,
            activation="silu",
            pad_slot_id=pad_slot_id,
            out=step,
            impl=impl,
        )
        torch.testing.assert_close(verify_out[:, t], step[:, 0], atol=1e-6, rtol=1e-6)
        for n, slot in enumerate(idx.tolist()):
            if slot >= 0:
                assert torch.equal(inter[n, t], pool[slot]), f"row {n}: window {t} != state after step {t}"
    # The last window is what a state-updating verify would have left.
    for n, slot in enumerate(idx.tolist()):
        if slot >= 0:
            assert torch.equal(inter[n, D - 1], pool[slot])


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_silu_of_extreme_values(impl):
    """Pre-activations far beyond exp's float32 range: silu saturates cleanly (no overflow, no NaN)."""
    dim, W = 4, 2
    x = torch.tensor([[[-200.0, -90.0, 90.0, 200.0]]])
    weight, pool = torch.ones(dim, W), torch.zeros(2, dim, W - 1)
    out = cc.update(x, pool, weight, conv_state_indices=torch.tensor([1]), activation="silu", impl=impl)
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
    out = cc.update(x, pool, weight, conv_state_indices=idx, intermediate_conv_windows=inter, impl="triton")
    ref = cc.update(
        x.contiguous(),
        ref_pool,
        weight.contiguous(),
        conv_state_indices=idx,
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
    a = cc.update(x, p1, weight, conv_state_indices=idx, impl="auto")
    b = cc.update(x, p2, weight, conv_state_indices=idx, impl="reference")
    assert torch.equal(a, b) and torch.equal(p1, p2)


# --- varlen (prefill) -----------------------------------------------------------------------------

VARLEN_CASES = [
    # impl, dtype, convention
    ("reference", torch.float32, "sglang"),
    ("triton", torch.float32, "sglang"),
    ("reference", torch.float32, "vllm"),
    ("triton", torch.float32, "vllm"),
    ("triton", torch.float32, "ascend"),
    ("triton", torch.bfloat16, "vllm"),
]


@pytest.mark.parametrize("impl,dtype,convention", VARLEN_CASES)
def test_varlen_matches_float64(impl, dtype, convention):
    dim, W, num_slots = 6, 4, 8
    # Rows: long, empty with an initial state, 1 token (< W-1: the state keeps older inputs), empty
    # without one, 2 tokens fresh; then one padded row and 2 tail tokens no row owns.
    lens = [5, 0, 1, 0, 2]
    has_init = torch.tensor([True, True, True, False, False, True])
    idx, pad_slot_id, live_slots, dummy = make_indices(convention, len(lens), 1, num_slots, torch.int64)
    lens_all = lens + [2]  # the padded row carries tokens: skipped (zeros) or run on the dummy slot
    cu = cu_from_lens(lens_all)
    T = int(cu[-1]) + 2
    x = torch.randn(T, dim).to(dtype)
    weight, bias = torch.randn(dim, W).to(dtype), torch.randn(dim).to(dtype)
    pool = torch.randn(num_slots, dim, W - 1).to(dtype)
    before = pool.clone()
    out = nan_like(x)

    rows = dict(
        cache_indices=idx, has_initial_state=has_init, cu_seqlens=cu, activation="silu", pad_slot_id=pad_slot_id
    )
    cc.varlen(x, weight, bias, conv_state=pool, out=out, impl=impl, **rows)
    pool64 = before.double()
    out64 = cc.varlen(x.double(), weight.double(), bias.double(), conv_state=pool64, impl="reference", **rows)

    tol = TOLERANCES[(impl, dtype)]
    assert_close(out, out64, tol)
    assert torch.equal(out[int(cu[-1]) :], torch.zeros_like(out[int(cu[-1]) :])), "tail tokens not zeroed"
    if pad_slot_id is not None:
        assert torch.equal(out[int(cu[-2]) : int(cu[-1])], torch.zeros_like(out[int(cu[-2]) : int(cu[-1])]))
    # Zero-length live rows keep their slot bitwise, with or without an initial state.
    unchanged = {int(idx[n]) for n, length in enumerate(lens) if length == 0}
    assert_pool(pool, before, pool64, (live_slots | dummy) - unchanged, tol)


def test_varlen_reference_is_a_causal_convolution():
    """Independent check: initial state or zeros, then F.conv1d; short sequences keep older inputs."""
    dim, W = 3, 4
    x = torch.randn(4, dim, dtype=torch.float64)
    weight, pool = torch.randn(dim, W, dtype=torch.float64), torch.randn(3, dim, W - 1, dtype=torch.float64)
    before = pool.clone()
    cu = torch.tensor([0, 3, 4], dtype=torch.int32)
    out = cc.varlen(
        x,
        weight,
        conv_state=pool,
        cache_indices=torch.tensor([1, 2]),
        has_initial_state=torch.tensor([False, True]),
        cu_seqlens=cu,
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


# --- custom op, validation, cost ------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_each_call_is_one_custom_op(impl):
    x, weight, pool = torch.randn(2, 1, 3), torch.randn(3, 4), torch.randn(3, 3, 3)
    idx = torch.tensor([1, -1])
    out = torch.empty_like(x)
    with OpLog() as log:
        cc.update(x, pool, weight, conv_state_indices=idx, out=out, impl=impl)
    assert log.ops == ["linattn.causal_conv1d_update.default"]

    xs = torch.randn(3, 3)
    outs = torch.empty_like(xs)
    cu, init = torch.tensor([0, 1, 3], dtype=torch.int32), torch.tensor([True, False])
    with OpLog() as log:
        cc.varlen(
            xs,
            weight,
            conv_state=pool,
            cache_indices=idx,
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
        conv_state_indices=torch.tensor([0, 1], dtype=torch.int32),
    )


BAD_UPDATE = [
    ("x", lambda kw: kw["x"][:, 0], r"x must be \[N, L, dim\]"),
    ("x dtype", lambda kw: kw["x"].long(), r"x must be floating point"),
    ("weight", lambda kw: kw["weight"][:, :1], r"W = weight.shape\[1\] must be >= 2"),
    ("weight dim", lambda kw: torch.randn(5, 3), r"weight must have shape \[4, 3\]"),
    ("bias", lambda kw: torch.randn(3), r"bias must have shape \[4\]"),
    ("conv_state", lambda kw: torch.randn(3, 4, 3), r"conv_state must have shape \[3, 4, 2\]"),
    ("conv_state dtype", lambda kw: kw["conv_state"].int(), r"conv_state must have dtype"),
    ("conv_state_indices", lambda kw: torch.tensor([0, 1, 2]), r"conv_state_indices must have shape \[2\]"),
    ("conv_state_indices dtype", lambda kw: torch.tensor([0.0, 1.0]), r"conv_state_indices must have dtype"),
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
    with pytest.raises(IndexError, match="row 1 has slot 7"):
        cc.update(**{**kw, "conv_state_indices": torch.tensor([0, 7])}, impl="reference")


def test_varlen_rejects_bad_inputs():
    x, weight, pool = torch.randn(3, 4), torch.randn(4, 3), torch.randn(3, 4, 2)
    ok = dict(
        conv_state=pool,
        cache_indices=torch.tensor([0, 1]),
        has_initial_state=torch.tensor([True, False]),
        cu_seqlens=torch.tensor([0, 1, 3], dtype=torch.int32),
    )
    with pytest.raises(ValueError, match=r"x must be \[T, dim\]"):
        cc.varlen(x[None], weight, **ok)
    with pytest.raises(ValueError, match=r"cache_indices must have shape \[2\]"):
        cc.varlen(x, weight, **{**ok, "cache_indices": torch.tensor([0])})
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
