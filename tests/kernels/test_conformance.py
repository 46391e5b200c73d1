"""What ``kernels.testing``'s check catches, on every op: a kernel that ignores the padding rule, one that
writes a slot no live row owns; and what every varlen op does with a zero-length live row.

The per-op conformance matrices (every variant, convention, implementation) are in the op's own test file.
"""

from __future__ import annotations

import functools

import pytest
import torch
from _kernel_helpers import IMPLS, is_varlen, launch_triton

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


# Few tokens, one value block: the interpreter's cost is per program and per token.
SHAPES = {"extend": 4, "HV": 1, "V": 12, "D": 2, "nheads": 2, "ngroups": 1}


@functools.cache
def _unguarded_call(op: str, variant: str):
    """The op's Triton kernel run with its padding guard off (``pad_slot_id=None``) on an sglang batch, whose
    padded rows carry -1: slot -1 is the guard slot just before the pool. Padded rows of varlen ops carry
    tokens, so that a kernel that has nothing to do for an empty row still touches their slot."""
    case = make_case(op, variant, convention="sglang", rows=1, padded=1, padded_tokens=is_varlen(op), shapes=SHAPES)
    call = case.fresh()
    launch_triton(case, {**call.args, "pad_slot_id": None})
    return case, case.check(call)


@pytest.mark.parametrize("op,variant", [ov for ov in OP_VARIANTS if ov[0] not in NEGATIVE_SAFE])
def test_an_unguarded_kernel_fails_the_check(op, variant):
    case, res = _unguarded_call(op, variant)
    assert not res.ok, res.summary()


@pytest.mark.parametrize("op,variant", GUARD_WRITES)
def test_guard_band_catches_an_unguarded_kernel(op, variant):
    case, res = _unguarded_call(op, variant)
    assert res.guard_changed == [(case.pools[0], "before")], res.summary()
    assert "guard band before" in res.summary()


@pytest.mark.parametrize("op", NEGATIVE_SAFE)
def test_row_protocol_kernels_never_dereference_a_negative_slot(op):
    """The gated-delta-rule kernels and Mamba2's scan read pad_slot_id=None as -1
    (triton_common.kernel_pad_slot_id): slots are never negative, so even unguarded they skip sglang's -1
    rows, inside the pool."""
    case, res = _unguarded_call(op, OPS[op].variants[0])
    assert res.ok, res.summary()


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
@pytest.mark.parametrize("op", [op for op in OPS if is_varlen(op)])
def test_zero_length_live_rows_keep_their_slot(op, impl):
    """Rows 0 and 1 (with and without an initial state, where the op has one) get no tokens: their slots stay
    bitwise unchanged; row 2 matches the float64 reference."""
    case = make_case(op, "extend", convention="vllm", rows=3, padded=0, tail=0, shapes={**SHAPES, "extend": 6})
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
