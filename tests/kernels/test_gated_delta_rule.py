"""Gated delta rule: the conformance matrix (``kernels.testing``: both impls against the float64 reference
under every padding convention), the reference against a naive float64 recurrence written here, and what
the matrix does not cover (chunk boundaries, V-blocks split across programs, verify then accept, the
engine gating's options, argument errors, the custom ops, the cost models).
"""

from __future__ import annotations

import math

import pytest
import torch
from _kernel_helpers import IMPLS, OpLog, conformance, launch_triton
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels.gated_delta_rule as gdn
from kernels.conventions import CONVENTIONS
from kernels.testing import cu_seqlens, make_case, rel_err

# ------------------------------------------------------------------------------- naive float64 truth


def naive(
    *, q, k, v, g, beta, state, state_indices, cu_seqlens, scale, use_qk_l2norm=False, has_initial_state=None,
    pad_slot_id=-1, depth=None, **_,
):  # fmt: skip
    """Per row, per head, per token, in float64, from the public op's arguments.
    Returns (out, new_state, intermediate states [N, depth, HV, K, V] or None)."""
    q, k, v, g, beta, state = (x.double() for x in (q, k, v, g, beta, state))
    T, HV, V = v.shape
    K = q.shape[2]
    group = HV // q.shape[1]
    N = state_indices.shape[0]
    out = torch.zeros(T, HV, V, dtype=torch.float64)
    new = state.clone()
    inter = torch.full((N, depth, HV, K, V), float("nan"), dtype=torch.float64) if depth else None
    for n in range(N):
        slot, bos, eos = int(state_indices[n]), int(cu_seqlens[n]), int(cu_seqlens[n + 1])
        if (pad_slot_id is not None and slot <= pad_slot_id) or eos == bos:
            continue
        for h in range(HV):
            init = has_initial_state is None or bool(has_initial_state[n])
            S = state[slot, h].clone() if init else torch.zeros(K, V, dtype=torch.float64)
            for t in range(bos, eos):
                qt, kt = q[t, h // group], k[t, h // group]
                if use_qk_l2norm:
                    qt = qt / torch.sqrt((qt * qt).sum() + 1e-6)
                    kt = kt / torch.sqrt((kt * kt).sum() + 1e-6)
                S = torch.exp(g[t, h]) * S
                u = beta[t, h] * (v[t, h] - S.T @ kt)
                S = S + torch.outer(kt, u)
                out[t, h] = S.T @ (scale * qt)
                if inter is not None:
                    inter[n, t - bos, h] = S
            new[slot, h] = S
    return out, new, inter


def packed(lens, slots, *, H=1, HV=1, K=4, V=4, num_slots=None, seed=0, l2norm=False) -> dict:
    """Inputs of ``recurrent`` for rows of any lengths on any slots (padded rows anywhere, zero-length rows):
    layouts ``make_case`` does not draw. Without the L2 norm, beta |k|^2 < 2 keeps the recurrence contractive."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q, k = torch.randn(T, H, K, generator=gen), torch.randn(T, H, K, generator=gen)
    if not l2norm:
        k = torch.nn.functional.normalize(k, dim=-1) * (0.5 + 0.5 * torch.rand(T, H, 1, generator=gen))
    return dict(
        q=q, k=k, v=torch.randn(T, HV, V, generator=gen),
        g=-(0.02 + 0.5 * torch.rand(T, HV, generator=gen)), beta=0.1 + 0.8 * torch.rand(T, HV, generator=gen),
        state=0.5 * torch.randn(num_slots or max(slots) + 1, HV, K, V, generator=gen),
        state_indices=torch.tensor(slots, dtype=torch.int32), cu_seqlens=cu_seqlens(lens),
    )  # fmt: skip


# ------------------------------------------------------------------------------------ conformance

GDN_OPS = ("gated_delta_rule.recurrent", "gated_delta_rule.chunked", "gated_delta_rule.scatter_accepted")


@pytest.mark.parametrize("run", conformance(*GDN_OPS), ids=str)
def test_conforms(run):
    run.check()


@settings(max_examples=25, deadline=None)
@given(
    lens=st.lists(st.integers(0, 4), min_size=1, max_size=5),
    convention=st.sampled_from(list(CONVENTIONS.values())),
    pad_mask=st.lists(st.booleans(), min_size=5, max_size=5),
    init_mask=st.lists(st.booleans(), min_size=5, max_size=5),
    gva=st.sampled_from([(1, 1), (1, 2), (2, 4)]),
    seed=st.integers(0, 2**16),
)
def test_reference_property_random_batches(lens, convention, pad_mask, init_mask, gva, seed):
    """Random varlen batches, padded rows anywhere, rows without initial state, every convention: the
    reference equals the naive float64 recurrence."""
    H, HV = gva
    N = len(lens)
    num_slots = N + convention.first_live_slot + 1
    first = convention.first_live_slot
    perm = torch.randperm(num_slots - first, generator=torch.Generator().manual_seed(seed))[:N] + first
    slots = [int(s) for s in perm]
    lens = list(lens)
    dummy_used = False
    for n in range(N):
        if pad_mask[n]:
            slots[n] = convention.sentinel
            if convention.processes_padding:  # padded rows really run on the dummy slot: one may bring tokens
                lens[n] = 0 if dummy_used else lens[n]
                dummy_used = True
    x = packed(lens, slots, H=H, HV=HV, K=5, V=3, num_slots=num_slots, seed=seed)
    x.update(has_initial_state=torch.tensor(init_mask[:N]), scale=0.4, pad_slot_id=convention.pad_slot_id)
    exp_out, exp_state, _ = naive(**x)
    state = x.pop("state").clone()
    out = gdn.recurrent(**x, state=state, out=torch.full_like(x["v"], float("nan")), impl="reference")
    assert rel_err(out, exp_out) < 2e-5
    assert rel_err(state, exp_state) < 2e-5


def test_reference_runs_in_float64():
    x = packed([3, 0, 2], [2, 0, 1], HV=2, K=6, V=5, seed=3)
    x = {k: t.double() if t.is_floating_point() else t for k, t in x.items()}
    exp_out, exp_state, _ = naive(**x, scale=0.5, pad_slot_id=0)
    state = x.pop("state").clone()
    out = gdn.recurrent(**x, state=state, scale=0.5, pad_slot_id=0, impl="reference")
    assert out.dtype == torch.float64
    assert rel_err(out, exp_out) < 1e-13 and rel_err(state, exp_state) < 1e-13


@pytest.mark.parametrize("states", ["gathered", "in place"])
@pytest.mark.parametrize("verify", [False, True], ids=["extend", "verify"])
def test_reference_both_state_paths_equal_the_naive_recurrence(monkeypatch, states, verify):
    """Rows of different lengths (and a zero-length, a padded and a fresh row) in float64: the reference's
    rows-together recurrence equals the naive one, its small-state path (all rows' states gathered into one
    tensor) as its large-state path (each row's state updated on its slot), outputs, pool and intermediates."""
    import kernels.gated_delta_rule.reference as ref

    monkeypatch.setattr(ref, "GATHER_MAX_SLOT_BYTES", 2**40 if states == "gathered" else 0)
    lens, slots = [3, 1, 0, 4, 2, 4], [5, 2, 3, -1, 1, 6]
    x = packed(lens, slots, H=1, HV=2, K=5, V=3, num_slots=8, seed=7, l2norm=True)
    x = {k: t.double() if t.is_floating_point() else t for k, t in x.items()}
    x.update(has_initial_state=torch.tensor([True, True, True, True, False, True]), scale=0.4, use_qk_l2norm=True)
    depth = max(lens)
    exp_out, exp_state, exp_inter = naive(**x, depth=depth)
    if verify:  # the pool stays as it was; the intermediates hold every step
        exp_state = x["state"]
    state = x.pop("state").clone()
    inter = torch.full((len(lens), depth, 2, 5, 3), float("nan"), dtype=torch.float64)
    out = gdn.recurrent(
        **x, state=state, intermediate_states=inter, disable_state_update=verify, impl="reference"
    )  # fmt: skip
    assert rel_err(out, exp_out) < 1e-12
    assert torch.equal(state, exp_state) if verify else rel_err(state, exp_state) < 1e-12
    written = ~exp_inter.isnan()  # rows' steps past their length stay untouched (NaN), in both
    assert torch.equal(written, ~inter.isnan()) and rel_err(inter[written], exp_inter[written]) < 1e-12


def test_chunked_reference_in_float64_for_any_chunk():
    """float64 end to end: chunks longer than every row (64), the default, and a short one (5) all equal the
    naive recurrence."""
    case = make_case("gated_delta_rule.chunked", convention="vllm", dtype=torch.float64, shapes={"extend": 24})
    for chunk in (64, None, 5):
        call = case.fresh(torch.float64)
        if chunk is None:
            call.args.pop("chunk_size")
        exp_out, exp_state, _ = naive(**call.args)
        case.fn(**call.args, impl="reference")
        assert rel_err(call.args["out"], exp_out) < 1e-12
        assert rel_err(call.args["state"], exp_state) < 1e-12


# ------------------------------------------------------------------------- beyond the matrix


@pytest.mark.parametrize("impl", IMPLS)
def test_chunk_boundaries_match_the_stepwise_recurrence(impl):
    """Rows of 5, 1 and 26 tokens: short chunks, and a full chunk plus a tail, under the default chunk of 16;
    chunked equals the float64 chunked reference and the token-by-token recurrence."""
    case = make_case("gated_delta_rule.chunked", convention="sglang", rows=3, padded=0, shapes={"extend": 40, "V": 10})
    assert max((case.args["cu_seqlens"][1:] - case.args["cu_seqlens"][:-1]).tolist()) > case.args["chunk_size"]
    call = case.run(impl=impl)
    res = case.check(call)
    assert res.ok, res.summary()
    stepwise = case.fresh(torch.float64)
    stepwise.args.pop("chunk_size")
    gdn.recurrent(**stepwise.args, impl="reference")
    assert rel_err(case.reference().args["out"], stepwise.args["out"]) < 1e-12
    assert rel_err(call.args["out"], stepwise.args["out"]) <= case.tol


@pytest.mark.parametrize("op", ["gated_delta_rule.recurrent", "gated_delta_rule.chunked"])
def test_triton_v_blocks_split_across_programs(op):
    """block_v = 16 < V = 36: three programs share each head's columns (the last one partial)."""
    case = make_case(op, "extend", convention="sglang", rows=1, padded=1, shapes={"HV": 1, "V": 36, "extend": 6})
    call = case.fresh()
    launch_triton(case, call.args, block_v=16)
    res = case.check(call)
    assert res.ok, res.summary()


@pytest.mark.parametrize("impl", IMPLS)
def test_rows_without_initial_state_in_a_decode_batch(impl):
    """has_initial_state in a decode batch: every row one token (the reference's rows-together path)."""
    case = make_case("gated_delta_rule.recurrent", "decode", convention="vllm", rows=3, padded=1)
    case.args["has_initial_state"] = torch.tensor([True, False, False, True])
    res = case.check(case.run(impl=impl))
    assert res.ok, res.summary()
    exp_out, _, _ = naive(**case.fresh(torch.float64).args)
    assert rel_err(case.reference().args["out"], exp_out) < 1e-12


@pytest.mark.parametrize("impl", IMPLS)
def test_raw_gating_inputs_equal_explicit_gating(impl):
    """recurrent(a=, b=, A_log=, dt_bias=) gates inside the op as the engines do, with torch's softplus options
    and a logit above its threshold (the linear branch); the same as gating first, then recurrent(g=, beta=)."""
    case = make_case("gated_delta_rule.recurrent", "gating", convention="sglang", rows=2, padded=1, shapes={"V": 10})
    case.args.update(softplus_beta=1.5, softplus_threshold=15.0)
    case.args["a"][0, 0] = 30.0
    res = case.check(case.run(impl=impl))
    assert res.ok, res.summary()

    explicit = case.fresh(torch.float64)
    raw = {n: explicit.args.pop(n) for n in ("a", "b", "A_log", "dt_bias", "softplus_beta", "softplus_threshold")}
    g, beta = gdn.gating(
        raw["a"], raw["b"], raw["A_log"], raw["dt_bias"], softplus_beta=1.5, softplus_threshold=15.0,
        dtype=torch.float64,
    )  # fmt: skip
    gdn.recurrent(**explicit.args, g=g, beta=beta, impl="reference")
    ref = case.reference().args
    assert rel_err(ref["out"], explicit.args["out"]) < 1e-12
    assert rel_err(ref["state"], explicit.args["state"]) < 1e-12


@pytest.mark.parametrize(
    "impl,convention,state_layout",
    [("reference", c, "k_first") for c in CONVENTIONS]
    + [("triton", "sglang", "k_first"), ("triton", "vllm", "k_first")]
    + [("reference", "sglang", "v_first"), ("triton", "vllm", "v_first")],
)
def test_verify_then_scatter_equals_sequential_decode(impl, convention, state_layout):
    """Target-verify of D draft tokens (padded rows carry tokens too) leaves the pool alone; accepting n
    tokens per row then gives each live slot the state of n decode steps; no other slot changes, in either
    state layout. (Triton's verify and accept under Ascend are in the conformance matrix.)"""
    case = make_case(
        "gated_delta_rule.recurrent", "verify", convention=convention, rows=2, padded=1, padded_tokens=True,
        shapes={"V": 10, "D": 2}, state_layout=state_layout,
    )  # fmt: skip
    call = case.run(impl=impl)
    res = case.check(call)
    assert res.ok, res.summary()
    state, inter, idx = call.args["state"], call.args["intermediate_states"], call.args["state_indices"]
    assert torch.equal(state, case.args["state"]), "disable_state_update must leave the whole pool unchanged"

    D = inter.shape[1]
    conv = case.convention
    # Live rows accept 1..D tokens; padded rows anything when skipped, a valid count when processed.
    num_accepted = [D, 1][: case.rows] + [1 if conv.processes_padding else D + 4] * case.padded
    gdn.scatter_accepted(
        state, inter, idx, torch.tensor(num_accepted, dtype=torch.int32), pad_slot_id=conv.pad_slot_id, impl=impl,
        state_layout=state_layout,
    )  # fmt: skip

    # Truth: decode the accepted tokens one at a time from the original pool, with the reference.
    seq = case.args["state"].clone()
    cu, tokens = call.args["cu_seqlens"], {n: call.args[n] for n in ("q", "k", "v", "g", "beta")}
    for step in range(D):
        rows = [n for n in range(case.rows) if step < num_accepted[n]]
        tok = torch.tensor([int(cu[n]) + step for n in rows])
        gdn.recurrent(
            **{n: t[tok] for n, t in tokens.items()}, state=seq, state_indices=idx[rows].contiguous(),
            cu_seqlens=torch.arange(len(rows) + 1, dtype=torch.int32), use_qk_l2norm=True, scale=call.args["scale"],
            state_layout=state_layout, impl="reference",
        )  # fmt: skip
    for s in case.live_slots:
        assert rel_err(state[s], seq[s]) <= case.tol, f"slot {s}"
    for s in set(range(state.shape[0])) - case.may_change():
        assert torch.equal(state[s], case.args["state"][s]), f"slot {s} changed but no live row owns it"


def test_idle_batch_all_padded():
    """r = 0: every row padded, all-zero qsl, no tokens; nothing is touched."""
    x = packed([0, 0, 0], [-1, -1, -1], num_slots=3)
    state = x.pop("state")
    before = state.clone()
    for impl in IMPLS:
        out = gdn.recurrent(**x, state=state, impl=impl)
        assert out.shape == (0, 1, 4)
    assert torch.equal(state, before)


# ------------------------------------------------------------------------ custom ops, errors, cost


def test_each_call_is_one_custom_op_without_host_sync():
    calls = [
        make_case("gated_delta_rule.recurrent", variant, rows=2, padded=1).fresh() for variant in ("decode", "gating")
    ]
    with OpLog() as log:
        for call in calls:
            gdn.recurrent(**call.args)
    assert log.ops == ["linattn.gdn_recurrent.default"] * 2  # one op, with or without the engine gating
    assert not hasattr(torch.ops.linattn, "gdn_fused_gating") and hasattr(torch.ops.linattn, "gdn_chunked")
    schema = str(torch.ops.linattn.gdn_scatter_accepted.default._schema)
    assert "Tensor(a0!) state" in schema


def _bad_calls():
    x = packed([2, 1], [1, 2], H=2, HV=4, K=8, V=6, num_slots=3)

    def with_(**kw):
        return {**x, **kw}

    i32 = torch.int32
    return [
        ("k", with_(k=x["k"][:, :, :4])),
        ("v", with_(v=torch.randn(3, 3, 6))),  # HV=3 not a multiple of H=2
        ("g", with_(g=x["g"][:, :2])),
        ("beta", with_(beta=x["beta"].to(i32))),
        ("state", with_(state=torch.randn(3, 4, 8, 7))),
        ("state", with_(state_layout="v_first")),  # a [3, 4, 8, 6] pool is K-first
        ("state_layout", with_(state_layout="V-first")),
        ("state_indices", with_(state_indices=x["state_indices"].float())),
        ("state_indices", with_(state_indices=torch.tensor([1, 3], dtype=i32))),  # slot 3 of 3
        ("cu_seqlens", with_(cu_seqlens=torch.tensor([0, 2], dtype=i32))),
        ("cu_seqlens", with_(cu_seqlens=torch.tensor([0, 2, 4], dtype=i32))),  # last > T
        ("cu_seqlens", with_(cu_seqlens=torch.tensor([1, 2, 3], dtype=i32))),
        ("out", with_(out=torch.empty(3, 4, 6, dtype=torch.float16))),
        ("intermediate_states", with_(intermediate_states=torch.zeros(2, 1, 4, 8, 6))),  # D=1 < len 2
        ("intermediate_states", with_(intermediate_states=torch.zeros(2, 2, 4, 6, 8))),  # V-first, pool K-first
        ("has_initial_state", with_(has_initial_state=torch.ones(3, dtype=torch.bool))),
        ("scale", with_(scale=float("nan"))),
        ("impl", with_(impl="cuda")),
    ]


@pytest.mark.parametrize("name,kwargs", _bad_calls(), ids=lambda v: v if isinstance(v, str) else "")
def test_bad_inputs_raise_clear_errors(name, kwargs):
    with pytest.raises(ValueError, match=rf"^gated_delta_rule\.recurrent: {name}\b"):
        gdn.recurrent(**kwargs)


def test_bad_inputs_other_ops():
    x = packed([2, 1], [1, 2], num_slots=3)
    args = {n: x[n] for n in ("q", "k", "v", "g", "beta")}
    meta = dict(state=x["state"], state_indices=x["state_indices"], cu_seqlens=x["cu_seqlens"])
    with pytest.raises(ValueError, match="intermediate_states"):
        gdn.chunked(**args, **meta, intermediate_states=torch.zeros(2, 2, 1, 4, 4))
    with pytest.raises(ValueError, match="chunk_size"):
        gdn.chunked(**args, **meta, chunk_size=24, impl="triton")
    with pytest.raises(ValueError, match="state"):
        gdn.recurrent(**args, **{**meta, "state": x["state"].double()}, impl="triton")
    qkv = {n: x[n] for n in ("q", "k", "v")}
    a, b = x["g"], x["beta"]
    raw = dict(a=a, b=b, A_log=torch.zeros(1), dt_bias=torch.zeros(1))
    with pytest.raises(ValueError, match="recurrent: A_log must have shape"):
        gdn.recurrent(**qkv, **{**raw, "A_log": torch.zeros(2)}, **meta)
    with pytest.raises(ValueError, match="recurrent: gating: .* missing dt_bias"):
        gdn.recurrent(**qkv, a=a, b=b, A_log=torch.zeros(1), **meta)
    with pytest.raises(ValueError, match="recurrent: gating: give either g and beta, or"):
        gdn.recurrent(**args, **raw, **meta)
    with pytest.raises(ValueError, match="recurrent: beta: missing"):
        gdn.recurrent(**qkv, g=x["g"], **meta)
    for bad_pad in (True, "-1", 0.5):  # a bool is an int to Python; the padding rule needs a real slot id
        with pytest.raises(ValueError, match="pad_slot_id must be an int or None"):
            gdn.recurrent(**args, **meta, pad_slot_id=bad_pad)
    inter = torch.zeros(2, 3, 1, 4, 4)
    for bad, msg in (([0, 1], "row 0 has 0"), ([1, 4], "row 1 has 4")):
        with pytest.raises(ValueError, match=f"num_accepted: {msg}"):
            gdn.scatter_accepted(x["state"], inter, x["state_indices"], torch.tensor(bad, dtype=torch.int32))
    with pytest.raises(ValueError, match="num_accepted"):
        gdn.scatter_accepted(x["state"], inter, x["state_indices"], torch.tensor([1, 1, 1], dtype=torch.int32))


def test_cost_models():
    T = N = 64
    H, HV, K, V = 16, 32, 128, 128
    c = gdn.recurrent_cost(T, N, H, HV, K, V, torch.bfloat16)
    state_bytes = 2 * N * HV * K * V * 4
    assert state_bytes < c.bytes < 1.1 * state_bytes  # decode is all state traffic
    assert c.flops == T * HV * (7 * K * V + 2 * V)
    assert 0.8 < c.intensity < 0.9  # 7KV flops per 8KV bytes of fp32 state: deeply memory-bound
    cc = gdn.chunked_cost(4096, 1, H, HV, K, V, chunk_size=64)
    assert cc.flops > 0 and cc.intensity > 10 * c.intensity  # prefill is compute-heavy
    assert gdn.scatter_accepted_cost(N, HV, K, V).bytes == state_bytes + 3 * N * 4
    # verify (D=4) with disable_state_update: the slots are read once and never written
    D = 4
    verify = gdn.recurrent_cost(N * D, N, H, HV, K, V, num_intermediate=N * D, state_update=False)
    written = gdn.recurrent_cost(N * D, N, H, HV, K, V, num_intermediate=N * D)
    assert written.bytes - verify.bytes == N * HV * K * V * 4
    assert verify.bytes < (D + 1) * N * HV * K * V * 4 * 1.05
    assert math.isclose((c + c).bytes, 2 * c.bytes)
