"""The kernels' skip rule (``kernels.padding``) and the engines' conventions (``kernels.conventions``), each
convention's boundary values, and the slot a processed row may name: inside the pool, never -1 read as the
pool's last slot (issue 27). Fast: torch references only, no Triton."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kernels.gated_delta_rule as gdn
from kernels.conventions import CONVENTIONS, Convention, get_convention
from kernels.gated_delta_rule.reference import chunked_reference, recurrent_reference
from kernels.padding import host_rows, live_rows_and_slots, skipped_rows
from kernels.testing import cu_seqlens

SGLANG, ASCEND, VLLM = (CONVENTIONS[n] for n in ("sglang", "sglang-ascend", "vllm"))
INDICES = [-2, -1, 0, 1, 3]


@pytest.mark.parametrize(
    ("convention", "skipped"),
    [(SGLANG, [True, True, False, False, False]), (VLLM, [True, True, True, False, False]), (ASCEND, [False] * 5)],
    ids=lambda c: c.name if isinstance(c, Convention) else "",
)
def test_each_convention_skips_exactly_the_rows_at_or_below_its_pad_slot_id(convention, skipped):
    idx = torch.tensor(INDICES, dtype=torch.int32)
    mask = skipped_rows(idx, convention.pad_slot_id)
    assert mask.dtype == torch.bool and mask.shape == idx.shape and mask.tolist() == skipped
    assert [convention.skips(i) for i in INDICES] == skipped  # the host form agrees with the tensor form
    assert convention.skips(convention.sentinel) is not convention.processes_padding
    assert not convention.skips(convention.first_live_slot)


def test_the_conventions_as_written():
    assert [(c.name, c.sentinel, c.pad_slot_id, c.dummy_slot) for c in CONVENTIONS.values()] == [
        ("sglang", -1, -1, 0),
        ("sglang-ascend", 0, None, 0),
        ("vllm", 0, 0, 0),
    ]
    assert [c.first_live_slot for c in CONVENTIONS.values()] == [1, 1, 1]
    assert Convention("x", sentinel=4, pad_slot_id=4, dummy_slot=4).first_live_slot == 5
    assert [c.processes_padding for c in CONVENTIONS.values()] == [False, True, False]
    assert [c.guard for c in CONVENTIONS.values()] == [
        "skip idx < 0",
        "none (padded rows processed on the dummy slot)",
        "skip idx <= 0",
    ]
    assert Convention("x", sentinel=-1, pad_slot_id=3).guard == "skip idx <= 3"
    with pytest.raises(AttributeError):
        SGLANG.sentinel = 0  # type: ignore[misc]  # frozen: one convention, shared by everyone


def test_get_convention_by_name_or_object_and_one_line_for_anything_else():
    assert get_convention("vllm") is VLLM
    own = Convention("mine", sentinel=-1, pad_slot_id=-1)
    assert get_convention(own) is own
    for bad in ("ascend", ["vllm"], None):
        with pytest.raises(ValueError, match=r"^convention: unknown convention .*; choose one of \['sglang', "):
            get_convention(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("convention", [SGLANG, ASCEND, VLLM], ids=lambda c: c.name)
def test_live_rows_and_slots_are_the_processed_rows_in_order(convention):
    idx = torch.tensor([3, convention.sentinel, 1, 4, convention.sentinel], dtype=torch.int32)
    rows, slots = live_rows_and_slots(idx, convention.pad_slot_id, num_slots=5)
    want = [0, 1, 2, 3, 4] if convention.processes_padding else [0, 2, 3]  # Ascend runs padding on slot 0
    assert rows.tolist() == want and slots.tolist() == idx[want].tolist() and slots.dtype == torch.int64
    assert host_rows(idx, convention.pad_slot_id, 5) == (
        idx.tolist(),
        skipped_rows(idx, convention.pad_slot_id).tolist(),
    )


@pytest.mark.parametrize(
    ("pad_slot_id", "indices", "row", "slot"),
    [
        (None, [2, -1], 1, -1),  # sglang's sentinel under Ascend's convention: not the last slot, an error
        (None, [5, 1], 0, 5),
        (0, [1, 0, 5], 2, 5),
        (-1, [-1, 4, 6, 9], 2, 6),  # the first bad processed row is named
    ],
)
def test_a_processed_row_outside_the_pool_is_an_index_error(pad_slot_id, indices, row, slot):
    idx = torch.tensor(indices, dtype=torch.int32)
    message = rf"^state_indices: row {row} has slot {slot}, outside the pool \[0, 5\) and not skipped under "
    with pytest.raises(IndexError, match=message + rf"pad_slot_id={pad_slot_id}$"):
        live_rows_and_slots(idx, pad_slot_id, num_slots=5)
    with pytest.raises(IndexError, match=message):
        host_rows(idx, pad_slot_id, num_slots=5)


def test_the_edges_of_the_pool():
    rows, slots = live_rows_and_slots(torch.tensor([0, 4], dtype=torch.int32), None, num_slots=5)
    assert rows.tolist() == [0, 1] and slots.tolist() == [0, 4]  # the first and the last slot are inside
    rows, slots = live_rows_and_slots(torch.tensor([-1, -1], dtype=torch.int32), -1, num_slots=5)
    assert rows.tolist() == [] and slots.tolist() == []  # an idle step


# -- where a -1 could arrive: the GDN reference indexes the pool with Python ints ----------------------------
def _inputs(slots: list[int], lens: list[int], num_slots: int = 4) -> dict:
    gen = torch.Generator().manual_seed(0)
    t = sum(lens)
    return dict(
        q=torch.randn(t, 1, 4, generator=gen), k=0.3 * torch.randn(t, 1, 4, generator=gen),
        v=torch.randn(t, 1, 4, generator=gen), g=-0.1 * torch.ones(t, 1), beta=0.5 * torch.ones(t, 1),
        state=torch.randn(num_slots, 1, 4, 4, generator=gen), state_indices=torch.tensor(slots, dtype=torch.int32),
        cu_seqlens=cu_seqlens(lens), out=torch.empty(t, 1, 4),
    )  # fmt: skip


@pytest.mark.parametrize("path", ["recurrent gathered", "recurrent in place", "chunked"])
def test_gdn_reference_refuses_minus_one_where_nothing_is_skipped(monkeypatch, path):
    """Under Ascend's convention (pad_slot_id None) a row holding -1 is processed: it must not run on the
    pool's last slot (``state[-1]``), whichever state path the reference takes."""
    import kernels.gated_delta_rule.reference as ref

    if path == "recurrent in place":
        monkeypatch.setattr(ref, "GATHER_MAX_SLOT_BYTES", 0)  # engine-sized slots: updated where they live
    run = recurrent_reference if path.startswith("recurrent") else chunked_reference
    extra = {"chunk_size": 2} if path == "chunked" else {}
    x = _inputs([2, -1], [1, 2])
    before = x["state"].clone()
    with pytest.raises(IndexError, match=r"state_indices: row 1 has slot -1, outside the pool \[0, 4\)"):
        run(**x, scale=0.5, pad_slot_id=None, **extra)
    assert torch.equal(x["state"], before)  # refused before any write
    run(**x, scale=0.5, pad_slot_id=-1, **extra)  # under sglang's convention the same row is skipped
    assert torch.equal(x["state"][[0, 1, 3]], before[[0, 1, 3]]) and not torch.equal(x["state"][2], before[2])
    assert x["out"][1:].eq(0).all()  # the skipped row's tokens are zeros


def test_the_op_refuses_minus_one_under_a_recorder_too():
    """Inside a dispatch mode (the CPU graph recorder) the op reads no values; its reference still refuses."""
    x = _inputs([1, -1], [1, 1])
    x.pop("out")
    with pytest.raises(ValueError, match=r"state_indices: row 1 has slot -1"):
        gdn.recurrent(**x, pad_slot_id=None, impl="reference")

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with PassThrough(), pytest.raises(IndexError, match=r"row 1 has slot -1"):
        gdn.recurrent(**x, pad_slot_id=None, impl="reference")
