"""`workbench bench replay`: one layer step run eagerly vs replayed from its captured graph, per bucket.

The sweep itself is :func:`workbench.sweeps.replay.sweep` (the report and the timing dashboard run it too);
this module picks the buckets and the preset, prints the table and saves the records.
"""

from __future__ import annotations

import torch

from workbench.layers import GDNConfig
from workbench.measure.legend import mark, print_legend
from workbench.measure.timing import Results, ratio
from workbench.sweeps.replay import sweep

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def print_table(results: Results) -> None:
    """Eager and replay medians per batch size and the speed-up, one impl after the other; a ``!`` flags a
    noisy median and a speed-up built on one (``legend.mark``); a legend line per column ends the table."""
    print(f"{'impl':<10}{'bs':>5}{'eager us':>11} {'IQR':>8}{'replay us':>11} {'IQR':>8}{'speedup':>9}")
    for impl in sorted({r.impl for r in results}):
        for bs in sorted({r.shape["bs"] for r in results}):
            sel = results.filter(impl=impl, bs=bs)
            e, r = sel.filter(mode="eager"), sel.filter(mode="replay")
            if not (len(e) and len(r)):
                continue
            sp = ratio(e[0], r[0])
            print(
                f"{impl:<10}{bs:5d}{e[0].median_us:11.1f}{mark(e[0])}{e[0].iqr_us:8.1f}{r[0].median_us:11.1f}"
                f"{mark(r[0])}{r[0].iqr_us:8.1f}{sp:8.2f}x{mark(e[0], r[0])}"
            )
    print_legend(
        [
            "bs: the captured bucket the batch fills; impl: the kernels' implementation",
            "eager us: build the step's metadata afresh, then run the layer step, as without graphs",
            "replay us: write the metadata into the bucket's buffers in place, then replay the captured graph",
            "IQR: interquartile range of the column before it, us",
            "speedup: eager us / replay us (above 1: replay is faster)",
        ]
    )


def run(
    quick: bool = False,
    json_path: str | None = None,
    device: str = "cpu",
    config: GDNConfig | None = None,
    impl: str = "auto",
    progress: bool = True,
) -> Results:
    """The `bench replay` command: sweep the buckets (preset "small" when ``quick``, else "quarter"), print a
    table, write JSON when ``json_path`` is given (``meta["threads"]``: torch's thread count of the run)."""
    buckets = list(BUCKETS[:4] if quick else BUCKETS)
    res = sweep(
        buckets,
        impls=(impl,),
        preset="small" if quick else "quarter",
        device=device,
        progress=progress,
        min_run_time=0.05 if quick else 0.3,
        config=config,
    )
    res.meta["quick"] = quick
    res.meta["threads"] = torch.get_num_threads()
    cfg = res.meta["config"]
    print(f"backend={res.meta['graph_backend']} hidden={cfg['hidden_size']} HV={cfg['num_v_heads']}")
    print_table(res)
    if json_path:
        print(f"wrote {res.save(json_path)}")
    return res
