"""``validate``: the invariants of docs/design.md, one small check per field, each error naming field and row.

Reads everything to the host: a debugging check, not for the replay hot path.
"""

from __future__ import annotations

import torch

from workbench.errors import MetadataError
from workbench.metadata.padding import PaddedRow
from workbench.metadata.record import GRAPH_MODES, Metadata
from workbench.metadata.tree import (
    NEXT_SIBLING,
    NEXT_TOKEN,
    PARENT_TOKEN,
    TREE_FIELDS,
    LinkProblem,
    parents_from_links,
    row_tree,
)
from workbench.pool import StatePool
from workbench.profiles import Profile


def _fail(field_name: str, row: int | None, msg: str) -> MetadataError:
    where = f"{field_name}[{row}]" if row is not None else field_name
    return MetadataError(f"{where}: {msg}", field=field_name, row=row)


def validate(meta: Metadata, pool: StatePool) -> None:
    """Check the invariants of docs/design.md; raise MetadataError naming the field and the row.

    Live indices unique, in range, never the dummy slot, and owned by the row's request; padded rows exactly
    the sentinel; padding only at the tail; ``qsl[0] = 0``, non-decreasing, live rows of the mode's length,
    padded rows zero-length; padded ``seq_lens``, ``req_pool_indices`` and ``num_accepted_tokens`` hold the
    profile's fill values (:class:`workbench.metadata.padding.PaddedRow`). A tree verify's live rows hold
    links that form a tree in sglang's order, and ``retrieve_parent_token`` derived from them; its padded
    rows are not checked (stale links are legal: the kernels skip those rows or run them on the dummy slot).
    """
    prof = pool.profile
    pad = PaddedRow.of(prof)
    _check_layout(meta, pool)
    _check_state_indices(meta, pool, pad)
    _check_query_start_loc(meta)
    _check_seq_lens_and_request_rows(meta, pad)
    _check_has_initial_state(meta)
    _check_num_accepted_tokens(meta, prof, pad)
    _check_intermediate_state_indices(meta)
    _check_tree(meta, prof)


# -- sizes, devices, dtypes, shapes ---------------------------------------------------------------------
def _check_layout(meta: Metadata, pool: StatePool) -> None:
    bs, r = meta.batch_size, meta.raw_batch_size
    if not 0 <= r <= bs:
        raise _fail("raw_batch_size", None, f"{r} not in [0, batch_size={bs}]")
    for name, t in meta.tensors().items():
        if t.device != pool.device:
            raise _fail(name, None, f"on device {t.device}, the pool on {pool.device}")
    _check_dtypes(meta)
    _check_shapes(meta, pool.profile)
    if meta.forward_mode == "extend" and meta.extend_lens is None:
        raise _fail("extend_lens", None, "missing: an extend step needs its per-row lengths")


def _check_dtypes(meta: Metadata) -> None:
    wanted = {
        "state_indices": torch.int32,
        "query_start_loc": torch.int32,
        "seq_lens": torch.int32,
    }
    for name, dtype in wanted.items():
        t = getattr(meta, name)
        if t.dtype != dtype:
            raise _fail(name, None, f"dtype {t.dtype}, expected {dtype}")


def _expected_state_shape(meta: Metadata, prof: Profile) -> tuple[int, ...]:
    bs = meta.batch_size
    if meta.forward_mode == "target_verify" and prof.spec_indices_2d:
        return (bs, meta.draft_tokens)
    if meta.forward_mode == "idle" and prof.spec_indices_2d and meta.state_indices.dim() == 2:
        return (bs, meta.state_indices.shape[1])  # an idle step run by a spec-decode graph
    return (bs,)


def _check_shapes(meta: Metadata, prof: Profile) -> None:
    bs = meta.batch_size
    want = _expected_state_shape(meta, prof)
    if tuple(meta.state_indices.shape) != want:
        raise _fail("state_indices", None, f"shape {tuple(meta.state_indices.shape)}, expected {want}")
    for name in ("seq_lens", "req_pool_indices", "has_initial_state"):
        if getattr(meta, name).shape != (bs,):
            raise _fail(name, None, f"shape {tuple(getattr(meta, name).shape)}, expected ({bs},)")
    for name, dtype in (("req_pool_indices", torch.int64), ("has_initial_state", torch.bool)):
        if getattr(meta, name).dtype != dtype:
            raise _fail(name, None, f"dtype {getattr(meta, name).dtype}, expected {dtype}")


# -- state_indices ----------------------------------------------------------------------------------------
def _check_state_indices(meta: Metadata, pool: StatePool, pad: PaddedRow) -> None:
    idx = [v if isinstance(v, list) else [v] for v in meta.state_indices.tolist()]
    rpi = meta.req_pool_indices.tolist()
    seen: dict[int, int] = {}  # slot -> the live row that uses it
    for i in range(meta.batch_size):
        if i >= meta.raw_batch_size:
            _check_padded_indices(i, idx[i], pad)
        else:
            _check_live_indices(i, idx[i], rpi[i], pool, seen)


def _check_padded_indices(i: int, row: list[int], pad: PaddedRow) -> None:
    if any(v != pad.state_index for v in row):
        raise _fail("state_indices", i, f"padded row holds {row}, expected the sentinel {pad.state_index}")


def _check_live_indices(i: int, row: list[int], request: int, pool: StatePool, seen: dict[int, int]) -> None:
    if not pool.is_allocated(request):
        raise _fail("req_pool_indices", i, f"row {request} is not an allocated request")
    owned = pool.slots_of(request)
    prof = pool.profile
    for j, v in enumerate(row):
        if v == prof.sentinel:
            raise _fail("state_indices", i, f"live row holds the sentinel {v}: padding only at the tail")
        if not 0 <= v < pool.num_slots:
            raise _fail("state_indices", i, f"slot {v} out of range [0, {pool.num_slots})")
        if v == prof.dummy_slot:
            raise _fail("state_indices", i, f"live row points at the reserved dummy slot {v}")
        if v in seen:
            raise _fail("state_indices", i, f"slot {v} also used by row {seen[v]}")
        if v != owned[j]:
            raise _fail("state_indices", i, f"slot {v}, but request row {request} owns slot {owned[j]}")
        seen[v] = i


# -- query_start_loc --------------------------------------------------------------------------------------
def _expected_lens(meta: Metadata) -> list[int]:
    """Tokens of each batch row: the mode's count for live rows, ``PaddedRow.num_tokens`` for padded ones."""
    r, bs = meta.raw_batch_size, meta.batch_size
    if meta.forward_mode == "extend":
        live: list[int] = meta.extend_lens.tolist()[:r] if meta.extend_lens is not None else [0] * r
    elif meta.forward_mode == "idle":
        live = []
    else:
        live = [meta.draft_tokens] * r
    return live + [PaddedRow.num_tokens] * (bs - r)


def _check_query_start_loc(meta: Metadata) -> None:
    bs, r = meta.batch_size, meta.raw_batch_size
    qsl = meta.query_start_loc.tolist()
    if len(qsl) != bs + 1:
        raise _fail("query_start_loc", None, f"length {len(qsl)}, expected batch_size+1 = {bs + 1}")
    if qsl[0] != 0:
        raise _fail("query_start_loc", 0, f"= {qsl[0]}, must be 0")
    expected = _expected_lens(meta)
    for i in range(bs):
        n = qsl[i + 1] - qsl[i]
        if n < 0:
            raise _fail("query_start_loc", i + 1, f"{qsl[i + 1]} < {qsl[i]}: must be non-decreasing")
        if n != expected[i]:
            kind = "padded row must be zero-length" if i >= r else f"{meta.forward_mode} row has {expected[i]} tokens"
            raise _fail("query_start_loc", i + 1, f"batch row {i} has {n} tokens; {kind}")


# -- seq_lens, req_pool_indices, has_initial_state --------------------------------------------------------
def _check_seq_lens_and_request_rows(meta: Metadata, pad: PaddedRow) -> None:
    # one pass over the rows, so the first bad row is reported whichever of the two fields it is in
    sl = meta.seq_lens.tolist()
    rpi = meta.req_pool_indices.tolist()
    r = meta.raw_batch_size
    for i in range(meta.batch_size):
        if i >= r and sl[i] != pad.seq_len:
            raise _fail("seq_lens", i, f"padded row holds {sl[i]}, expected fill {pad.seq_len}")
        if i < r and sl[i] < 1:
            raise _fail("seq_lens", i, f"live row holds {sl[i]}, must be >= 1")
        if i >= r and rpi[i] != pad.req_pool_index:
            raise _fail("req_pool_indices", i, f"padded row holds {rpi[i]}, expected {pad.req_pool_index}")


def _check_has_initial_state(meta: Metadata) -> None:
    init = meta.has_initial_state.tolist()
    r = meta.raw_batch_size
    for i in range(meta.batch_size):
        if i >= r and init[i] != PaddedRow.has_initial_state:
            raise _fail("has_initial_state", i, "padded row claims an initial state")
        if i < r and meta.forward_mode in GRAPH_MODES and not init[i]:
            raise _fail("has_initial_state", i, f"live {meta.forward_mode} row must read its state")


# -- verify extras: vLLM's num_accepted_tokens, sglang's by-row intermediate indices ---------------------
def _check_num_accepted_tokens(meta: Metadata, prof: Profile, pad: PaddedRow) -> None:
    if meta.forward_mode != "target_verify" or pad.num_accepted is None:
        return
    bs, r, d = meta.batch_size, meta.raw_batch_size, meta.draft_tokens
    acc = meta.num_accepted_tokens
    if acc is None:
        raise _fail("num_accepted_tokens", None, f"missing: profile {prof.name!r} needs it in target_verify")
    if acc.dtype != torch.int32 or acc.shape != (bs,):
        raise _fail("num_accepted_tokens", None, f"{acc.dtype}{list(acc.shape)}, expected torch.int32[{bs}]")
    for i, a in enumerate(acc.tolist()):
        if i < r and not 1 <= a <= d:
            raise _fail("num_accepted_tokens", i, f"live row holds {a}, must be in 1..D={d}")
        if i >= r and a != pad.num_accepted:
            raise _fail("num_accepted_tokens", i, f"padded row holds {a}, expected fill {pad.num_accepted}")


def _check_intermediate_state_indices(meta: Metadata) -> None:
    inter = meta.intermediate_state_indices
    if inter is None:
        return
    bs = meta.batch_size
    want = list(range(bs))
    got = inter.tolist()
    if got != want:
        row = next(i for i in range(max(len(got), bs)) if i >= len(got) or i >= bs or got[i] != want[i])
        raise _fail("intermediate_state_indices", row, "must be the batch row (arange(batch_size))")


# -- draft trees (sglang, topk > 1) ---------------------------------------------------------------------
def _check_tree(meta: Metadata, prof: Profile) -> None:
    tensors = {name: getattr(meta, name) for name in TREE_FIELDS}
    if all(t is None for t in tensors.values()):
        return
    bs, r = meta.batch_size, meta.raw_batch_size
    nt = tensors[NEXT_TOKEN]
    # an idle step run by a tree-verify graph keeps the buffers' width, with draft_tokens 0
    d = meta.draft_tokens if meta.forward_mode == "target_verify" or nt is None else nt.shape[-1]
    for name, t in tensors.items():
        if t is None or t.dtype != torch.int32 or tuple(t.shape) != (bs, d):
            got = "missing" if t is None else f"{t.dtype}{list(t.shape)}"
            raise _fail(name, None, f"{got}, expected torch.int32[{bs}, {d}] beside the other draft-tree fields")
    if not prof.tree_verify:
        raise _fail(NEXT_TOKEN, None, f"profile {prof.name!r} has no draft trees (it verifies chains only)")
    links = (tensors[NEXT_TOKEN].tolist(), tensors[NEXT_SIBLING].tolist())
    for b in range(r):
        bad = row_tree(links[0][b], links[1][b])
        if isinstance(bad, LinkProblem):
            raise _fail(bad.field, b, bad.why if bad.node is None else f"entry {bad.node} = {bad.value}: {bad.why}")
    want = parents_from_links(tensors[NEXT_TOKEN], tensors[NEXT_SIBLING]).tolist()
    have = tensors[PARENT_TOKEN].tolist()
    for b in range(r):
        if have[b] != want[b]:
            t = next(t for t in range(d) if have[b][t] != want[b][t])
            raise _fail(PARENT_TOKEN, b, f"entry {t} = {have[b][t]}, the row's links give {want[b][t]}")
