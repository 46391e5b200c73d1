"""The bucket choice at replay time (the bucket lists themselves belong to the profiles).

An engine captures one graph per batch size in a fixed list; at run time a batch of ``raw_bs`` requests is
padded up to the smallest captured size that holds it (bisect-left). A batch larger than the largest bucket
runs eagerly: it is never truncated.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from workbench.errors import MetadataError
from workbench.profiles import Profile, get_profile


def capture_buckets(max_bs: int, speculative: bool = False, profile: str | Profile | None = None) -> list[int]:
    """The engine default capture list for ``max_bs``; sglang's unless ``profile`` has its own.

    >>> capture_buckets(20)
    [1, 2, 4, 8, 12, 16, 20]
    """
    if isinstance(max_bs, bool) or not isinstance(max_bs, int) or max_bs < 1:
        raise MetadataError(f"max_bs must be a positive int, got {max_bs!r}", field="max_bs")
    return get_profile(profile or "sglang").buckets(max_bs, speculative)


def choose_bucket(raw_bs: int, buckets: Sequence[int]) -> int | None:
    """Smallest bucket ``>= raw_bs`` (bisect-left), or None when the batch is above the largest bucket."""
    i = bisect.bisect_left(buckets, raw_bs)
    return buckets[i] if i < len(buckets) else None


def above_largest(raw_bs: int, buckets: Sequence[int]) -> str:
    """Why a batch gets no bucket (the one wording of it, for errors and eager reasons)."""
    return f"raw batch {raw_bs} is above the largest captured bucket {buckets[-1]}"


def resolve_bucket(raw_bs: int, buckets: Sequence[int], bucket: int | str = "auto") -> int | None:
    """The captured bucket a batch of ``raw_bs`` live rows is padded to.

    ``bucket="auto"``: the smallest bucket ``>= raw_bs``, or None when the batch is above the largest (it
    runs eagerly; :func:`above_largest` says why). An int must be a captured bucket that holds the batch:
    a batch is never truncated. Anything else raises ``MetadataError`` naming the value.

    >>> resolve_bucket(5, [1, 2, 4, 8]), resolve_bucket(9, [1, 2, 4, 8]), resolve_bucket(3, [1, 2, 4, 8], 8)
    (8, None, 8)
    >>> resolve_bucket(3, [1, 2, 4, 8], 6)
    Traceback (most recent call last):
    ...
    workbench.errors.MetadataError: bucket 6 was not captured; captured buckets: [1, 2, 4, 8]
    """
    if bucket == "auto":
        return choose_bucket(raw_bs, buckets)
    if isinstance(bucket, bool) or not isinstance(bucket, int):
        raise MetadataError(f"bucket must be 'auto', None or an int, got {bucket!r}", field="bucket")
    if bucket not in buckets:
        raise MetadataError(f"bucket {bucket} was not captured; captured buckets: {list(buckets)}", field="bucket")
    if raw_bs > bucket:
        raise MetadataError(
            f"raw batch {raw_bs} is larger than bucket {bucket}; a batch is never truncated", field="bucket"
        )
    return bucket


def check_buckets(buckets: Sequence[int]) -> list[int]:
    """Validate a user-given bucket list: positive ints, strictly increasing."""
    out = list(buckets)
    if not out:
        raise MetadataError("buckets: empty list; capture at least one batch size", field="buckets")
    for i, bs in enumerate(out):
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            raise MetadataError(f"buckets[{i}] must be a positive int, got {bs!r}", field="buckets", row=i)
        if i and bs <= out[i - 1]:
            raise MetadataError(
                f"buckets must be strictly increasing: buckets[{i}]={bs} after {out[i - 1]}", field="buckets", row=i
            )
    return out
