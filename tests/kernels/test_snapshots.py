"""kernels.snapshots: the references hand out the states they pass at the tokens asked for, and nothing else
changes. The GDN states are checked against an independent float64 naive recurrence (test_kda's, with a
per-channel gate, and a scalar gate as equal channels), Mamba2's against the decode step token by token, the
conv windows against their definition (the last W-1 inputs up to the token)."""

from __future__ import annotations

import pytest
import torch
from test_kda import batch, naive_kda
from test_mamba2_scan import batch as scan_batch

import kernels.gated_delta_rule as gdn
import kernels.gated_delta_rule.reference as gdn_ref
from kernels import causal_conv1d as cc
from kernels import mamba2
from kernels.snapshots import Snapshots, active, take_states
from kernels.testing import cu_seqlens, rel_err

# rows on slots 2, 4 (zero-length), the padded -1, 0 and 5 (fresh: no initial state)
LENS, SLOTS, FRESH = [5, 0, 3, 7, 4], [2, 4, -1, 0, 5], [False, False, False, False, True]
# slot -> tokens: mid-row, a zero-length row's, a padded row's, the row's last token, the first of a fresh
# row, one past a row's end, a slot no row has, and 0 tokens (no state is taken after no token)
WANTED = {2: 3, 4: 1, -1: 2, 0: 7, 5: 1, 6: 1, 1: 0}
TAKEN = {2: (0, 3), 0: (3, 7), 5: (4, 1)}  # slot -> (row, tokens): what the references hand out


def _gdn_args(state_layout: str, dtype: torch.dtype, equal_channels: bool) -> dict:
    args = batch(LENS, SLOTS, HV=2, K=12, V=10, num_slots=7, seed=3, state_layout=state_layout)
    if equal_channels:  # a scalar gate: every key channel decays alike
        args["gk"] = args["gk"][..., :1].expand_as(args["gk"]).contiguous()
    args["has_initial_state"] = torch.tensor([not f for f in FRESH])
    for key in ("q", "k", "v", "gk", "beta", "state", "out"):
        args[key] = args[key].to(dtype)
    return args


def _call(args: dict, scalar: bool) -> None:
    a = {k: v for k, v in args.items() if k != "out"}
    if scalar:
        a["g"] = a.pop("gk")[..., 0]
    gdn.recurrent(**a, out=args["out"], impl="reference")


@pytest.mark.parametrize("state_layout", ["k_first", "v_first"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("gathered", [True, False], ids=["gathered", "in_place"])
@pytest.mark.parametrize("scalar", [True, False], ids=["g", "gk"])
def test_gdn_reference_hands_out_each_asked_state(state_layout, dtype, gathered, scalar, monkeypatch):
    if not gathered:  # engine-sized slots: updated where they live, row by row
        monkeypatch.setattr(gdn_ref, "GATHER_MAX_SLOT_BYTES", 0)
    args = _gdn_args(state_layout, dtype, equal_channels=scalar)
    plain = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    want = naive_kda(**args, depth=max(LENS))  # float64 truth, intermediate states K-first
    _call(plain, scalar)
    with take_states(WANTED) as snaps:
        _call(args, scalar)
    assert set(snaps.ssm) == set(TAKEN), "a state taken for a row not asked for, or one asked for not taken"
    assert not snaps.conv, "the recurrence took a conv window"
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for slot, (row, tokens) in TAKEN.items():
        got = snaps.ssm[slot]
        assert got.dtype == dtype and got.shape == args["state"].shape[1:], f"slot {slot}: {got.dtype} {got.shape}"
        truth = want[2][row, tokens - 1]  # K-first
        truth = truth if state_layout == "k_first" else truth.transpose(-1, -2)
        assert rel_err(got, truth) <= tol, f"slot {slot} after {tokens} tokens: {rel_err(got, truth):.3g}"
    # taking is a copy: the call's outputs and pool are bit for bit those of a call without it
    assert torch.equal(args["out"], plain["out"]) and torch.equal(args["state"], plain["state"])
    assert active() is None


def test_gdn_reference_takes_nothing_outside_the_block_or_in_a_verify():
    args = _gdn_args("k_first", torch.float32, equal_channels=False)
    with take_states({}) as snaps:
        _call(args, scalar=False)
    assert not snaps.ssm and active() is None
    # a verify keeps every step's state in intermediate_states already: nothing is taken
    gen = torch.Generator().manual_seed(5)
    N, D, HV, K, V = 2, 3, 2, 12, 10
    pool = torch.randn(4, HV, K, V, generator=gen)
    inter = torch.full((N, D, HV, K, V), float("nan"))
    with take_states({1: 2, 3: 1}) as snaps:
        gdn.recurrent(
            torch.randn(N * D, 1, K, generator=gen), torch.randn(N * D, 1, K, generator=gen),
            torch.randn(N * D, HV, V, generator=gen), -torch.rand(N * D, HV, generator=gen),
            torch.rand(N * D, HV, generator=gen), state=pool, state_indices=torch.tensor([1, 3]),
            cu_seqlens=cu_seqlens([D, D]), intermediate_states=inter, disable_state_update=True, impl="reference",
        )  # fmt: skip
    assert not snaps.ssm and not inter.isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_conv_varlen_reference_hands_out_each_asked_window(dtype):
    dim, W = 6, 4
    gen = torch.Generator().manual_seed(11)
    T = sum(LENS) + 2
    x = torch.randn(T, dim, generator=gen, dtype=dtype)
    weight, bias = torch.randn(dim, W, generator=gen, dtype=dtype), torch.randn(dim, generator=gen, dtype=dtype)
    pool = torch.randn(7, dim, W - 1, generator=gen, dtype=dtype)
    before = pool.clone()
    kw = dict(
        conv_state=pool, state_indices=torch.tensor(SLOTS), has_initial_state=torch.tensor([not f for f in FRESH]),
        cu_seqlens=cu_seqlens(LENS), activation="silu", impl="reference",
    )  # fmt: skip
    plain_pool = pool.clone()
    plain = cc.varlen(x, weight, bias, **{**kw, "conv_state": plain_pool})
    with take_states(WANTED) as snaps:
        out = cc.varlen(x, weight, bias, **kw)
    assert set(snaps.conv) == set(TAKEN) and not snaps.ssm
    bounds = cu_seqlens(LENS).tolist()
    for slot, (row, tokens) in TAKEN.items():
        initial = torch.zeros(dim, W - 1, dtype=dtype) if FRESH[row] else before[slot]
        seq = torch.cat([initial, x[bounds[row] : bounds[row] + tokens].T], dim=1)
        assert torch.equal(snaps.conv[slot], seq[:, -(W - 1) :]), f"slot {slot} after {tokens} tokens"
    assert torch.equal(out, plain) and torch.equal(pool, plain_pool)


def test_snapshots_say_which_tokens_a_row_can_hand_out():
    snaps = Snapshots({3: 4, 5: 0})
    assert snaps.tokens(3, 4) == 4 and snaps.tokens(3, 9) == 4
    assert snaps.tokens(3, 3) is None, "past the row's end"
    assert snaps.tokens(5, 2) is None, "no state after no token"
    assert snaps.tokens(7, 2) is None, "not asked"
    with take_states(snaps) as inner:
        assert inner is snaps and active() is snaps
        with take_states({1: 1}) as nested:
            assert active() is nested
        assert active() is snaps
    assert active() is None


@pytest.mark.parametrize("lens", [[5, 9, 3], [150, 7]], ids=["short", "past-a-block"])
def test_mamba2_scan_reference_hands_out_each_asked_state(lens):
    """Against the decode step fed the row's tokens one at a time (a 150-token row spans the scan's blocks of
    64), on rows that start from their slot or from zeros; the chunk states and pools as without taking."""
    a = scan_batch(lens, chunk=4)
    before = a["state"].clone()
    plain = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in a.items()}
    slots = a["state_indices"].tolist()
    wanted = {slots[0]: 3, slots[1]: lens[1], 99: 1}
    if len(lens) > 2:
        wanted[slots[2]] = 4  # past its 3 tokens: not taken
    else:
        wanted[slots[0]] = 130  # in the scan's third block
    plain_out = mamba2.chunk_scan(**plain, impl="reference")
    with take_states(wanted) as snaps:
        out = mamba2.chunk_scan(**a, impl="reference")
    taken = {slots[0]: (0, wanted[slots[0]]), slots[1]: (1, lens[1])}
    assert set(snaps.ssm) == set(taken) and not snaps.conv
    nh, hd, ds = before.shape[1:]
    for slot, (n, tokens) in taken.items():
        step = before[slot : slot + 1].clone() if a["has_initial_state"][n] else before[:1].new_zeros(1, nh, hd, ds)
        bos = int(a["cu_seqlens"][n])
        for t in range(bos, bos + tokens):
            mamba2.selective_state_update(
                step, a["x"][t : t + 1], a["dt"][t : t + 1, :, None].expand(1, nh, hd),
                a["A"][:, None, None].expand(nh, hd, ds), a["B"][t : t + 1], a["C"][t : t + 1],
                dt_bias=a["dt_bias"][:, None].expand(nh, hd), dt_softplus=True,
                state_indices=torch.tensor([0]), impl="reference",
            )  # fmt: skip
        assert rel_err(snaps.ssm[slot], step[0]) <= 1e-12, f"slot {slot} after {tokens} tokens"
    assert torch.equal(out, plain_out) and torch.equal(a["state"], plain["state"])
    assert torch.equal(a["chunk_states"], plain["chunk_states"])
