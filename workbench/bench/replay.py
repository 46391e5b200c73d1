"""`workbench bench replay`: one layer step run eagerly vs replayed from its captured graph, per bucket.

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
from workbench.layers import GatedDeltaNetLayer, GDNConfig, Mamba2Config, Mamba2Layer
from workbench.measure.timing import Results, TimingError, compare, environment, time_fn
from workbench.pool import StatePool
from workbench.runner import GraphRunner

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
LAYERS = {"gdn": (GatedDeltaNetLayer, GDNConfig), "mamba2": (Mamba2Layer, Mamba2Config)}
# "small": the test layer (seconds on a CPU); "bench": a quarter-width engine layer (the state pool fits the
# CPU bench in a minute); "engine": engine-sized (a GPU)
PRESETS: dict[str, dict[str, Any]] = {
    "small": {"gdn": GDNConfig.small(), "mamba2": Mamba2Config.small()},
    "bench": {
        "gdn": GDNConfig(hidden_size=1024, num_v_heads=8, num_k_heads=4),
        "mamba2": Mamba2Config(hidden_size=1024, num_heads=16, n_groups=2),
    },
    "engine": {"gdn": GDNConfig(), "mamba2": Mamba2Config()},
}
MODES = ("eager", "replay")


def recorded_impl(impl: str, device: str) -> str:
    """The implementation ``impl`` runs as on ``device``, for the record: "auto" is the reference on the CPU
    and Triton on an accelerator (the kernels' own rule)."""
    if impl != "auto":
        return impl
    return "reference" if torch.device(device).type == "cpu" else "triton"


def _check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise TimingError(f"{name}: expected one of {list(choices)}, got {value!r}")


def sweep(
    batch_sizes: Sequence[int],
    *,
    impls: Sequence[str] = ("reference",),
    modes: Sequence[str] = MODES,
    layer: str = "gdn",
    preset: str = "small",
    device: str = "cpu",
    progress: bool = True,
    min_run_time: float = 0.1,
    config: Any = None,
    threads: int | None = None,
) -> Results:
    """Time a decode step of ``layer`` per batch size (each a captured bucket), per impl and mode.

    Records: ``what="<layer>_decode_step"``, ``shape={"bs": bs}``, ``impl`` the kernel implementation,
    ``mode`` "eager" | "replay". ``meta`` holds the layer config, the graph backend and the environment.
    ``config`` overrides the preset's layer config.
    """
    _check_choice("layer", layer, list(LAYERS))
    _check_choice("preset", preset, list(PRESETS))
    for m in modes:
        _check_choice("modes", m, MODES)
    sizes = sorted(set(batch_sizes))
    if not sizes or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in sizes):
        raise TimingError(f"batch_sizes: expected ints >= 1, got {list(batch_sizes)!r}")
    from tqdm.auto import tqdm

    layer_cls, _ = LAYERS[layer]
    cfg = config or PRESETS[preset][layer]
    num_slots = sizes[-1] + 2
    results = Results(meta={"benchmark": "replay", "layer": layer, "preset": preset, "config": dict(cfg.__dict__)})
    todo = [(impl, bs, mode) for impl in impls for bs in sizes for mode in modes]
    # None: tqdm keeps quiet where stderr is no terminal (logs, CI); a notebook still shows its bar
    bar = tqdm(total=len(todo), desc=f"replay sweep ({device})", disable=None if progress else True)
    for impl in impls:
        pool = StatePool(num_slots, "sglang", device=device)
        lay: Any = layer_cls(cfg, seed=0, device=device, impl=impl)
        runner = GraphRunner(
            lay, pool, buckets=sizes, modes=["decode"], backend="auto", state=lay.new_state(num_slots, seed=1)
        )
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


def print_table(results: Results) -> None:
    """Eager and replay medians per batch size and the speed-up, one impl after the other."""
    print(f"{'impl':<10}{'bs':>5}{'eager us':>11}{'IQR':>8}{'replay us':>11}{'IQR':>8}{'speedup':>9}")
    for impl in sorted({r.impl for r in results}):
        for bs in sorted({r.shape["bs"] for r in results}):
            sel = results.filter(impl=impl, bs=bs)
            e, r = sel.filter(mode="eager"), sel.filter(mode="replay")
            if not (len(e) and len(r)):
                continue
            sp = compare(e[0], r[0])
            print(
                f"{impl:<10}{bs:5d}{e[0].median_us:11.1f}{e[0].iqr_us:8.1f}{r[0].median_us:11.1f}{r[0].iqr_us:8.1f}"
                f"{sp:8.2f}x"
            )


def run(
    quick: bool = False,
    json_path: str | None = None,
    device: str = "cpu",
    config: GDNConfig | None = None,
    impl: str = "auto",
    progress: bool = True,
) -> Results:
    """The `bench replay` command: sweep the buckets, print a table, write JSON when ``json_path`` is given."""
    buckets = list(BUCKETS[:4] if quick else BUCKETS)
    res = sweep(
        buckets,
        impls=(impl,),
        preset="small" if quick else "bench",
        device=device,
        progress=progress,
        min_run_time=0.05 if quick else 0.3,
        config=config,
    )
    res.meta["quick"] = quick
    cfg = res.meta["config"]
    print(f"backend={res.meta['graph_backend']} hidden={cfg['hidden_size']} HV={cfg['num_v_heads']}")
    print_table(res)
    if json_path:
        print(f"wrote {res.save(json_path)}")
    return res
