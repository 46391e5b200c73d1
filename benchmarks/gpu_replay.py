"""Gated DeltaNet decode step on a lent GPU: graph replay vs eager, per bucket, after integrity checks.

    python benchmarks/gpu_replay.py [--quick] [--out PATH]     # one NVIDIA GPU, about 1 min
    python benchmarks/gpu_replay.py --dry-run                   # the same code paths on the CPU (tiny layer)

1. Checks: ``GraphRunner.compare`` at a few batch sizes (replay against the float64 reference: foreign
   slots unchanged, live rows within tolerance, padded outputs zero; on the CPU recorder also bitwise
   equal to a padded eager step), and the sync-free eager step against the runner's eager step.
2. Timing, per bucket (raw batch = bucket), with ``workbench.measure.timing.time_fn`` (CUDA events around
   each step, L2 warm; ``torch.utils.benchmark`` on the CPU), one record per mode:
   - ``mode="eager"``: ``GraphRunner.eager``, engine-style: fresh metadata each step, with host reads
     (``.tolist()``, a device-to-host sync per step), as an engine's eager path may do; the same mode as
     ``workbench bench replay``'s.
   - ``mode="eager-no-sync"``: the step launched eagerly with its metadata written in place into the
     bucket's static buffers, as replay does: no host sync in the step. The honest baseline for the graph.
   - ``mode="replay"``: in-place metadata update + graph replay.
   The device is named ``"cuda"`` on purpose: pool, layer and batches normalise it to ``cuda:0``.

Writes one ``workbench.measure.timing.Results`` (``Results.load`` reads it; ``meta["checks"]`` holds the
checks) to benchmarks/results/gpu_replay_<device type>.json (dry run: gpu_replay_dryrun_cpu.json). Exit
status: 0 when every check passed, 1 when any failed (timings are still written), 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[1]
WHAT = "gdn_decode_step"  # as workbench.sweeps.replay names the layer step
MODES = {
    "eager": "engine-style eager step (GraphRunner.eager): fresh metadata with host reads, a device-to-host sync",
    "eager-no-sync": "eager step, metadata written in place into the bucket's buffers (no host sync)",
    "replay": "in-place metadata update + graph replay",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="buckets up to 32")
    ap.add_argument("--dry-run", action="store_true", help="CPU recorder + Triton interpreter, tiny layer")
    ap.add_argument("--min-run-time", type=float, default=0.1, help="seconds of timed steps per measurement")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/gpu_replay_<device>.json)")
    return ap.parse_args(argv)


def integrity_checks(runner: Any, rows: torch.Tensor, inputs: Any, top: int, device: str) -> list[dict[str, Any]]:
    """``GraphRunner.compare`` at one row, three rows and one below the largest bucket ``top``."""
    from workbench import Batch
    from workbench.measure.timing import json_safe

    checks = []
    for raw in sorted({1, min(3, top), top - 1} - {0}):
        cmp = runner.compare(Batch.decode(rows[:raw], [50] * raw, device=device), inputs(raw))
        checks.append(json_safe({"check": f"compare raw_bs={raw}", **cmp.to_dict()}))
        print(f"check raw_bs={raw}: bucket={cmp.bucket} ok={cmp.ok} integrity_ok={cmp.integrity.ok} "
              f"max_diff={cmp.max_output_diff:.3g}")  # fmt: skip
    return checks


def sync_free_check(runner: Any, eager_no_sync: Any, batch: Any, x: Any) -> dict[str, Any]:
    """The sync-free eager step gives what ``runner.eager`` gives, from the same state."""
    import torch

    from workbench.measure.timing import json_safe

    saved = runner.state.clone()
    want = runner.eager(batch, x).output.clone()
    for k, t in runner.state.tensors().items():  # back to the state before, for the same step again
        t.copy_(saved.tensors()[k])
    got = eager_no_sync(batch, x)
    diff = float((got - want).abs().max())
    same = bool(torch.allclose(got, want, atol=1e-4, rtol=1e-4))
    print(f"check sync-free eager vs runner.eager bs={batch.raw_batch_size}: ok={same} max_diff={diff:.3g}")
    label = f"sync-free eager == runner.eager bs={batch.raw_batch_size}"
    return json_safe({"check": label, "ok": same, "max_output_diff": diff})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    sys.path.insert(0, str(REPO))
    import torch

    from workbench import Batch, StatePool
    from workbench.layers import GatedDeltaNetLayer, GDNConfig
    from workbench.measure.timing import Results, environment, ratio, time_fn
    from workbench.runner import GraphRunner

    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: this script is for a lent GPU (use --dry-run for the CPU run)", file=sys.stderr)
        return 2
    if args.out and not Path(args.out).parent.is_dir():
        print(f"--out: folder {str(Path(args.out).parent)!r} does not exist (create it first)", file=sys.stderr)
        return 2
    name = "cpu" if args.dry_run else "cuda"  # not "cuda:0": the workbench must normalise it
    if args.dry_run:  # the interpreter's times mean nothing: each timing path a few calls
        buckets, config, min_run_time = [1, 2], GDNConfig.small(), 1e-3
    else:
        buckets = [1, 2, 4, 8, 16, 32] if args.quick else [1, 2, 4, 8, 16, 32, 64, 128, 256]
        config, min_run_time = GDNConfig(), args.min_run_time  # engine-like: hidden 2048, H 16, HV 32, K = V = 128
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

    checks = integrity_checks(runner, rows, inputs, buckets[-1], name)
    bs = buckets[-1]
    checks.append(sync_free_check(runner, eager_no_sync, Batch.decode(rows[:bs], [60] * bs, device=name), inputs(bs)))

    res = Results(meta={
        "benchmark": "gpu_replay", "dry_run": args.dry_run, "environment": environment(str(dev)),
        "graph_backend": runner.graph_backend.name, "modes": MODES, "config": dict(config.__dict__),
        "min_run_time": min_run_time, "checks": checks,
    })  # fmt: skip
    steps = {"eager": runner.eager, "eager-no-sync": eager_no_sync, "replay": runner.replay}
    print(f"{'bs':>4} {'eager us':>10} {'no-sync us':>11} {'replay us':>10} {'vs eager':>9} {'vs no-sync':>11}")
    for bs in buckets:
        batch, x = Batch.decode(rows[:bs], [100] * bs, device=name), inputs(bs)
        recs = {
            mode: time_fn(
                partial(step, batch, x),
                what=WHAT,
                device=str(dev),
                shape={"bs": bs},
                impl="triton",
                mode=mode,
                min_run_time=min_run_time,
            )  # fmt: skip
            for mode, step in steps.items()
        }
        for rec in recs.values():
            res.append(rec)
        e, n, r = recs["eager"], recs["eager-no-sync"], recs["replay"]
        print(f"{bs:4d} {e.median_us:10.1f} {n.median_us:11.1f} {r.median_us:10.1f} {ratio(e, r):8.2f}x "
              f"{ratio(n, r):10.2f}x")  # fmt: skip
    ok = all(c["ok"] for c in checks)
    res.meta["checks_ok"] = ok
    default = f"gpu_replay_dryrun_{dev.type}.json" if args.dry_run else f"gpu_replay_{dev.type}.json"
    out = Path(args.out or REPO / "benchmarks" / "results" / default)
    out.parent.mkdir(exist_ok=True)  # the default folder; a given --out's folder was checked before the run
    res.save(out)
    print(f"checks ok: {ok}  wrote {len(res)} records to {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
