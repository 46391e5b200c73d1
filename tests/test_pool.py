"""StatePool.alloc_at: a request placed where a recorded trace (or an engine) put it."""

from __future__ import annotations

import re

import pytest
import torch

from workbench.pool import StatePool


def test_alloc_at_places_a_request_where_a_trace_put_it_and_refuses_what_is_taken() -> None:
    """A recorded trace (or an engine) chose the row and slots: alloc_at honours them; alloc goes on lowest-first
    around them; taken, reserved and dummy values are refused, naming them, and nothing changes."""
    from workbench.errors import MetadataError

    pool = StatePool(16, "sglang")
    pool.alloc_at(7, [12])
    assert pool.slots_of(7) == [12] and int(pool.mapping[7, 0]) == 12
    rows = pool.alloc(3).tolist()
    assert rows == [1, 2, 3] and [pool.slots_of(r)[0] for r in rows] == [1, 2, 3]
    pool.free([7])
    pool.alloc_at(7, [5])  # a freed row, a slot never handed out
    assert pool.live_rows == [1, 2, 3, 7] and sorted(pool.owned_slots()) == [1, 2, 3, 5]
    before = (pool.mapping.clone(), pool.num_free)
    for row, slots, message in [
        (7, [6], "row=7: not a free request-pool row"),
        (0, [6], "row=0: not a free request-pool row"),
        (8, [5], "slots[0]=5: owned by another request"),
        (8, [0], "slots[0]=0: the dummy slot"),
        (8, [6, 9], "slots: 2 given, the pool keeps 1 per request"),
    ]:
        with pytest.raises(MetadataError, match=re.escape(message)):
            pool.alloc_at(row, slots)
    assert torch.equal(pool.mapping, before[0]) and pool.num_free == before[1]
    assert pool.alloc(1).tolist() == [4] and pool.slots_of(4) == [4]  # lowest-first around the placed ones


def test_a_prefix_cache_holds_slots_without_rows_and_a_finishing_request_donates_its_own() -> None:
    """Held slots are neither free nor a request's: alloc goes around them, alloc_at refuses them naming the
    cache, release gives them back, donate frees a row but keeps its slot held; refusals change nothing."""
    from workbench.errors import MetadataError

    pool = StatePool(8, "sglang")
    assert pool.hold() == 1 and pool.hold(5) == 5 and pool.held_slots == {1, 5}
    rows = pool.alloc(2).tolist()
    assert [pool.slots_of(r)[0] for r in rows] == [2, 3]  # around the held slot 1
    free_before = pool.free_slots()
    for call, message in [
        (lambda: pool.hold(5), "slot=5: not free"),
        (lambda: pool.hold(2), "slot=2: not free"),
        (lambda: pool.hold(0), "slot=0: not free"),
        (lambda: pool.alloc_at(4, [5]), "slots[0]=5: held by a prefix cache (a checkpoint)"),
        (lambda: pool.release(2), "release: slot 2 is not held by a prefix cache"),
    ]:
        with pytest.raises(MetadataError, match=re.escape(message)):
            call()
    assert pool.free_slots() == free_before and pool.held_slots == {1, 5}
    assert pool.donate(rows[0]) == 2 and pool.held_slots == {1, 2, 5}
    assert not pool.is_allocated(rows[0]) and int(pool.mapping[rows[0], 0]) == pool.profile.dummy_slot
    pool.release(1)
    assert pool.alloc(1).tolist() == [rows[0]] and pool.slots_of(rows[0]) == [1]  # the row and slot reused
    with pytest.raises(MetadataError, match="one can be donated"):
        spec = StatePool(9, "vllm", slots_per_request=2)
        spec.donate(int(spec.alloc(1)[0]))
    full = StatePool(3, "sglang")
    full.hold(), full.hold()
    with pytest.raises(MetadataError, match="no free slot to hold"):
        full.hold()


def test_a_request_moves_to_a_free_slot_and_frees_its_old_one() -> None:
    """vLLM align's running state moving into the block of its position: the row maps to the new slot, the
    old one is free again; a slot that is not free is refused, naming it, and nothing changes."""
    from workbench.errors import MetadataError

    pool = StatePool(6, "vllm")
    (row,) = pool.alloc(1).tolist()
    held = pool.hold()
    assert pool.move(row, 4) == 1 and pool.slots_of(row) == [4] and int(pool.mapping[row, 0]) == 4
    assert 1 in pool.free_slots() and 4 not in pool.free_slots()
    for slot in (held, 0, 4, 9):
        with pytest.raises(MetadataError, match=re.escape(f"slot={slot}: not free")):
            pool.move(row, slot)
    assert pool.slots_of(row) == [4] and pool.held_slots == {held}


def test_a_window_of_slots_slides_keeping_the_shared_ones() -> None:
    """vLLM align with speculation: a request's D slots (its window of blocks) are remapped in column order;
    the slots it keeps stay, new ones must be free, the left ones are freed and returned; a refused remap
    names the slot and changes nothing."""
    from workbench.errors import MetadataError

    pool = StatePool(10, "vllm", slots_per_request=3)
    (row,) = pool.alloc(1).tolist()
    (other,) = pool.alloc(1).tolist()
    assert pool.slots_of(row) == [1, 2, 3] and pool.slots_of(other) == [4, 5, 6]
    assert pool.remap(row, [2, 3, 7]) == [1] and pool.slots_of(row) == [2, 3, 7]
    assert pool.mapping[row].tolist() == [2, 3, 7] and 1 in pool.free_slots() and 7 not in pool.free_slots()
    held = pool.hold()
    for slots, says in (([3, 3, 8], "slots[1]=3: given twice"), ([3, 7, 4], "slots[2]=4: not free"),
                        ([3, 7, held], f"slots[2]={held}: not free"), ([3, 7, 0], "slots[2]=0: not free"),
                        ([3, 7], "slots: 2 given, the pool keeps 3")):  # fmt: skip
        free = pool.free_slots()
        with pytest.raises(MetadataError, match=re.escape(says)):
            pool.remap(row, slots)
        assert pool.slots_of(row) == [2, 3, 7] and pool.free_slots() == free
