"""How large a step's metadata may get: the default bucket list of a pool, the memory of padded rows.

Both are checked before anything is allocated: a user-given bucket (or a pool of 10^9 slots) would
otherwise reach ``torch.full`` or a Python list as an out-of-memory error.
"""

from __future__ import annotations

from workbench.buckets import capture_buckets
from workbench.limits import check_memory
from workbench.pool import StatePool
from workbench.profiles import default_bucket_bytes


def default_buckets(pool: StatePool, speculative: bool) -> list[int]:
    """The profile's capture list up to ``pool.capacity``, after checking the host memory it needs."""
    # a pool of 10^9 slots makes a list of ~31M Python ints: refuse it before building it, not after
    n = pool.capacity
    check_memory(f"num_slots={pool.num_slots}", default_bucket_bytes(n), f"the default bucket list up to {n:,}")
    return capture_buckets(n, speculative, pool.profile)


def row_bytes(pool: StatePool) -> int:
    """Metadata bytes per padded row: state indices (one int32 per slot a request owns), qsl, seq_lens,
    num_accepted, intermediate indices (int32), req_pool_indices (int64), has_initial_state (bool)."""
    return 4 * pool.slots_per_request + 4 * 4 + 8 + 1


def check_padded_memory(name: str, rows: int, pool: StatePool) -> None:
    """Refuse (``MetadataError`` naming ``name``) metadata of ``rows`` padded rows that would not fit."""
    check_memory(name, rows * row_bytes(pool), f"metadata of {rows:,} padded rows", pool.device)


def check_tree_memory(name: str, rows: int, draft_tokens: int, pool: StatePool) -> None:
    """Refuse the three int32 ``[rows, D]`` draft-tree buffers of a tree verify when they would not fit."""
    check_memory(name, 12 * rows * draft_tokens, f"draft-tree links of {rows:,} rows x D={draft_tokens:,}", pool.device)
