"""Graph mode: one static set of metadata tensors per captured bucket, rewritten in place every step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from workbench import html
from workbench.batch import Batch
from workbench.buckets import above_largest, check_buckets, choose_bucket, resolve_bucket
from workbench.errors import MetadataError
from workbench.limits import INT32_MAX
from workbench.metadata.padding import (
    PaddedRow,
    RowViews,
    check_tree,
    live_index_table,
    row_views,
    write_query_start_loc,
    write_rows,
    write_tree,
)
from workbench.metadata.record import GRAPH_MODES, Metadata
from workbench.metadata.sizing import check_padded_memory, check_tree_memory, default_buckets
from workbench.metadata.tree import DraftTree
from workbench.pool import StatePool


def _short_buckets(buckets: Sequence[int]) -> str:
    """``[1, 2, 4, ..., 256]``: the first three buckets and the last (all of them up to four)."""
    shown = list(buckets) if len(buckets) <= 4 else [*buckets[:3], "...", buckets[-1]]
    return "[" + ", ".join(map(str, shown)) + "]"


def _check_graph_bucket(bucket: object) -> None:
    # graph buffers are always padded to a captured bucket: None ("no padding" in build_metadata) has no buffer
    if bucket == "auto" or (isinstance(bucket, int) and not isinstance(bucket, bool)):
        return
    raise MetadataError(
        f"bucket must be 'auto' or a captured bucket (an int), got {bucket!r}: graph buffers are always padded "
        "(build_metadata(..., bucket=None) builds an unpadded step)",
        field="bucket",
    )


def _check_tree_option(tree: object, mode: str, pool: StatePool) -> None:
    if not isinstance(tree, bool):
        raise MetadataError(f"tree must be True or False, got {tree!r}", field="tree")
    if tree and mode != "target_verify":
        raise MetadataError(f"tree: draft trees are a target_verify's, these buffers are for {mode!r}", field="tree")
    if tree and not pool.profile.tree_verify:
        raise MetadataError(
            f"tree: profile {pool.profile.name!r} has no draft trees (it verifies chains only)", field="tree"
        )


class MetadataBuffers:
    """One static set of metadata tensors per captured bucket, updated in place each step.

    A graph records the addresses of its bucket's tensors at capture, so :meth:`update` writes a batch's
    metadata into them with tensor ops only: no host sync, no loop over requests, no allocation. Padding
    is derived from ``batch.raw_batch_size`` (host shape information), never by counting fill values, and
    written by the same code as the eager build (:mod:`workbench.metadata.padding`).

    Args:
        pool: the state pool (its profile and mapping, its device).
        mode: "decode" or "target_verify" (idle batches run in either).
        buckets: captured batch sizes (default: the profile's list for ``pool.capacity``).
        draft_tokens: D for target_verify (1 for decode).
        tree: target_verify of draft trees (sglang's backend setting ``topk > 1``): three more int32 ``[bs, D]``
            static buffers per bucket, allocated zeros, ``retrieve_next_token``, ``retrieve_next_sibling`` and
            ``retrieve_parent_token``. Every batch then carries a tree (``Batch.tree``; a chain is
            ``DraftTree.chain``); without it a batch with a tree is refused. Only a profile with ``tree_verify``.
    """

    def __init__(
        self,
        pool: StatePool,
        mode: str = "decode",
        buckets: Sequence[int] | None = None,
        draft_tokens: int = 1,
        *,
        tree: bool = False,
    ) -> None:
        if not isinstance(pool, StatePool):
            raise MetadataError(f"pool must be a workbench.StatePool, got {type(pool).__name__}", field="pool")
        if mode not in GRAPH_MODES:
            raise MetadataError(
                f"mode: graphs are captured for {GRAPH_MODES}, got {mode!r} (extend runs eagerly)", field="mode"
            )
        if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or draft_tokens < 1:
            raise MetadataError(f"draft_tokens must be an int >= 1, got {draft_tokens!r}", field="draft_tokens")
        if mode == "decode" and draft_tokens != 1:
            raise MetadataError(
                f"draft_tokens: decode has 1 token per request, got {draft_tokens}", field="draft_tokens"
            )
        _check_tree_option(tree, mode, pool)
        self.pool = pool
        self.mode = mode
        self.draft_tokens = draft_tokens
        self.tree = tree
        self.buckets = default_buckets(pool, mode == "target_verify") if buckets is None else check_buckets(buckets)
        check_padded_memory(f"buckets={_short_buckets(self.buckets)}", sum(self.buckets) + self.buckets[-1], pool)
        if tree:
            check_tree_memory(f"buckets={_short_buckets(self.buckets)}", sum(self.buckets), draft_tokens, pool)
        if (self.buckets[-1] + 1) * draft_tokens > INT32_MAX:
            raise MetadataError(
                f"draft_tokens={draft_tokens}: bucket {self.buckets[-1]} x {draft_tokens} tokens does not fit "
                f"int32 query_start_loc (max {INT32_MAX:,})",
                field="draft_tokens",
            )
        self._pad = PaddedRow.of(pool.profile)
        self._table = live_index_table(pool, mode, draft_tokens)
        # token offsets of a full bucket, 0, D, 2D, ...: clamped at the live total, they are query_start_loc
        self._qsl_steps = torch.arange(
            0, (self.buckets[-1] + 1) * draft_tokens, draft_tokens, dtype=torch.int32, device=pool.device
        )
        self._views: dict[tuple[int, int], RowViews] = {}
        self.static: dict[int, Metadata] = {}
        for bs in self.buckets:
            self.static[bs] = self._allocate(bs)
            self.reset_for_capture(bs)

    def _allocate(self, bs: int) -> Metadata:
        prof, dev, d = self.pool.profile, self.pool.device, self.draft_tokens
        meta = Metadata(
            profile=prof,
            forward_mode=self.mode,
            raw_batch_size=bs,
            draft_tokens=d,
            state_indices=torch.empty((bs, *self._table.shape[1:]), dtype=torch.int32, device=dev),
            query_start_loc=torch.empty(bs + 1, dtype=torch.int32, device=dev),
            seq_lens=torch.empty(bs, dtype=torch.int32, device=dev),
            req_pool_indices=torch.empty(bs, dtype=torch.int64, device=dev),
            has_initial_state=torch.empty(bs, dtype=torch.bool, device=dev),
            bucket=bs,
        )
        if self.mode == "target_verify":
            if prof.num_accepted_fill is not None:
                meta.num_accepted_tokens = torch.empty(bs, dtype=torch.int32, device=dev)
            if prof.verify_intermediate_by_row:
                meta.intermediate_state_indices = torch.arange(bs, dtype=torch.int32, device=dev)
        if self.tree:  # zeros, as sglang allocates them; a row keeps its links until a step overwrites them
            meta.retrieve_next_token = torch.zeros((bs, d), dtype=torch.int32, device=dev)
            meta.retrieve_next_sibling = torch.zeros((bs, d), dtype=torch.int32, device=dev)
            meta.retrieve_parent_token = torch.zeros((bs, d), dtype=torch.int32, device=dev)
        return meta

    def bucket_for(self, raw_bs: int) -> int | None:
        """The bucket a batch of ``raw_bs`` pads to (bisect-left), or None: above the largest, run eagerly."""
        return choose_bucket(raw_bs, self.buckets)

    def update(self, batch: Batch, bucket: int | Literal["auto"] = "auto") -> Metadata:
        """Write ``batch``'s metadata into its bucket's static tensors; return that bucket's Metadata.

        ``bucket``: "auto" (the smallest captured bucket that holds the batch) or a captured bucket. Graph
        buffers are always padded, so None (``build_metadata``'s "no padding") is refused.

        The returned object is the bucket's static buffer, by design: a captured graph reads these very
        tensors, so every call for the same bucket returns the same object and overwrites it in place
        (tensors and the host fields ``raw_batch_size``, ``forward_mode``, ``draft_tokens`` alike). A
        Metadata held from an earlier step therefore shows the latest step; call ``.clone()`` on it to
        keep a step's values. The slices of a (bucket, raw_bs) pair are cached the first time that pair
        is seen (Python view objects over the static storage; no tensor memory is allocated).

        Tree buffers (``tree=True``): the live rows' links ``[:raw_bs]`` are copied in from ``batch.tree`` and
        the padded rows keep the links of whichever earlier step last wrote them (sglang never clears them);
        then ``retrieve_parent_token`` of every row is derived from the buffers' links in place (one step per
        node, with a few small temporaries). So a padded row's parents are an old tree's, or a star of
        zeros before any step reached that row: harmless where the kernel skips the row, and worth knowing
        where it processes it (sglang on Ascend).

        >>> from workbench import Batch, StatePool
        >>> pool = StatePool(8)
        >>> bufs = MetadataBuffers(pool, "decode", buckets=[4])
        >>> first = bufs.update(Batch.decode(pool.alloc(2), [5, 6]))
        >>> kept = first.clone()
        >>> second = bufs.update(Batch.decode(pool.alloc(3), [7, 8, 9]))
        >>> second is first, first.raw_batch_size, kept.raw_batch_size
        (True, 3, 2)
        """
        _check_graph_bucket(bucket)
        tree = self._check_batch(batch)
        r = batch.raw_batch_size
        bs = resolve_bucket(r, self.buckets, bucket)
        if bs is None:
            raise MetadataError(f"{above_largest(r, self.buckets)}: run it eagerly", field="bucket")
        self._check_request_rows(batch)
        m = self.static[bs]
        v = self._views.get((bs, r)) or self._make_views(bs, r)
        write_rows(v, batch, self._table, self._pad)
        write_query_start_loc(m.query_start_loc, self._qsl_steps[: bs + 1], r * self.draft_tokens)
        write_tree(m, tree, r)  # nothing without tree buffers; padded rows' links stay stale
        m.raw_batch_size = r
        m.forward_mode = batch.mode
        m.draft_tokens = self.draft_tokens if batch.mode != "idle" else 0
        return m

    def _check_batch(self, batch: Batch) -> DraftTree | None:
        """Refuse a batch these buffers cannot hold (before any write); its checked tree, if any."""
        if batch.mode != "idle" and batch.mode != self.mode:
            raise MetadataError(
                f"forward_mode: buffers captured for {self.mode!r}, batch is {batch.mode!r}", field="forward_mode"
            )
        if batch.mode == "target_verify" and batch.draft_tokens != self.draft_tokens:
            raise MetadataError(
                f"draft_tokens: buffers captured for D={self.draft_tokens}, batch has D={batch.draft_tokens}",
                field="draft_tokens",
            )
        if batch.device != self.pool.device:
            raise MetadataError(
                f"batch.req_pool_indices is on {batch.device}, the buffers on {self.pool.device}",
                field="batch.req_pool_indices",
            )
        tree = check_tree(batch, self.pool.profile)
        if tree is not None and not self.tree:
            raise MetadataError(
                "tree: the batch carries draft trees, and these buffers were built without tree=True (no "
                "retrieve_* buffers to write them to)",
                field="tree",
            )
        if self.tree and batch.mode == "target_verify" and batch.tree is None:
            raise MetadataError(
                "tree: buffers built with tree=True (sglang's topk > 1) read each row's tree links, and this batch "
                "has none; pass tree=DraftTree.chain(r, D) for chains",
                field="tree",
            )
        return tree

    def _check_request_rows(self, batch: Batch) -> None:
        # before any write, so a bad batch leaves the buffers as they were; only where a host read costs no sync
        if not batch.raw_batch_size or batch.req_pool_indices.device.type != "cpu":
            return
        rows = self._table.shape[0]
        bad = (batch.req_pool_indices >= rows).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            row = int(batch.req_pool_indices[i])
            raise MetadataError(
                f"req_pool_indices[{i}] = {row}: out of range, the pool has request rows [0, {rows})",
                field="req_pool_indices",
                row=i,
            )

    def _make_views(self, bs: int, r: int) -> RowViews:
        # Slicing costs as much as a small op on the CPU; the views of a (bucket, raw_bs) pair are reused.
        v = row_views(self.static[bs], r)
        self._views[(bs, r)] = v
        return v

    def reset_for_capture(self, bucket: int) -> Metadata:
        """Put ``bucket``'s buffers in their capture state: all rows live, no padding, every row on request
        row 0 and the dummy slot (as in sglang, capture runs the kernels there and writes only that slot);
        ``num_accepted_tokens`` is D, as vLLM captures it; the other fields hold the padded-row values
        (:class:`workbench.metadata.padding.PaddedRow`). Tree buffers are left as they are, in the same
        storage the graph records: sglang skips their copy at capture (its capture batch has no links)."""
        m = self.static[bucket]
        pad = self._pad
        m.state_indices.fill_(self.pool.profile.dummy_slot)
        m.query_start_loc.copy_(self._qsl_steps[: bucket + 1])
        m.seq_lens.fill_(pad.seq_len)
        m.req_pool_indices.fill_(pad.req_pool_index)
        m.has_initial_state.fill_(True)
        if m.num_accepted_tokens is not None and pad.num_accepted is not None:
            # as vLLM 0.33.0's build_for_cudagraph_capture: every capture row accepts all D tokens (the
            # steps of query_start_loc); which slot it names matters not, every one is the dummy
            m.num_accepted_tokens.fill_(self.draft_tokens)
        m.raw_batch_size = bucket
        m.forward_mode = self.mode
        m.draft_tokens = self.draft_tokens
        return m

    # -- views ----------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        tree = ", tree" if self.tree else ""
        return (
            f"MetadataBuffers({self.pool.profile.name} {self.mode}, buckets={_short_buckets(self.buckets)} "
            f"({len(self.buckets)}), D={self.draft_tokens}{tree}, device={self.pool.device})"
        )

    def _repr_html_(self) -> str:
        head = {
            "profile": self.pool.profile.name,
            "mode": self.mode,
            "D": self.draft_tokens,
            "buckets": len(self.buckets),
            "device": self.pool.device,
        }
        if self.tree:
            head["drafts"] = "tree"
        cols = ["bucket", "raw_bs", "padding", "state_indices"]
        rows = []
        for bs, m in self.static.items():
            rows.append([bs, m.raw_batch_size, m.num_padding, "x".join(map(str, m.state_indices.shape))])
        note = html.note("each bucket's tensors are rewritten in place by update(); raw_bs is the latest step's")
        return html.block(html.facts(head), html.table(cols, rows, max_rows=16), note, title="MetadataBuffers")
