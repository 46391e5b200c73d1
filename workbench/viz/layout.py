"""A state slot's layout as a figure: which element a reader takes when it reads a slot in one layout that
was written in the other.

A gated-delta-rule state slot holds ``K * V`` numbers per value head. K-first (``[K, V]``, the workbench's
and fla's default) keeps element ``(k, v)`` at offset ``k * V + v``; V-first (``[V, K]``, sglang's and vLLM's
pools) at ``v * K + k``. A reader that assumes the wrong one takes, at ``(k, v)``, the element the writer put
at that offset: :func:`layout_reads` computes it, :func:`state_layout_map` draws it. At ``K == V`` the shapes
agree, so nothing refuses the read, and every off-diagonal element is the transposed one; at ``K != V`` most
elements come from another row and column altogether.

Data in (two sizes, two layout names), ``go.Figure`` out.

    >>> layout_reads(2, 3, written="v_first", read="k_first")[0]
    [(0, 0), (1, 0), (0, 1)]
"""

from __future__ import annotations

from typing import Any

from workbench.errors import MetadataError
from workbench.extras import require
from workbench.viz.palette import GREEN, ORANGE, VERMILLION, category_heatmap

LAYOUTS = ("k_first", "v_first")
"""The two layouts of a recurrent state slot: ``[K, V]`` and ``[V, K]`` per value head."""

RIGHT, TRANSPOSED, ELSEWHERE = 0, 1, 2
"""Cell codes: the reader takes its own element, the transposed one ``(v, k)``, or another one."""


def _offset(k: int, v: int, K: int, V: int, layout: str) -> int:
    return k * V + v if layout == "k_first" else v * K + k


def _element(offset: int, K: int, V: int, layout: str) -> tuple[int, int]:
    if layout == "k_first":
        return offset // V, offset % V
    return offset % K, offset // K


def _check(K: int, V: int, written: str, read: str) -> None:
    for name, value in (("K", K), ("V", V)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 256:
            raise MetadataError(f"{name}={value!r}: must be an int in [1, 256]", field=name)
    for name, layout in (("written", written), ("read", read)):
        if layout not in LAYOUTS:
            raise MetadataError(f"{name}={layout!r}: must be one of {LAYOUTS}", field=name)


def layout_reads(K: int, V: int, *, written: str = "v_first", read: str = "k_first") -> list[list[tuple[int, int]]]:
    """For each position ``(k, v)`` a reader in layout ``read`` asks for (``[K][V]``), the ``(k', v')`` the
    writer put at that offset in layout ``written``. Equal layouts: every position is its own element."""
    _check(K, V, written, read)
    return [[_element(_offset(k, v, K, V, read), K, V, written) for v in range(V)] for k in range(K)]


def layout_codes(K: int, V: int, *, written: str = "v_first", read: str = "k_first") -> list[list[int]]:
    """:data:`RIGHT`, :data:`TRANSPOSED` or :data:`ELSEWHERE` for each position ``[K][V]`` of the read."""
    out = []
    for k, row in enumerate(layout_reads(K, V, written=written, read=read)):
        out.append(
            [RIGHT if got == (k, v) else TRANSPOSED if got == (v, k) else ELSEWHERE for v, got in enumerate(row)]
        )
    return out


def state_layout_map(K: int, V: int, *, written: str = "v_first", read: str = "k_first") -> Any:
    """One panel per value head's slot: the ``K x V`` positions a ``read``-layout reader takes, each coloured by
    what it gets from a slot written ``written`` (green its own element, orange the transposed one, vermillion
    another), the hover naming the element and the offset."""
    go = require("plotly.graph_objects", None, "workbench.viz figures")
    reads = layout_reads(K, V, written=written, read=read)
    codes = layout_codes(K, V, written=written, read=read)
    words = [
        [
            f"read s[k={k}, v={v}] at offset {_offset(k, v, K, V, read)}: written there as s[k={got[0]}, v={got[1]}]"
            for v, got in enumerate(row)
        ]
        for k, row in enumerate(reads)
    ]
    wrong = sum(c != RIGHT for row in codes for c in row)
    heat = category_heatmap(
        "read", codes, x=list(range(V)), y=list(range(K)), colours=[GREEN, ORANGE, VERMILLION], words=words
    )
    fig = go.Figure(heat)
    fig.update_layout(
        title=f"A {read} read of a {written} slot, K={K}, V={V}: {wrong} of {K * V} elements are not the ones asked",
        xaxis_title="v (value channel)",
        yaxis_title="k (key channel)",
        yaxis_autorange="reversed",
        height=max(260, 28 * K + 140),
        margin={"l": 70, "r": 20, "t": 60, "b": 60},
    )
    return fig


__all__ = ["ELSEWHERE", "LAYOUTS", "RIGHT", "TRANSPOSED", "layout_codes", "layout_reads", "state_layout_map"]
