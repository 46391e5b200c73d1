"""``workbench.kernelcheck.sizing``: the bound of a case's bytes holds against what every builder of
``kernels.testing`` really draws, and is not far above it (or a huge request would pass unrefused)."""

import pytest
import torch

from kernels.testing import OPS, SHAPES, make_case
from workbench.kernelcheck.sizing import CHECK_FACTOR, case_bytes, check_bytes, sizes_used

ALL = [(op, variant) for op, spec in OPS.items() for variant in spec.variants]
SIZES = [
    ({}, 3, 2),
    ({"K": 32, "V": 48, "HV": 4, "H": 2, "D": 5, "extend": 40}, 7, 1),
    ({"dim": 96, "width": 3, "nheads": 6, "headdim": 16, "dstate": 24, "ngroups": 3}, 1, 0),
    ({"extend": 3}, 16, 9),
]


def _drawn(op: str, variant: str, over: dict[str, int], rows: int, padded: int) -> int:
    case = make_case(op, variant, rows=rows, padded=padded, shapes=over, padded_tokens=True)
    storage = sum(s.numel() * s.element_size() for s in case.storage.values())
    args = sum(
        a.untyped_storage().nbytes()
        for k, a in case.args.items()
        if isinstance(a, torch.Tensor) and k not in case.storage
    )
    return storage + args


@pytest.mark.parametrize("op, variant", ALL, ids=[f"{o}[{v}]" for o, v in ALL])
@pytest.mark.parametrize("over, rows, padded", SIZES)
def test_the_bound_holds_and_is_tight(op, variant, over, rows, padded):
    drawn = _drawn(op, variant, over, rows, padded)
    bound = case_bytes(op, variant, {**SHAPES["small"], **over}, rows, padded)
    assert drawn <= bound <= 3 * drawn + 512, (drawn, bound)


def test_a_check_holds_several_cases_and_an_unknown_op_is_named():
    sizes = SHAPES["engine"]
    one = case_bytes("mamba2.selective_state_update", "decode", sizes, 8, 2, tail=0)
    assert check_bytes("mamba2.selective_state_update", "decode", sizes, 8, 2, tail=0) == CHECK_FACTOR * one
    with pytest.raises(ValueError, match="op: no size model for 'gdn'"):
        case_bytes("gdn", "decode", sizes, 1, 0)


def _shapes_of(case) -> dict[str, object]:
    """What a case's sizes decide: every tensor's shape and the token offsets."""
    out: dict[str, object] = {k: tuple(a.shape) for k, a in case.args.items() if isinstance(a, torch.Tensor)}
    out["cu_seqlens"] = case.args["cu_seqlens"].tolist() if "cu_seqlens" in case.args else None
    return out


@pytest.mark.parametrize("op, variant", ALL, ids=[f"{o}[{v}]" for o, v in ALL])
def test_the_sizes_a_variant_uses_are_those_its_builder_reads(op, variant):
    """``sizes_used`` (what ``--shape`` may set) against the builders: a size it lists changes the drawn case,
    one it leaves out does not (5 differs from every size of "small")."""
    base = _shapes_of(make_case(op, variant))
    used = sizes_used(op, [variant])
    for key in SHAPES["small"]:
        changed = _shapes_of(make_case(op, variant, shapes={key: 5})) != base
        assert changed == (key in used), (key, used)
