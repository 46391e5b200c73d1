"""The prefix tree of recurrent-state checkpoints: deepest stateful match under a limit, tombstones, one state
per node, LRU eviction that skips locked checkpoints and prunes dead branches, and a brute-force cross-check."""

from __future__ import annotations

import random

import pytest

from workbench.errors import WorkbenchError
from workbench.traces.radix import RadixCache, RadixError


def test_match_is_the_deepest_checkpoint_on_the_path_within_the_limit():
    tree = RadixCache()
    assert tree.insert([1, 2], 11) and tree.insert([1, 2, 3, 4], 12) and tree.insert([7], 13)
    assert tree.match([1, 2, 3, 4, 5]) == (4, 12)
    assert tree.match([1, 2, 3, 4]) == (4, 12)  # no limit: the whole sequence may match
    assert tree.match([1, 2, 3, 4], limit=3) == (2, 11)  # a hit must leave tokens to compute
    assert tree.match([1, 2, 3, 4], limit=4) == (4, 12)
    assert tree.match([1, 2, 9, 9]) == (2, 11)  # the path leaves the tree after [1, 2]
    assert tree.match([1, 2], limit=1) is None
    assert tree.match([1, 2], limit=0) is None
    assert tree.match([2, 1]) is None and tree.match([]) is None
    assert tree.match([7, 1, 2]) == (1, 13)


def test_tombstones_hold_no_state():
    tree = RadixCache()
    tree.insert([1, 2, 3, 4], 5)
    assert tree.num_nodes == 4 and len(tree) == 1
    assert tree.state_at([1, 2]) is None  # the prefix is in the tree, its state is not
    assert tree.match([1, 2, 3]) is None
    assert tree.state_at([1, 2, 3, 4]) == 5 and tree.state_at([1, 2, 3, 4, 5]) is None
    assert tree.path(5) == (1, 2, 3, 4)
    assert tree.checkpoints() == [(4, 5)]


def test_insert_twice_keeps_the_first_state_and_says_so():
    tree = RadixCache()
    assert tree.insert([3, 1], 4) is True
    assert tree.insert([3], 6) is True
    assert tree.insert([3, 1], 5) is False  # the caller keeps (or frees) slot 5
    assert tree.state_at([3, 1]) == 4 and 5 not in tree and len(tree) == 2
    assert tree.lru_order() == [6, 4]  # the second insert touched the state already there
    with pytest.raises(RadixError, match="slot = 4: already holds"):
        tree.insert([8, 8], 4)  # one slot, one checkpoint
    assert tree.checkpoints() == [(1, 6), (2, 4)]


def test_lru_eviction_order_touch_and_locks():
    tree = RadixCache()
    for slot, tokens in ((1, [1]), (2, [2]), (3, [3]), (4, [4])):
        tree.insert(tokens, slot)
    tree.touch(1)  # a hit: most recently used now
    assert tree.lru_order() == [2, 3, 4, 1]
    tree.lock(3)
    tree.lock(3)
    assert tree.is_locked(3) and tree.evictable() == 3
    assert tree.evict_one() == 2
    assert tree.evict_lru(5) == [4, 1]  # 3 is locked: skipped, not waited for
    assert tree.evict_one() is None and len(tree) == 1
    tree.unlock(3)
    assert tree.evict_one() is None  # still locked once
    tree.unlock(3)
    assert tree.evict_lru(2) == [3] and len(tree) == 0 and tree.num_nodes == 0
    tree.insert([9], 9)
    with pytest.raises(RadixError, match="unlock: slot 9 is not locked"):
        tree.unlock(9)


def test_evicting_prunes_dead_branches_and_tombstones_internal_nodes():
    tree = RadixCache()
    tree.insert([1, 2], 10)  # internal once [1, 2, 3] is in
    tree.insert([1, 2, 3], 11)
    tree.insert([1, 5, 6], 12)
    assert tree.num_nodes == 5
    assert tree.evict_one() == 10  # internal: only its state goes
    assert tree.num_nodes == 5 and tree.match([1, 2, 3, 4]) == (3, 11) and tree.match([1, 2, 9]) is None
    assert tree.evict_one() == 11  # a leaf: it and the tombstone [1, 2] above it go, [1] still leads to 12
    assert tree.num_nodes == 3 and tree.state_at([1, 5, 6]) == 12
    assert tree.evict_one() == 12
    assert tree.num_nodes == 0 and tree.match([1, 5, 6]) is None
    tree.insert([1, 5, 6], 12)  # a freed slot can be a checkpoint again
    assert tree.checkpoints() == [(3, 12)]


def test_repr_names_the_checkpoints_and_locks():
    tree = RadixCache()
    assert "0 checkpoints" in repr(tree) and "empty" in repr(tree)
    tree.insert([4, 4, 4], 7)
    tree.insert([4], 8)
    tree.lock(8)
    text = repr(tree)
    assert "2 checkpoints" in text and "3 tokens in slot 7" in text and "1 tokens in slot 8 (locked)" in text
    assert "3 nodes" in text
    for slot in range(9, 30):
        tree.insert([slot], slot)
    assert "more" in repr(tree)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda t: t.insert([], 1), r"tokens = \[\]"),
        (lambda t: t.insert([1, -2], 1), r"tokens\[1\] = -2"),
        (lambda t: t.insert([1, True], 1), r"tokens\[1\] = True"),
        (lambda t: t.insert([1], -1), "slot = -1"),
        (lambda t: t.insert([1], False), "slot = False"),
        (lambda t: t.touch(3), "slot = 3: holds no checkpoint"),
        (lambda t: t.lock(3), "slot = 3"),
        (lambda t: t.path(3), "slot = 3"),
        (lambda t: t.evict_lru(-1), "n = -1"),
    ],
)
def test_bad_arguments_name_the_field_and_value(call, match):
    with pytest.raises(RadixError, match=match) as info:
        call(RadixCache())
    assert isinstance(info.value, WorkbenchError)


def test_agrees_with_a_brute_force_model():
    """Random inserts, hits, locks and evictions against a dict of sequences and an explicit LRU list."""
    rng = random.Random(3)
    tree = RadixCache()
    model: dict[tuple[int, ...], int] = {}  # sequence -> slot
    lru: list[int] = []  # slots, least recently used first
    locked: set[int] = set()
    free = list(range(1, 40))
    for _ in range(600):
        op = rng.random()
        seq = tuple(rng.randrange(3) for _ in range(rng.randint(1, 6)))
        if op < 0.4 and free:
            slot = free.pop()
            took = tree.insert(seq, slot)
            assert took == (seq not in model)
            if took:
                model[seq], lru = slot, [*lru, slot]
            else:
                free.append(slot)
                lru = [s for s in lru if s != model[seq]] + [model[seq]]
        elif op < 0.75:
            limit = rng.randint(0, len(seq))
            want = max(((len(k), s) for k, s in model.items() if len(k) <= limit and seq[: len(k)] == k), default=None)
            assert tree.match(seq, limit) == want
            if want is not None:
                tree.touch(want[1])
                lru = [s for s in lru if s != want[1]] + [want[1]]
        elif op < 0.85 and lru:
            slot = rng.choice(lru)
            if slot in locked:
                tree.unlock(slot)
                locked.discard(slot)
            else:
                tree.lock(slot)
                locked.add(slot)
        else:
            want_slot = next((s for s in lru if s not in locked), None)
            assert tree.evict_one() == want_slot
            if want_slot is not None:
                lru.remove(want_slot)
                model = {k: s for k, s in model.items() if s != want_slot}
                free.append(want_slot)
        assert tree.lru_order() == lru
        assert sorted(tree.checkpoints()) == sorted((len(k), s) for k, s in model.items())
        assert all(tree.path(s) == k for k, s in model.items())
        # every leaf holds a state: the nodes are exactly the distinct prefixes of the stored sequences
        assert tree.num_nodes == len({k[:i] for k in model for i in range(1, len(k) + 1)})
