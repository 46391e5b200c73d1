"""linear_attn.recurrent: the conformance matrix (``kernels.testing``), the reference against the closed form
of causal linear attention, and what the matrix does not cover (scale handling, decode steps against one
varlen call, strided inputs, argument errors, the custom op, the cost model).
"""

from __future__ import annotations

import pytest
import torch
from _kernel_helpers import IMPLS, OpLog, conformance, opcheck_mutations

from kernels import linear_attn
from kernels.cost import Cost
from kernels.testing import cu_seqlens


@pytest.mark.parametrize("run", conformance("linear_attn.recurrent"), ids=str)
def test_conforms(run):
    run.check()


def test_reference_is_causal_linear_attention():
    """Independent check of the reference: the closed form o_t = S0^T q + sum_{s<=t} (k_s . q) v_s."""
    T, H, HV, K, V = 4, 1, 2, 3, 5
    q, k = torch.randn(T, H, K, dtype=torch.float64), torch.randn(T, H, K, dtype=torch.float64)
    v = torch.randn(T, HV, V, dtype=torch.float64)
    state = torch.randn(2, HV, K, V, dtype=torch.float64)
    S0 = state[1].clone()
    scale = 0.7
    meta = dict(state_indices=torch.tensor([1]), cu_seqlens=cu_seqlens([T]))
    out = linear_attn.recurrent(q, k, v, state=state, **meta, scale=scale, impl="reference")
    for h in range(HV):  # GVA: both value heads read q/k head 0
        for t in range(T):
            qs = scale * q[t, 0]
            expected = S0[h].T @ qs + sum((k[s, 0] @ qs) * v[s, h] for s in range(t + 1))
            torch.testing.assert_close(out[t, h], expected)
        torch.testing.assert_close(state[1, h], S0[h] + k[:, 0].T @ v[:, h])


def test_default_scale_is_inverse_sqrt_k():
    q, k, v = torch.randn(2, 1, 4), torch.randn(2, 1, 4), torch.randn(2, 1, 3)
    state = torch.randn(2, 1, 4, 3)
    meta = dict(state_indices=torch.tensor([1]), cu_seqlens=cu_seqlens([2]))
    a = linear_attn.recurrent(q, k, v, state=state.clone(), **meta, impl="reference")
    b = linear_attn.recurrent(q, k, v, state=state.clone(), **meta, scale=0.5, impl="reference")
    assert torch.equal(a, b)


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_steps_equal_one_varlen_call(impl):
    """Running a sequence token by token (decode) equals one call over all its tokens."""
    T, H, HV, K, V = 3, 1, 2, 4, 6
    q, k, v = torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, HV, V)
    state = torch.randn(3, HV, K, V)
    stepwise = state.clone()
    idx = torch.tensor([2], dtype=torch.int32)
    whole = linear_attn.recurrent(q, k, v, state=state, state_indices=idx, cu_seqlens=cu_seqlens([T]), impl=impl)
    for t in range(T):
        one = dict(state=stepwise, state_indices=idx, cu_seqlens=cu_seqlens([1]), impl=impl)
        o = linear_attn.recurrent(q[t : t + 1], k[t : t + 1], v[t : t + 1], **one)
        torch.testing.assert_close(o[0], whole[t], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(stepwise, state, atol=1e-6, rtol=1e-6)


def test_triton_follows_strides():
    """q, k, v sliced out of one fused projection and a V-first state pool seen through a transpose."""
    T, H, HV, K, V, num_slots = 3, 1, 2, 4, 5, 3
    qkv = torch.randn(T, 2 * H * K + HV * V)
    q = qkv[:, : H * K].unflatten(1, (H, K))
    k = qkv[:, H * K : 2 * H * K].unflatten(1, (H, K))
    v = qkv[:, 2 * H * K :].unflatten(1, (HV, V))
    state = torch.randn(num_slots, HV, V, K).transpose(2, 3)  # [num_slots, HV, K, V] view, V-first memory
    ref_state = state.contiguous()
    meta = dict(state_indices=torch.tensor([2, 0]), cu_seqlens=cu_seqlens([2, 1]))
    out = linear_attn.recurrent(q, k, v, state=state, **meta, impl="triton")
    ref = linear_attn.recurrent(
        q.contiguous(), k.contiguous(), v.contiguous(), state=ref_state, **meta, impl="reference"
    )
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(state, ref_state)


def test_auto_is_reference_on_cpu():
    q, k, v = torch.randn(2, 1, 4), torch.randn(2, 1, 4), torch.randn(2, 2, 3)
    state = torch.randn(3, 2, 4, 3)
    s1, s2 = state.clone(), state.clone()
    meta = dict(state_indices=torch.tensor([1, 2]), cu_seqlens=cu_seqlens([1, 1]))
    a = linear_attn.recurrent(q, k, v, state=s1, **meta, impl="auto")
    b = linear_attn.recurrent(q, k, v, state=s2, **meta, impl="reference")
    assert torch.equal(a, b) and torch.equal(s1, s2)


@pytest.mark.parametrize("impl", IMPLS)
def test_each_call_is_one_custom_op(impl):
    q, k, v = torch.randn(2, 1, 4), torch.randn(2, 1, 4), torch.randn(2, 2, 3)
    state, out = torch.randn(3, 2, 4, 3), torch.empty(2, 2, 3)
    meta = dict(state_indices=torch.tensor([1, -1]), cu_seqlens=cu_seqlens([1, 1]))
    with OpLog() as log:
        linear_attn.recurrent(q, k, v, state=state, **meta, out=out, impl=impl)
    assert log.ops == ["linattn.linear_attn_recurrent.default"]


def test_custom_op_schema_declares_the_mutations():
    q, k, v = torch.randn(3, 1, 4), torch.randn(3, 1, 4), torch.randn(3, 2, 3)
    state, out = torch.randn(3, 2, 4, 3), torch.zeros(3, 2, 3)
    args = (q, k, v, state, "k_first", torch.tensor([1, 2]), cu_seqlens([2, 1]), 0.5, -1, out, "reference")
    opcheck_mutations(torch.ops.linattn.linear_attn_recurrent.default, args)


def _good():
    return dict(
        q=torch.randn(3, 2, 4),
        k=torch.randn(3, 2, 4),
        v=torch.randn(3, 4, 5),
        state=torch.randn(4, 4, 4, 5),
        state_indices=torch.tensor([1, 2]),
        cu_seqlens=cu_seqlens([1, 2]),
    )


BAD = [
    ("q", lambda: torch.randn(3, 8), r"q must be \[T, H, K\]"),
    ("q", lambda: torch.zeros(3, 2, 4, dtype=torch.int32), r"q must be floating point"),
    ("k", lambda: torch.randn(3, 2, 5), r"k must have shape \[3, 2, 4\]"),
    ("v", lambda: torch.randn(2, 4, 5), r"v must be \[T=3, HV, V\]"),
    ("v", lambda: torch.randn(3, 3, 5), r"HV=3 must be a multiple of query/key heads H=2"),
    (
        "state",
        lambda: torch.randn(4, 4, 5, 4),
        r"state: \[4, 4, 5, 4\] is not \[slots, HV=4, K=4, V=5\] "
        r"\(state_layout='k_first'\)",
    ),
    ("state", lambda: torch.randn(4, 4, 4, 5).bfloat16(), r"state must have dtype"),
    ("state", lambda: torch.randn(4, 4, 5), r"state: \[4, 4, 5\] is not \[slots, HV=4, K=4, V=5\]"),
    ("state_layout", lambda: "kv", r"state_layout: must be one of \['k_first', 'v_first'\], got 'kv'"),
    ("state_indices", lambda: torch.tensor([1, 2, 3]), r"state_indices must have shape \[2\]"),
    ("state_indices", lambda: torch.tensor([1.0, 2.0]), r"state_indices must have dtype"),
    ("cu_seqlens", lambda: torch.tensor([0.0, 1.0, 3.0]), r"cu_seqlens must have dtype"),
    ("cu_seqlens", lambda: torch.zeros(2, 3, dtype=torch.int32), r"cu_seqlens must be a 1-D tensor"),
    ("out", lambda: torch.empty(3, 4, 4), r"out must have shape \[3, 4, 5\]"),
    ("scale", lambda: "0.5", r"scale must be a float or None"),
    ("pad_slot_id", lambda: "-1", r"pad_slot_id must be an int or None"),
    ("impl", lambda: "npu", r"impl must be one of"),
]


@pytest.mark.parametrize("name,make,match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_rejects_bad_inputs(name, make, match):
    kw = _good()
    kw[name] = make()
    with pytest.raises(ValueError, match=match):
        linear_attn.recurrent(**kw)


def test_pool_and_metadata_are_keyword_only():
    kw = _good()
    with pytest.raises(TypeError):
        linear_attn.recurrent(*(kw.pop(n) for n in ("q", "k", "v", "state", "state_indices", "cu_seqlens")))


def test_out_of_pool_slot_is_an_index_error_in_the_reference():
    kw = {**_good(), "state_indices": torch.tensor([1, 4])}
    with pytest.raises(IndexError, match="state_indices: row 1 has slot 4"):
        linear_attn.recurrent(**kw, impl="reference")


def test_cost():
    c = linear_attn.recurrent_cost(T=4, N=2, H=1, HV=2, K=8, V=16, dtype=torch.float16)
    io = 4 * (2 * 1 * 8 + 2 * 2 * 16) * 2
    assert c == Cost(bytes=io + 2 * 2 * 2 * 8 * 16 * 4, flops=4 * 2 * (4 * 8 * 16 + 8))
    assert c.intensity == c.flops / c.bytes
