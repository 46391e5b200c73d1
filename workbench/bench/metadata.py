"""`workbench bench metadata`: in-place graph-mode metadata update vs the per-step sequence an engine ran.

The baseline is the replay-time sequence of sglang's linear-attention backend before the fused update:
fill the static inputs, mirror ``seq_lens`` to the host, count fill values there to find the padding,
zero the padded request rows, gather the slots (a fresh tensor), write the sentinel, copy it into the
graph's buffer, and patch ``query_start_loc`` by slice assignment.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from workbench.batch import Batch
from workbench.buckets import capture_buckets
from workbench.measure.timing import time_callable, write_json
from workbench.metadata import MetadataBuffers
from workbench.pool import StatePool

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class EngineStyleUpdate:
    """The baseline sequence, on its own static buffers (same shapes as MetadataBuffers)."""

    def __init__(self, pool: StatePool, buckets: list[int]) -> None:
        self.pool = pool
        max_bs = buckets[-1]
        dev = pool.device
        self.fill = pool.profile.seq_len_fill
        self.seq_lens = torch.full((max_bs,), self.fill, dtype=torch.int32, device=dev)
        self.req_pool_indices = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.qsl_cache = torch.arange(0, max_bs + 1, dtype=torch.int32, device=dev)
        self.state_indices = {bs: torch.full((bs,), -1, dtype=torch.int32, device=dev) for bs in buckets}
        self.qsl = {bs: torch.zeros(bs + 1, dtype=torch.int32, device=dev) for bs in buckets}
        self.mapping = pool.mapping[:, 0]

    def __call__(self, batch: Batch, bs: int) -> None:
        r = batch.raw_batch_size
        if bs != r:
            self.seq_lens.fill_(self.fill)
            self.req_pool_indices.zero_()
        self.seq_lens[:r].copy_(batch.seq_lens)
        self.req_pool_indices[:r].copy_(batch.req_pool_indices)
        seq_lens_cpu = self.seq_lens[:bs].cpu()
        num_padding = int(torch.count_nonzero(seq_lens_cpu == self.fill))
        rpi = self.req_pool_indices[:bs]
        rpi[bs - num_padding :] = 0
        idx = self.mapping[rpi]
        idx[bs - num_padding :] = -1
        self.state_indices[bs].copy_(idx)
        qsl = self.qsl[bs]
        qsl.copy_(self.qsl_cache[: bs + 1])
        qsl[r + 1 :] = r


def run(quick: bool = False, json_path: str | None = None, device: str = "cpu") -> dict[str, Any]:
    """Time both updates for each batch size; print a table; write JSON when ``json_path`` is given."""
    sizes = SIZES[::3] if quick else SIZES
    buckets = capture_buckets(max(sizes))
    pool = StatePool(num_slots=max(sizes) + 1, profile="sglang", device=device)
    rows = pool.alloc(max(sizes))
    ours = MetadataBuffers(pool, "decode", buckets=buckets)
    base = EngineStyleUpdate(pool, buckets)
    min_time = 0.05 if quick else 0.3
    results = []
    print(f"{'bs':>5} {'raw_bs':>6} {'in-place us':>12} {'engine-style us':>16} {'ratio':>7}")
    for bs in sizes:
        prev = [b for b in buckets if b < bs]
        raw = (prev[-1] + 1) if prev else bs  # the smallest batch that still lands in bucket bs
        perm = torch.randperm(max(sizes))[:raw]
        # seq_lens > fill value: the baseline would count a real row of length 1 as padding
        batch = Batch.decode(rows[perm], torch.randint(2, 4096, (raw,), dtype=torch.int32).tolist(), device=device)
        t_ours = time_callable(partial(ours.update, batch), f"in-place bs={bs}", min_time)
        t_base = time_callable(partial(base, batch, bs), f"engine-style bs={bs}", min_time)
        ratio = t_base.median_us / t_ours.median_us
        results.append(
            {
                "bs": bs,
                "raw_bs": raw,
                "in_place": t_ours.to_dict(),
                "engine_style": t_base.to_dict(),
                "speedup": ratio,
            }
        )
        print(f"{bs:5d} {raw:6d} {t_ours.median_us:12.2f} {t_base.median_us:16.2f} {ratio:6.2f}x")
    payload = {"benchmark": "metadata", "device": device, "results": results}
    if json_path:
        write_json(json_path, payload)
        print(f"wrote {json_path}")
    return payload
