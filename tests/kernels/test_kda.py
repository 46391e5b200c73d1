"""Kimi Delta Attention (KDA): the gated delta rule with a per-key-channel gate, ``gk=`` on
``gated_delta_rule.recurrent`` and ``chunked``.

The truth here is ``naive_kda``, written from the definition in this file (float64, token by token, per
sequence, plain loops; it calls nothing of ``kernels.gated_delta_rule``). Both implementations, every mode
(decode, verify with intermediate states, extend with has_initial_state, chunked prefill), both state layouts
and every padding convention are held against it, on NaN-poisoned outputs, with K != V; the padding rule is
also judged by ``kernels.testing``'s check (guard band, slots no live row owns bitwise unchanged). A gk whose
K channels all equal g is the scalar gate: the recurrence gives GDN's results bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _kernel_helpers import IMPLS, OpLog, launch_triton, opcheck_mutations

import kernels.gated_delta_rule as gdn
from kernels.conventions import CONVENTIONS, STATE_LAYOUTS
from kernels.testing import cu_seqlens, make_case, rel_err, tolerance

# ------------------------------------------------------------------------------- naive float64 truth


def _k_first(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x if layout == "k_first" else x.transpose(-1, -2)


def naive_kda(
    *, q, k, v, gk, beta, state, state_indices, cu_seqlens, scale, use_qk_l2norm=False, has_initial_state=None,
    pad_slot_id=-1, state_layout="k_first", depth=None, **_,
):  # fmt: skip
    """KDA from its definition, in float64: per row, per value head, per token t
        S <- S * exp(gk_t)[:, None]               (row c of the K x V state scaled by exp(gk_t[c]))
        S <- S + beta_t * outer(k_t, v_t - k_t^T S)
        o_t = scale * q_t^T S                      (after the update)
    Rows with state_indices <= pad_slot_id are skipped (zero outputs, no slot touched); zero-length rows
    write nothing. Returns (out [T, HV, V], the pool K-first, intermediate states [N, depth, HV, K, V] K-first
    (NaN where no step wrote) or None)."""
    q, k, v, gk, beta = (x.double() for x in (q, k, v, gk, beta))
    pool = _k_first(state.double(), state_layout).clone()
    T, HV, V = v.shape
    K = q.shape[2]
    group = HV // q.shape[1]
    N = state_indices.shape[0]
    out = torch.zeros(T, HV, V, dtype=torch.float64)
    inter = torch.full((N, depth, HV, K, V), float("nan"), dtype=torch.float64) if depth else None
    for n in range(N):
        slot, bos, eos = int(state_indices[n]), int(cu_seqlens[n]), int(cu_seqlens[n + 1])
        if (pad_slot_id is not None and slot <= pad_slot_id) or eos == bos:
            continue
        fresh = has_initial_state is not None and not bool(has_initial_state[n])
        for h in range(HV):
            S = torch.zeros(K, V, dtype=torch.float64) if fresh else pool[slot, h].clone()
            for t in range(bos, eos):
                qt, kt = q[t, h // group], k[t, h // group]
                if use_qk_l2norm:
                    qt = qt / torch.sqrt((qt * qt).sum() + 1e-6)
                    kt = kt / torch.sqrt((kt * kt).sum() + 1e-6)
                for c in range(K):  # the decay, one key channel (one row of S) at a time
                    S[c] = S[c] * torch.exp(gk[t, h, c])
                v_minus = v[t, h] - kt @ S
                S = S + beta[t, h] * torch.outer(kt, v_minus)
                out[t, h] = scale * (qt @ S)
                if inter is not None:
                    inter[n, t - bos, h] = S
            pool[slot, h] = S
    return out, pool, inter


def kda_gate(T: int, HV: int, K: int, seed: int, strength: float = 1.0) -> torch.Tensor:
    """A fresh per-channel log-decay: -softplus(randn) (never zero, always negative), times ``strength``."""
    return -strength * F.softplus(torch.randn(T, HV, K, generator=torch.Generator().manual_seed(seed)))


def batch(lens, slots, *, H=1, HV=2, K=12, V=10, num_slots, seed, state_layout="k_first", l2norm=True) -> dict:
    """The arguments of ``recurrent(..., gk=...)`` for rows of any lengths on any slots: fresh random inputs,
    never zeros, a pool in ``state_layout``, a NaN-poisoned ``out``, two tokens past the last row."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens) + 2
    k = torch.randn(T, H, K, generator=gen)
    if not l2norm:  # beta |k|^2 < 2 keeps the recurrence contractive
        k = F.normalize(k, dim=-1) * (0.5 + 0.5 * torch.rand(T, H, 1, generator=gen))
    pool = 0.5 * torch.randn(num_slots, HV, K, V, generator=gen)
    return dict(
        q=torch.randn(T, H, K, generator=gen), k=k, v=torch.randn(T, HV, V, generator=gen),
        gk=kda_gate(T, HV, K, seed + 1), beta=0.1 + 0.8 * torch.rand(T, HV, generator=gen),
        state=pool if state_layout == "k_first" else pool.transpose(-1, -2).contiguous(),
        state_layout=state_layout, state_indices=torch.tensor(slots, dtype=torch.int32),
        cu_seqlens=cu_seqlens([*lens]), scale=K**-0.5, use_qk_l2norm=l2norm,
        out=torch.full((T, HV, V), float("nan")),
    )  # fmt: skip


def assert_matches_naive(args: dict, want: tuple, tol: float, before: torch.Tensor, owned: set[int]) -> None:
    """The call's results (``args`` after the op ran) against ``naive_kda``'s: every output (no NaN left), every
    slot a processed row owns, the intermediate states where the truth wrote them (elsewhere NaN or zero); every
    other slot bitwise as ``before``."""
    out, pool, inter = want
    layout = args.get("state_layout", "k_first")
    assert not args["out"].isnan().any(), "an output row was never written"
    assert rel_err(args["out"], out) <= tol, f"out: {rel_err(args['out'], out):.3g}"
    got_pool = _k_first(args["state"], layout)
    for s in range(pool.shape[0]):
        if s in owned:
            assert rel_err(got_pool[s], pool[s]) <= tol, f"slot {s}: {rel_err(got_pool[s], pool[s]):.3g}"
        else:
            assert torch.equal(args["state"][s], before[s]), f"slot {s} changed but no processed row owns it"
    if inter is not None:
        got = _k_first(args["intermediate_states"], layout)
        written = ~inter.isnan()
        assert rel_err(got[written], inter[written]) <= tol, "intermediate states"
        rest = got[~written]
        assert bool((rest.isnan() | (rest == 0)).all()), "intermediate states written where no step ran"


def owned_slots(slots, lens, pad_slot_id) -> set[int]:
    return {s for s, n in zip(slots, lens, strict=True) if n and not (pad_slot_id is not None and s <= pad_slot_id)}


# ------------------------------------------------------------------------ the matrix: kernels.testing


# As the GDN conformance matrix (_kernel_helpers): two live rows on the pool's edges, one padded row, K != V,
# one value block. Each cell builds a GDN case and trades its scalar g for a fresh per-channel gk.
SHAPES = {"HV": 1, "K": 12, "V": 10, "D": 2, "extend": 3}
MODES = [("gated_delta_rule.recurrent", v) for v in ("decode", "verify", "extend")] + [
    ("gated_delta_rule.chunked", "extend")
]
RUNS = [("reference", torch.float32, False), ("triton", torch.float32, False), ("triton", torch.float16, True)]


def kda_case(op, variant, convention, *, dtype=torch.float32, padded_tokens=False, state_layout=None, shapes=None):
    """A ``kernels.testing`` case of ``op`` with the per-channel gate: ``make_case``'s call, g replaced by gk."""
    case = make_case(
        op, variant, convention=convention, rows=2, padded=1, shapes=shapes or SHAPES, dtype=dtype,
        padded_tokens=padded_tokens, state_layout=state_layout,
    )  # fmt: skip
    T, HV = case.args.pop("g").shape
    case.args["gk"] = kda_gate(T, HV, case.args["q"].shape[2], seed=T * 7 + HV)
    return case


# fp32 in both layouts; fp16 with padded rows carrying tokens (skipped by their slot, not their length) in one
# (a layout is a stride pattern, fp16 only the loads and stores).
CELLS = [
    (op, variant, convention, impl, dtype, padded_tokens, layout)
    for op, variant in MODES
    for convention in CONVENTIONS
    for impl, dtype, padded_tokens in RUNS
    for layout in (STATE_LAYOUTS if dtype == torch.float32 else ("k_first",))
]


def _cell_id(cell) -> str:
    op, variant, convention, impl, dtype, padded_tokens, layout = cell
    fp16 = "-fp16-padded_tokens" if dtype == torch.float16 else ""
    return f"{op.split('.')[1]}[{variant}]-{convention}-{impl}{fp16}-{layout}"


@pytest.mark.parametrize(
    "op,variant,convention,impl,dtype,padded_tokens,state_layout", CELLS, ids=[_cell_id(c) for c in CELLS]
)
def test_kda_conforms(op, variant, convention, impl, dtype, padded_tokens, state_layout):
    """Every mode, convention, implementation and layout: kernels.testing's check (the repo's float64
    reference; guard band and foreign slots bitwise) and the naive KDA (outputs, pool, intermediate states)."""
    case = kda_case(op, variant, convention, dtype=dtype, padded_tokens=padded_tokens, state_layout=state_layout)
    call = case.run(impl=impl)
    res = case.check(call)
    assert res.ok, res.summary()
    truth = case.fresh(torch.float64).args
    want = naive_kda(**truth, depth=truth["intermediate_states"].shape[1] if variant == "verify" else None)
    if variant == "verify":  # disable_state_update: the pool stays as it was
        assert torch.equal(call.args["state"], case.args["state"])
        want = (want[0], _k_first(truth["state"], state_layout), want[2])
    lens = (truth["cu_seqlens"][1:] - truth["cu_seqlens"][:-1]).tolist()
    owned = owned_slots(truth["state_indices"].tolist(), lens, case.convention.pad_slot_id)
    if variant == "verify":
        owned = set()
    assert_matches_naive(call.args, want, max(case.tol, tolerance(dtype)), case.args["state"], owned)


# --------------------------------------------------------------------------- random varlen batches

# (lens, padded rows, HV, V) per seed: zero-length live rows, padded rows carrying tokens, a row longer than a
# chunk (17 > 16), V below and above K = 12 (V = 20: two value blocks of the chunked kernel), GVA (HV = 2).
BATCHES = [
    ([3, 0, 5, 1], [False, False, False, True], 2, 10),
    ([17, 2, 0, 4, 1], [False, True, False, False, True], 1, 20),
    ([1, 1, 1], [True, False, False], 1, 10),
]


@pytest.mark.parametrize("state_layout", STATE_LAYOUTS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op", ["recurrent", "chunked"])
@pytest.mark.parametrize("seed", range(len(BATCHES)))
def test_random_varlen_batches_equal_the_naive_kda(seed, op, impl, state_layout):
    """Varlen batches with padded rows (sglang's -1, carrying tokens: skipped by their slot), zero-length rows,
    rows without initial state, GVA (2 value heads per q/k head), K=12 != V, both layouts; chunked with a
    chunk boundary inside a row."""
    lens, pad, HV, V = BATCHES[seed]
    N = len(lens)
    gen = torch.Generator().manual_seed(100 + seed)
    slots = [int(s) for s in torch.randperm(N + 2, generator=gen)[:N] + 1]
    slots = [-1 if p else s for s, p in zip(slots, pad, strict=True)]
    x = batch(lens, slots, H=1, HV=HV, V=V, num_slots=N + 3, seed=seed, state_layout=state_layout)
    x["has_initial_state"] = torch.tensor([n % 3 != 1 for n in range(N)])
    want = naive_kda(**x)
    before = x["state"].clone()
    fn = gdn.recurrent if op == "recurrent" else gdn.chunked
    fn(**x, impl=impl, **({"chunk_size": 16 if impl == "triton" else 5} if op == "chunked" else {}))
    assert_matches_naive(x, want, 1e-4, before, owned_slots(slots, lens, -1))


@pytest.mark.parametrize("state_layout", STATE_LAYOUTS)
@pytest.mark.parametrize("impl", IMPLS)
def test_verify_writes_every_steps_state_and_leaves_the_pool(impl, state_layout):
    """Target-verify with KDA: D=4 draft tokens per row (a padded row carrying tokens, vLLM's 0 skipped),
    intermediate states per step (batch-row indexed), the pool bitwise unchanged."""
    lens, slots = [4, 4, 4, 3], [3, 0, 1, 4]
    x = batch(lens, slots, HV=2, num_slots=5, seed=11, state_layout=state_layout)
    inter_shape = (4, 4, 2, 12, 10) if state_layout == "k_first" else (4, 4, 2, 10, 12)
    x.update(pad_slot_id=0, intermediate_states=torch.full(inter_shape, float("nan")), disable_state_update=True)
    out, _, inter = naive_kda(**x, depth=4)
    before = x["state"].clone()
    gdn.recurrent(**x, impl=impl)
    assert_matches_naive(x, (out, _k_first(before, state_layout), inter), 1e-4, before, set())
    assert torch.equal(x["state"], before)


@pytest.mark.parametrize("impl", IMPLS)
def test_reference_in_float64_and_strong_decay(impl):
    """float64 end to end (reference: 1e-12), and a strong gate (-8 softplus: cumulative log-decay below -100
    inside a chunk) where a chunked form that split e^{G_i - G_j} into e^{G_i} e^{-G_j} would overflow."""
    lens, slots = [26, 7], [2, 1]
    x = batch(lens, slots, HV=1, num_slots=3, seed=5)
    x["gk"] = kda_gate(x["gk"].shape[0], 1, 12, seed=9, strength=8.0)
    assert float(x["gk"][:16].sum(0).min()) < -100
    if impl == "reference":
        x = {n: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for n, t in x.items()}
    want = naive_kda(**x)
    tol = 1e-12 if impl == "reference" else 1e-4
    for fn in (gdn.recurrent, gdn.chunked):
        call = {n: t.clone() if isinstance(t, torch.Tensor) else t for n, t in x.items()}
        fn(**call, impl=impl)
        assert_matches_naive(call, want, tol, x["state"], {1, 2})


@pytest.mark.parametrize("op", ["recurrent", "chunked"])
def test_triton_v_blocks_split_across_programs(op):
    """block_v = 16 < V = 36: three programs share each head's columns; the per-channel decay acts on rows."""
    x = batch([5, 3], [1, 2], HV=1, V=36, num_slots=3, seed=4)
    want = naive_kda(**x)
    before = x["state"].clone()
    case = make_case(f"gated_delta_rule.{op}", "extend", rows=1, padded=0)  # only its launcher is used
    launch_triton(case, x, block_v=16)
    assert_matches_naive(x, want, 1e-4, before, {1, 2})


# ------------------------------------------------------------------- the scalar gate as a special case


@pytest.mark.parametrize(
    "impl,state_layout", [("reference", "k_first"), ("reference", "v_first"), ("triton", "v_first")]
)  # Triton's layouts are a stride pattern, covered above; here the gate
def test_equal_channels_are_the_scalar_gate_exactly(impl, state_layout):
    """gk[t, h, :] all equal to g[t, h]: recurrent gives GDN's outputs, pool and intermediate states bit for
    bit; chunked (another summation order inside a chunk) to rounding."""
    lens, slots = [5, 0, 17, 2], [3, -1, 1, 2]
    x = batch(lens, slots, HV=1, num_slots=4, seed=21, state_layout=state_layout)
    g = -F.softplus(torch.randn(x["v"].shape[:2], generator=torch.Generator().manual_seed(3)))
    gk = g[:, :, None].expand(*g.shape, 12).contiguous()
    x.pop("gk")
    inter = torch.full((4, 17, 1, *x["state"].shape[-2:]), float("nan"))
    for op, extra in (("recurrent", {"intermediate_states": inter}), ("chunked", {})):
        fn = getattr(gdn, op)
        a = {n: t.clone() if isinstance(t, torch.Tensor) else t for n, t in {**x, **extra}.items()}
        b = {n: t.clone() if isinstance(t, torch.Tensor) else t for n, t in {**x, **extra}.items()}
        fn(**a, g=g, impl=impl)
        fn(**b, gk=gk, impl=impl)
        for name in ("out", "state", *extra):
            if op == "recurrent":
                assert torch.equal(a[name].nan_to_num(7.0), b[name].nan_to_num(7.0)), f"{op} {name}"
            else:
                assert rel_err(a[name], b[name]) < 1e-5, f"{op} {name}"


# ------------------------------------------------------------------------ errors, custom ops, cost


def _small():
    x = batch([2, 1], [1, 2], H=1, HV=2, K=8, V=6, num_slots=3, seed=0)
    return {n: x[n] for n in ("q", "k", "v", "gk", "beta", "state", "state_indices", "cu_seqlens")}


@pytest.mark.parametrize(
    "op,extra,drop,msg",
    [
        ("recurrent", {"g": torch.zeros(5, 2) - 0.1}, (), r"recurrent: gk: give the per-channel gate gk or the scalar"),
        ("chunked", {"g": torch.zeros(5, 2) - 0.1}, (), r"chunked: gk: give the per-channel gate gk or the scalar"),
        (
            "recurrent",
            {"A_log": torch.zeros(2), "a": torch.zeros(5, 2)},
            (),
            r"recurrent: gk: .*; got gk and a, A_log$",
        ),
        ("recurrent", {"dt_bias": torch.zeros(2)}, ("beta",), r"recurrent: gk: .*raw gating.*got gk and dt_bias$"),
        ("recurrent", {}, ("beta",), r"recurrent: beta: missing; gk and beta come together"),
        ("chunked", {}, ("beta",), r"chunked: beta: missing; gk and beta come together"),
        ("chunked", {}, ("gk",), r"chunked: g: missing; chunked\(\) takes g and beta, or gk and beta"),
        ("recurrent", {"gk": torch.zeros(5, 2) - 0.1}, (), r"recurrent: gk must have shape \[5, 2, 8\], got \[5, 2\]"),
        (
            "chunked",
            {"gk": torch.zeros(5, 2, 6) - 0.1},
            (),
            r"chunked: gk must have shape \[5, 2, 8\], got \[5, 2, 6\]",
        ),
        ("recurrent", {"gk": torch.zeros(5, 2, 8, dtype=torch.int32)}, (), r"recurrent: gk must have dtype"),
    ],
)
def test_gk_is_refused_by_name_beside_another_gate(op, extra, drop, msg):
    x = {n: t for n, t in _small().items() if n not in drop}
    x = {**x, **extra}
    with pytest.raises(ValueError, match=msg):
        getattr(gdn, op)(**x, impl="reference")


def test_each_kda_call_is_one_custom_op_with_gk_optional():
    x = _small()
    out = torch.empty_like(x["v"])
    with OpLog() as log:
        gdn.recurrent(**x, out=out)
        gdn.chunked(**x, out=out)
    assert log.ops == ["linattn.gdn_recurrent.default", "linattn.gdn_chunked.default"]
    for op in (torch.ops.linattn.gdn_recurrent, torch.ops.linattn.gdn_chunked):
        assert "Tensor? gk" in str(op.default._schema)
    assert "Tensor? g," in str(torch.ops.linattn.gdn_chunked.default._schema)
    opcheck_mutations(  # positional, in the schema's order
        torch.ops.linattn.gdn_recurrent.default,
        tuple(dict(q=x["q"], k=x["k"], v=x["v"], g=None, beta=x["beta"], a=None, b=None, A_log=None, dt_bias=None,
             gk=x["gk"], state=x["state"].clone(), state_layout="k_first", state_indices=x["state_indices"],
             cu_seqlens=x["cu_seqlens"], out=out, intermediate_states=None, has_initial_state=None, scale=0.3,
             use_qk_l2norm=False, disable_state_update=False, pad_slot_id=-1, softplus_beta=1.0,
             softplus_threshold=20.0, impl="reference").values()),
    )  # fmt: skip


def test_cost_counts_the_gate_per_channel():
    T = N = 64
    H, HV, K, V = 16, 32, 128, 128
    scalar = gdn.recurrent_cost(T, N, H, HV, K, V)
    per_channel = gdn.recurrent_cost(T, N, H, HV, K, V, per_channel_gate=True)
    assert per_channel.bytes - scalar.bytes == T * HV * (K - 1) * 4  # gk [T, HV, K] fp32 instead of g [T, HV]
    assert per_channel.flops - scalar.flops == T * HV * (K - 1)  # K exps instead of one
    c_scalar = gdn.chunked_cost(4096, 1, H, HV, K, V)
    c_kda = gdn.chunked_cost(4096, 1, H, HV, K, V, per_channel_gate=True)
    assert c_kda.bytes - c_scalar.bytes == 4096 * HV * (K - 1) * 4
    assert c_kda.flops > c_scalar.flops
