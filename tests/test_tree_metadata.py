"""Draft trees of a speculative verify (sglang, topk > 1): ``DraftTree``, sglang's parent derivation, the tree
fields of ``Metadata`` in the eager build, the graph buffers and ``validate``, and the explorer's tree figure."""

from __future__ import annotations

import random

import pytest
import torch

from workbench import Batch, DraftTree, MetadataBuffers, MetadataError, StatePool, build_metadata, validate
from workbench.metadata import parents_from_links
from workbench.metadata.tree import TREE_FIELDS

EXAMPLE = [-1, 0, 0, 1]  # 0 -> {1, 2}, 1 -> {3}
EXAMPLE_NEXT = [1, 3, -1, -1]
EXAMPLE_SIBLING = [-1, 2, -1, -1]


def sglang_parents(next_token: list[int], next_sibling: list[int]) -> list[int]:
    """sglang's derivation, one node at a time, in plain Python: the reference of ``parents_from_links``."""
    d = len(next_token)
    parent = [0] * d
    for i in range(d):
        if 0 <= next_token[i] < d:
            parent[next_token[i]] = i
        if 0 <= next_sibling[i] < d:
            parent[next_sibling[i]] = parent[i]
    return parent


def _sglang_pool(n: int = 16) -> tuple[StatePool, torch.Tensor]:
    pool = StatePool(n, "sglang")
    return pool, pool.alloc(3)


# -- DraftTree ----------------------------------------------------------------------------------------------
def test_the_example_tree_in_both_encodings():
    tree = DraftTree.from_parents([EXAMPLE])
    assert tree.next_token.tolist() == [EXAMPLE_NEXT] and tree.next_sibling.tolist() == [EXAMPLE_SIBLING]
    assert tree.next_token.dtype == tree.next_sibling.dtype == torch.int64
    assert DraftTree.from_links([EXAMPLE_NEXT], [EXAMPLE_SIBLING]) == tree
    assert tree.depth.tolist() == [[0, 1, 1, 2]] and (tree.num_requests, tree.draft_tokens) == (1, 4)
    assert tree.path(0, 3) == [0, 1, 3] and tree.path(0, 0) == [0] and tree.leaves(0) == [2, 3]
    assert not tree.is_chain and DraftTree.chain(2, 4).is_chain and DraftTree.from_parents([[-1]]).is_chain
    assert parents_from_links([EXAMPLE_NEXT], [EXAMPLE_SIBLING]).tolist() == [[0, 0, 0, 1]]
    assert repr(tree) == "DraftTree(r=1, D=4, parents=[[-1, 0, 0, 1]])"
    page = tree._repr_html_()
    assert "DraftTree" in page and "[1, 3, -1, -1]" in page and "<b>chains</b>=0" in page


@pytest.mark.parametrize("seed", range(12))
def test_random_trees_round_trip_and_keep_sglangs_order(seed):
    rng = random.Random(seed)
    r, d, k = rng.randint(1, 6), rng.randint(3, 12), rng.randint(2, 4)
    depth = rng.randint(_min_depth(d, k), d - 1)
    tree = DraftTree.random(r, d, k, seed=seed, depth=depth)
    assert tree == DraftTree.random(r, d, k, seed=seed, depth=depth)  # reproducible
    for b, parents in enumerate(tree.parents.tolist()):
        children = [parents.count(t) for t in range(d)]
        assert max(children) <= k and max(tree.depth[b].tolist()) <= depth
        assert parents[1:] == sorted(parents[1:])  # level by level, a parent's children together, ascending
        assert parents != list(range(-1, d - 1))  # every row branches
    again = DraftTree.from_links(tree.next_token, tree.next_sibling)
    assert again == tree and torch.equal(again.next_token, tree.next_token)
    assert DraftTree.from_parents(tree.parents.tolist()) == tree
    derived = parents_from_links(tree.next_token, tree.next_sibling)
    assert derived.dtype == torch.int32 and torch.equal(derived[:, 1:].long(), tree.parents[:, 1:])
    assert (derived[:, 0] == 0).all()  # nothing links to the root: its entry stays 0


def _min_depth(d: int, k: int) -> int:
    depth, cap, level = 0, 1, 1
    while cap < d:
        depth, level = depth + 1, level * k
        cap += level
    return max(depth, 1)


def test_random_with_a_generator_advances_it_and_topk_one_is_a_chain():
    g = torch.Generator().manual_seed(5)
    first, second = DraftTree.random(4, 6, 2, generator=g), DraftTree.random(4, 6, 2, generator=g)
    assert first != second and first == DraftTree.random(4, 6, 2, generator=torch.Generator().manual_seed(5))
    assert DraftTree.random(3, 5, 1, seed=0).is_chain
    assert DraftTree.random(2, 5, 4, seed=0, depth=1).parents.tolist() == [[-1, 0, 0, 0, 0]] * 2  # a star
    assert DraftTree.random(0, 3, 2, seed=0).parents.shape == (0, 3)


def test_parents_from_links_is_sglangs_derivation_on_any_links():
    rng = random.Random(0)
    d = 6
    nt = [[rng.randint(-3, d + 2) for _ in range(d)] for _ in range(40)]  # garbage: out of range, self links
    ns = [[rng.randint(-3, d + 2) for _ in range(d)] for _ in range(40)]
    want = [sglang_parents(a, b) for a, b in zip(nt, ns, strict=True)]
    assert parents_from_links(torch.tensor(nt), torch.tensor(ns)).tolist() == want
    out = torch.full((40, d), 7, dtype=torch.int32)
    assert parents_from_links(torch.tensor(nt, dtype=torch.int32), torch.tensor(ns), out=out) is out
    assert out.tolist() == want
    assert (
        parents_from_links(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, 3, dtype=torch.int32)).tolist()
        == [[0, 0, 0]] * 2
    )


def test_parents_from_links_is_wrong_on_siblings_linked_descending():
    """sglang's assumption: siblings ascending. Node 1's children 2, 3, 4 linked 4 -> 3 -> 2: the link 3 -> 2
    is read before node 3's own parent is set (by 4 -> 3), so node 2 gets parent 0, not 1."""
    true_parents = [-1, 0, 1, 1, 1]
    descending_next, descending_sibling = [1, 4, -1, -1, -1], [-1, -1, -1, 2, 3]
    assert parents_from_links([descending_next], [descending_sibling]).tolist() == [[0, 0, 0, 1, 1]]
    tree = DraftTree.from_parents([true_parents])
    assert parents_from_links(tree.next_token, tree.next_sibling).tolist() == [[0, 0, 1, 1, 1]]
    with pytest.raises(MetadataError, match=r"retrieve_next_sibling\[0, 4\] = 3: siblings are linked in ascending"):
        DraftTree.from_links([descending_next], [descending_sibling])


# (links, message, field, row)
BAD_LINKS = [
    (
        ([[1, 3, -1, -1], [1, 3, -1, -1]], [[-1, 2, -1, -1], [-1, -1, 1, -1]]),
        r"\[1\]: node 2 is reached from no",
        "retrieve_next_token",
        1,
    ),
    (([[1, -1, -1]], [[-1, 1, -1]]), r"retrieve_next_sibling\[0, 1\] = 1: siblings", "retrieve_next_sibling", 0),
    (
        ([[1, 3, -1, -1], [2, -1, -1, -1]], [[-1, 2, -1, -1], [-1, -1, 1, -1]]),
        r"retrieve_next_sibling\[1, 2\] = 1: siblings",
        "retrieve_next_sibling",
        1,
    ),
    (
        ([[1, 0, -1]], [[-1, 2, -1]]),
        r"retrieve_next_token\[0, 1\] = 0: a child comes after its parent",
        "retrieve_next_token",
        0,
    ),
    (
        ([[1, -1, -1]], [[2, -1, -1]]),
        r"retrieve_next_sibling\[0, 0\] = 2: the root has no sibling",
        "retrieve_next_sibling",
        0,
    ),
    (([[1, 5, -1]], [[-1, -1, -1]]), r"retrieve_next_token\[0, 1\] = 5: not a node", "retrieve_next_token", 0),
    (
        ([[1, 2, -1]], [[-1, 2, -1]]),
        r"retrieve_next_token\[0, 1\] = 2: node 2 is reached twice",
        "retrieve_next_token",
        0,
    ),
    (
        ([[1, 2, -1, -1]], [[-1, 3, 3, -1]]),
        r"retrieve_next_sibling\[0, 2\] = 3: node 3 is reached twice",
        "retrieve_next_sibling",
        0,
    ),
    (([[1, 2]], [[-1, -1, -1]]), r"retrieve_next_sibling: shape \(1, 3\)", "retrieve_next_sibling", None),
    (([[1, "x"]], [[-1, -1]]), r"retrieve_next_token\[0, 1\]: expected an int", "retrieve_next_token", 0),
    (([], []), "no rows", "retrieve_next_token", None),
]


@pytest.mark.parametrize(("links", "message", "field", "row"), BAD_LINKS, ids=[m for _, m, _, _ in BAD_LINKS])
def test_bad_links_are_named_by_field_and_entry(links, message, field, row):
    with pytest.raises(MetadataError, match=message) as info:
        DraftTree.from_links(*links)
    assert (info.value.field, info.value.row) == (field, row)


@pytest.mark.parametrize(
    ("call", "message", "field"),
    [
        (lambda: DraftTree.from_parents([[-1, 0, 2]]), r"parents\[0, 2\] = 2: a parent comes before", "parents"),
        (lambda: DraftTree.from_parents([[0, 0]]), r"parents\[0, 0\] = 0: the root", "parents"),
        (lambda: DraftTree.from_parents(torch.zeros(2, 0, dtype=torch.int64)), "D = 0", "parents"),
        (lambda: DraftTree.from_parents(torch.zeros(2, 2)), "integer tensor", "parents"),
        (lambda: DraftTree.random(1, 8, 2, seed=0, depth=2), "topk=2, depth=2: a tree of at most 7 nodes", "topk"),
        (lambda: DraftTree.random(1, 8, 2), "exactly one of seed", "seed"),
        (lambda: DraftTree.random(1, 8, 2, seed=1, generator=torch.Generator()), "exactly one of seed", "seed"),
        (lambda: DraftTree.random(1, 4, 0, seed=0), "topk = 0", "topk"),
        (lambda: DraftTree.chain(-1, 4), "num_requests = -1", "num_requests"),
        (lambda: DraftTree.from_parents([EXAMPLE]).path(0, 4), "node = 4", "node"),
        (lambda: DraftTree.from_parents([EXAMPLE]).leaves(1), "row = 1", "row"),
    ],
)
def test_bad_trees_are_refused_in_one_line(call, message, field):
    with pytest.raises(MetadataError, match=message) as info:
        call()
    assert info.value.field == field and "\n" not in str(info.value)


# -- accepting ----------------------------------------------------------------------------------------------
def test_accept_index_and_last_accepted_on_random_paths():
    tree = DraftTree.random(6, 9, 3, seed=3)
    rng = random.Random(1)
    for _ in range(20):
        last = [rng.randrange(9) for _ in range(6)]
        idx = tree.accept_index(last, width=9)
        lens = [len(tree.path(b, t)) for b, t in enumerate(last)]
        assert idx.dtype == torch.int64 and idx.shape == (6, 9)
        for b in range(6):
            assert idx[b, : lens[b]].tolist() == [b * 9 + t for t in tree.path(b, last[b])]
            assert (idx[b, lens[b] :] == -1).all()
        assert tree.last_accepted(idx, lens).tolist() == last
        assert tree.last_accepted(idx, torch.tensor(lens)).tolist() == last
    paths = [tree.path(b, rng.randrange(9)) for b in range(6)]
    assert torch.equal(tree.accept_index(paths), tree.accept_index([p[-1] for p in paths]))
    assert tree.accept_index(paths).shape[1] == int(tree.depth.max()) + 1  # default width: the longest path


def test_accept_index_refuses_what_is_no_root_first_path():
    tree = DraftTree.from_parents([EXAMPLE, EXAMPLE])
    with pytest.raises(MetadataError, match=r"accepted\[1\]: \[0, 2, 3\] goes from node 2 to node 3, whose parent"):
        tree.accept_index([[0, 1], [0, 2, 3]])
    with pytest.raises(MetadataError, match=r"accepted\[0\]: \[1, 3\] starts at node 1"):
        tree.accept_index([[1, 3], 0])
    with pytest.raises(MetadataError, match=r"width=2: accepted\[0\] is a path of 3 nodes") as info:
        tree.accept_index([3, 0], width=2)
    assert (info.value.field, info.value.row) == ("width", 0)
    with pytest.raises(MetadataError, match=r"accept_index\[1, 1\] = 2: not a node of row 1") as info:
        tree.last_accepted([[0, 1, 3], [4, 2, -1]], [3, 2])  # row 1's ids are 4..7: built with a wrong D
    assert (info.value.field, info.value.row) == ("accept_index", 1)
    with pytest.raises(MetadataError, match=r"accept_index\[1\]: \[0, 3\] goes from node 0 to node 3"):
        tree.last_accepted([[0, 1, 3], [4, 7, -1]], [3, 2])


# -- the batch and the eager build ----------------------------------------------------------------------------
def test_batch_keeps_a_checked_tree_and_shows_it():
    pool, rows = _sglang_pool()
    tree = DraftTree.from_parents([EXAMPLE] * 3)
    batch = Batch.target_verify(rows, [5, 6, 7], 4, tree=tree)
    assert batch.tree is tree and repr(batch) == "Batch.target_verify(raw_bs=3, D=4, tree)"
    assert "tree_parents" in batch._repr_html_() and "[-1, 0, 0, 1]" in batch._repr_html_()
    assert Batch.target_verify(rows[:1], [5], 1, tree=DraftTree.chain(1, 1)).tree is not None  # D = 1: the root
    for bad, words in (
        (DraftTree.from_parents([EXAMPLE] * 2), "trees of 2 requests x 4 nodes, the batch has 3 requests"),
        (DraftTree.chain(3, 3), "x 3 nodes, the batch has 3 requests x draft_tokens=4"),
        ([EXAMPLE] * 3, "expected a workbench.metadata.DraftTree or None, got list"),
    ):
        with pytest.raises(MetadataError, match=words) as info:
            Batch.target_verify(rows, [5, 6, 7], 4, tree=bad)
        assert info.value.field == "tree"


def test_build_metadata_fills_live_links_and_pads_with_fresh_zeros():
    pool, rows = _sglang_pool()
    tree = DraftTree.random(3, 5, 2, seed=7)
    meta = build_metadata(Batch.target_verify(rows, [5, 6, 7], 5, tree=tree), pool, bucket=4, buckets=[4])
    for name in TREE_FIELDS:
        t = getattr(meta, name)
        assert t.dtype == torch.int32 and t.shape == (4, 5) and name in meta.tensors()
    assert meta.retrieve_next_token[:3].tolist() == tree.next_token.tolist()
    assert meta.retrieve_next_sibling[:3].tolist() == tree.next_sibling.tolist()
    assert meta.retrieve_parent_token[:3, 1:].tolist() == tree.parents[:, 1:].tolist()
    assert meta.retrieve_next_token[3].tolist() == meta.retrieve_next_sibling[3].tolist() == [0] * 5
    assert meta.retrieve_parent_token[3].tolist() == [0] * 5  # derived from the zeros: every node under 0
    validate(meta, pool)
    kept = meta.clone()
    assert kept.retrieve_parent_token is not meta.retrieve_parent_token
    assert torch.equal(kept.retrieve_parent_token, meta.retrieve_parent_token)
    row = meta.rows()[0]
    assert row["retrieve_next_token"] == tree.next_token[0].tolist() and "drafts=tree" in meta.table()
    assert "retrieve_parent_token" in meta.table() and "retrieve_parent_token" in meta._repr_html_()
    assert "D=5 tree" in repr(meta)
    unpadded = build_metadata(Batch.target_verify(rows, [5, 6, 7], 5, tree=tree), pool, bucket=None)
    assert unpadded.retrieve_next_token.shape == (3, 5)
    chain = build_metadata(Batch.target_verify(rows, [5, 6, 7], 5), pool, bucket=4, buckets=[4])
    assert all(getattr(chain, n) is None for n in TREE_FIELDS) and "retrieve_next_token" not in chain.tensors()


def test_a_profile_without_trees_refuses_a_tree_batch_naming_tree():
    pool = StatePool(40, "vllm", slots_per_request=4)
    rows = pool.alloc(2)
    batch = Batch.target_verify(rows, [5, 6], 4, tree=DraftTree.from_parents([EXAMPLE] * 2))
    with pytest.raises(MetadataError, match="tree: profile 'vllm' has no draft trees") as info:
        build_metadata(batch, pool, bucket=4, buckets=[4])
    assert info.value.field == "tree"
    with pytest.raises(MetadataError, match="tree: profile 'vllm' has no draft trees"):
        MetadataBuffers(pool, "target_verify", [4], 4, tree=True)
    bufs = MetadataBuffers(pool, "target_verify", [4], 4)
    with pytest.raises(MetadataError, match="tree: profile 'vllm' has no draft trees"):
        bufs.update(batch)
    build_metadata(Batch.target_verify(rows, [5, 6], 4), pool, bucket=4, buckets=[4])  # its chains are fine


# -- the graph buffers --------------------------------------------------------------------------------------
def test_buffers_copy_live_links_and_leave_padded_rows_stale():
    pool = StatePool(16, "sglang")
    rows = pool.alloc(3)
    bufs = MetadataBuffers(pool, "target_verify", [4], 4, tree=True)
    static = bufs.static[4]
    ptrs = {n: getattr(static, n).data_ptr() for n in TREE_FIELDS}
    assert all((getattr(static, n) == 0).all() for n in TREE_FIELDS)  # allocated zeros, as sglang's
    a = DraftTree.from_parents([[-1, 0, 1, 2], [-1, 0, 0, 0], [-1, 0, 0, 1]])
    b = DraftTree.from_parents([[-1, 0, 0, 0], [-1, 0, 1, 1]])
    m = bufs.update(Batch.target_verify(rows, [5, 6, 7], 4, tree=a))
    validate(m, pool)
    assert m.retrieve_next_token[:3].tolist() == a.next_token.tolist()
    m = bufs.update(Batch.target_verify(rows[:2], [5, 6], 4, tree=b))
    validate(m, pool)
    assert m.raw_batch_size == 2
    assert m.retrieve_next_token[:2].tolist() == b.next_token.tolist()
    assert m.retrieve_next_token[2].tolist() == a.next_token[2].tolist() == [1, 3, -1, -1]  # A's, stale
    assert m.retrieve_next_sibling[2].tolist() == a.next_sibling[2].tolist()
    assert m.retrieve_parent_token[2].tolist() == [0, 0, 0, 1]  # derived from the stale links
    assert m.retrieve_next_token[3].tolist() == [0, 0, 0, 0]  # never a live row: the fresh zeros
    assert m.retrieve_parent_token[:2, 1:].tolist() == b.parents[:, 1:].tolist()
    bufs.reset_for_capture(4)
    assert {n: getattr(static, n).data_ptr() for n in TREE_FIELDS} == ptrs  # same storage: what the graph records
    assert static.retrieve_next_token[2].tolist() == [1, 3, -1, -1]  # capture copies no links (sglang's skip)
    m = bufs.update(Batch.idle())
    assert m.forward_mode == "idle" and m.retrieve_next_token[0].tolist() == b.next_token[0].tolist()
    validate(m, pool)
    assert "tree" in repr(bufs) and "drafts" in bufs._repr_html_()


def test_buffers_refuse_a_tree_batch_without_tree_buffers_and_a_chain_batch_with_them():
    pool = StatePool(16, "sglang")
    rows = pool.alloc(3)
    tree_batch = Batch.target_verify(rows, [5, 6, 7], 4, tree=DraftTree.chain(3, 4))
    chain_batch = Batch.target_verify(rows, [5, 6, 7], 4)
    with pytest.raises(MetadataError, match="tree: the batch carries draft trees, and these buffers") as info:
        MetadataBuffers(pool, "target_verify", [4], 4).update(tree_batch)
    assert info.value.field == "tree"
    tree_bufs = MetadataBuffers(pool, "target_verify", [4], 4, tree=True)
    before = {n: t.clone() for n, t in tree_bufs.static[4].tensors().items()}
    with pytest.raises(MetadataError, match="tree: buffers built with tree=True") as info:
        tree_bufs.update(chain_batch)
    assert info.value.field == "tree"
    assert all(torch.equal(t, before[n]) for n, t in tree_bufs.static[4].tensors().items())  # nothing written
    tree_bufs.update(tree_batch)  # a chain, as a tree: fine
    for mode, tree, words in (("decode", True, "draft trees are a target_verify's"), ("target_verify", 1, "True or")):
        with pytest.raises(MetadataError, match=words) as info:
            MetadataBuffers(pool, mode, [4], 4 if mode == "target_verify" else 1, tree=tree)
        assert info.value.field == "tree"


# -- validate -----------------------------------------------------------------------------------------------
def test_validate_checks_live_rows_and_leaves_padded_rows_alone():
    pool, rows = _sglang_pool()
    tree = DraftTree.random(3, 6, 2, seed=2)
    meta = build_metadata(Batch.target_verify(rows, [5, 6, 7], 6, tree=tree), pool, bucket=4, buckets=[4])
    validate(meta, pool)
    padded = meta.clone()
    padded.retrieve_next_token[3] = torch.tensor([5, 5, -7, 2, 9, 0], dtype=torch.int32)  # garbage, padded row
    validate(padded, pool)
    corrupt = meta.clone()
    corrupt.retrieve_parent_token[1, 5] += 1
    with pytest.raises(MetadataError, match=r"retrieve_parent_token\[1\]: entry 5 = \d+, the row's links give") as info:
        validate(corrupt, pool)
    assert (info.value.field, info.value.row) == ("retrieve_parent_token", 1)
    broken = meta.clone()
    broken.retrieve_next_token[2] = torch.tensor([-1] * 6, dtype=torch.int32)
    with pytest.raises(MetadataError, match=r"retrieve_next_token\[2\]: node 1 is reached from no link") as info:
        validate(broken, pool)
    assert (info.value.field, info.value.row) == ("retrieve_next_token", 2)


# -- the explorer and the figure ----------------------------------------------------------------------------
def test_explorer_model_draws_sglangs_trees_and_says_vllm_has_none():
    from workbench.widgets.explorer_model import ExplorerModel, control_of

    m = ExplorerModel(profile="all", mode="target_verify", raw_batch_size=4, draft_tokens=6, topk=2, pool_size=64)
    st = m.state
    assert [x.profile.name for x in st.metas] == ["sglang", "sglang-ascend"]
    assert "vllm verifies chains only" in st.errors["topk"] and set(st.errors) == {"topk"}
    assert st.tree is not None and not st.tree.is_chain and st.tree.draft_tokens == 6
    for meta in st.metas:
        assert meta.retrieve_next_token[:4].tolist() == st.tree.next_token.tolist()
    assert st.accept_index is not None and st.accept_index.shape[0] == 4
    st.tree.last_accepted(st.accept_index, (st.accept_index >= 0).sum(1))  # root-first paths of the trees
    view = m.tree_view(2)
    assert view.tree is st.tree and view.row == 2 and "row 2 of 4: topk 2" in view.note
    assert "not a live row" in m.tree_view(4).note and m.tree_view(4).tree is None
    assert "must be an int" in m.tree_view(True).note
    chains = m.update(profile="vllm", topk=1)
    assert chains.ok and chains.tree is not None and chains.tree.is_chain
    assert chains.metas[0].retrieve_next_token is None  # a chain batch: no tree fields
    m.update(mode="decode")
    assert m.state.tree is None and "draft tree is a target_verify step's" in m.tree_view(0).note
    assert control_of("tree: profile 'vllm' has no draft trees") == control_of("topk = 0: ...") == "topk"


def test_draft_tree_figure_draws_nodes_edges_and_the_accepted_path():
    pytest.importorskip("plotly")
    from workbench.viz import draft_tree_figure
    from workbench.viz import tree as vt

    tree = DraftTree.from_parents([[-1, 0, 0, 1, 1, 2]])
    fig = draft_tree_figure(tree, 0, accept_index=tree.accept_index([4]))
    traces = {t.name: t for t in fig.data}
    assert tuple(traces) == vt.TREE_TRACES
    nodes = traces[vt.TREE_NODES]
    assert list(nodes.text) == ["0", "1", "2", "3", "4", "5"] and list(nodes.x) == [0, 1, 1, 2, 2, 2]
    assert list(nodes.y) == [1.25, 0.5, 2.0, 0.0, 1.0, 2.0]  # leaves 3, 4, 5 on lines 0..2, parents centred
    assert len([v for v in traces[vt.TREE_EDGES].x if v is None]) == 5  # one edge a node but the root
    assert list(traces[vt.ACCEPTED_NODES].x) == [0, 1, 2]  # 0 -> 1 -> 4
    assert "accepted 3 nodes, to node 4" in fig.layout.title.text and "3 leaves" in fig.layout.title.text
    with pytest.raises(MetadataError, match=r"accept_index\[0, 2\] = 3: not the next node"):
        draft_tree_figure(tree, 0, accept_index=[[0, 2, 3]])


def test_draft_tree_figure_of_metadata_reads_what_the_kernel_reads():
    pytest.importorskip("plotly")
    from workbench.viz import tree as vt

    pool, rows = _sglang_pool()
    bufs = MetadataBuffers(pool, "target_verify", [4], 4, tree=True)
    bufs.update(Batch.target_verify(rows, [5, 6, 7], 4, tree=DraftTree.from_parents([EXAMPLE] * 3)))
    meta = bufs.update(Batch.target_verify(rows[:1], [5], 4, tree=DraftTree.chain(1, 4)))
    assert vt.tree_row(meta, 0).parents == [-1, 0, 1, 2] and vt.tree_row(meta, 0).kind == "live"
    stale = vt.tree_row(meta, 2)
    assert stale.parents == EXAMPLE and stale.kind == "padded"  # the links row 2 was left with
    assert "padded" in vt.draft_tree_layout(meta, 2)["title_text"]
    fresh = vt.tree_row(meta, 3)
    assert fresh.parents == [-1, 0, 0, 0]  # zeros: every node under the root
    chain = build_metadata(Batch.target_verify(rows, [5, 6, 7], 3), pool, bucket=None)
    assert vt.tree_row(chain, 1).parents == [-1, 0, 1] and vt.tree_row(chain, 1).kind == "chain"
    decode = build_metadata(Batch.decode(rows, [5, 6, 7]), pool, bucket=None)
    with pytest.raises(MetadataError, match="a decode step drafts no tokens"):
        vt.tree_row(decode, 0)
    garbage = meta.clone()
    garbage.retrieve_parent_token[1] = torch.tensor([0, 2, 0, 0], dtype=torch.int32)
    with pytest.raises(MetadataError, match=r"retrieve_parent_token\[1\]: entry 1 = 2 is no earlier node"):
        vt.tree_row(garbage, 1)


def test_explorer_view_shows_the_tree_of_the_chosen_row_in_verify_only():
    pytest.importorskip("ipywidgets")
    from workbench.widgets import MetadataExplorer

    e = MetadataExplorer(profile="sglang", mode="target_verify", raw_batch_size=4, draft_tokens=5, topk=2)
    fig = e.tree_fig
    assert e.tree_box.layout.display is None and e.tree_row.max == 3
    e.tree_row.value = 3
    assert e.tree_fig is fig and "Draft tree of row 3" in fig.layout.title.text and "row 3 of 4" in e.tree_note.value
    nodes = next(t for t in fig.data if t.name.startswith("draft node"))
    assert list(nodes.x) == e.model.state.tree.depth[3].tolist()  # each node at its depth
    e.controls["raw_batch_size"].value = 2
    assert e.tree_row.max == 1 and e.tree_row.value == 1 and "row 1" in fig.layout.title.text
    e.controls["mode"].value = "decode"
    assert e.tree_box.layout.display == "none"
