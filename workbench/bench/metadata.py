"""`workbench bench metadata`: in-place graph-mode metadata update vs the per-step sequence an engine ran.

The baseline is the replay-time sequence of sglang's linear-attention backend before the fused update:
fill the static inputs, mirror ``seq_lens`` to the host, count fill values there to find the padding,
zero the padded request rows, gather the slots (a fresh tensor), write the sentinel, copy it into the
graph's buffer, and patch ``query_start_loc`` by slice assignment.
"""

from __future__ import annotations

from functools import partial

import torch

from workbench.batch import Batch
from workbench.buckets import capture_buckets
from workbench.measure.legend import mark, print_legend
from workbench.measure.timing import Results, environment, ratio, time_fn
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


def print_table(res: Results) -> None:
    """Both updates' medians and IQRs per bucket and their ratio; a ``!`` flags a noisy median and a ratio
    built on one (``legend.mark``); a legend line per column ends the table."""
    print(f"{'bs':>5} {'raw_bs':>6} {'in-place us':>12} {'IQR':>8} {'engine-style us':>16} {'IQR':>8} {'ratio':>8}")
    ours = {r.shape["bs"]: r for r in res.filter(impl="in_place")}
    base = {r.shape["bs"]: r for r in res.filter(impl="engine_style")}
    for bs in sorted(ours.keys() & base.keys()):
        a, b = ours[bs], base[bs]
        print(
            f"{bs:5d} {a.shape['raw_bs']:6d} {a.median_us:12.2f}{mark(a)}{a.iqr_us:8.2f} {b.median_us:16.2f}{mark(b)}"
            f"{b.iqr_us:8.2f} {ratio(b, a):7.2f}x{mark(a, b)}"
        )
    print_legend(
        [
            "bs: the captured bucket; raw_bs: live rows, the smallest batch that still lands in bs (most padding)",
            "in-place us: MetadataBuffers.update, the bucket's static tensors written with tensor ops only",
            "engine-style us: the sequence sglang ran before the fused update (seq_lens mirrored to the host, "
            "padding counted there, a fresh gather, copies into the graph's buffers)",
            "IQR: interquartile range of the column before it, us",
            "ratio: engine-style us / in-place us (above 1: in place is faster)",
        ]
    )


def run(quick: bool = False, json_path: str | None = None, device: str = "cpu", progress: bool = True) -> Results:
    """Time both updates for each batch size; print a table; write JSON when ``json_path`` is given.

    Records: ``what="metadata_update"``, ``shape={"bs", "raw_bs"}``, ``impl`` "in_place" | "engine_style",
    ``mode="update"``; ``meta["threads"]``: torch's thread count of the run.
    """
    from tqdm.auto import tqdm

    sizes = SIZES[::3] if quick else SIZES
    buckets = capture_buckets(max(sizes))
    pool = StatePool(num_slots=max(sizes) + 1, profile="sglang", device=device)
    rows = pool.alloc(max(sizes))
    ours = MetadataBuffers(pool, "decode", buckets=buckets)
    base = EngineStyleUpdate(pool, buckets)
    min_time = 0.05 if quick else 0.3
    results = Results(
        meta={"benchmark": "metadata", "profile": "sglang", "quick": quick, "threads": torch.get_num_threads()}
    )
    # None: tqdm keeps quiet where stderr is no terminal (logs, CI); a notebook still shows its bar
    for bs in tqdm(sizes, desc=f"metadata bench ({device})", disable=None if progress else True):
        prev = [b for b in buckets if b < bs]
        raw = (prev[-1] + 1) if prev else bs  # the smallest batch that still lands in bucket bs
        perm = torch.randperm(max(sizes))[:raw]
        # seq_lens > fill value: the baseline would count a real row of length 1 as padding
        batch = Batch.decode(rows[perm], torch.randint(2, 4096, (raw,), dtype=torch.int32).tolist(), device=device)
        shape = {"bs": bs, "raw_bs": raw}
        timed = partial(
            time_fn, what="metadata_update", device=device, shape=shape, mode="update", min_run_time=min_time
        )
        t_ours = timed(partial(ours.update, batch), impl="in_place")
        t_base = timed(partial(base, batch, bs), impl="engine_style")
        results.append(t_ours)
        results.append(t_base)
    print_table(results)
    results.meta["environment"] = environment(device)
    if json_path:
        print(f"wrote {results.save(json_path)}")
    return results
