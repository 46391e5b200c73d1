"""Gated delta rule: both impls (torch reference in fp32, Triton in the interpreter) against a naive float64
recurrence written here, on fresh random inputs, under every padding convention of kernels/padding.py.

Every call gets NaN-poisoned outputs (and intermediate buffers), and every slot that no live non-empty row
owns must come back bitwise unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from _kernel_helpers import OpLog, cu_from_lens, nan_like
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels.gated_delta_rule as gdn

# Max error relative to max(1, max |expected|), per input dtype (q/k/v/out). State pools are float32 in
# every case, so the state tolerance stays tight; fp16 outputs carry fp16 rounding (2^-11 ~ 4.9e-4).
TOLERANCES = {
    torch.float32: {"out": 2e-5, "state": 2e-5},
    torch.float16: {"out": 2e-3, "state": 5e-5},
    torch.float64: {"out": 1e-12, "state": 1e-12},
}
IMPLS = ["reference", "triton"]


# ------------------------------------------------------------------------------- naive float64 truth


def naive(q, k, v, g, beta, state, idx, cu, *, scale, l2norm=False, has_init=None, pad_slot_id=-1, depth=None):
    """Per row, per head, per token, in float64. Returns (out, new_state, intermediate or None)."""
    q, k, v, g, beta, state = (x.double() for x in (q, k, v, g, beta, state))
    T, HV, V = v.shape
    K = q.shape[2]
    group = HV // q.shape[1]
    N = idx.shape[0]
    out = torch.zeros(T, HV, V, dtype=torch.float64)
    new = state.clone()
    inter = torch.full((N, depth, HV, K, V), float("nan"), dtype=torch.float64) if depth else None
    for n in range(N):
        slot, bos, eos = int(idx[n]), int(cu[n]), int(cu[n + 1])
        if (pad_slot_id is not None and slot <= pad_slot_id) or eos == bos:
            continue
        for h in range(HV):
            init = has_init is None or bool(has_init[n])
            S = state[slot, h].clone() if init else torch.zeros(K, V, dtype=torch.float64)
            for t in range(bos, eos):
                qt, kt = q[t, h // group], k[t, h // group]
                if l2norm:
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


# ---------------------------------------------------------------------------------------- case setup


@dataclass
class Case:
    name: str
    lens: list[int]
    slots: list[int]
    pad_slot_id: int | None
    H: int
    HV: int
    K: int
    V: int
    num_slots: int
    dtype: torch.dtype = torch.float32
    l2norm: bool = False
    has_init: list[bool] | None = None
    extra: dict = field(default_factory=dict)


CASES = [
    # sglang decode: padded tail rows -1, zero length; live rows on the first (0) and last (7) slots.
    Case("decode-sglang", [1, 1, 1, 1, 1, 0, 0], [0, 5, 3, 7, 1, -1, -1], -1, 2, 4, 16, 24, 8, l2norm=True),
    # A graph bucket of 5 tokens with 3 live rows: the 2 tokens past cu_seqlens[-1] belong to no row.
    Case("decode-bucket-tail", [1, 1, 1, 0, 0], [2, 4, 1, -1, -1], -1, 1, 1, 8, 8, 5, extra={"tail_tokens": 2}),
    # vLLM decode: slot 0 is the null block; padded rows 0; GVA 2; K not a power of two.
    # Rows without initial state inside an all-decode batch (the rows-together path).
    Case(
        "decode-vllm-gva",
        [1, 1, 1, 1, 0, 0],
        [1, 7, 4, 2, 0, 0],
        0,
        1,
        2,
        12,
        8,
        8,
        has_init=[True, False, True, False, True, True],
    ),
    # sglang on Ascend: nothing skipped; the padded row (len 1) really runs on the dummy slot 0.
    # V = 40: two V-blocks of 32 in the recurrent kernel, the second one partial.
    Case("extend-ascend-dummy", [2, 1, 3, 1], [1, 2, 5, 0], None, 2, 2, 16, 40, 6),
    # varlen extend: zero-length live rows (one without initial state), rows without initial state,
    # skipped rows with and without tokens in the middle; K, V not powers of two; GVA 3.
    Case(
        "extend-varlen",
        [5, 0, 7, 3, 0, 2, 0],
        [3, 6, 9, 1, -1, -1, 4],
        -1,
        1,
        3,
        20,
        12,
        10,
        l2norm=True,
        has_init=[True, True, False, True, True, False, False],
    ),
    # fp16 activations, verify-like uniform length with a padded tail row.
    Case("verify-fp16", [3, 3, 3, 0], [2, 1, 4, -1], -1, 2, 2, 16, 16, 5, dtype=torch.float16),
]


def make_inputs(c: Case, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    T = sum(c.lens) + c.extra.get("tail_tokens", 0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    q = rnd(T, c.H, c.K)
    k = rnd(T, c.H, c.K)
    if not c.l2norm:  # keep beta |k|^2 < 2 so that the recurrence stays contractive without the norm
        k = F.normalize(k, dim=-1) * (0.5 + 0.5 * torch.rand(T, c.H, 1, generator=gen))
    return dict(
        q=q.to(c.dtype),
        k=k.to(c.dtype),
        v=rnd(T, c.HV, c.V).to(c.dtype),
        g=-(0.02 + 0.5 * torch.rand(T, c.HV, generator=gen)),
        beta=0.1 + 0.8 * torch.rand(T, c.HV, generator=gen),
        state=0.5 * rnd(c.num_slots, c.HV, c.K, c.V),
        state_indices=torch.tensor(c.slots, dtype=torch.int32),
        cu_seqlens=cu_from_lens(c.lens),
        has_initial_state=None if c.has_init is None else torch.tensor(c.has_init),
    )


def written_slots(c: Case) -> set[int]:
    return {s for s, n in zip(c.slots, c.lens, strict=True) if n > 0 and (c.pad_slot_id is None or s > c.pad_slot_id)}


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    if expected.numel() == 0:
        return 0.0
    return (actual.double() - expected).abs().max().item() / max(1.0, expected.abs().max().item())


def assert_untouched(before: torch.Tensor, after: torch.Tensor, written: set[int]) -> None:
    for s in range(before.shape[0]):
        if s not in written:
            assert torch.equal(before[s], after[s]), f"slot {s} changed but no live row owns it"


def assert_pool_matches(case: Case, before: torch.Tensor, after: torch.Tensor, expected, tol: float) -> None:
    """Slots written by live non-empty rows match the float64 truth; every other slot is bitwise unchanged."""
    written = written_slots(case)
    for s in written:
        assert rel_err(after[s], expected[s]) < tol, f"slot {s}"
    assert_untouched(before, after, written)


# -------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_recurrent_matches_float64(case: Case, impl: str):
    x = make_inputs(case)
    scale = case.K**-0.5
    exp_out, exp_state, _ = naive(
        x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], x["state_indices"], x["cu_seqlens"],
        scale=scale, l2norm=case.l2norm, has_init=x["has_initial_state"], pad_slot_id=case.pad_slot_id,
    )  # fmt: skip
    state = x["state"].clone()
    out = nan_like(x["v"])
    ret = gdn.recurrent(
        x["q"], x["k"], x["v"], x["g"], x["beta"], state=state, state_indices=x["state_indices"],
        cu_seqlens=x["cu_seqlens"], use_qk_l2norm=case.l2norm, has_initial_state=x["has_initial_state"],
        pad_slot_id=case.pad_slot_id, out=out, impl=impl,
    )  # fmt: skip
    assert ret is out
    tol = TOLERANCES[case.dtype]
    assert not out.isnan().any(), "an output row was left unwritten"
    assert rel_err(out, exp_out) < tol["out"]
    assert_pool_matches(case, x["state"], state, exp_state, tol["state"])


@pytest.mark.parametrize("impl", IMPLS)
def test_chunked_matches_recurrent_and_float64(impl: str):
    # chunk 16 with rows of 20 and 3 tokens: a full chunk plus a tail, and a single short chunk
    case = Case("chunked", [20, 0, 3, 1], [2, 5, 0, -1], -1, 1, 2, 12, 20, 6, l2norm=True, has_init=[1, 1, 0, 1])
    x = make_inputs(case, seed=1)
    x["has_initial_state"] = x["has_initial_state"].bool()
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    exp_out, exp_state, _ = naive(
        *args, x["state"], x["state_indices"], x["cu_seqlens"], scale=case.K**-0.5, l2norm=True,
        has_init=x["has_initial_state"],
    )  # fmt: skip
    kw = dict(use_qk_l2norm=True, has_initial_state=x["has_initial_state"], impl=impl)
    s_chunk, s_rec = x["state"].clone(), x["state"].clone()
    out = nan_like(x["v"])
    meta = dict(state_indices=x["state_indices"], cu_seqlens=x["cu_seqlens"])
    gdn.chunked(*args, state=s_chunk, **meta, out=out, chunk_size=16, **kw)
    o_rec = gdn.recurrent(*args, state=s_rec, **meta, **kw)
    assert not out.isnan().any()
    assert rel_err(out, exp_out) < 2e-5 and rel_err(out, o_rec.double()) < 2e-5
    assert_pool_matches(case, x["state"], s_chunk, exp_state, 2e-5)


@pytest.mark.parametrize("kernel", ["recurrent", "chunked"])
def test_triton_v_blocks_split_across_programs(kernel: str):
    """block_v = 16 < V = 36: three programs share each head's columns (the last one partial)."""
    from kernels.gated_delta_rule.triton_chunked import launch_chunked
    from kernels.gated_delta_rule.triton_recurrent import launch_recurrent

    case = Case("vsplit", [17, 0, 2], [2, 0, -1], -1, 1, 2, 8, 36, 4, l2norm=True)
    x = make_inputs(case, seed=8)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    exp_out, exp_state, _ = naive(*args, x["state"], x["state_indices"], x["cu_seqlens"], scale=0.3, l2norm=True)
    state, out = x["state"].clone(), nan_like(x["v"])
    kw = dict(scale=0.3, use_qk_l2norm=True, has_initial_state=None, disable_state_update=False, pad_slot_id=-1)
    kw.update(zip(("q", "k", "v", "g", "beta"), args, strict=True), state=state, out=out, block_v=16)
    kw.update(state_indices=x["state_indices"], cu_seqlens=x["cu_seqlens"])
    if kernel == "recurrent":
        launch_recurrent(intermediate_states=None, **kw)
    else:
        launch_chunked(chunk_size=16, **kw)
    assert rel_err(out, exp_out) < 2e-5 and rel_err(state, exp_state) < 2e-5
    assert_untouched(x["state"], state, {2})


def test_chunked_reference_float64_default_chunk():
    """float64 end to end: chunked (default chunk 64 and a small chunk) equals the naive recurrence."""
    case = Case("c64", [24, 7], [1, 3], -1, 2, 2, 8, 8, 4, dtype=torch.float64)
    x = make_inputs(case, seed=2)
    x["state"] = x["state"].double()
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    exp_out, exp_state, _ = naive(*args, x["state"], x["state_indices"], x["cu_seqlens"], scale=0.3)
    for chunk in (64, 5):
        state = x["state"].clone()
        out = gdn.chunked(
            *args, state=state, state_indices=x["state_indices"], cu_seqlens=x["cu_seqlens"], scale=0.3,
            chunk_size=chunk, impl="reference",
        )  # fmt: skip
        assert out.dtype == torch.float64
        assert rel_err(out, exp_out) < 1e-12
        assert rel_err(state, exp_state) < 1e-12


def test_reference_runs_in_float64():
    case = Case("f64", [3, 0, 2], [2, 0, 1], 0, 1, 2, 6, 5, 3, dtype=torch.float64)
    x = make_inputs(case, seed=3)
    x["state"] = x["state"].double()
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    exp_out, exp_state, _ = naive(*args, x["state"], x["state_indices"], x["cu_seqlens"], scale=0.5, pad_slot_id=0)
    state = x["state"].clone()
    meta = dict(state_indices=x["state_indices"], cu_seqlens=x["cu_seqlens"])
    out = gdn.recurrent(*args, state=state, **meta, scale=0.5, pad_slot_id=0, impl="reference")
    assert rel_err(out, exp_out) < 1e-13 and rel_err(state, exp_state) < 1e-13


@pytest.mark.parametrize("impl", IMPLS)
def test_raw_gating_inputs_equal_explicit_gating(impl: str):
    """recurrent(a=, b=, A_log=, dt_bias=) gates inside the op as the engines do; the float64 truth gates first."""
    case = Case("gating", [2, 1, 0, 3], [4, 1, -1, 2], -1, 2, 4, 8, 10, 5, l2norm=True)
    x = make_inputs(case, seed=4)
    T, HV = x["g"].shape
    gen = torch.Generator().manual_seed(5)
    a = 3 * torch.randn(T, HV, generator=gen)
    a[0, 0] = 30.0  # above the softplus threshold: the linear branch
    b = 2 * torch.randn(T, HV, generator=gen)
    A_log = torch.randn(HV, generator=gen) * 0.5
    dt_bias = torch.randn(HV, generator=gen) * 0.5
    g, beta = gdn.gating(a, b, A_log, dt_bias, softplus_beta=1.5, softplus_threshold=15.0, dtype=torch.float64)
    args = (x["q"], x["k"], x["v"])
    meta = (x["state_indices"], x["cu_seqlens"])
    exp_out, exp_state, _ = naive(*args, g, beta, x["state"], *meta, scale=case.K**-0.5, l2norm=True)
    state = x["state"].clone()
    out = gdn.recurrent(
        *args, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, state_indices=meta[0], cu_seqlens=meta[1],
        softplus_beta=1.5, softplus_threshold=15.0, use_qk_l2norm=True, out=nan_like(x["v"]), impl=impl,
    )  # fmt: skip
    assert rel_err(out, exp_out) < 2e-5
    assert_pool_matches(case, x["state"], state, exp_state, 2e-5)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("pad_slot_id", [-1, 0])
def test_verify_then_scatter_equals_sequential_decode(impl: str, pad_slot_id: int):
    D = 3
    pad = pad_slot_id
    # live rows on slots 1 and 6 (first and last live slots of the pool); a padded row with tokens
    slots = [1, 6, 3, pad, pad]
    case = Case("verify", [D, D, D, D, 0], slots, pad, 1, 2, 12, 10, 7, l2norm=True)
    x = make_inputs(case, seed=6)
    N = len(slots)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    idx, cu = x["state_indices"], x["cu_seqlens"]
    inter = torch.full((N, D, case.HV, case.K, case.V), float("nan"))
    state = x["state"].clone()
    out = gdn.recurrent(
        *args, state=state, state_indices=idx, cu_seqlens=cu, use_qk_l2norm=True, intermediate_states=inter,
        disable_state_update=True,
        pad_slot_id=pad, out=nan_like(x["v"]), impl=impl,
    )  # fmt: skip
    assert torch.equal(state, x["state"]), "disable_state_update must leave the whole pool unchanged"
    exp_out, _, exp_inter = naive(*args, x["state"], idx, cu, scale=case.K**-0.5, l2norm=True, pad_slot_id=pad, depth=D)
    assert rel_err(out, exp_out) < 2e-5
    for n in range(N):
        if n < 3:  # live rows
            assert rel_err(inter[n], exp_inter[n]) < 2e-5
        else:
            assert inter[n].isnan().all(), f"padded row {n} wrote intermediate states"

    num_accepted = torch.tensor([2, 3, 1, 0, 7], dtype=torch.int32)  # padded rows: any value
    gdn.scatter_accepted(state, inter, idx, num_accepted, pad_slot_id=pad, impl=impl)

    # Truth: decode the accepted tokens one at a time from the original pool.
    seq = x["state"].clone()
    for step in range(D):
        rows = [n for n in range(3) if step < int(num_accepted[n])]
        tok = torch.tensor([int(cu[n]) + step for n in rows])
        decode_cu = torch.arange(len(rows) + 1, dtype=torch.int32)
        gdn.recurrent(
            *(a[tok] for a in args), state=seq, state_indices=idx[rows].contiguous(), cu_seqlens=decode_cu,
            use_qk_l2norm=True,
            pad_slot_id=pad, impl="reference",
        )  # fmt: skip
    for s in (1, 6, 3):
        assert rel_err(state[s], seq[s].double()) < 2e-5
    assert_untouched(x["state"], state, {1, 6, 3})


def test_zero_length_live_row_leaves_slot_bitwise_unchanged():
    case = Case("zero", [0, 2, 0], [3, 1, 2], -1, 1, 1, 4, 4, 4)
    x = make_inputs(case, seed=7)
    for impl in IMPLS:
        for init in (None, torch.tensor([False, True, False])):
            state = x["state"].clone()
            gdn.recurrent(
                *(x[n] for n in ("q", "k", "v", "g", "beta")), state=state, state_indices=x["state_indices"],
                cu_seqlens=x["cu_seqlens"], has_initial_state=init, impl=impl,
            )  # fmt: skip
            assert torch.equal(state[3], x["state"][3]) and torch.equal(state[2], x["state"][2])


def test_idle_batch_all_padded():
    """r = 0: every row padded, all-zero qsl, no tokens; nothing is touched."""
    x = make_inputs(Case("idle", [0, 0, 0], [-1, -1, -1], -1, 1, 1, 4, 4, 3))
    state = x["state"].clone()
    for impl in IMPLS:
        out = gdn.recurrent(
            *(x[n] for n in ("q", "k", "v", "g", "beta")),
            state=state,
            state_indices=x["state_indices"],
            cu_seqlens=x["cu_seqlens"],
            impl=impl,
        )
        assert out.shape == (0, 1, 4)
    assert torch.equal(state, x["state"])


@settings(max_examples=25, deadline=None)
@given(
    lens=st.lists(st.integers(0, 4), min_size=1, max_size=5),
    convention=st.sampled_from([-1, 0, None]),
    pad_mask=st.lists(st.booleans(), min_size=5, max_size=5),
    gva=st.sampled_from([(1, 1), (1, 2), (2, 4)]),
    seed=st.integers(0, 2**16),
)
def test_reference_property_random_batches(lens, convention, pad_mask, gva, seed):
    """Random varlen batches, random padded rows anywhere, every convention: reference == naive float64."""
    H, HV = gva
    N = len(lens)
    num_slots = N + 2
    perm = torch.randperm(num_slots - 1, generator=torch.Generator().manual_seed(seed))[:N] + 1
    slots = [int(s) for s in perm]  # live slots in 1..num_slots-1 (slot 0: null / dummy)
    lens = list(lens)
    dummy_used = False
    for n in range(N):
        if pad_mask[n]:
            slots[n] = {-1: -1, 0: 0, None: 0}[convention]
            if convention is None:  # Ascend: padded rows really run on slot 0; only one may bring tokens
                lens[n] = 0 if dummy_used else lens[n]
                dummy_used = True
    case = Case("prop", lens, slots, convention, H, HV, 5, 3, num_slots)
    x = make_inputs(case, seed=seed)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    exp_out, exp_state, _ = naive(
        *args, x["state"], x["state_indices"], x["cu_seqlens"], scale=0.4, pad_slot_id=convention
    )
    state = x["state"].clone()
    out = gdn.recurrent(
        *args, state=state, state_indices=x["state_indices"], cu_seqlens=x["cu_seqlens"], scale=0.4,
        pad_slot_id=convention, out=nan_like(x["v"]), impl="reference",
    )  # fmt: skip
    assert rel_err(out, exp_out) < 2e-5
    assert_pool_matches(case, x["state"], state, exp_state, 2e-5)


def test_each_call_is_one_custom_op_without_host_sync():
    case = Case("op", [1, 1, 0], [1, 2, -1], -1, 1, 1, 4, 4, 3)
    x = make_inputs(case)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    out = nan_like(x["v"])
    state = x["state"].clone()
    A_log, dt_bias = torch.zeros(1), torch.zeros(1)
    with OpLog() as log:
        gdn.recurrent(*args, state=state, state_indices=x["state_indices"], cu_seqlens=x["cu_seqlens"], out=out)
        gdn.recurrent(
            *args[:3], a=args[3], b=args[4], A_log=A_log, dt_bias=dt_bias, state=state,
            state_indices=x["state_indices"], cu_seqlens=x["cu_seqlens"], out=out,
        )  # fmt: skip
    assert log.ops == ["linattn.gdn_recurrent.default"] * 2  # one op, with or without the engine gating
    assert not hasattr(torch.ops.linattn, "gdn_fused_gating") and hasattr(torch.ops.linattn, "gdn_chunked")
    schema = str(torch.ops.linattn.gdn_scatter_accepted.default._schema)
    assert "Tensor(a0!) state" in schema


def _bad_calls():
    case = Case("bad", [2, 1], [1, 2], -1, 2, 4, 8, 8, 3)
    x = make_inputs(case)
    base = dict(x)
    base.pop("has_initial_state")

    def with_(**kw):
        d = dict(base)
        d.update(kw)
        return d

    i32 = torch.int32
    return [
        ("k", with_(k=x["k"][:, :, :4])),
        ("v", with_(v=torch.randn(3, 3, 8))),  # HV=3 not a multiple of H=2
        ("g", with_(g=x["g"][:, :2])),
        ("beta", with_(beta=x["beta"].to(i32))),
        ("state", with_(state=torch.randn(3, 4, 8, 7))),
        ("state_indices", with_(state_indices=x["state_indices"].float())),
        ("state_indices", with_(state_indices=torch.tensor([1, 3], dtype=i32))),  # slot 3 of 3
        ("cu_seqlens", with_(cu_seqlens=torch.tensor([0, 2], dtype=i32))),
        ("cu_seqlens", with_(cu_seqlens=torch.tensor([0, 2, 4], dtype=i32))),  # last > T
        ("cu_seqlens", with_(cu_seqlens=torch.tensor([1, 2, 3], dtype=i32))),
        ("out", with_(out=torch.empty(3, 4, 8, dtype=torch.float16))),
        ("intermediate_states", with_(intermediate_states=torch.zeros(2, 1, 4, 8, 8))),  # D=1 < len 2
        ("has_initial_state", with_(has_initial_state=torch.ones(3, dtype=torch.bool))),
        ("scale", with_(scale=float("nan"))),
        ("impl", with_(impl="cuda")),
    ]


@pytest.mark.parametrize("name,kwargs", _bad_calls(), ids=lambda v: v if isinstance(v, str) else "")
def test_bad_inputs_raise_clear_errors(name, kwargs):
    kwargs = dict(kwargs)
    pos = [kwargs.pop(n) for n in ("q", "k", "v", "g", "beta")]
    with pytest.raises(ValueError, match=rf"^gated_delta_rule\.recurrent: {name}\b"):
        gdn.recurrent(*pos, **kwargs)


def test_bad_inputs_other_ops():
    x = make_inputs(Case("bad2", [2, 1], [1, 2], -1, 1, 1, 4, 4, 3))
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    meta = dict(state=x["state"], state_indices=x["state_indices"], cu_seqlens=x["cu_seqlens"])
    with pytest.raises(ValueError, match="intermediate_states"):
        gdn.chunked(*args, **meta, intermediate_states=torch.zeros(2, 2, 1, 4, 4))
    with pytest.raises(ValueError, match="chunk_size"):
        gdn.chunked(*args, **meta, chunk_size=24, impl="triton")
    with pytest.raises(ValueError, match="state"):
        gdn.recurrent(*args, **{**meta, "state": x["state"].double()}, impl="triton")
    a, b = x["g"], x["beta"]
    raw = dict(a=a, b=b, A_log=torch.zeros(1), dt_bias=torch.zeros(1))
    with pytest.raises(ValueError, match="recurrent: A_log must have shape"):
        gdn.recurrent(*args[:3], **{**raw, "A_log": torch.zeros(2)}, **meta)
    with pytest.raises(ValueError, match="recurrent: gating: .* missing dt_bias"):
        gdn.recurrent(*args[:3], a=a, b=b, A_log=torch.zeros(1), **meta)
    with pytest.raises(ValueError, match="recurrent: gating: give either g and beta, or"):
        gdn.recurrent(*args, **raw, **meta)
    with pytest.raises(ValueError, match="recurrent: beta: missing"):
        gdn.recurrent(*args[:4], **meta)
    for bad_pad in (True, "-1", 0.5):  # a bool is an int to Python; the padding rule needs a real slot id
        with pytest.raises(ValueError, match="pad_slot_id must be an int or None"):
            gdn.recurrent(*args, **meta, pad_slot_id=bad_pad)
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
