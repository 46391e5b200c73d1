"""mamba2.selective_state_update: both implementations against a float64 reference, padding, integrity."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _kernel_helpers import TOLERANCES, OpLog, assert_close, assert_pool, make_indices, nan_like, opcheck_mutations

from kernels import mamba2
from kernels.cost import Cost


def make_inputs(N, nheads, headdim, dstate, ngroups, num_slots, dtype, *, tied=False, optional=True):
    """Fresh random inputs in engine-like ranges: A < 0, dt around softplus' knee."""
    x = torch.randn(N, nheads, headdim).to(dtype)
    B = torch.randn(N, ngroups, dstate).to(dtype)
    C = torch.randn(N, ngroups, dstate).to(dtype)
    z = torch.randn(N, nheads, headdim).to(dtype) if optional else None
    if tied:  # per-head scalars expanded with stride 0, as engines pass them
        A = (-torch.rand(nheads) - 0.1)[:, None, None].expand(nheads, headdim, dstate)
        dt = torch.randn(N, nheads).to(dtype)[:, :, None].expand(N, nheads, headdim)
        D = torch.randn(nheads)[:, None].expand(nheads, headdim) if optional else None
        dt_bias = torch.randn(nheads)[:, None].expand(nheads, headdim) if optional else None
    else:
        A = -torch.rand(nheads, headdim, dstate) - 0.1
        dt = torch.randn(N, nheads, headdim).to(dtype)
        D = torch.randn(nheads, headdim) if optional else None
        dt_bias = torch.randn(nheads, headdim) if optional else None
    state = torch.randn(num_slots, nheads, headdim, dstate)
    return dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias), state


def as_f64(inputs: dict) -> dict:
    return {k: (None if v is None else v.double()) for k, v in inputs.items()}


CASES = [
    # impl, dtype, convention, n_live, n_pad, nheads, headdim, dstate, ngroups, tied, softplus, optional
    ("reference", torch.float32, "sglang", 3, 1, 4, 6, 10, 2, False, True, True),
    ("triton", torch.float32, "sglang", 3, 1, 4, 6, 10, 2, False, True, True),
    ("reference", torch.float32, "vllm", 2, 2, 2, 5, 16, 1, True, True, True),
    ("triton", torch.float32, "vllm", 2, 2, 2, 5, 16, 1, True, True, True),
    ("reference", torch.float32, "ascend", 2, 1, 6, 3, 7, 3, False, False, False),
    ("triton", torch.float32, "ascend", 2, 1, 6, 3, 7, 3, False, False, False),
    ("triton", torch.bfloat16, "sglang", 2, 1, 4, 8, 16, 4, True, True, True),
    ("triton", torch.float16, "vllm", 2, 1, 2, 12, 5, 2, False, True, True),
    ("reference", torch.bfloat16, "ascend", 2, 1, 4, 8, 16, 2, True, True, True),
]


@pytest.mark.parametrize(
    "impl,dtype,convention,n_live,n_pad,nheads,headdim,dstate,ngroups,tied,softplus,optional", CASES
)
def test_matches_float64(
    impl, dtype, convention, n_live, n_pad, nheads, headdim, dstate, ngroups, tied, softplus, optional
):
    num_slots = 5
    idx, pad_slot_id, live_slots, dummy = make_indices(convention, n_live, n_pad, num_slots)
    N = n_live + n_pad
    inputs, state = make_inputs(N, nheads, headdim, dstate, ngroups, num_slots, dtype, tied=tied, optional=optional)
    before = state.clone()
    out = nan_like(inputs["x"])

    got = mamba2.selective_state_update(
        state, **inputs, dt_softplus=softplus, state_batch_indices=idx, pad_slot_id=pad_slot_id, out=out, impl=impl
    )
    assert got is out

    state64 = before.double()
    out64 = mamba2.selective_state_update(
        state64,
        **as_f64(inputs),
        dt_softplus=softplus,
        state_batch_indices=idx,
        pad_slot_id=pad_slot_id,
        impl="reference",
    )

    tol = TOLERANCES[(impl, dtype)]
    for n in range(N):
        if n < n_live or pad_slot_id is None:
            assert_close(out[n], out64[n], tol)
        else:
            assert torch.equal(out[n], torch.zeros_like(out[n])), f"padded row {n} output is not zeros"
    state_tol = TOLERANCES[(impl, torch.float32)]  # the pool is float32 whatever the activations
    assert_pool(state, before, state64, live_slots | dummy, state_tol)
    if dummy:
        assert not torch.equal(state[0], before[0]), "the dummy slot 0 was not really processed"


def test_reference_follows_mamba_ssm_formula():
    """Independent check of the reference: one row, one head at a time, written out from the formula."""
    N, nheads, headdim, dstate, ngroups = 2, 4, 3, 5, 2
    inputs, state = make_inputs(N, nheads, headdim, dstate, ngroups, 3, torch.float64)
    inputs = as_f64(inputs)
    state = state.double()
    before = state.clone()
    idx = torch.tensor([2, 0])
    out = mamba2.selective_state_update(state, **inputs, dt_softplus=True, state_batch_indices=idx, impl="reference")
    for n, slot in enumerate(idx.tolist()):
        for h in range(nheads):
            g = h // (nheads // ngroups)
            dt = F.softplus(inputs["dt"][n, h] + inputs["dt_bias"][h])  # [headdim]
            S = before[slot, h] * torch.exp(inputs["A"][h] * dt[:, None])
            S = S + torch.outer(dt * inputs["x"][n, h], inputs["B"][n, g])
            y = S @ inputs["C"][n, g] + inputs["D"][h] * inputs["x"][n, h]
            y = y * inputs["z"][n, h] * torch.sigmoid(inputs["z"][n, h])
            torch.testing.assert_close(state[slot, h], S)
            torch.testing.assert_close(out[n, h], y)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_softplus_extremes(impl):
    """softplus(dt) is linear above 20 and relatively accurate far below 0 (a naive log(1 + exp(dt))
    in float32 is off by percents at dt = -12). A zero state makes the update exactly dt * x * B."""
    inputs, state = make_inputs(1, 1, 4, 4, 1, 2, torch.float32, optional=False)
    inputs["dt"] = torch.tensor([[[-30.0, -12.0, 19.0, 40.0]]])
    state[1] = 0.0
    before = state.clone()
    mamba2.selective_state_update(state, **inputs, dt_softplus=True, state_batch_indices=torch.tensor([1]), impl=impl)
    state64 = before.double()
    mamba2.selective_state_update(
        state64, **as_f64(inputs), dt_softplus=True, state_batch_indices=torch.tensor([1]), impl="reference"
    )
    torch.testing.assert_close(state.double(), state64, atol=0.0, rtol=1e-5)


def test_triton_follows_strides():
    """State slots padded in memory and x, z sliced out of a wider projection."""
    N, nheads, headdim, dstate, ngroups, num_slots = 2, 4, 3, 6, 2, 3
    inputs, _ = make_inputs(N, nheads, headdim, dstate, ngroups, num_slots, torch.float32, tied=True)
    inputs["x"] = torch.randn(N, nheads, 2 * headdim)[..., :headdim]
    inputs["z"] = torch.randn(N, 2 * nheads, headdim)[:, nheads:]
    state = torch.randn(num_slots, nheads, headdim, dstate + 2)[..., :dstate]
    ref_state = state.clone(memory_format=torch.contiguous_format)
    idx = torch.tensor([2, 0])
    out = mamba2.selective_state_update(state, **inputs, dt_softplus=True, state_batch_indices=idx, impl="triton")
    dense = {k: v.contiguous() for k, v in inputs.items()}
    ref = mamba2.selective_state_update(ref_state, **dense, dt_softplus=True, state_batch_indices=idx, impl="reference")
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(state, ref_state)


def test_auto_is_reference_on_cpu():
    inputs, state = make_inputs(2, 2, 3, 4, 1, 3, torch.float32)
    s1, s2 = state.clone(), state.clone()
    idx = torch.tensor([1, 2])
    a = mamba2.selective_state_update(s1, **inputs, state_batch_indices=idx, impl="auto")
    b = mamba2.selective_state_update(s2, **inputs, state_batch_indices=idx, impl="reference")
    assert torch.equal(a, b) and torch.equal(s1, s2)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_each_call_is_one_custom_op(impl):
    inputs, state = make_inputs(2, 2, 3, 4, 1, 3, torch.float32)
    out, idx = torch.empty_like(inputs["x"]), torch.tensor([1, -1])
    with OpLog() as log:
        mamba2.selective_state_update(state, **inputs, state_batch_indices=idx, out=out, impl=impl)
    assert log.ops == ["linattn.mamba2_selective_state_update.default"]


def test_custom_op_schema_declares_the_mutations():
    inputs, state = make_inputs(2, 2, 3, 4, 1, 3, torch.float32)
    i = inputs
    out = torch.zeros_like(i["x"])
    args = (state, i["x"], i["dt"], i["A"], i["B"], i["C"], i["D"], i["z"], i["dt_bias"], True, torch.tensor([2, 0]))
    opcheck_mutations(torch.ops.linattn.mamba2_selective_state_update.default, (*args, -1, out, "reference"))


BAD = [
    ("x", lambda i, s: i["x"][0], r"x must be \[N, nheads, headdim\]"),
    ("x", lambda i, s: i["x"].long(), r"x must be floating point"),
    ("state", lambda i, s: s[:, :1], r"state must have shape \[5, 4, 6, 10\]"),
    ("state", lambda i, s: s.half(), r"state must have dtype"),
    ("state", lambda i, s: s[0], r"state must be a 4-D pool"),
    ("B", lambda i, s: torch.randn(3, 3, 10), r"nheads \(4\) must be a multiple of ngroups"),
    ("C", lambda i, s: torch.randn(3, 2, 9), r"C must have shape \[3, 2, 10\]"),
    ("dt", lambda i, s: torch.randn(3, 4), r"dt must have shape \[3, 4, 6\]"),
    ("A", lambda i, s: torch.randn(4, 6), r"A must have shape \[4, 6, 10\]"),
    ("D", lambda i, s: torch.randn(4), r"D must have shape \[4, 6\]"),
    ("z", lambda i, s: torch.randn(3, 4, 5), r"z must have shape \[3, 4, 6\]"),
    ("dt_bias", lambda i, s: torch.randn(6), r"dt_bias must have shape \[4, 6\]"),
    ("state_batch_indices", lambda i, s: torch.tensor([0, 1]), r"state_batch_indices must have shape \[3\]"),
    ("state_batch_indices", lambda i, s: torch.tensor([0.0, 1.0, 2.0]), r"state_batch_indices must have dtype"),
    ("out", lambda i, s: torch.empty(3, 4, 7), r"out must have shape \[3, 4, 6\]"),
    ("pad_slot_id", lambda i, s: 1.5, r"pad_slot_id must be an int or None"),
    ("impl", lambda i, s: "gpu", r"impl must be one of"),
]


@pytest.mark.parametrize("name,make,match", BAD, ids=[f"{b[0]}-{k}" for k, b in enumerate(BAD)])
def test_rejects_bad_inputs(name, make, match):
    inputs, state = make_inputs(3, 4, 6, 10, 2, 5, torch.float32)
    kw = {**inputs, "state": state, "state_batch_indices": torch.tensor([0, 1, 2])}
    kw[name] = make(inputs, state)
    with pytest.raises(ValueError, match=match):
        mamba2.selective_state_update(**kw)


def test_out_of_pool_slot_is_an_index_error_in_the_reference():
    inputs, state = make_inputs(2, 2, 3, 4, 1, 3, torch.float32)
    with pytest.raises(IndexError, match="row 0 has slot 3"):
        mamba2.selective_state_update(state, **inputs, state_batch_indices=torch.tensor([3, 1]), impl="reference")


def test_cost():
    c = mamba2.selective_state_update_cost(
        2, 4, 8, 16, 1, torch.bfloat16, has_D=False, has_z=False, has_dt_bias=False, dt_softplus=False
    )
    state_bytes = 2 * (2 * 4 * 8 * 16 * 4)
    io_bytes = 2 * 4 * 8 * 2 * 2 + 2 * 4 * 2 + 2 * 2 * 16 * 2 + 4 * 4  # x+out, tied dt, B+C, tied A
    assert c == Cost(bytes=state_bytes + io_bytes, flops=7 * 2 * 4 * 8 * 16 + 2 * 4 * 8)
    untied = mamba2.selective_state_update_cost(2, 4, 8, 16, 1, torch.bfloat16, tied=False)
    assert untied.bytes > mamba2.selective_state_update_cost(2, 4, 8, 16, 1, torch.bfloat16).bytes
