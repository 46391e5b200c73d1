"""Capture bucket lists and the bucket choice at replay time.

An engine captures one graph per batch size in a fixed list; at run time a batch of ``raw_bs`` requests is
padded up to the smallest captured size that holds it (bisect-left). A batch larger than the largest bucket
runs eagerly: it is never truncated.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from workbench.errors import MetadataError


def _clip(sizes: list[int], max_bs: int) -> list[int]:
    kept = sorted({bs for bs in sizes if 1 <= bs <= max_bs})
    if not kept or kept[-1] != max_bs:
        kept.append(max_bs)  # engines always capture max_bs itself
    return kept


def sglang_buckets(max_bs: int, speculative: bool = False) -> list[int]:
    """sglang's default capture list, clipped to ``max_bs`` with ``max_bs`` appended."""
    if speculative:
        sizes = (
            list(range(1, 9))
            + list(range(10, 33, 2))
            + list(range(40, 65, 4))
            + list(range(72, 257, 8))
            + list(range(272, max_bs + 1, 16))
        )
    else:
        sizes = (
            [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
        )
    return _clip(sizes, max_bs)


def vllm_buckets(max_bs: int, speculative: bool = False) -> list[int]:
    """vLLM's default cudagraph capture sizes (1, 2, 4, then every 8 to 256, then every 16), clipped."""
    sizes = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, max_bs + 1, 16))
    return _clip(sizes, max_bs)


def capture_buckets(max_bs: int, speculative: bool = False, profile: str | None = None) -> list[int]:
    """The engine default capture list for ``max_bs``; sglang's unless ``profile`` has its own.

    >>> capture_buckets(20)
    [1, 2, 4, 8, 12, 16, 20]
    """
    if isinstance(max_bs, bool) or not isinstance(max_bs, int) or max_bs < 1:
        raise MetadataError(f"max_bs must be a positive int, got {max_bs!r}")
    if profile is None:
        return sglang_buckets(max_bs, speculative)
    from workbench.profiles import get_profile

    return get_profile(profile).buckets(max_bs, speculative)


def choose_bucket(raw_bs: int, buckets: Sequence[int]) -> int | None:
    """Smallest bucket ``>= raw_bs`` (bisect-left), or None when the batch is above the largest bucket."""
    i = bisect.bisect_left(buckets, raw_bs)
    return buckets[i] if i < len(buckets) else None


def check_buckets(buckets: Sequence[int]) -> list[int]:
    """Validate a user-given bucket list: positive ints, strictly increasing."""
    out = list(buckets)
    if not out:
        raise MetadataError("buckets: empty list; capture at least one batch size")
    for i, bs in enumerate(out):
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            raise MetadataError(f"buckets[{i}] must be a positive int, got {bs!r}")
        if i and bs <= out[i - 1]:
            raise MetadataError(f"buckets must be strictly increasing: buckets[{i}]={bs} after {out[i - 1]}")
    return out
