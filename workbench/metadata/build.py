"""The eager build: a batch's padded metadata in fresh tensors (what an eager step, or a test, reads)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from workbench.batch import Batch
from workbench.buckets import above_largest, check_buckets, resolve_bucket
from workbench.errors import MetadataError
from workbench.limits import INT32_MAX
from workbench.metadata.padding import (
    PaddedRow,
    check_tree,
    live_index_table,
    row_views,
    write_query_start_loc,
    write_rows,
    write_tree,
)
from workbench.metadata.record import Metadata
from workbench.metadata.sizing import check_padded_memory, check_tree_memory, default_buckets
from workbench.pool import StatePool


def _padded_size(
    batch: Batch, pool: StatePool, bucket: int | str | None, buckets: Sequence[int] | None
) -> tuple[int, int | None, str | None]:
    """(padded batch size, captured bucket or None, eager reason or None); ``bucket=None``: no padding."""
    r = batch.raw_batch_size
    if bucket is None:
        return r, None, None
    known = default_buckets(pool, batch.mode == "target_verify") if buckets is None else check_buckets(buckets)
    bs = resolve_bucket(r, known, bucket)
    if bs is None:
        return r, None, f"{above_largest(r, known)}: runs eagerly"
    return bs, bs, None


def _check_inputs(batch: Batch, pool: StatePool) -> None:
    if not isinstance(batch, Batch):
        raise MetadataError(f"batch must be a workbench.Batch, got {type(batch).__name__}", field="batch")
    if not isinstance(pool, StatePool):
        raise MetadataError(f"pool must be a workbench.StatePool, got {type(pool).__name__}", field="pool")
    if batch.device != pool.device:
        raise MetadataError(
            f"batch.req_pool_indices is on {batch.device}, the pool on {pool.device}", field="batch.req_pool_indices"
        )
    for i, row in enumerate(batch.req_pool_indices.tolist()):
        if not pool.is_allocated(row):
            raise MetadataError(
                f"req_pool_indices[{i}] = {row}: request not allocated in the pool", field="req_pool_indices", row=i
            )


def _empty_metadata(batch: Batch, pool: StatePool, bs: int, table: torch.Tensor) -> Metadata:
    """A Metadata of ``bs`` rows in uninitialised tensors, with the optional tensors ``batch.mode`` needs."""
    prof, dev, mode = pool.profile, pool.device, batch.mode
    meta = Metadata(
        profile=prof,
        forward_mode=mode,
        raw_batch_size=batch.raw_batch_size,
        draft_tokens=batch.draft_tokens,
        state_indices=torch.empty((bs, *table.shape[1:]), dtype=torch.int32, device=dev),
        query_start_loc=torch.empty(bs + 1, dtype=torch.int32, device=dev),
        seq_lens=torch.empty(bs, dtype=torch.int32, device=dev),
        req_pool_indices=torch.empty(bs, dtype=torch.int64, device=dev),
        has_initial_state=torch.empty(bs, dtype=torch.bool, device=dev),
    )
    if mode == "extend":
        meta.extend_lens = torch.empty(bs, dtype=torch.int32, device=dev)
    if mode == "target_verify":
        if prof.num_accepted_fill is not None:
            meta.num_accepted_tokens = torch.empty(bs, dtype=torch.int32, device=dev)
        if prof.verify_intermediate_by_row:
            meta.intermediate_state_indices = torch.arange(bs, dtype=torch.int32, device=dev)
        if batch.tree is not None:  # zeros: what a fresh static buffer holds in the rows no step wrote
            d = batch.draft_tokens
            meta.retrieve_next_token = torch.zeros((bs, d), dtype=torch.int32, device=dev)
            meta.retrieve_next_sibling = torch.zeros((bs, d), dtype=torch.int32, device=dev)
            meta.retrieve_parent_token = torch.zeros((bs, d), dtype=torch.int32, device=dev)
    return meta


def _token_starts(meta: Metadata) -> torch.Tensor:
    """int32 ``[bs + 1]``: the rows' token offsets laid end to end (extend: by ``extend_lens``)."""
    bs, dev = meta.batch_size, meta.query_start_loc.device
    if meta.extend_lens is not None:
        starts = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
        starts[1:] = torch.cumsum(meta.extend_lens, 0)
        return starts
    step = max(meta.draft_tokens, 1)  # decode 1, verify D; idle carries 0 draft tokens and no live row
    # int64 first: (bs + 1) * D may pass int32 when bs > raw_bs; padded entries are clamped to the live total
    starts = torch.arange(bs + 1, dtype=torch.int64, device=dev) * step
    return starts.clamp_(max=INT32_MAX).to(torch.int32)


def build_metadata(
    batch: Batch,
    pool: StatePool,
    bucket: int | str | None = "auto",
    *,
    buckets: Sequence[int] | None = None,
) -> Metadata:
    """Build the padded metadata of ``batch`` (eager path; allocates fresh tensors).

    Args:
        batch: the live requests.
        pool: the state pool they were allocated from (its profile decides the padding).
        bucket: "auto" (smallest captured bucket that holds the batch), an int (must be captured), or None
            (no padding: ``batch_size == raw_batch_size``). A batch above the largest bucket runs eagerly:
            ``bucket`` is None and ``eager_reason`` says why.
        buckets: the captured bucket list; default: the profile's list for ``pool.capacity``.

    Returns:
        a :class:`Metadata` whose padded rows follow :class:`workbench.metadata.padding.PaddedRow`, written
        by the same code as the graph buffers' in-place update. A batch with draft trees (``batch.tree``, an
        sglang profile) also gets the ``retrieve_*`` links of its rows; its padded rows' links are zeros, as
        a fresh static buffer's, and their ``retrieve_parent_token`` is derived from those zeros (each node's
        parent 0). A profile without ``tree_verify`` (vLLM) refuses a tree, naming ``tree``.
    """
    _check_inputs(batch, pool)
    tree = check_tree(batch, pool.profile)
    bs, captured, reason = _padded_size(batch, pool, bucket, buckets)
    check_padded_memory(f"bucket={bs}", bs, pool)
    if tree is not None:
        check_tree_memory(f"bucket={bs}", bs, batch.draft_tokens, pool)
    table = live_index_table(pool, batch.mode, batch.draft_tokens)
    meta = _empty_metadata(batch, pool, bs, table)
    meta.bucket, meta.eager_reason = captured, reason
    write_rows(row_views(meta, batch.raw_batch_size), batch, table, PaddedRow.of(pool.profile))
    write_query_start_loc(meta.query_start_loc, _token_starts(meta), batch.num_tokens)
    write_tree(meta, tree, batch.raw_batch_size)
    return meta
