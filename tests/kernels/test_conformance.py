"""What ``kernels.testing``'s check catches, on every op: a kernel that ignores the padding rule, one that
writes a slot no live row owns, a state read in the wrong layout; what every varlen op does with a
zero-length live row; and that a V-first pool holds the K-first state transposed, op by op.

The per-op conformance matrices (every variant, convention, implementation) are in the op's own test file.
"""

from __future__ import annotations

import functools

import pytest
import torch
from _kernel_helpers import IMPLS, is_varlen, launch_triton

from kernels.conventions import STATE_LAYOUTS, to_layout
from kernels.testing import OPS, cu_seqlens, make_case, rel_err

OP_VARIANTS = [(op, variant) for op, spec in OPS.items() for variant in spec.variants]
# Kernels that read the rows through triton_common's row protocol (kernel_pad_slot_id: None becomes -1).
NEGATIVE_SAFE = (
    "gated_delta_rule.recurrent", "gated_delta_rule.chunked", "gated_delta_rule.scatter_accepted", "mamba2.chunk_scan"
)  # fmt: skip

GUARD_WRITES = [
    ("causal_conv1d.update", "decode"),
    ("causal_conv1d.varlen", "extend"),
    ("mamba2.selective_state_update", "decode"),
    ("linear_attn.recurrent", "decode"),
    ("linear_attn.recurrent", "extend"),
]


# Few tokens, one value block: the interpreter's cost is per program and per token. K != V: a state read in
# the wrong layout has the wrong shape.
SHAPES = {"extend": 4, "HV": 1, "K": 12, "V": 10, "D": 2, "nheads": 2, "ngroups": 1}
# Ops whose state is a K x V matrix per head, with a layout choice: each variant once.
LAYOUT_OP_VARIANTS = [(op, variant) for op, spec in OPS.items() if spec.state_layouts for variant in spec.variants]


@functools.cache
def _unguarded_call(op: str, variant: str, state_layout: str | None = None):
    """The op's Triton kernel run with its padding guard off (``pad_slot_id=None``) on an sglang batch, whose
    padded rows carry -1: slot -1 is the guard slot just before the pool. Padded rows of varlen ops carry
    tokens, so that a kernel that has nothing to do for an empty row still touches their slot."""
    case = make_case(
        op, variant, convention="sglang", rows=1, padded=1, padded_tokens=is_varlen(op), shapes=SHAPES,
        state_layout=state_layout,
    )  # fmt: skip
    call = case.fresh()
    launch_triton(case, {**call.args, "pad_slot_id": None})
    return case, case.check(call)


@pytest.mark.parametrize("op,variant", [ov for ov in OP_VARIANTS if ov[0] not in NEGATIVE_SAFE])
def test_an_unguarded_kernel_fails_the_check(op, variant):
    case, res = _unguarded_call(op, variant)
    assert not res.ok, res.summary()


@pytest.mark.parametrize("op,variant", GUARD_WRITES)
def test_guard_band_catches_an_unguarded_kernel(op, variant):
    for layout in OPS[op].state_layouts or (None,):
        case, res = _unguarded_call(op, variant, layout)
        assert res.guard_changed == [(case.pools[0], "before")], f"{layout}: {res.summary()}"
        assert "guard band before" in res.summary()


@pytest.mark.parametrize("op", NEGATIVE_SAFE)
def test_row_protocol_kernels_never_dereference_a_negative_slot(op):
    """The gated-delta-rule kernels and Mamba2's scan read pad_slot_id=None as -1
    (triton_common.kernel_pad_slot_id): slots are never negative, so even unguarded they skip sglang's -1
    rows, inside the pool (in either state layout)."""
    for layout in OPS[op].state_layouts or (None,):
        case, res = _unguarded_call(op, OPS[op].variants[0], layout)
        assert res.ok, f"{layout}: {res.summary()}"


@pytest.mark.parametrize("op", OPS)
def test_check_fails_a_kernel_that_writes_a_slot_no_live_row_owns(op):
    """Under vLLM the dummy slot (the null block) is the stray one; under Ascend, where padded rows may write
    it, the first free slot."""
    for convention in ("vllm", "sglang-ascend"):
        case = make_case(op, convention=convention, rows=2, padded=1, shapes=SHAPES)
        stray = min(set(range(case.args[case.pools[0]].shape[0])) - case.may_change())
        assert (stray == case.convention.dummy_slot) == (convention == "vllm")
        _check_fails_a_stray_write(case, stray)


def _check_fails_a_stray_write(case, stray: int) -> None:
    pool = case.pools[0]

    def kernel(**args):
        case.fn(**args, impl="reference")
        args[pool][stray] += 1.0

    res = case.check(case.run(kernel))
    assert not res.ok and res.foreign_changed == [(pool, stray)], res.summary()
    assert f"slot(s) [{stray}] of {pool} changed but no processed row owns them" in res.summary()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "op,state_layout", [(op, layout) for op in OPS if is_varlen(op) for layout in OPS[op].state_layouts or (None,)]
)
def test_zero_length_live_rows_keep_their_slot(op, state_layout, impl):
    """Rows 0 and 1 (with and without an initial state, where the op has one) get no tokens: their slots stay
    bitwise unchanged; row 2 matches the float64 reference."""
    case = make_case(
        op, "extend", convention="vllm", rows=3, padded=0, tail=0, shapes={**SHAPES, "extend": 6},
        state_layout=state_layout,
    )  # fmt: skip
    call, want = case.fresh(), case.fresh(torch.float64)
    lens = (call.args["cu_seqlens"][1:] - call.args["cu_seqlens"][:-1]).tolist()
    for args in (call.args, want.args):
        args["cu_seqlens"] = cu_seqlens([0, 0, *lens[2:]])
    case.fn(**call.args, impl=impl)
    case.fn(**want.args, impl="reference")
    pool, idx = case.pools[0], call.args["state_indices"].tolist()
    for row in (0, 1):
        assert torch.equal(call.args[pool][idx[row]], case.args[pool][idx[row]]), f"row {row}'s slot changed"
    assert rel_err(call.args[pool][idx[2]], want.args[pool][idx[2]]) <= case.tol, "row 2's slot"
    assert rel_err(call.args["out"], want.args["out"]) <= case.tol
    assert not call.args["out"].isnan().any()


# ------------------------------------------------------------------------------------------ state layouts


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op,variant", LAYOUT_OP_VARIANTS)
def test_a_v_first_pool_holds_the_k_first_state_transposed(op, variant, impl):
    """One seed, both layouts: the V-first case's pool (and intermediate states) are the K-first case's
    transposed, and the op on the V-first pool leaves the K-first float64 reference's results transposed: the
    layouts are checked against each other, not only each against its own reference."""
    kf = make_case(op, variant, convention="vllm", shapes=SHAPES, state_layout="k_first")
    vf = make_case(op, variant, convention="vllm", shapes=SHAPES, state_layout="v_first")
    assert torch.equal(vf.storage["state"], to_layout(kf.storage["state"], "k_first", "v_first"))
    call, want = vf.run(impl=impl), kf.reference()
    for name in ("state", "intermediate_states", "out"):
        if name in want.args:
            got = call.args[name] if name == "out" else to_layout(call.args[name], "v_first", "k_first")
            assert rel_err(got, want.args[name]) <= kf.tol, f"{name} ({impl})"


# The ops that read the state through its layout (scatter_accepted copies a slot whole: see below).
READERS = [(op, OPS[op].variants[0]) for op in ("gated_delta_rule.recurrent", "gated_delta_rule.chunked",
                                                 "linear_attn.recurrent")]  # fmt: skip


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op,variant", READERS)
def test_a_k_first_read_of_a_v_first_pool_has_the_wrong_shape_only_where_k_ne_v(op, variant, impl):
    """The bug class of an engine that reads its V-first pool as K-first (state_layout deliberately wrong).
    K != V: the argument check refuses it, naming state_layout and both shapes. K == V: the shapes agree, so
    the call passes every argument check and runs; only the values show the transposed read, against the
    float64 reference (the right layout passes it)."""
    case = make_case(op, variant, convention="sglang", shapes=SHAPES, state_layout="v_first")
    call = case.fresh()
    call.args["state_layout"] = "k_first"
    name = op.removesuffix(".recurrent").removesuffix(".chunked")
    with pytest.raises(ValueError, match=rf"{name}\.\w+: state: \[\d+, 1, 10, 12\] is not "
                       rf"\[slots, HV=1, K=12, V=10\] \(state_layout='k_first'\)"):  # fmt: skip
        case.fn(**call.args, impl=impl)

    square = make_case(op, variant, convention="sglang", shapes={**SHAPES, "V": 12}, state_layout="v_first")
    call = square.fresh()
    call.args["state_layout"] = "k_first"
    square.fn(**call.args, impl=impl)  # accepted: a [12, 12] slot is both layouts' shape
    res = square.check(call)
    assert not res.ok and res.bad_state_slots and "out" in res.bad_outputs, res.summary()
    assert square.check(square.run(impl=impl)).ok


@pytest.mark.parametrize("impl", IMPLS)
def test_scatter_of_a_k_first_buffer_into_a_v_first_pool_has_the_wrong_shape_only_where_k_ne_v(impl):
    """scatter_accepted copies a slot whole: its intermediate states must be in the pool's layout. A K-first
    buffer (a verify run K-first) scattered into a V-first pool is refused where K != V (state named with the
    shapes) and copied transposed, unseen by any shape, where K == V."""
    for V, refused in ((10, True), (12, False)):
        case = make_case("gated_delta_rule.scatter_accepted", convention="vllm", shapes={**SHAPES, "V": V},
                         state_layout="v_first")  # fmt: skip
        call = case.fresh()
        call.args["intermediate_states"] = to_layout(call.args["intermediate_states"], "v_first", "k_first")
        if refused:
            with pytest.raises(ValueError, match=r"scatter_accepted: state: \[\d+, 1, 10, 12\] is not \[slots, "
                               r"HV=1, V=12, K=10\] \(state_layout='v_first'\)"):  # fmt: skip
                case.fn(**call.args, impl=impl)
            continue
        case.fn(**call.args, impl=impl)
        res = case.check(call)
        assert not res.ok and res.bad_state_slots, res.summary()


@pytest.mark.parametrize("op", [op for op, spec in OPS.items() if spec.state_layouts])
def test_a_bad_state_layout_is_refused_by_name(op):
    case = make_case(op, shapes=SHAPES)
    with pytest.raises(ValueError, match=r"state_layout: must be one of \['k_first', 'v_first'\], got 'kv'"):
        case.fn(**{**case.fresh().args, "state_layout": "kv"}, impl="reference")


def test_make_case_takes_a_layout_only_where_the_op_has_one():
    assert make_case("linear_attn.recurrent", shapes=SHAPES).state_layout == "k_first"
    assert "state_layout" not in make_case("linear_attn.recurrent", shapes=SHAPES).args  # the op's default
    assert make_case("mamba2.chunk_scan", shapes=SHAPES).state_layout is None
    with pytest.raises(ValueError, match="state_layout: mamba2.selective_state_update takes no state layout"):
        make_case("mamba2.selective_state_update", state_layout="v_first")
    with pytest.raises(ValueError, match=r"state_layout: unknown layout 'V'; choose one of \['k_first', 'v_first'\]"):
        make_case("linear_attn.recurrent", state_layout="V")
    assert STATE_LAYOUTS == ("k_first", "v_first")
