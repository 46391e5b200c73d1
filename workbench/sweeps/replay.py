"""One layer step run eagerly vs replayed from its captured graph, per bucket (``workbench bench replay``,
the report's timings and the timing dashboard all run this sweep).

Eager means what an engine does without graphs: build fresh metadata for the batch, then run the layer.
Replay means: write the metadata in place, copy the inputs into the static buffer, replay the graph.
On the CPU the "graph" is the recorder, which re-runs the recorded ops from Python: it removes the layer's
host logic and the metadata build, not kernel launches, so expect modest gains there; on a GPU the
difference is launch overhead (see benchmarks/gpu_replay.py).

    >>> res = sweep([1, 2], min_run_time=0.01, progress=False)
    >>> sorted({(r.mode, r.shape["bs"]) for r in res})
    [('eager', 1), ('eager', 2), ('replay', 1), ('replay', 2)]
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch

from workbench.batch import Batch
from workbench.layer_names import DEFAULT_LAYER
from workbench.layers import LAYERS
from workbench.measure.timing import Results, TimingError, environment, time_fn
from workbench.pool import StatePool
from workbench.runner import GraphRunner
from workbench.sweeps.common import PRESET_NAMES, check_choice, recorded_impl

# the layer config of each preset, per layer (see workbench.sweeps.common for what the names mean): the
# registry's, for every layer that has the preset
PRESETS: dict[str, dict[str, Any]] = {
    preset: {name: spec.config(preset) for name, spec in LAYERS.items() if preset in spec.presets}
    for preset in PRESET_NAMES
}
MODES = ("eager", "replay")


def sweep(
    batch_sizes: Sequence[int],
    *,
    impls: Sequence[str] = ("reference",),
    modes: Sequence[str] = MODES,
    layer: str = DEFAULT_LAYER,
    preset: str = "small",
    device: str = "cpu",
    progress: bool = True,
    min_run_time: float = 0.1,
    config: Any = None,
    threads: int | None = None,
) -> Results:
    """Time a decode step of ``layer`` per batch size (each a captured bucket), per impl and mode.

    Records: ``what="<layer>_decode_step"``, ``shape={"bs": bs}``, ``impl`` the kernel implementation that
    ran (``recorded_impl``), ``mode`` "eager" | "replay"; inputs are float32 ``[bs, hidden]``. ``meta``
    holds the layer config, the graph backend and the environment. ``config`` overrides the preset's
    layer config.
    """
    check_choice("layer", layer, list(LAYERS))
    check_choice("preset", preset, list(PRESETS))
    for m in modes:
        check_choice("modes", m, MODES)
    sizes = sorted(set(batch_sizes))
    if not sizes or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in sizes):
        raise TimingError(f"batch_sizes: expected ints >= 1, got {list(batch_sizes)!r}")
    from tqdm.auto import tqdm

    spec = LAYERS[layer]
    cfg = config or spec.config(preset)
    num_slots = sizes[-1] + 2
    results = Results(meta={"benchmark": "replay", "layer": layer, "preset": preset, "config": dict(cfg.__dict__)})
    todo = [(impl, bs, mode) for impl in impls for bs in sizes for mode in modes]
    # None: tqdm keeps quiet where stderr is no terminal (logs, CI); a notebook still shows its bar
    bar = tqdm(total=len(todo), desc=f"replay sweep ({device})", disable=None if progress else True)
    for impl in impls:
        pool = StatePool(num_slots, "sglang", device=device)
        lay: Any = spec.make(config=cfg, seed=0, device=device, impl=impl, state_layout=pool.profile.state_layout)
        runner = GraphRunner(lay, pool, buckets=sizes, modes=["decode"], backend="auto", state_seed=1)
        if "replay" in modes:
            runner.capture(progress=False)
        results.meta["graph_backend"] = runner.graph_backend.name
        rows = pool.alloc(sizes[-1])
        for bs in sizes:
            batch = Batch.decode(rows[:bs], [100] * bs, device=device)
            x = torch.randn(bs, cfg.hidden_size, device=device)
            for mode in modes:
                step = partial(runner.eager if mode == "eager" else runner.replay, batch, x)
                rec = time_fn(
                    step,
                    what=f"{layer}_decode_step",
                    device=device,
                    shape={"bs": bs},
                    impl=recorded_impl(impl, device),
                    mode=mode,
                    min_run_time=min_run_time,
                    threads=threads,
                )
                results.append(rec)
                bar.update(1)
    bar.close()
    results.meta["environment"] = environment(device)
    return results
