"""The padding rule, written once: what a padded batch row holds in each field, and the one writer of a step.

A padded row (``raw_batch_size <= i < batch_size``, always at the tail) holds, under a profile:

- ``state_indices``: the sentinel (every entry of a vLLM ``[bs, D]`` row);
- ``seq_lens``: the profile's seq-len fill; ``req_pool_indices``: the reserved request row;
- ``num_accepted_tokens`` (engines that have it, vLLM): the profile's fill, 1;
- ``has_initial_state``: False; ``extend_lens``: 0; and zero tokens, so ``query_start_loc`` stays flat
  over the padded tail.

The draft-tree links of a tree verify (``retrieve_next_token``, ``retrieve_next_sibling``) are the exception:
no value is written to a padded row. sglang copies the live rows' links into its static per-bucket buffers
and leaves the rest stale, and its kernel derives ``retrieve_parent_token`` from every row's links;
:func:`write_tree` does the same, so an eager build's padded rows hold what a fresh buffer holds (zeros).

The eager build (``build_metadata``) and the in-place graph update (``MetadataBuffers.update``) both write a
step through :func:`write_rows` and :func:`write_query_start_loc`, and ``validate`` checks the same
:class:`PaddedRow` values, so the three cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from workbench.batch import Batch
from workbench.errors import MetadataError
from workbench.metadata.record import Metadata
from workbench.metadata.tree import DraftTree, parents_from_links
from workbench.pool import StatePool
from workbench.profiles import Profile


@dataclass(frozen=True)
class PaddedRow:
    """The values of a padded row under one profile (see the module docstring).

    Attributes:
        state_index: ``state_indices`` of a padded row: the profile's sentinel.
        seq_len: ``seq_lens``: the profile's fill value.
        req_pool_index: ``req_pool_indices``: the reserved request row.
        num_accepted: ``num_accepted_tokens``; also what a live row holds when the batch brings no counts.
            None where the engine has no such buffer.
        has_initial_state: a padded row reads no state (the same for every profile).
        num_tokens: a padded row is zero-length (the same for every profile; also its ``extend_lens``).
    """

    state_index: int
    seq_len: int
    req_pool_index: int
    num_accepted: int | None
    has_initial_state: ClassVar[bool] = False
    num_tokens: ClassVar[int] = 0

    @classmethod
    def of(cls, profile: Profile) -> PaddedRow:
        """The padded row of ``profile``.

        >>> from workbench.profiles import PROFILES
        >>> [PaddedRow.of(p) for p in PROFILES.values()]  # doctest: +NORMALIZE_WHITESPACE
        [PaddedRow(state_index=-1, seq_len=1, req_pool_index=0, num_accepted=None),
         PaddedRow(state_index=0, seq_len=0, req_pool_index=0, num_accepted=None),
         PaddedRow(state_index=0, seq_len=0, req_pool_index=0, num_accepted=1)]
        """
        return cls(
            state_index=profile.sentinel,
            seq_len=profile.seq_len_fill,
            req_pool_index=profile.reserved_request_row,
            num_accepted=profile.num_accepted_fill,
        )


@dataclass(frozen=True)
class RowViews:
    """Live (``[:r]``) and padded (``[r:]``) views of one step's metadata tensors (no tensor memory of
    their own). ``acc_*`` exist where the step has ``num_accepted_tokens``, ``ext_*`` in extend."""

    state_live: torch.Tensor
    state_pad: torch.Tensor
    seq_live: torch.Tensor
    seq_pad: torch.Tensor
    rpi_live: torch.Tensor
    rpi_pad: torch.Tensor
    init_live: torch.Tensor
    init_pad: torch.Tensor
    acc_live: torch.Tensor | None = None
    acc_pad: torch.Tensor | None = None
    ext_live: torch.Tensor | None = None
    ext_pad: torch.Tensor | None = None


def row_views(meta: Metadata, raw_batch_size: int) -> RowViews:
    """The live and padded views of ``meta``'s tensors for ``raw_batch_size`` live rows."""
    r = raw_batch_size
    acc, ext = meta.num_accepted_tokens, meta.extend_lens
    return RowViews(
        state_live=meta.state_indices[:r],
        state_pad=meta.state_indices[r:],
        seq_live=meta.seq_lens[:r],
        seq_pad=meta.seq_lens[r:],
        rpi_live=meta.req_pool_indices[:r],
        rpi_pad=meta.req_pool_indices[r:],
        init_live=meta.has_initial_state[:r],
        init_pad=meta.has_initial_state[r:],
        acc_live=None if acc is None else acc[:r],
        acc_pad=None if acc is None else acc[r:],
        ext_live=None if ext is None else ext[:r],
        ext_pad=None if ext is None else ext[r:],
    )


def live_index_table(pool: StatePool, mode: str, draft_tokens: int) -> torch.Tensor:
    """The mapping the live rows gather their state indices from: int32 ``[rows]``, or ``[rows, D]`` for
    vLLM spec decode (one slot per draft position)."""
    if mode == "target_verify" and pool.profile.spec_indices_2d:
        if pool.slots_per_request != draft_tokens:
            raise MetadataError(
                f"slots_per_request={pool.slots_per_request}: profile {pool.profile.name!r} keeps one slot "
                f"per draft position in target_verify, so the pool needs slots_per_request=D={draft_tokens}",
                field="slots_per_request",
            )
        return pool.mapping
    return pool.mapping[:, 0]


def write_rows(views: RowViews, batch: Batch, table: torch.Tensor, pad: PaddedRow) -> None:
    """Write ``batch`` into ``views`` in place: live rows from the batch, padded rows by ``pad``.

    Tensor ops only, no host read and no allocation outside extend (whose initial-state flags compare
    ``prefix_lens``): the graph update runs this between replays. ``table`` is :func:`live_index_table`.
    ``query_start_loc`` is written by :func:`write_query_start_loc`.
    """
    v = views
    torch.index_select(table, 0, batch.req_pool_indices, out=v.state_live)
    v.seq_live.copy_(batch.seq_lens)
    v.rpi_live.copy_(batch.req_pool_indices)
    if batch.mode == "extend" and batch.prefix_lens is not None:
        torch.gt(batch.prefix_lens, 0, out=v.init_live)  # a prefill row reads its state iff tokens are cached
    else:
        v.init_live.fill_(True)
    if v.acc_live is not None:
        if batch.num_accepted_tokens is not None:
            v.acc_live.copy_(batch.num_accepted_tokens)
        elif pad.num_accepted is not None:
            v.acc_live.fill_(pad.num_accepted)
    if v.ext_live is not None:
        if batch.extend_lens is not None:
            v.ext_live.copy_(batch.extend_lens)
        else:
            v.ext_live.fill_(batch.draft_tokens)
    write_padding(v, pad)


def write_padding(views: RowViews, pad: PaddedRow) -> None:
    """Fill the padded rows of ``views`` with ``pad``'s values (every field but ``query_start_loc``)."""
    v = views
    v.state_pad.fill_(pad.state_index)
    v.seq_pad.fill_(pad.seq_len)
    v.rpi_pad.fill_(pad.req_pool_index)
    v.init_pad.fill_(pad.has_initial_state)
    if v.acc_pad is not None and pad.num_accepted is not None:
        v.acc_pad.fill_(pad.num_accepted)
    if v.ext_pad is not None:
        v.ext_pad.fill_(pad.num_tokens)


def write_query_start_loc(out: torch.Tensor, starts: torch.Tensor, live_tokens: int) -> None:
    """``out = min(starts, live_tokens)``, in place, one op.

    ``starts``, int32 ``[bs + 1]``: the token offsets of the bucket's rows laid end to end (``arange * D``
    in a graph mode, the running sum of the extend lengths in extend). Every entry past the live rows then
    equals the live total: each padded row has ``PaddedRow.num_tokens`` (zero) tokens.
    """
    torch.clamp(starts, max=live_tokens, out=out)


def check_tree(batch: Batch, profile: Profile) -> DraftTree | None:
    """``batch.tree``, checked against the batch and ``profile``: a tree is a verify's, of the batch's rows
    and D, and only a profile with ``tree_verify`` (sglang) takes one."""
    tree = batch.tree
    if tree is None:
        return None
    if not profile.tree_verify:
        raise MetadataError(
            f"tree: profile {profile.name!r} has no draft trees (it verifies chains only); pass tree=None or use "
            "an sglang profile",
            field="tree",
        )
    if batch.mode != "target_verify" or not isinstance(tree, DraftTree):
        raise MetadataError(
            f"tree: a {batch.mode} batch carries {type(tree).__name__}; only a target_verify batch carries a "
            "workbench.metadata.DraftTree",
            field="tree",
        )
    if tree.num_requests != batch.raw_batch_size or tree.draft_tokens != batch.draft_tokens:
        raise MetadataError(
            f"tree: trees of {tree.num_requests} requests x {tree.draft_tokens} nodes for a batch of "
            f"{batch.raw_batch_size} requests x D={batch.draft_tokens}",
            field="tree",
        )
    return tree


def write_tree(meta: Metadata, tree: DraftTree | None, raw_batch_size: int) -> None:
    """Write a tree verify's links in place: rows ``[:r]`` from ``tree`` (None: no live row), the padded rows
    left as they are; then ``retrieve_parent_token`` of every row derived from the links the buffers hold
    (:func:`workbench.metadata.tree.parents_from_links`). Tensor ops only (the tree's host links are copied
    to the metadata's device)."""
    nt, ns, parent = meta.retrieve_next_token, meta.retrieve_next_sibling, meta.retrieve_parent_token
    if nt is None or ns is None or parent is None:
        return
    r = raw_batch_size
    if tree is not None and r:
        nt[:r].copy_(tree.next_token)
        ns[:r].copy_(tree.next_sibling)
    parents_from_links(nt, ns, out=parent)
