"""A verify row's draft tree: nodes by depth, parent edges, and the accepted path (sglang, ``topk > 1``).

Pure functions, data in, ``go.Figure`` out (plotly through ``workbench.extras``). The tree comes from a
:class:`workbench.metadata.DraftTree` (what a batch drafts) or from a step's :class:`workbench.metadata.Metadata`
(what the kernel reads: ``retrieve_parent_token``, a padded row's stale links included; a verify without tree
fields is drawn as the chain the kernel walks). The figure has a fixed set of traces (``TREE_TRACES``), so a
widget updates it in place from :func:`draft_tree_traces` and :func:`draft_tree_layout`.

Layout: node ``t`` at x = its depth, the leaves one line each in depth-first order (children ascending), an
inner node between its first and last child. Colours (``viz.palette``): a live row's nodes blue, a padded
row's grey, the accepted path orange.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.errors import MetadataError
from workbench.extras import require
from workbench.limits import check_int
from workbench.metadata import DraftTree, Metadata
from workbench.viz.palette import BLUE, GREY, ORANGE

if TYPE_CHECKING:
    import plotly.graph_objects as go
    import torch

TREE_EDGES = "parent edge"
TREE_NODES = "draft node (its id)"
ACCEPTED_EDGES = "accepted path"
ACCEPTED_NODES = "accepted node"  # no legend entry of its own: the accepted path's says it
# drawn in this order: the accepted path's edges under the nodes, so a node's id stays readable over them
TREE_TRACES = (TREE_EDGES, ACCEPTED_EDGES, TREE_NODES, ACCEPTED_NODES)
MAX_HEIGHT = 720  # px: past this the leaves' lines get closer, the figure no taller


@dataclass(frozen=True)
class TreeRow:
    """One row's tree as drawn: ``parents`` (``parents[0] = -1``), ``kind`` ("live", "padded" or "chain": a
    verify without tree fields), the batch ``row`` and ``D``."""

    parents: list[int]
    kind: str
    row: int

    @property
    def draft_tokens(self) -> int:
        return len(self.parents)


def tree_row(tree_or_meta: DraftTree | Metadata, row: int) -> TreeRow:
    """Row ``row``'s tree from a :class:`DraftTree` or from a step's metadata (see the module docstring)."""
    if isinstance(tree_or_meta, DraftTree):
        if tree_or_meta.num_requests == 0:
            raise MetadataError("row: the DraftTree is for no request", field="row")
        b = check_int("row", row, 0, tree_or_meta.num_requests - 1)
        return TreeRow(tree_or_meta.parents[b].tolist(), "live", b)
    if not isinstance(tree_or_meta, Metadata):
        raise MetadataError(
            f"tree_or_meta: expected a DraftTree or a Metadata, got {type(tree_or_meta).__name__}", field="tree_or_meta"
        )
    meta = tree_or_meta
    if meta.batch_size == 0:
        raise MetadataError("row: the step has no batch row", field="row")
    b = check_int("row", row, 0, meta.batch_size - 1)
    if meta.retrieve_parent_token is None:
        if meta.forward_mode != "target_verify":
            raise MetadataError(f"forward_mode: a {meta.forward_mode} step drafts no tokens", field="forward_mode")
        return TreeRow(list(range(-1, meta.draft_tokens - 1)), "chain", b)
    parents = meta.retrieve_parent_token[b].tolist()
    parents[0] = -1  # the kernel never writes the root's entry
    for t in range(1, len(parents)):
        if not 0 <= parents[t] < t:  # garbage links (never what a step writes): no tree to draw
            raise MetadataError(
                f"retrieve_parent_token[{b}]: entry {t} = {parents[t]} is no earlier node; not a tree",
                field="retrieve_parent_token",
                row=b,
            )
    return TreeRow(parents, "live" if b < meta.raw_batch_size else "padded", b)


def _positions(parents: list[int]) -> tuple[list[int], list[float], list[list[int]]]:
    """(depth, line, children) of each node: leaves on lines 0, 1, ... depth first, inner nodes centred."""
    d = len(parents)
    children: list[list[int]] = [[] for _ in range(d)]
    depth = [0] * d
    for t in range(1, d):
        children[parents[t]].append(t)
        depth[t] = depth[parents[t]] + 1
    line = [0.0] * d
    leaves = 0
    for t in _post_order(children):
        if children[t]:
            line[t] = (line[children[t][0]] + line[children[t][-1]]) / 2
        else:
            line[t], leaves = float(leaves), leaves + 1
    return depth, line, children


def _post_order(children: list[list[int]]) -> list[int]:
    out: list[int] = []
    stack = [(0, False)]
    while stack:  # iterative: a chain of D nodes is D deep
        t, done = stack.pop()
        if done:
            out.append(t)
            continue
        stack.append((t, True))
        stack.extend((c, False) for c in reversed(children[t]))
    return out


def accepted_path(tr: TreeRow, accept_index: torch.Tensor | Sequence[Sequence[int]] | None) -> list[int]:
    """Row ``tr.row``'s accepted nodes (local ids) from sglang's ``accept_index`` (global ids ``b * D + node``,
    -1 after the path); ``[]`` without one or for a row it does not cover. Checked: a root-first path."""
    if accept_index is None:
        return []
    rows = accept_index.tolist() if hasattr(accept_index, "tolist") else [list(r) for r in accept_index]
    if tr.row >= len(rows):
        return []
    d = tr.draft_tokens
    path: list[int] = []
    for k, v in enumerate(rows[tr.row]):
        if v == -1:
            break
        node = v - tr.row * d
        if not 0 <= node < d or (k == 0) != (node == 0) or (k and tr.parents[node] != path[-1]):
            raise MetadataError(
                f"accept_index[{tr.row}, {k}] = {v}: not the next node of a root-first path of row {tr.row} "
                f"(global ids {tr.row * d}..{tr.row * d + d - 1})",
                field="accept_index",
                row=tr.row,
            )
        path.append(node)
    return path


def draft_tree_traces(
    tree_or_meta: DraftTree | Metadata, row: int = 0, *, accept_index: Any = None
) -> dict[str, dict[str, list]]:
    """Per trace of :func:`draft_tree_figure` (by legend name): ``x`` (depth), ``y`` (line), ``text`` (node id
    on the nodes), ``customdata`` (hover words) and, for the nodes, ``color``. Edges are line segments separated
    by None."""
    tr = tree_row(tree_or_meta, row)
    depth, line, _ = _positions(tr.parents)
    path = accepted_path(tr, accept_index)
    out: dict[str, dict[str, list]] = {n: {"x": [], "y": [], "text": [], "customdata": []} for n in TREE_TRACES}
    colour = GREY if tr.kind == "padded" else BLUE
    for t in range(1, tr.draft_tokens):
        for name in (TREE_EDGES, *([ACCEPTED_EDGES] if t in path else [])):
            p = tr.parents[t]
            out[name]["x"] += [depth[p], depth[t], None]
            out[name]["y"] += [line[p], line[t], None]
    chain = [0]
    for t in range(tr.draft_tokens):
        if t:
            chain = _path_to(tr.parents, t)
        parent = "none (the verified root)" if t == 0 else str(tr.parents[t])
        words = (
            f"node {t} (global id {tr.row * tr.draft_tokens + t}): depth {depth[t]}, parent {parent}, "
            f"path {chain}" + (", accepted" if t in path else "")
        )
        nodes = out[TREE_NODES]
        nodes["x"].append(depth[t])
        nodes["y"].append(line[t])
        nodes["text"].append(str(t))
        nodes["customdata"].append(words)
        if t in path:
            acc = out[ACCEPTED_NODES]
            acc["x"].append(depth[t])
            acc["y"].append(line[t])
            acc["text"].append("")
            acc["customdata"].append(words)
    out[TREE_NODES]["color"] = [colour] * tr.draft_tokens
    return out


def _path_to(parents: list[int], t: int) -> list[int]:
    out = [t]
    while out[-1] != 0:
        out.append(parents[out[-1]])
    return out[::-1]


def draft_tree_layout(tree_or_meta: DraftTree | Metadata, row: int = 0, *, accept_index: Any = None) -> dict[str, Any]:
    """The part of :func:`draft_tree_figure`'s layout that follows the data, as ``fig.update_layout`` keywords:
    ``title_text``, ``height`` (px, 28 a leaf, 320 to ``MAX_HEIGHT``), ``xaxis_range`` and ``yaxis_range``."""
    tr = tree_row(tree_or_meta, row)
    depth, line, children = _positions(tr.parents)
    path = accepted_path(tr, accept_index)
    leaves = sum(1 for c in children if not c)
    ends = f"{leaves} leaf" if leaves == 1 else f"{leaves} leaves"
    title = f"Draft tree of row {tr.row}: D={tr.draft_tokens}, depth {max(depth)}, {ends}"
    # a second line, so the title fits a narrow notebook: what the row is, and its accepted path in short
    second = {"live": "", "padded": "a padded row: the links it was left with", "chain": "a chain: no tree fields"}
    more = [second[tr.kind]] if second[tr.kind] else []
    if path:
        more.append(f"accepted {len(path)} nodes, to node {path[-1]} (orange)")
    if more:
        title += "<br>" + "; ".join(more)
    return {
        "title_text": title,
        "height": min(MAX_HEIGHT, max(320, 190 + 28 * leaves)),
        "xaxis_range": [-0.5, max(depth) + 0.5],
        "yaxis_range": [max(line) + 0.6, -0.6],  # first leaf on top
    }


def draft_tree_figure(tree_or_meta: DraftTree | Metadata, row: int = 0, *, accept_index: Any = None) -> go.Figure:
    """Row ``row``'s draft tree: each node at its depth, labelled with its id, an edge to its parent; with
    ``accept_index`` (sglang's, global node ids ``b * D + node``, -1 after the path) the accepted path orange.

    ``tree_or_meta``: a :class:`workbench.metadata.DraftTree` (row = request) or a step's
    :class:`workbench.metadata.Metadata` (row = batch row; a padded row's tree is the one its stale links give).
    """
    go = require("plotly.graph_objects", None, "workbench.viz figures")

    data = draft_tree_traces(tree_or_meta, row, accept_index=accept_index)
    fig = go.Figure()
    style: dict[str, dict[str, Any]] = {
        TREE_EDGES: dict(mode="lines", line=dict(color=GREY, width=2)),
        TREE_NODES: dict(
            mode="markers+text",
            marker=dict(size=22, color=data[TREE_NODES]["color"], line=dict(color="white", width=1)),
            textfont=dict(color="white"),
            textposition="middle center",
        ),
        ACCEPTED_EDGES: dict(mode="lines", line=dict(color=ORANGE, width=5)),
        ACCEPTED_NODES: dict(
            mode="markers",
            marker=dict(size=30, color="rgba(0,0,0,0)", line=dict(color=ORANGE, width=3)),
            showlegend=False,
        ),
    }
    for name in TREE_TRACES:
        d = data[name]
        hover = (
            {"hovertemplate": "%{customdata}<extra></extra>"}
            if name in (TREE_NODES, ACCEPTED_NODES)
            else {"hoverinfo": "skip"}  # an edge says nothing its two nodes do not
        )
        fig.add_trace(
            go.Scatter(
                name=name, x=d["x"], y=d["y"], text=d["text"], customdata=d["customdata"], **hover, **style[name]
            )
        )
    # the legend at the figure's foot (yref "container" reserves its rows), as the metadata figures
    fig.update_layout(
        margin=dict(l=30, r=20, t=80, b=10),  # room for a title of two lines
        legend=dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left"),
        plot_bgcolor="white",
    )
    fig.update_xaxes(title_text="depth (draft steps after the verified root)", dtick=1, showgrid=True, gridcolor="#eee")
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False)
    fig.update_layout(**draft_tree_layout(tree_or_meta, row, accept_index=accept_index))
    return fig
