"""Draft trees of a speculative verify (sglang's ``speculative_eagle_topk > 1``): :class:`DraftTree` and
sglang's parent derivation, :func:`parents_from_links`.

A verify row's ``D`` draft tokens are the nodes of a tree: node 0 is the verified root, and nodes come in
topological order (``parent[t] < t``). sglang encodes a row's tree as two links per node, int64 ``[bs, D]``
from its tree builder: ``retrieve_next_token[b, i]``, the first child of node ``i`` (-1: a leaf), and
``retrieve_next_sibling[b, i]``, the next sibling of node ``i`` (-1: the last child). The example tree of
this page, ``D = 4``::

        0            parents        [-1,  0,  0,  1]
       / \\           next_token     [ 1,  3, -1, -1]   first child
      1   2          next_sibling   [-1,  2, -1, -1]   next sibling
      |              derived        [ 0,  0,  0,  1]   parents_from_links (entry 0, the root's, n/a)
      3

The GDN and Mamba2 backends copy the links into per-bucket int32 ``[bs, D]`` buffers, and the conv kernel
derives ``retrieve_parent_token`` from them one node at a time (:func:`parents_from_links`). That derivation
is right only when siblings are linked in ascending node order and a node's first child is its smallest
child, which is how sglang builds trees (and how :class:`DraftTree` writes them): a sibling link reads the
parent of its source, which a link of a later node has not set yet.

A chain (every verify of vLLM, and sglang with ``topk = 1``) is the tree ``parent[t] = t - 1``. The commit
reads the last accepted node from ``accept_index`` ``[bs, spec_steps + 1]`` of global node ids (``b * D +
node``), -1 past each row's accepted length (:meth:`DraftTree.accept_index`, :meth:`DraftTree.last_accepted`).

>>> tree = DraftTree.from_parents([[-1, 0, 0, 1]])
>>> tree.next_token.tolist(), tree.next_sibling.tolist()
([[1, 3, -1, -1]], [[-1, 2, -1, -1]])
>>> parents_from_links(tree.next_token, tree.next_sibling).tolist()
[[0, 0, 0, 1]]
>>> tree.path(0, 3), tree.leaves(0), tree.is_chain
([0, 1, 3], [2, 3], False)
"""

from __future__ import annotations

import math
import random as _random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench import html
from workbench.errors import MetadataError
from workbench.limits import INT64_MAX, check_int, check_memory

NEXT_TOKEN = "retrieve_next_token"
NEXT_SIBLING = "retrieve_next_sibling"
PARENT_TOKEN = "retrieve_parent_token"
TREE_FIELDS = (NEXT_TOKEN, NEXT_SIBLING, PARENT_TOKEN)
"""The per-row int32 ``[bs, D]`` metadata fields of a tree verify, in sglang's names."""

# host bytes per node while a tree is built: four int64 tensors, and a Python int in a list (8 + 28 B) for
# the nested lists the links and the random trees pass through
NODE_BYTES = 4 * 8 + 36
_RANDOM_TRIES = 16  # draws of a row before a random tree that must branch takes the fixed branching shape

Matrix = Sequence[Sequence[int]] | torch.Tensor


def _matrix(name: str, value: object) -> torch.Tensor:
    """``value`` (nested lists of ints, or an integer tensor) as an int64 host tensor ``[r, D]``, ``D >= 1``."""
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise MetadataError(f"{name}: expected an integer tensor, got dtype {value.dtype}", field=name)
        if value.dim() != 2:
            raise MetadataError(f"{name}: expected shape [r, D], got {tuple(value.shape)}", field=name)
        t = value.detach().to("cpu", torch.int64)  # trees are host data: the builders copy them to the device
    else:
        t = _from_lists(name, value)
    if t.shape[1] < 1:
        raise MetadataError(f"{name}: D = 0 nodes per row; a tree has at least its root (node 0)", field=name)
    return t


def _from_lists(name: str, value: object) -> torch.Tensor:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise MetadataError(f"{name}: expected a list of rows or a 2-D integer tensor, got {value!r:.60}", field=name)
    if not value:
        raise MetadataError(f"{name}: no rows, so no D; for zero requests pass a tensor of shape [0, D]", field=name)
    width = -1
    for b, row in enumerate(value):
        if isinstance(row, str | bytes) or not isinstance(row, Sequence):
            raise MetadataError(f"{name}[{b}]: expected a row of ints, got {row!r:.60}", field=name, row=b)
        if width < 0:
            width = len(row)
        if len(row) != width:
            raise MetadataError(f"{name}[{b}]: {len(row)} entries, row 0 has {width}", field=name, row=b)
        for i, v in enumerate(row):
            if isinstance(v, bool) or not isinstance(v, int):
                raise MetadataError(f"{name}[{b}, {i}]: expected an int, got {v!r:.60}", field=name, row=b)
            if not -INT64_MAX - 1 <= v <= INT64_MAX:
                raise MetadataError(f"{name}[{b}, {i}] = {v}: does not fit int64", field=name, row=b)
    return torch.tensor([list(row) for row in value], dtype=torch.int64).view(len(value), width)


# -- links -> tree: the check DraftTree.from_links and validate() share ------------------------------------
@dataclass(frozen=True)
class LinkProblem:
    """Why one row's links are no tree in sglang's order: ``field`` (``retrieve_next_token`` or
    ``retrieve_next_sibling``), the ``node`` whose entry is at fault (None: a node no link reaches, then
    ``value`` is that node), the entry's ``value``, and ``why``."""

    field: str
    node: int | None
    value: int
    why: str


def row_tree(next_token: Sequence[int], next_sibling: Sequence[int]) -> list[int] | LinkProblem:
    """The parents of one row's links (``parents[0] = -1``), or the first :class:`LinkProblem`.

    Walks from the root, each node's first child then its siblings: every node 1..D-1 must be reached
    exactly once, a child must come after its parent, and siblings must be linked in ascending order (so a
    node's first child is its smallest), as sglang builds them.
    """
    d = len(next_token)
    parents = [-1] * d
    reached = [False] * d
    reached[0] = True
    if next_sibling[0] != -1:
        return LinkProblem(NEXT_SIBLING, 0, next_sibling[0], "the root has no sibling (must be -1)")
    order = [0]
    for i in order:  # grows while it is walked: breadth first from the root
        src_field, src, node = NEXT_TOKEN, i, next_token[i]
        while node != -1:
            if not 0 <= node < d:
                return LinkProblem(src_field, src, node, f"not a node (-1 or 0..{d - 1})")
            if src_field == NEXT_TOKEN and node <= i:
                return LinkProblem(src_field, src, node, "a child comes after its parent (parent < child)")
            if src_field == NEXT_SIBLING and node <= src:
                why = "siblings are linked in ascending node order (sglang's order, which its parent derivation needs)"
                return LinkProblem(src_field, src, node, why)
            if reached[node]:
                return LinkProblem(src_field, src, node, f"node {node} is reached twice (every node has one parent)")
            reached[node], parents[node] = True, i
            order.append(node)
            src_field, src, node = NEXT_SIBLING, node, next_sibling[node]
    for j in range(d):
        if not reached[j]:
            why = f"node {j} is reached from no link: each of nodes 1..{d - 1} is the first child or the next sibling"
            return LinkProblem(NEXT_TOKEN, None, j, why + " of exactly one node")
    return parents


def parents_from_links(next_token: Matrix, next_sibling: Matrix, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """sglang's ``retrieve_parent_token``, int32 ``[bs, D]``, derived from the links as its conv kernel does.

    ``parent`` starts at zeros; then for ``i`` in ``0..D-1``: ``parent[next_token[i]] = i`` where
    ``next_token[i] != -1``, then ``parent[next_sibling[i]] = parent[i]`` where ``next_sibling[i] != -1``;
    a link outside ``0..D-1`` is ignored. Any integer ``[bs, D]`` links are taken, stale or garbage rows
    included (a padded row of the graph buffers), and every row gets an answer; it is a row's true parents
    only when its siblings are linked in ascending order (:mod:`workbench.metadata.tree`). Entry 0, the
    root's, stays 0 in a tree.

    Vectorised over the rows, one step per node (tensor ops only, no host read): ``out`` (int32 ``[bs, D]``
    on the links' device) is written in place, as the graph buffers' update does; without it a new tensor.

    >>> parents_from_links([[1, 3, -1, -1]], [[-1, 2, -1, -1]]).tolist()
    [[0, 0, 0, 1]]
    >>> parents_from_links([[0, 0, 0]], [[0, 0, 0]]).tolist()  # the zeros of a fresh buffer: a star
    [[0, 0, 0]]
    """
    nt = _links_tensor(NEXT_TOKEN, next_token)
    ns = _links_tensor(NEXT_SIBLING, next_sibling)
    if nt.shape != ns.shape or nt.device != ns.device:
        raise MetadataError(
            f"{NEXT_SIBLING}: shape {tuple(ns.shape)} on {ns.device}, {NEXT_TOKEN} {tuple(nt.shape)} on {nt.device}",
            field=NEXT_SIBLING,
        )
    bs, d = nt.shape
    if out is None:
        out = torch.zeros((bs, d), dtype=torch.int32, device=nt.device)
    elif out.shape != nt.shape or out.dtype != torch.int32 or out.device != nt.device:
        raise MetadataError(
            f"out: {out.dtype}{list(out.shape)} on {out.device}, expected torch.int32{[bs, d]} on {nt.device}",
            field="out",
        )
    else:
        out.zero_()
    if not bs or not d:
        return out
    rows = torch.arange(bs, device=nt.device)
    for i in range(d):
        _set_parent(out, rows, nt[:, i], i, d)
        _set_parent(out, rows, ns[:, i], out[:, i], d)  # a sibling shares the parent node i has by now
    return out


def _set_parent(parent: torch.Tensor, rows: torch.Tensor, target: torch.Tensor, value: Any, d: int) -> None:
    """``parent[b, target[b]] = value`` for each row whose target is a node; other rows keep what they hold."""
    ok = (target >= 0) & (target < d)
    col = target.clamp(0, d - 1).long()
    kept = parent[rows, col]
    parent[rows, col] = torch.where(ok, value, kept)


def _links_tensor(name: str, value: object) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise MetadataError(f"{name}: expected an integer tensor, got dtype {value.dtype}", field=name)
        if value.dim() != 2:
            raise MetadataError(f"{name}: expected shape [bs, D], got {tuple(value.shape)}", field=name)
        return value
    return _from_lists(name, value)


# -- the tree ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class DraftTree:
    """The draft trees of ``r`` requests of ``D`` nodes each (one per verify row).

    Attributes:
        parents: int64 ``[r, D]`` on the host: ``parents[b, t]`` the parent of node ``t`` of row ``b``,
            ``parents[:, 0] == -1`` (the verified root), ``0 <= parents[b, t] < t`` otherwise.

    Build one with :meth:`from_parents`, :meth:`from_links` (sglang's encoding), :meth:`chain` or
    :meth:`random`; a constructed tree is checked (``MetadataError`` naming the field and the entry). Its
    tensors are shared, not copied: treat them as read-only. The example tree (module docstring)::

        >>> DraftTree.from_links([[1, 3, -1, -1]], [[-1, 2, -1, -1]]).parents.tolist()
        [[-1, 0, 0, 1]]
        >>> DraftTree.from_links([[1, -1, -1]], [[-1, -1, -1]])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        workbench.errors.MetadataError: retrieve_next_token[0]: node 2 is reached from no link: ...
    """

    parents: torch.Tensor
    _next_token: torch.Tensor = field(init=False, repr=False)
    _next_sibling: torch.Tensor = field(init=False, repr=False)
    _depth: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        parents = _matrix("parents", self.parents)
        r, d = parents.shape
        # the links and depths take as much again, and the checks a row of D even for no request
        check_memory(
            f"parents of shape [{r}, {d}]", max(r, 1) * d * NODE_BYTES, f"trees of {d:,} nodes", field="parents"
        )
        _check_parents(parents)
        object.__setattr__(self, "parents", parents)
        nxt, sib = _links_of(parents)
        object.__setattr__(self, "_next_token", nxt)
        object.__setattr__(self, "_next_sibling", sib)
        object.__setattr__(self, "_depth", _depth_of(parents))

    # -- constructors -----------------------------------------------------------------------------------
    @classmethod
    def from_parents(cls, parents: Matrix) -> DraftTree:
        """The trees whose parents are ``parents`` (nested lists or an integer tensor ``[r, D]``)."""
        return cls(_matrix("parents", parents))

    @classmethod
    def from_links(cls, next_token: Matrix, next_sibling: Matrix) -> DraftTree:
        """The trees sglang encodes as ``retrieve_next_token`` / ``retrieve_next_sibling`` (``[r, D]``).

        Checked row by row: every node reached exactly once from the root, a child after its parent, siblings
        in ascending order; an error names the field and the entry, ``retrieve_next_sibling[1, 2] = 1: ...``.
        """
        nt, ns = _matrix(NEXT_TOKEN, next_token), _matrix(NEXT_SIBLING, next_sibling)
        if nt.shape != ns.shape:
            raise MetadataError(
                f"{NEXT_SIBLING}: shape {tuple(ns.shape)}, {NEXT_TOKEN} has {tuple(nt.shape)}", field=NEXT_SIBLING
            )
        rows = []
        for b, (tok, sib) in enumerate(zip(nt.tolist(), ns.tolist(), strict=True)):
            got = row_tree(tok, sib)
            if isinstance(got, LinkProblem):
                where = f"{got.field}[{b}]" if got.node is None else f"{got.field}[{b}, {got.node}] = {got.value}"
                raise MetadataError(f"{where}: {got.why}", field=got.field, row=b)
            rows.append(got)
        return cls(torch.tensor(rows, dtype=torch.int64).view(nt.shape))

    @classmethod
    def chain(cls, num_requests: int, draft_tokens: int) -> DraftTree:
        """``num_requests`` chains of ``draft_tokens`` nodes: ``parent[t] = t - 1`` (what vLLM verifies).

        >>> DraftTree.chain(2, 3).parents.tolist()
        [[-1, 0, 1], [-1, 0, 1]]
        """
        r, d = _sizes(num_requests, draft_tokens)
        return cls(torch.arange(-1, d - 1, dtype=torch.int64).expand(r, d).clone())

    @classmethod
    def random(
        cls,
        num_requests: int,
        draft_tokens: int,
        topk: int,
        *,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        depth: int | None = None,
    ) -> DraftTree:
        """Random trees in sglang's node order: nodes level by level (breadth first), a parent's children
        next to each other in ascending order, each node with at most ``topk`` children and at most ``depth``
        (default ``D - 1``) edges below the root.

        Where a tree that branches exists (``topk >= 2``, ``D >= 3``) every row branches: a row drawn as a
        chain is drawn again. Reproducible: pass exactly one of ``seed`` (an int) or ``generator`` (a
        ``torch.Generator``, which advances by one draw).

        >>> t = DraftTree.random(3, 6, 2, seed=0)
        >>> t.num_requests, t.draft_tokens, t.is_chain, int(t.depth.max()) <= 5
        (3, 6, False, True)
        """
        r, d = _sizes(num_requests, draft_tokens)
        k = check_int("topk", topk, 1)
        levels = check_int("depth", depth, min(1, d - 1), d - 1) if depth is not None else d - 1
        cap = _capacity(k, levels, d)
        if cap < d:
            raise MetadataError(
                f"topk={k}, depth={levels}: a tree of at most {cap} nodes, fewer than D={d}", field="topk"
            )
        rng = _random.Random(_seed(seed, generator))
        branch = k >= 2 and d >= 3 and levels == d - 1  # a chain is possible: make sure each row branches
        rows = [_random_row(rng, d, k, levels, branch) for _ in range(r)]
        return cls(torch.tensor(rows, dtype=torch.int64).view(r, d))

    # -- facts ------------------------------------------------------------------------------------------
    @property
    def num_requests(self) -> int:
        """``r``: the rows (requests) the trees are for."""
        return self.parents.shape[0]

    @property
    def draft_tokens(self) -> int:
        """``D``: nodes per tree, the verified root included."""
        return self.parents.shape[1]

    @property
    def next_token(self) -> torch.Tensor:
        """int64 ``[r, D]``: the first (smallest) child of each node, -1 for a leaf (sglang's encoding)."""
        return self._next_token

    @property
    def next_sibling(self) -> torch.Tensor:
        """int64 ``[r, D]``: the next larger sibling of each node, -1 for the last child and the root."""
        return self._next_sibling

    @property
    def depth(self) -> torch.Tensor:
        """int64 ``[r, D]``: edges from the root to each node (the root 0)."""
        return self._depth

    @property
    def is_chain(self) -> bool:
        """Every row is the chain ``parent[t] = t - 1``."""
        return bool(torch.equal(self.parents, DraftTree.chain(self.num_requests, self.draft_tokens).parents))

    def path(self, row: int, node: int) -> list[int]:
        """Node ids from the root to ``node`` of row ``row``, both ends included: ``[0, ..., node]``."""
        b = self._row(row)
        t = check_int("node", node, 0, self.draft_tokens - 1)
        parents = self.parents[b].tolist()
        out = [t]
        while out[-1] != 0:
            out.append(parents[out[-1]])
        return out[::-1]

    def leaves(self, row: int) -> list[int]:
        """The nodes of row ``row`` without a child, ascending."""
        b = self._row(row)
        return [t for t, c in enumerate(self._next_token[b].tolist()) if c == -1]

    # -- accepting --------------------------------------------------------------------------------------
    def accept_index(
        self, accepted: Sequence[int | Sequence[int]] | torch.Tensor, width: int | None = None
    ) -> torch.Tensor:
        """sglang's ``accept_index``: int64 ``[r, width]``, row ``b`` the global ids (``b * D + node``) of its
        accepted root-to-node path, -1 after it.

        ``accepted``: per row either its root-first path (``[0, 1, 3]``, checked against the tree) or its last
        accepted node (the path to it is taken); a 1-D integer tensor is the last nodes. ``width``: sglang's
        ``spec_steps + 1``; default the longest path of these trees (their deepest node's depth + 1).

        >>> DraftTree.from_parents([[-1, 0, 0, 1]] * 2).accept_index([[0, 1, 3], 2]).tolist()
        [[0, 1, 3], [4, 6, -1]]
        """
        r, d = self.num_requests, self.draft_tokens
        if isinstance(accepted, torch.Tensor):
            if accepted.dim() != 1 or accepted.dtype.is_floating_point or accepted.dtype == torch.bool:
                raise MetadataError(
                    f"accepted: expected a 1-D integer tensor of last nodes, got {accepted.dtype}"
                    f"{list(accepted.shape)}",
                    field="accepted",
                )
            accepted = accepted.tolist()
        if isinstance(accepted, str | bytes) or not isinstance(accepted, Sequence) or len(accepted) != r:
            got = len(accepted) if isinstance(accepted, Sequence) else repr(accepted)[:40]
            raise MetadataError(f"accepted: expected one entry per request ({r}), got {got}", field="accepted")
        paths = [self._accepted_path(b, entry) for b, entry in enumerate(accepted)]
        longest = int(self._depth.max()) + 1 if r else 1
        w = longest if width is None else check_int("width", width, 1)
        check_memory(f"width={w}", 8 * r * w, f"accept_index of {r:,} rows x {w:,}", field="width")
        out = torch.full((r, w), -1, dtype=torch.int64)
        for b, p in enumerate(paths):
            if len(p) > w:
                raise MetadataError(
                    f"width={w}: accepted[{b}] is a path of {len(p)} nodes ({p}); accept_index holds {w}",
                    field="width",
                    row=b,
                )
            out[b, : len(p)] = torch.tensor(p, dtype=torch.int64) + b * d
        return out

    def last_accepted(self, accept_index: Matrix, accept_lens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """int64 ``[r]``: each row's last accepted node, local (``accept_index[b, len - 1] - b * D``), as the
        commit reads it. Each row's first ``accept_lens[b]`` entries must be a root-first path of its tree.

        >>> tree = DraftTree.from_parents([[-1, 0, 0, 1]] * 2)
        >>> tree.last_accepted([[0, 1, 3], [4, 6, -1]], [3, 2]).tolist()
        [3, 2]
        """
        r, d = self.num_requests, self.draft_tokens
        idx = _matrix("accept_index", accept_index)
        lens = accept_lens.tolist() if isinstance(accept_lens, torch.Tensor) else accept_lens
        if isinstance(lens, str | bytes) or not isinstance(lens, Sequence) or len(lens) != r:
            raise MetadataError(f"accept_lens: expected {r} lengths, one per request", field="accept_lens")
        if idx.shape[0] != r:
            raise MetadataError(f"accept_index: {idx.shape[0]} rows for {r} requests", field="accept_index")
        rows = idx.tolist()
        out = []
        for b, n in enumerate(lens):
            check_int(f"accept_lens[{b}]", n, 1, idx.shape[1])
            local = [v - b * d for v in rows[b][:n]]
            for k, v in enumerate(local):
                if not 0 <= v < d:
                    raise MetadataError(
                        f"accept_index[{b}, {k}] = {rows[b][k]}: not a node of row {b} (global ids "
                        f"{b * d}..{b * d + d - 1})",
                        field="accept_index",
                        row=b,
                    )
            self._check_path(b, local, "accept_index")
            out.append(local[-1])
        return torch.tensor(out, dtype=torch.int64)

    # -- helpers ----------------------------------------------------------------------------------------
    def _row(self, row: object) -> int:
        if self.num_requests == 0:
            raise MetadataError("row: these trees are for no request", field="row")
        return check_int("row", row, 0, self.num_requests - 1)

    def _accepted_path(self, b: int, entry: object) -> list[int]:
        if isinstance(entry, int) and not isinstance(entry, bool):
            check_int(f"accepted[{b}]", entry, 0, self.draft_tokens - 1)
            return self.path(b, entry)
        if isinstance(entry, str | bytes) or not isinstance(entry, Sequence) or not entry:
            raise MetadataError(
                f"accepted[{b}]: expected a node or a root-first path of nodes, got {entry!r:.40}",
                field="accepted",
                row=b,
            )
        path = []
        for k, v in enumerate(entry):
            path.append(check_int(f"accepted[{b}][{k}]", v, 0, self.draft_tokens - 1, field="accepted", row=b))
        self._check_path(b, path, "accepted")
        return path

    def _check_path(self, b: int, path: list[int], name: str) -> None:
        """``path`` must start at the root and go from each node to one of its children."""
        parents = self.parents[b].tolist()
        if path[0] != 0:
            raise MetadataError(f"{name}[{b}]: {path} starts at node {path[0]}, not the root 0", field=name, row=b)
        for prev, t in zip(path, path[1:], strict=False):
            if parents[t] != prev:
                raise MetadataError(
                    f"{name}[{b}]: {path} goes from node {prev} to node {t}, whose parent is {parents[t]}",
                    field=name,
                    row=b,
                )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DraftTree) and torch.equal(self.parents, other.parents)

    def __hash__(self) -> int:
        return hash((self.parents.shape, tuple(self.parents.flatten().tolist())))

    def __repr__(self) -> str:
        r, d = self.num_requests, self.draft_tokens
        rows = [html.short_list(p, limit=8) for p in self.parents[:3].tolist()]
        more = ", ..." if r > 3 else ""
        return f"DraftTree(r={r}, D={d}, parents=[{', '.join(rows)}{more}])"

    def _repr_html_(self) -> str:
        r, d = self.num_requests, self.draft_tokens
        head = {"requests": r, "D": d, "max depth": int(self._depth.max()) if r else 0}
        head["chains"] = sum(1 for p in self.parents.tolist() if p == list(range(-1, d - 1)))
        cols = ["row", "parents", "next_token", "next_sibling", "depth", "leaves"]
        table = []
        for b in range(min(r, 200)):  # html.table elides the middle; reading 200 rows is enough for that
            lists = (self.parents[b], self._next_token[b], self._next_sibling[b], self._depth[b])
            table.append([b, *(html.short_list(t.tolist(), limit=16) for t in lists), len(self.leaves(b))])
        note = html.note("node 0 is the verified root; links in sglang's order (siblings ascending)")
        return html.block(html.facts(head), html.table(cols, table, max_rows=40), note, title="DraftTree")


# -- building blocks --------------------------------------------------------------------------------------
def _sizes(num_requests: object, draft_tokens: object) -> tuple[int, int]:
    r = check_int("num_requests", num_requests, 0)
    d = check_int("draft_tokens", draft_tokens, 1)
    check_memory(
        f"num_requests={r}, draft_tokens={d}",
        max(r, 1) * d * NODE_BYTES,
        f"{r:,} trees of {d:,} nodes",
        field="num_requests",
    )
    return r, d


def _check_parents(parents: torch.Tensor) -> None:
    """``parents[:, 0] == -1`` and ``0 <= parents[:, t] < t``: the first entry that is not, named."""
    d = parents.shape[1]
    t = torch.arange(d, dtype=torch.int64)
    bad = (parents < 0) | (parents >= t)
    bad[:, 0] = parents[:, 0] != -1
    where = bad.nonzero()
    if where.numel():
        b, i = (int(v) for v in where[0])
        v = int(parents[b, i])
        why = "the root (node 0) has no parent: -1" if i == 0 else f"a parent comes before its child: 0 <= parent < {i}"
        raise MetadataError(f"parents[{b}, {i}] = {v}: {why}", field="parents", row=b)


def _links_of(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(next_token, next_sibling) int64 ``[r, D]`` of valid parents, siblings linked in ascending order."""
    r, d = parents.shape
    # sorting by (parent, node) puts each parent's children next to each other, ascending; the root (parent
    # -1) sorts first, alone
    key, order = (parents * d + torch.arange(d)).sort(dim=1)
    group = key.div(d, rounding_mode="floor")  # the parent of each sorted node
    same = group[:, 1:] == group[:, :-1]
    nxt_sib = torch.full((r, d), -1, dtype=torch.int64)
    nxt_sib.scatter_(1, order[:, :-1], torch.where(same, order[:, 1:], -1))
    first = torch.ones((r, d), dtype=torch.bool)
    first[:, 1:] = ~same
    # the first child of a group goes to its parent's entry; the root's group (parent -1) to a spare column
    cols = torch.where(first & (group >= 0), group, d)
    nxt = torch.full((r, d + 1), -1, dtype=torch.int64)
    nxt.scatter_(1, cols, torch.where(first, order, -1))
    return nxt[:, :d].contiguous(), nxt_sib


def _depth_of(parents: torch.Tensor) -> torch.Tensor:
    depth = torch.zeros_like(parents)
    for t in range(1, parents.shape[1]):  # parents come first: their depth is known
        depth[:, t] = depth.gather(1, parents[:, t : t + 1]).squeeze(1) + 1
    return depth


def _capacity(topk: int, depth: int, limit: int) -> int:
    """Nodes of the full ``topk``-ary tree of ``depth`` levels below the root, counted up to ``limit``."""
    total, level = 1, 1
    for _ in range(depth):
        level *= topk
        total += level
        if total >= limit:
            return total
    return total


def _seed(seed: int | None, generator: torch.Generator | None) -> int:
    if (seed is None) == (generator is None):
        raise MetadataError("seed: pass exactly one of seed= (an int) or generator= (a torch.Generator)", field="seed")
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise MetadataError(
                f"generator: expected a torch.Generator, got {type(generator).__name__}", field="generator"
            )
        return int(torch.randint(0, 2**62, (1,), generator=generator))
    return check_int("seed", seed, 0)


def _random_row(rng: _random.Random, d: int, topk: int, depth: int, branch: bool) -> list[int]:
    for _ in range(_RANDOM_TRIES):
        sizes = _level_sizes(rng, d, topk, depth)
        if not branch or max(sizes) > 1:
            return _bfs_parents(rng, sizes, topk)
    # the fixed branching shape: the root's two children, then a chain under the first (depth D - 2)
    return _bfs_parents(rng, [1, 2, *([1] * (d - 3))], topk)


def _level_sizes(rng: _random.Random, d: int, topk: int, depth: int) -> list[int]:
    """Nodes per level (the root's level 1), summing to ``d``, each level at most ``topk`` times the one above
    and at most ``depth`` levels below the root: drawn level by level among the sizes that still fit."""
    sizes, left, levels = [1], d - 1, depth
    while left:
        per_node = _capacity(topk, levels - 1, left)  # a node here and its subtree below it, at most
        lo = max(1, math.ceil(left / per_node))
        hi = min(topk * sizes[-1], left)
        n = rng.randint(lo, hi)
        sizes.append(n)
        left, levels = left - n, levels - 1
    return sizes


def _bfs_parents(rng: _random.Random, sizes: list[int], topk: int) -> list[int]:
    """Parents of a tree with these level sizes, nodes numbered level by level: each level's nodes shared
    among the level above in order (at most ``topk`` each), so children sit together, ascending."""
    parents, start = [-1], 0
    for above, n in zip(sizes, sizes[1:], strict=False):
        left = n
        for k in range(above):
            rest = above - k - 1
            c = rng.randint(max(0, left - topk * rest), min(topk, left))
            parents += [start + k] * c
            left -= c
        start += above
    return parents


__all__ = ["TREE_FIELDS", "DraftTree", "LinkProblem", "parents_from_links", "row_tree"]
