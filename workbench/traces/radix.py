"""A prefix tree of recurrent-state checkpoints over token ids, as sglang's mamba radix cache keeps them.

A KV cache can be cut at any length; a recurrent state cannot: it is the state after exactly some prefix of
a request's tokens. So the tree's nodes (one per token: an uncompressed trie) hold either one state slot (a
*checkpoint*: the state after exactly the tokens from the root to the node) or none (a *tombstone*: the
prefix is known, as its KV would be cached, but there is no state to start from). The semantics follow
sglang 0.5.23's ``UnifiedRadixCache`` with its mamba component (``docs/traces.md``, "Prefix caching"; the
code here is the workbench's own):

* :meth:`RadixCache.match` returns the deepest checkpoint on a prompt's path (the rest of the matched
  prefix is recomputed: a tombstone gives nothing to start from), no deeper than ``limit`` (the simulator
  passes ``prompt_len - 1``, so a hit leaves at least one prompt token to compute and sample from).
* Eviction is LRU over checkpoints; a :meth:`~RadixCache.touch` (a hit) refreshes only the node hit, not
  its ancestors. Evicting a leaf deletes the node and the tombstones above it that then lead nowhere (its
  KV goes with it); evicting an internal node only tombstones it. A locked checkpoint (in use at this
  step: a hit's source, one just published) is never evicted.
* :meth:`RadixCache.insert` puts a slot at exactly one node; when that node has a state already, the tree
  keeps the old one and says so (the caller keeps, or frees, its own slot).

The tree knows slots as plain ints; which slots are free is the pool's business
(:class:`workbench.pool.StatePool` ``hold`` / ``release`` / ``donate``).

Complexity: ``match``, ``insert`` and ``state_at`` cost O(len(tokens)); ``touch``, ``lock`` and
``unlock`` O(1); ``evict_one`` O(locked checkpoints skipped + depth pruned); memory one node per distinct
prefix of the inserted sequences (at most the sum of their lengths): every leaf holds a checkpoint, so the
tree shrinks as checkpoints are evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from workbench.errors import WorkbenchError


class RadixError(WorkbenchError):
    """A bad argument to the tree (a token, a slot, a lock): the message names it and the value."""


class _Node:
    """One token of a path: its children by token id, the slot it holds (None: a tombstone), its locks."""

    __slots__ = ("children", "depth", "locks", "parent", "slot", "token")

    def __init__(self, parent: _Node | None, token: int, depth: int) -> None:
        self.parent, self.token, self.depth = parent, token, depth
        self.children: dict[int, _Node] = {}
        self.slot: int | None = None
        self.locks = 0


def _check_tokens(tokens: Sequence[int]) -> None:
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise RadixError(f"tokens[{i}] = {t!r}: a token id is an int >= 0")


def _check_slot(slot: object) -> int:
    if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
        raise RadixError(f"slot = {slot!r}: a state slot is an int >= 0")
    return slot


class RadixCache:
    """Checkpoints (state slots) keyed by the exact token sequence each holds the state of.

    >>> tree = RadixCache()
    >>> tree.insert([5, 9, 2], slot=4)
    True
    >>> tree.match([5, 9, 2, 7], limit=3)
    (3, 4)
    >>> tree.match([5, 9], limit=2) is None  # the node after [5, 9] is a tombstone
    True
    """

    def __init__(self) -> None:
        self._root = _Node(None, -1, 0)
        self._lru: OrderedDict[int, _Node] = OrderedDict()  # slot -> its node, least recently used first
        self._nodes = 0  # nodes below the root

    # -- queries --------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Checkpoints (nodes holding a state) in the tree."""
        return len(self._lru)

    def __contains__(self, slot: object) -> bool:
        """Whether ``slot`` holds one of the tree's checkpoints."""
        return slot in self._lru

    @property
    def num_nodes(self) -> int:
        """Nodes of the trie (checkpoints and tombstones; the root not counted)."""
        return self._nodes

    def match(self, tokens: Sequence[int], limit: int | None = None) -> tuple[int, int] | None:
        """The deepest checkpoint on ``tokens``' path no deeper than ``limit`` (default ``len(tokens)``).

        Returns ``(length, slot)``: ``slot`` holds the state after exactly ``tokens[:length]``; None when no
        node on the path (up to ``limit``) holds a state. Pure: the caller :meth:`touch`-es a hit it uses.
        """
        depth = len(tokens) if limit is None else min(len(tokens), limit)
        node, best = self._root, None
        for i in range(depth):
            child = node.children.get(tokens[i])
            if child is None:
                break
            node = child
            if node.slot is not None:
                best = (node.depth, node.slot)
        return best

    def state_at(self, tokens: Sequence[int]) -> int | None:
        """The slot holding the state after exactly ``tokens`` (None: no such node, or a tombstone)."""
        node = self._find(tokens)
        return None if node is None else node.slot

    def path(self, slot: int) -> tuple[int, ...]:
        """The token ids whose state ``slot`` holds (root to node); refused when ``slot`` is not in the tree."""
        node = self._node_of(slot)
        out: list[int] = []
        while node.parent is not None:
            out.append(node.token)
            node = node.parent
        return tuple(reversed(out))

    def checkpoints(self) -> list[tuple[int, int]]:
        """Every checkpoint as ``(tokens it holds the state of, slot)``, shortest first (then by slot)."""
        return sorted((node.depth, slot) for slot, node in self._lru.items())

    def lru_order(self) -> list[int]:
        """The checkpoints' slots, least recently used first (the order :meth:`evict_one` takes them in,
        locked ones skipped)."""
        return list(self._lru)

    def evictable(self) -> int:
        """Checkpoints that :meth:`evict_one` could take now (not locked)."""
        return sum(1 for node in self._lru.values() if node.locks == 0)

    def is_locked(self, slot: int) -> bool:
        """Whether the checkpoint in ``slot`` is locked (refused when it is not in the tree)."""
        return self._node_of(slot).locks > 0

    # -- updates --------------------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], slot: int) -> bool:
        """Put ``slot`` at the node of exactly ``tokens`` (created with the tombstones above it as needed).

        Returns True when the tree took the slot (it is now the most recently used checkpoint); False when
        that node holds a state already: the tree keeps its own (touched) and the caller keeps ``slot``.
        Refused: an empty sequence (the root holds no state), a bad token id, a slot the tree holds.
        """
        if len(tokens) == 0:
            raise RadixError("tokens = []: a checkpoint holds the state after at least one token")
        _check_tokens(tokens)
        slot = _check_slot(slot)
        if slot in self._lru:
            at = self._lru[slot].depth
            raise RadixError(f"slot = {slot}: already holds the tree's checkpoint of {at} tokens")
        node = self._root
        for t in tokens:
            child = node.children.get(t)
            if child is None:
                child = node.children[t] = _Node(node, t, node.depth + 1)
                self._nodes += 1
            node = child
        if node.slot is not None:
            self._lru.move_to_end(node.slot)
            return False
        node.slot = slot
        self._lru[slot] = node
        return True

    def touch(self, slot: int) -> None:
        """Mark the checkpoint in ``slot`` used now (a hit): the last one LRU eviction takes."""
        self._node_of(slot)
        self._lru.move_to_end(slot)

    def lock(self, slot: int) -> None:
        """Keep the checkpoint in ``slot`` from eviction until as many :meth:`unlock` calls (it is in use)."""
        self._node_of(slot).locks += 1

    def unlock(self, slot: int) -> None:
        """Undo one :meth:`lock`; refused when ``slot`` is not locked."""
        node = self._node_of(slot)
        if node.locks == 0:
            raise RadixError(f"unlock: slot {slot} is not locked")
        node.locks -= 1

    def evict_one(self) -> int | None:
        """Drop the least recently used checkpoint that is not locked; returns its slot (now the caller's to
        free), or None when every checkpoint is locked or there is none. A leaf goes with the tombstones above
        it that lead to no other state; an internal node becomes a tombstone."""
        victim = next((node for node in self._lru.values() if node.locks == 0), None)
        if victim is None:
            return None
        slot = victim.slot
        assert slot is not None  # every node in the LRU holds a state
        del self._lru[slot]
        victim.slot = None
        self._prune(victim)
        return slot

    def evict_lru(self, n: int) -> list[int]:
        """Evict up to ``n`` checkpoints in LRU order (locked ones skipped); returns their slots, oldest first
        (fewer than ``n`` when too few can go)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise RadixError(f"n = {n!r}: must be an int >= 0")
        out: list[int] = []
        while len(out) < n:
            slot = self.evict_one()
            if slot is None:
                break
            out.append(slot)
        return out

    # -- internals ------------------------------------------------------------------------------------
    def _find(self, tokens: Sequence[int]) -> _Node | None:
        node = self._root
        for t in tokens:
            child = node.children.get(t)
            if child is None:
                return None
            node = child
        return None if node is self._root else node

    def _node_of(self, slot: int) -> _Node:
        node = self._lru.get(slot)
        if node is None:
            raise RadixError(f"slot = {slot!r}: holds no checkpoint of the tree")
        return node

    def _prune(self, node: _Node) -> None:
        """Delete ``node`` and its stateless ancestors while each leads nowhere (no child, no state)."""
        while node.parent is not None and node.slot is None and not node.children:
            parent = node.parent
            del parent.children[node.token]
            self._nodes -= 1
            node = parent

    def __repr__(self) -> str:
        shown = [
            f"{node.depth} tokens in slot {slot}" + (" (locked)" if node.locks else "")
            for slot, node in list(self._lru.items())[:8]
        ]
        more = f", ... {len(self._lru) - 8} more" if len(self._lru) > 8 else ""
        body = ", ".join(shown) + more if shown else "empty"
        return f"RadixCache({len(self._lru)} checkpoints, LRU first: {body}; {self._nodes} nodes)"


__all__ = ["RadixCache", "RadixError"]
