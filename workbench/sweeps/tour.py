"""The metadata tour: the same five requests, decode and target-verify (D=3), padded to bucket 8 under every
profile. ``workbench demo`` prints it; the report draws it.

>>> [(m.profile.name, m.forward_mode, m.raw_batch_size, m.batch_size) for m in metadata_tour()][:2]
[('sglang', 'decode', 5, 8), ('sglang', 'target_verify', 5, 8)]
"""

from __future__ import annotations

from workbench.batch import Batch
from workbench.metadata import Metadata, build_metadata, validate
from workbench.pool import StatePool
from workbench.profiles import PROFILES

SEQ_LENS = (7, 3, 9, 4, 12)
DRAFT_TOKENS = 3
TOUR_BUCKETS = (1, 2, 4, 8, 16)


def metadata_tour() -> list[Metadata]:
    """One validated ``Metadata`` per (profile, mode), in ``PROFILES`` order, decode before verify. Each pool
    has holes (slots freed before the batch is admitted), so the live slots are not simply 1..5."""
    metas = []
    for profile in PROFILES.values():
        for mode in ("decode", "target_verify"):
            spr = profile.slots_per_request(DRAFT_TOKENS if mode == "target_verify" else 1)
            pool = StatePool(32, profile.name, slots_per_request=spr)
            pool.free(pool.alloc(6)[::2])
            rows = pool.alloc(len(SEQ_LENS))
            seq = list(SEQ_LENS)
            if mode == "decode":
                batch = Batch.decode(rows, seq)
            else:
                batch = Batch.target_verify(rows, seq, draft_tokens=DRAFT_TOKENS)
            meta = build_metadata(batch, pool, bucket="auto", buckets=list(TOUR_BUCKETS))
            validate(meta, pool)
            metas.append(meta)
    return metas
