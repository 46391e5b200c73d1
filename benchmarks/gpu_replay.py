"""GPU check for a lent machine: Gated DeltaNet layer step, eager vs CUDA-graph replay, per bucket.

One self-contained run (installs nothing): checks replay against eager and the float64 reference at a few
batch sizes, then times eager and replay steps (median of CUDA-event timings) for every bucket and writes
benchmarks/results/gpu_replay.json. Target from the issue: replay >= 5x faster than eager at bs=1.

    python benchmarks/gpu_replay.py [--quick] [--out benchmarks/results/gpu_replay.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from workbench import Batch, StatePool
from workbench.layers import GatedDeltaNetLayer, GDNConfig
from workbench.measure.timing import write_json
from workbench.runner import GraphRunner


def cuda_median_us(fn, iters: int = 50, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/gpu_replay.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this script is for a lent GPU", file=sys.stderr)
        return 2
    dev = "cuda"
    buckets = [1, 2, 4, 8, 16, 32] if args.quick else [1, 2, 4, 8, 16, 32, 64, 128, 256]
    config = GDNConfig()  # engine-like: hidden 2048, H 16, HV 32, K = V = 128
    num_slots = buckets[-1] + 2
    pool = StatePool(num_slots, "sglang", device=dev)
    layer = GatedDeltaNetLayer(config, seed=0, device=dev, dtype=torch.float32, impl="triton")
    runner = GraphRunner(
        layer, pool, buckets=buckets, modes=["decode"], backend="cuda", state=layer.new_state(num_slots, seed=1)
    )
    runner.capture(progress=False)
    rows = pool.alloc(buckets[-1])

    checks = []
    for raw in (1, 3, buckets[-1] - 1):
        cmp = runner.compare(
            Batch.decode(rows[:raw], [50] * raw, device=dev), torch.randn(raw, config.hidden_size, device=dev)
        )
        checks.append({"raw_bs": raw, **cmp.to_dict()})
        print(
            f"check raw_bs={raw}: bucket={cmp.bucket} integrity_ok={cmp.integrity.ok} "
            f"max_diff={cmp.max_output_diff:.3g}"
        )

    results = []
    print(f"{'bs':>4} {'eager us':>10} {'replay us':>10} {'speedup':>8}")
    for bs in buckets:
        batch = Batch.decode(rows[:bs], [100] * bs, device=dev)
        x = torch.randn(bs, config.hidden_size, device=dev)
        eager = cuda_median_us(lambda b=batch, x=x: runner.eager(b, x))
        replay = cuda_median_us(lambda b=batch, x=x: runner.replay(b, x))
        results.append({"bs": bs, "eager_us": eager, "replay_us": replay, "speedup": eager / replay})
        print(f"{bs:4d} {eager:10.1f} {replay:10.1f} {eager / replay:7.2f}x")
    write_json(args.out, {"benchmark": "gpu_replay", "config": config.__dict__, "checks": checks, "results": results})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
