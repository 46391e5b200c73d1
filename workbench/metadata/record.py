"""The per-step metadata record (:class:`Metadata`) and its views: rows, table, facts, repr, HTML.

For ``r`` live requests padded to bucket ``bs`` (``p = bs - r`` padded rows at the tail):

- ``state_indices`` int32 ``[bs]`` (vLLM verify: ``[bs, D]``): live rows ``mapping[req_pool_indices[i]]``,
  padded rows the profile's sentinel.
- ``query_start_loc`` int32 ``[bs+1]``: decode ``[0,1,..,r, r,..,r]``, verify ``[0,D,..,rD, rD,..,rD]``,
  extend the cumulative extend lengths; padded rows are zero-length.
- ``seq_lens`` int32 ``[bs]`` padded with the profile's fill value; ``req_pool_indices`` int64 padded with the
  reserved request row (0).
- a tree verify (sglang, ``topk > 1``): ``retrieve_next_token``, ``retrieve_next_sibling`` and
  ``retrieve_parent_token``, int32 ``[bs, D]`` (:mod:`workbench.metadata.tree`); padded rows are zeros in an
  eager build and stale in the graph buffers, their parents derived from whatever links they hold.

What a padded row holds in each field is written once, in :mod:`workbench.metadata.padding`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import torch

from workbench import html
from workbench.metadata.tree import TREE_FIELDS
from workbench.profiles import Profile
from workbench.tables import format_table

GRAPH_MODES = ("decode", "target_verify")
"""The forward modes a graph is captured for (extend runs eagerly; idle runs in either graph)."""


RowFate = Literal["live", "skipped", "processed"]
ROW_FATES: tuple[RowFate, ...] = ("live", "skipped", "processed")
"""``live``: a request's row; ``skipped``: a padded row the kernels neither read nor write; ``processed``:
a padded row run on the dummy slot (sglang on Ascend, whose kernels skip nothing)."""


def fate(meta: Metadata, row: int, first_index: int) -> RowFate:
    """What the kernels do with ``row`` whose (first) state index is ``first_index``: the profile's skip rule
    (``kernels.conventions.Convention.skips``) applied to a padded row."""
    if row < meta.raw_batch_size:
        return "live"
    return "skipped" if meta.profile.convention.skips(first_index) else "processed"


@dataclass
class Metadata:
    """Everything a linear-attention kernel reads about one (padded) step.

    Tensors are on the pool's device. ``raw_batch_size`` live rows come first; the rest is padding.
    ``bucket`` is the captured batch size used, or None when the step is not padded for a graph;
    ``eager_reason`` says why a step that asked for a bucket runs eagerly.

    Ascend's verify also carries (``NpuMetadataBackend`` fills it; None elsewhere)
    ``intermediate_token_indices``, int32 ``[bs * D]``, each verify token's row in the intermediate buffer
    (sglang-ascend's ``gdn_token_indices``).

    A verify of draft trees (``Batch.tree``, profiles with ``tree_verify``) carries int32 ``[bs, D]``
    ``retrieve_next_token`` (each node's first child, -1: a leaf), ``retrieve_next_sibling`` (its next
    sibling, -1: none) and ``retrieve_parent_token`` (derived from the two by
    :func:`workbench.metadata.tree.parents_from_links`, as sglang's conv kernel does); None for chains.
    Live rows hold the batch's trees. Padded rows are not the padding rule's: an eager build leaves them as a
    fresh buffer is (zeros), the graph buffers leave them stale, as sglang does.

    A Metadata returned by ``MetadataBuffers.update`` is the bucket's static buffer: the next update of
    that bucket rewrites it in place. :meth:`clone` keeps a copy.
    """

    profile: Profile
    forward_mode: str
    raw_batch_size: int
    draft_tokens: int
    state_indices: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    req_pool_indices: torch.Tensor
    has_initial_state: torch.Tensor
    extend_lens: torch.Tensor | None = None
    num_accepted_tokens: torch.Tensor | None = None
    intermediate_state_indices: torch.Tensor | None = None
    bucket: int | None = None
    eager_reason: str | None = None
    intermediate_token_indices: torch.Tensor | None = None
    retrieve_next_token: torch.Tensor | None = None
    retrieve_next_sibling: torch.Tensor | None = None
    retrieve_parent_token: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.query_start_loc.numel() - 1

    @property
    def num_padding(self) -> int:
        return self.batch_size - self.raw_batch_size

    @property
    def num_tokens(self) -> int:
        """Live tokens, ``query_start_loc[-1]`` (a host read)."""
        return int(self.query_start_loc[-1])

    def tensors(self) -> dict[str, torch.Tensor]:
        """The metadata tensors by name (those that exist for this mode and profile)."""
        names = (
            "state_indices",
            "query_start_loc",
            "seq_lens",
            "req_pool_indices",
            "has_initial_state",
            "extend_lens",
            "num_accepted_tokens",
            "intermediate_state_indices",
            "intermediate_token_indices",
            *TREE_FIELDS,
        )
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def clone(self) -> Metadata:
        """A copy with its own tensors: what a step's metadata was, kept past the next in-place update."""
        copies = {
            f.name: getattr(self, f.name).clone()
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **copies)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per batch row (host copies), for tables and figures."""
        qsl = self.query_start_loc.tolist()
        idx = self.state_indices.tolist()
        sl = self.seq_lens.tolist()
        rpi = self.req_pool_indices.tolist()
        init = self.has_initial_state.tolist()
        acc = None if self.num_accepted_tokens is None else self.num_accepted_tokens.tolist()
        tree = {n: t.tolist() for n in TREE_FIELDS if (t := getattr(self, n)) is not None}
        out = []
        for i in range(self.batch_size):
            row = {
                "row": i,
                "kind": "live" if i < self.raw_batch_size else "pad",
                "kernel": fate(self, i, idx[i][0] if isinstance(idx[i], list) else idx[i]),
                "req_pool_index": rpi[i],
                "state_index": idx[i],
                "seq_len": sl[i],
                "qsl_start": qsl[i],
                "qsl_end": qsl[i + 1],
                "num_tokens": qsl[i + 1] - qsl[i],
                "has_initial_state": bool(init[i]),
            }
            if acc is not None:
                row["num_accepted_tokens"] = acc[i]
            for name, values in tree.items():
                row[name] = values[i]
            out.append(row)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary and tensors."""
        return {
            "profile": self.profile.name,
            "forward_mode": self.forward_mode,
            "raw_batch_size": self.raw_batch_size,
            "batch_size": self.batch_size,
            "num_padding": self.num_padding,
            "draft_tokens": self.draft_tokens,
            "bucket": self.bucket,
            "eager_reason": self.eager_reason,
            "sentinel": self.profile.sentinel,
            "kernel_guard": self.profile.guard,
            **{name: t.tolist() for name, t in self.tensors().items()},
        }

    def facts(self) -> dict[str, object]:
        """The batch facts: profile, mode, raw and padded batch size, bucket, sentinel, guard (and D in verify)."""
        prof = self.profile
        out: dict[str, object] = {
            "profile": prof.name,
            "mode": self.forward_mode,
            "raw_bs": self.raw_batch_size,
            "bs": self.batch_size,
            "padding": self.num_padding,
            "bucket": self.bucket,
            "sentinel": prof.sentinel,
            "guard": prof.guard,
        }
        if self.forward_mode == "target_verify":
            out["D"] = self.draft_tokens
            if self.retrieve_parent_token is not None:
                out["drafts"] = "tree"
        return out

    def facts_line(self) -> str:
        """:meth:`facts` on one line, as the text table's header shows them."""
        return "  ".join(f"{k}: {v}" if k == "guard" else f"{k}={v}" for k, v in self.facts().items())

    def _columns(self) -> list[str]:
        """The per-row columns of the text and HTML tables (``rows()`` keys)."""
        cols = ["row", "kind", "kernel", "req_pool_index", "state_index", "seq_len", "qsl_start", "qsl_end"]
        cols.append("num_tokens")
        cols += ["num_accepted_tokens"] if self.num_accepted_tokens is not None else []
        return cols + [n for n in TREE_FIELDS if getattr(self, n) is not None]

    def table(self) -> str:
        """A readable text table: a header with the batch facts, then one line per row (padded rows ``pad``)."""
        head = self.facts_line()
        if self.eager_reason:
            head += f"\nnote: {self.eager_reason}"
        cols = self._columns()
        qsl = "query_start_loc = " + str(self.query_start_loc.tolist())
        return f"{head}\n{format_table(self.rows(), cols)}\n{qsl}"

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        # host reads: a notebook/debugging view, never on the replay hot path
        head = f"{self.profile.name} {self.forward_mode}"
        if self.forward_mode == "target_verify":
            head += f" D={self.draft_tokens}" + (" tree" if self.retrieve_parent_token is not None else "")
        size = f"raw_bs={self.raw_batch_size}"
        size += f" -> bs={self.batch_size} (bucket)" if self.bucket is not None else f", bs={self.batch_size}"
        if self.state_indices.is_meta:  # shapes only: a "meta" tensor holds no values
            return f"Metadata({head}, {size}, on the meta device)"
        idx = html.short_list(self.state_indices.tolist())
        qsl = html.short_list(self.query_start_loc.tolist())
        return f"Metadata({head}, {size}, state_indices={idx}, query_start_loc={qsl})"

    def _repr_html_(self) -> str:
        head = self.facts()
        cols = self._columns()
        parts = [html.facts(head)]
        if self.eager_reason:
            parts.append(html.note(f"note: {self.eager_reason}"))
        if self.state_indices.is_meta:
            return html.block(*parts, html.note("on the meta device: shapes only, no values"), title="Metadata")
        rows = self.rows()
        cells = [
            [html.Cell(r[c], "fail") if c == "kernel" and r[c] == "processed" else r[c] for c in cols] for r in rows
        ]
        parts.append(html.table(cols, cells, row_kinds=[r["kind"] for r in rows], max_rows=40, left=["kind", "kernel"]))
        padded = [r["kernel"] for r in rows[self.raw_batch_size :]]
        if padded:  # a profile pads with one sentinel, so its padded rows share one fate
            what = "processed on the dummy slot" if "processed" in padded else "skipped by the kernel"
            first, last = self.raw_batch_size, self.batch_size - 1
            span = f"row {first}" if first == last else f"rows {first}-{last}"
            parts.append(html.note(f"padded {span}: {what} (guard: {self.profile.guard})", fail="processed" in padded))
            if self.retrieve_parent_token is not None:
                parts.append(html.note(f"retrieve_* of padded {span}: links left as they were (zeros when fresh)"))
        parts.append(html.note("query_start_loc = " + html.short_list(self.query_start_loc.tolist(), limit=40)))
        return html.block(*parts, title="Metadata")


def tokens_per_row(mode: str, draft_tokens: int) -> int:
    """Tokens each batch row carries in a graph mode (``draft_tokens`` in target_verify, else 1)."""
    return draft_tokens if mode == "target_verify" else 1
