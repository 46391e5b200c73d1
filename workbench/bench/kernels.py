"""`workbench bench kernels`: ceilings, then each decode kernel at decode batch sizes with its copy floor.

The sweep itself is :func:`workbench.sweeps.kernels.sweep` (the report's roofline and the timing dashboard
run it too); this module picks the batch sizes and the preset, prints each case's line as soon as it is
measured (the full run takes minutes per op at bs 256 on a small CPU), then the whole table, and saves the
records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from workbench.measure.ceilings import Ceilings, measure_ceilings
from workbench.measure.legend import mark, print_legend
from workbench.measure.timing import Results, TimingRecord, ratio
from workbench.sweeps import kernels as kernel_sweep
from workbench.sweeps.kernels import FLOOR_MODE, sweep

FULL_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUICK_BATCHES = (1, 8, 32)
QUICK_PRESET = "engine"  # the tests shrink it to "small"

__all__ = ["FULL_BATCHES", "QUICK_BATCHES", "QUICK_PRESET", "print_table", "run", "sweep", "sweep_printing"]

COLUMNS = f"{'op':<36}{'bs':>5}{'median us':>12} {'IQR us':>10}{'floor us':>11} {'ratio':>8} {'GB/s':>8}{'of copy':>9}"


def format_row(r: TimingRecord, floor: TimingRecord | None, ceil: Ceilings | None) -> str:
    """One case's line of the table: ``r`` a kernel record, ``floor`` its copy floor (or None)."""
    nan = float("nan")
    frac = ceil.fraction_of_copy(r) if ceil else None
    cached = "c" if ceil is not None and ceil.fits_cache(r) else " "
    return (
        f"{r.what:<36}{r.shape['bs']:>5}{r.median_us:>12.1f}{mark(r)}{r.iqr_us:>10.1f}"
        f"{floor.median_us if floor else nan:>11.1f}{mark(floor)}{ratio(r, floor) if floor else nan:>8.2f}"
        f"{mark(r, floor)}{r.gbps or 0:>8.2f}{frac if frac is not None else nan:>9.1%}{cached}"
    )


def print_table(res: Results) -> None:
    """Median, IQR, copy floor, ratio to the floor, GB/s and fraction of the copy ceiling per op and bs; a
    ``!`` flags a noisy median (``legend.mark``), a ``c`` a fraction whose bytes fit the last-level cache;
    a legend line per column ends the table."""
    ceil = Ceilings.from_dict(res.meta["ceilings"]) if res.meta.get("ceilings") else None
    floors = {r.key[:3]: r for r in res.filter(mode=FLOOR_MODE)}  # by (what, device, shape)
    print(COLUMNS)
    for r in res.filter(mode="kernel"):
        print(format_row(r, floors.get(r.key[:3]), ceil))
    for op, err in res.meta.get("errors", {}).items():
        print(f"{op:<36} error: {err}")
    ceiling = f"the copy ceiling, {ceil.copy_text()}" if ceil else "the copy ceiling (none recorded: nan)"
    cache = f"the {ceil.cache_text()}" if ceil and ceil.cache_bytes else "the last-level cache"
    print_legend(
        [
            "floor us: one dst.copy_(src) of the same state bytes (read + write), the least a step that moves its "
            "state can take",
            "ratio: median / floor us (1.00: as fast as copying the state; nan without a floor)",
            "GB/s: the bytes the op must move (its cost model, kernels/*/cost.py) over its median",
            f"of copy: GB/s over {ceiling}",
            f"c after of copy: the bytes fit {cache}; back-to-back calls read them from it, so above 100% is possible",
        ]
    )


def sweep_printing(
    batch_sizes: Sequence[int], ceil: Ceilings | None, *, preset: str, device: str, min_run_time: float
) -> Results:
    """:func:`sweep` with floors, one case (op, bs) at a time, each case's line printed (and flushed) as soon
    as it is measured; an op that fails prints its error and is skipped at the larger sizes, as the sweep
    does. Returns the records and meta of one whole sweep."""
    ops = kernel_sweep.DECODE_OPS  # read at call time: a test narrows the list
    out: Results | None = None
    variants: dict[str, Any] = {}
    print(COLUMNS, flush=True)
    for op in ops:
        for bs in batch_sizes:
            part = sweep([bs], ops=[op], preset=preset, device=device, progress=False, min_run_time=min_run_time,
                         floors=True)  # fmt: skip
            variants.update(part.meta["variants"])
            if out is None:
                out = Results(meta=dict(part.meta, errors={}))
            out.records.extend(part.records)
            kernel = next(iter(part.filter(mode="kernel")), None)
            if kernel is not None:
                print(format_row(kernel, next(iter(part.filter(mode=FLOOR_MODE)), None), ceil), flush=True)
            for what, err in part.meta["errors"].items():
                out.meta["errors"][what] = err
                print(f"{what:<36}{bs:>5} error: {err}", flush=True)
            if part.meta["errors"]:
                break  # the op is broken: its larger sizes would only fail again
    if out is None:
        raise ValueError(f"sweep_printing: no cases (ops {list(ops)}, batch sizes {list(batch_sizes)})")
    out.meta["variants"] = variants
    out.meta["environment"] = part.meta["environment"]  # the load average at the end of the run, as sweep()
    return out


def run(quick: bool = False, json_path: str | None = None, device: str = "cpu", progress: bool = True) -> Results:
    """The `bench kernels` command: ceilings, then every decode op at decode batch sizes with its copy floor.

    Full: preset "engine" at bs 1..256, ``min_run_time`` 0.2 s, a 64 MiB copy and a 1024^2 matmul for the
    ceilings on the CPU (``measure_ceilings``' defaults). Quick: ``QUICK_PRESET`` at ``QUICK_BATCHES``,
    0.05 s, 3 repeats of the ceilings (the default copy size) and a 256^2 matmul. Prints the ceilings, then
    each case's line as it is measured (``progress``; else nothing until the end), then the whole table;
    writes JSON when ``json_path`` is given. ``meta["ceilings"]`` holds the ceilings, ``meta["errors"]`` any op
    that failed, ``meta["threads"]`` torch's thread count of the run.
    """
    sizes: Sequence[int]
    if quick:
        # the default copy (past the last-level cache, or it would measure the cache) in fewer repeats
        ceil = measure_ceilings(device, matmul_n=256, min_run_time=0.05, repeats=3)
        sizes, preset, min_run_time = QUICK_BATCHES, QUICK_PRESET, 0.05
    else:
        ceil = measure_ceilings(device, min_run_time=0.2)
        sizes, preset, min_run_time = FULL_BATCHES, "engine", 0.2
    print(repr(ceil), flush=True)
    if progress:
        res = sweep_printing(sizes, ceil, preset=preset, device=device, min_run_time=min_run_time)
        print()
    else:
        res = sweep(sizes, preset=preset, device=device, progress=False, min_run_time=min_run_time, floors=True)
    res.meta["ceilings"] = ceil.to_dict()
    res.meta["quick"] = quick
    res.meta["threads"] = torch.get_num_threads()
    print_table(res)
    if json_path:
        print(f"wrote {res.save(json_path)}")
    return res
