"""Gated DeltaNet decode step on a lent GPU: graph replay vs eager, per bucket, after integrity checks.

    python benchmarks/gpu_replay.py [--quick] [--out PATH]     # one NVIDIA GPU, ~1 min
    python benchmarks/gpu_replay.py --dry-run                   # the same code paths on the CPU (tiny layer)

1. Checks: ``GraphRunner.compare`` at a few batch sizes (replay against the float64 reference: foreign
   slots unchanged, live rows within tolerance, padded outputs zero; on the CPU recorder also bitwise
   equal to a padded eager step), and the sync-free eager step against the runner's eager step.
2. Timing, per bucket (raw batch = bucket), median of CUDA-event times around one step:
   - ``eager_us``: the step launched eagerly with its metadata written in place into the bucket's static
     buffers, as replay does: no host sync in the step. The honest baseline for the graph.
   - ``eager_sync_us`` (labelled "engine-style"): ``GraphRunner.eager``, which builds fresh metadata each
     step with host reads (``.tolist()``), a device-to-host sync per step, as an engine's eager path may.
   - ``replay_us``: metadata update + graph replay.
   The device is named ``"cuda"`` on purpose: pool, layer and batches normalise it to ``cuda:0``.

Writes benchmarks/results/gpu_replay_<device type>.json (dry run: gpu_replay_dryrun_cpu.json). Exit status:
0 when every check passed, 1 when any failed (timings are still written), 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="buckets up to 32")
    ap.add_argument("--dry-run", action="store_true", help="CPU recorder + Triton interpreter, tiny layer")
    ap.add_argument("--iters", type=int, default=50, help="timed steps per measurement")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/gpu_replay_<device>.json)")
    return ap.parse_args(argv)


def median_us(torch: Any, dev: Any, fn: Callable[[], Any], iters: int) -> float:
    """Median time of one fn() call: CUDA events around each call on a GPU (the device timeline, launch
    gaps included), perf_counter on the CPU."""
    for _ in range(min(iters, 3)):  # warm-up
        fn()
    times = []
    for _ in range(iters):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    sys.path.insert(0, str(REPO))
    import torch

    from workbench import Batch, StatePool
    from workbench.layers import GatedDeltaNetLayer, GDNConfig
    from workbench.runner import GraphRunner

    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: this script is for a lent GPU (use --dry-run for the CPU run)", file=sys.stderr)
        return 2
    if args.out and not Path(args.out).parent.is_dir():
        print(f"--out: folder {str(Path(args.out).parent)!r} does not exist (create it first)", file=sys.stderr)
        return 2
    name = "cpu" if args.dry_run else "cuda"  # not "cuda:0": the workbench must normalise it
    if args.dry_run:
        buckets, config, iters = [1, 2], GDNConfig.small(), 1  # the interpreter's times mean nothing
    else:
        buckets = [1, 2, 4, 8, 16, 32] if args.quick else [1, 2, 4, 8, 16, 32, 64, 128, 256]
        config, iters = GDNConfig(), args.iters  # engine-like: hidden 2048, H 16, HV 32, K = V = 128
    num_slots = buckets[-1] + 2
    pool = StatePool(num_slots, "sglang", device=name)
    dev = pool.device
    layer = GatedDeltaNetLayer(config, seed=0, device=name, dtype=torch.float32, impl="triton")
    runner = GraphRunner(
        layer, pool, buckets=buckets, modes=["decode"], backend="auto", state=layer.new_state(num_slots, seed=1)
    )
    runner.capture(progress=False)
    rows = pool.alloc(buckets[-1])
    gen = torch.Generator().manual_seed(0)

    def inputs(n: int) -> torch.Tensor:
        return torch.randn(n, config.hidden_size, generator=gen).to(dev)

    def eager_no_sync(batch: Batch, x: torch.Tensor) -> torch.Tensor:
        """The step as replay runs it (metadata written in place into the bucket's buffers), launched eagerly."""
        meta = runner.meta_backend.init_forward_metadata_out_graph(batch)
        runner.meta_backend.init_forward_metadata_in_graph(batch)
        return runner.layer.forward(x, meta, runner.state, None)

    checks: list[dict[str, Any]] = []
    for raw in sorted({1, min(3, buckets[-1]), buckets[-1] - 1} - {0}):
        cmp = runner.compare(Batch.decode(rows[:raw], [50] * raw, device=name), inputs(raw))
        checks.append({"check": f"compare raw_bs={raw}", **cmp.to_dict()})
        print(f"check raw_bs={raw}: bucket={cmp.bucket} ok={cmp.ok} integrity_ok={cmp.integrity.ok} "
              f"max_diff={cmp.max_output_diff:.3g}")  # fmt: skip
    bs = buckets[-1]
    batch, x = Batch.decode(rows[:bs], [60] * bs, device=name), inputs(bs)
    saved = runner.state.clone()
    want = runner.eager(batch, x).output.clone()
    for k, t in runner.state.tensors().items():  # back to the state before, for the same step again
        t.copy_(saved.tensors()[k])
    got = eager_no_sync(batch, x)
    diff = float((got - want).abs().max())
    same = bool(torch.allclose(got, want, atol=1e-4, rtol=1e-4))
    checks.append({"check": f"sync-free eager == runner.eager bs={bs}", "ok": same, "max_output_diff": diff})
    print(f"check sync-free eager vs runner.eager bs={bs}: ok={same} max_diff={diff:.3g}")

    results = []
    print(f"{'bs':>4} {'eager us':>10} {'eager+sync us':>14} {'replay us':>10} {'speedup':>8} {'vs sync':>8}")
    for bs in buckets:
        batch, x = Batch.decode(rows[:bs], [100] * bs, device=name), inputs(bs)
        eager = median_us(torch, dev, lambda b=batch, x=x: eager_no_sync(b, x), iters)
        eager_sync = median_us(torch, dev, lambda b=batch, x=x: runner.eager(b, x), iters)
        replay = median_us(torch, dev, lambda b=batch, x=x: runner.replay(b, x), iters)
        results.append(dict(bs=bs, eager_us=eager, eager_sync_us=eager_sync, replay_us=replay,
                            speedup=eager / replay, speedup_vs_sync=eager_sync / replay))  # fmt: skip
        print(f"{bs:4d} {eager:10.1f} {eager_sync:14.1f} {replay:10.1f} {eager / replay:7.2f}x "
              f"{eager_sync / replay:7.2f}x")  # fmt: skip
    ok = all(c["ok"] for c in checks)
    payload = {
        "benchmark": "gpu_replay",
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (TRITON_INTERPRET=1)",
        "backend": runner.graph_backend.name,
        "dry_run": args.dry_run,
        "torch": torch.__version__,
        "columns": {
            "eager_us": "eager step, metadata written in place (no host sync)",
            "eager_sync_us": "engine-style eager step: fresh metadata with host reads (a device-to-host sync)",
            "replay_us": "in-place metadata update + graph replay",
        },
        "config": config.__dict__,
        "checks_ok": ok,
        "checks": checks,
        "results": results,
    }
    default = f"gpu_replay_dryrun_{dev.type}.json" if args.dry_run else f"gpu_replay_{dev.type}.json"
    out = Path(args.out or REPO / "benchmarks" / "results" / default)
    out.parent.mkdir(exist_ok=True)  # the default folder; a given --out's folder was checked before the run
    out.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(f"checks ok: {ok}  wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
