"""`workbench bench kernels`: ceilings, then each decode kernel at decode batch sizes with its copy floor.

The sweep itself is :func:`workbench.sweeps.kernels.sweep` (the report's roofline and the timing dashboard
run it too); this module picks the batch sizes and the preset, prints the table and saves the records.
"""

from __future__ import annotations

from workbench.measure.ceilings import measure_ceilings
from workbench.measure.legend import mark, print_legend
from workbench.measure.timing import Results, ratio
from workbench.sweeps.kernels import FLOOR_MODE, sweep

FULL_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUICK_BATCHES = (1, 8, 32)
QUICK_PRESET = "engine"  # the tests shrink it to "small"

__all__ = ["FULL_BATCHES", "QUICK_BATCHES", "QUICK_PRESET", "print_table", "run", "sweep"]


def print_table(res: Results) -> None:
    """Median, IQR, copy floor, ratio to the floor, GB/s and fraction of the copy ceiling per op and bs; a
    ``!`` flags a noisy median (``legend.mark``), a ``c`` a fraction whose bytes fit the last-level cache;
    a legend line per column ends the table."""
    from workbench.measure.ceilings import Ceilings

    ceil = Ceilings.from_dict(res.meta["ceilings"]) if res.meta.get("ceilings") else None
    floors = {r.key[:3]: r for r in res.filter(mode=FLOOR_MODE)}  # by (what, device, shape)
    nan = float("nan")
    print(f"{'op':<36}{'bs':>5}{'median us':>12} {'IQR us':>10}{'floor us':>11} {'ratio':>8} {'GB/s':>8}{'of copy':>9}")
    for r in res.filter(mode="kernel"):
        f = floors.get(r.key[:3])
        frac = ceil.fraction_of_copy(r) if ceil else None
        cached = "c" if ceil is not None and ceil.fits_cache(r) else " "
        print(
            f"{r.what:<36}{r.shape['bs']:>5}{r.median_us:>12.1f}{mark(r)}{r.iqr_us:>10.1f}"
            f"{f.median_us if f else nan:>11.1f}{mark(f)}{ratio(r, f) if f else nan:>8.2f}{mark(r, f)}"
            f"{r.gbps or 0:>8.2f}{frac if frac is not None else nan:>9.1%}{cached}"
        )
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


def run(quick: bool = False, json_path: str | None = None, device: str = "cpu", progress: bool = True) -> Results:
    """The `bench kernels` command: ceilings, then every decode op at decode batch sizes with its copy floor.

    Full: preset "engine" at bs 1..256, ``min_run_time`` 0.2 s, a 64 MiB copy and a 1024^2 matmul for the
    ceilings on the CPU (``measure_ceilings``' defaults). Quick: ``QUICK_PRESET`` at ``QUICK_BATCHES``,
    0.05 s, 3 repeats of the ceilings (the default copy size) and a 256^2 matmul. Prints a table; writes
    JSON when ``json_path`` is given. ``meta["ceilings"]`` holds the ceilings, ``meta["errors"]`` any op
    that failed.
    """
    if quick:
        # the default copy (past the last-level cache, or it would measure the cache) in fewer repeats
        ceil = measure_ceilings(device, matmul_n=256, min_run_time=0.05, repeats=3)
        res = sweep(QUICK_BATCHES, preset=QUICK_PRESET, device=device, progress=progress, min_run_time=0.05,
                    floors=True)  # fmt: skip
    else:
        ceil = measure_ceilings(device, min_run_time=0.2)
        res = sweep(FULL_BATCHES, preset="engine", device=device, progress=progress, min_run_time=0.2, floors=True)
    res.meta["ceilings"] = ceil.to_dict()
    res.meta["quick"] = quick
    print(repr(ceil))
    print_table(res)
    if json_path:
        print(f"wrote {res.save(json_path)}")
    return res
