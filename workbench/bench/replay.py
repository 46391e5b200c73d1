"""`workbench bench replay`: one layer step run eagerly vs replayed from its captured graph, per bucket.

Eager means what an engine does without graphs: build fresh metadata for the batch, then run the layer.
Replay means: write the metadata in place, copy the inputs into the static buffer, replay the graph.
On the CPU the "graph" is the recorder, which re-runs the recorded ops from Python: it removes the layer's
host logic and the metadata build, not kernel launches, so expect modest gains there; on a GPU the
difference is launch overhead (see benchmarks/gpu_replay.py).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from workbench.batch import Batch
from workbench.layers import GatedDeltaNetLayer, GDNConfig
from workbench.measure.timing import time_callable, write_json
from workbench.pool import StatePool
from workbench.runner import GraphRunner

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def run(
    quick: bool = False,
    json_path: str | None = None,
    device: str = "cpu",
    config: GDNConfig | None = None,
    impl: str = "auto",
) -> dict[str, Any]:
    """Time eager vs replay of a Gated DeltaNet decode step for each bucket; print and write JSON."""
    buckets = list(BUCKETS[:4] if quick else BUCKETS)
    # a quarter-width engine layer on the CPU: same structure, a state pool that fits the bench in seconds
    config = config or (GDNConfig.small() if quick else GDNConfig(hidden_size=1024, num_v_heads=8, num_k_heads=4))
    num_slots = buckets[-1] + 2
    pool = StatePool(num_slots, "sglang", device=device)
    layer = GatedDeltaNetLayer(config, seed=0, device=device, impl=impl)
    runner = GraphRunner(
        layer, pool, buckets=buckets, modes=["decode"], backend="auto", state=layer.new_state(num_slots, seed=1)
    )
    runner.capture(progress=False)
    rows = pool.alloc(buckets[-1])
    min_time = 0.05 if quick else 0.3
    results = []
    print(
        f"backend={runner.graph_backend.name} hidden={config.hidden_size} HV={config.num_v_heads} K={config.head_k_dim}"
    )
    print(f"{'bs':>4} {'eager us':>10} {'replay us':>10} {'speedup':>8}")
    for bs in buckets:
        batch = Batch.decode(rows[:bs], [100] * bs, device=device)
        x = torch.randn(bs, config.hidden_size, device=device)
        t_eager = time_callable(partial(runner.eager, batch, x), f"eager bs={bs}", min_time)
        t_replay = time_callable(partial(runner.replay, batch, x), f"replay bs={bs}", min_time)
        speedup = t_eager.median_us / t_replay.median_us
        results.append({"bs": bs, "eager": t_eager.to_dict(), "replay": t_replay.to_dict(), "speedup": speedup})
        print(f"{bs:4d} {t_eager.median_us:10.1f} {t_replay.median_us:10.1f} {speedup:7.2f}x")
    payload = {
        "benchmark": "replay",
        "device": device,
        "backend": runner.graph_backend.name,
        "layer": "GatedDeltaNet",
        "config": config.__dict__,
        "results": results,
    }
    if json_path:
        write_json(json_path, payload)
        print(f"wrote {json_path}")
    return payload
