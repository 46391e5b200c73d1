"""The report's sections: each appends HTML to its part list (and figures through the page)."""

from __future__ import annotations

import importlib
import platform
from typing import Any

import torch

from workbench.measure.timing import NOISY_IQR, is_noisy
from workbench.viz.page import Page, esc, table

D = 2  # draft tokens of the verify checks
CHECK_BUCKETS = [1, 2, 4, 8]


# -- metadata tour --------------------------------------------------------------------------------------
def metadata_section(parts: list[str], page: Page) -> None:
    import workbench.viz as viz
    from workbench.sweeps.tour import metadata_tour

    metas = metadata_tour()
    parts.append(
        "<p>The same five requests (seq_lens 7, 3, 9, 4, 12), decode and target-verify (D=3), padded to "
        "bucket 8 under each profile. What a padded row does differs: sglang marks it -1 (skipped), vLLM "
        "points it at the null slot 0 (skipped), sglang on Ascend points it at the dummy slot 0, where the "
        "kernels process it (the conv update writes slot 0; the recurrence sees a zero-length row).</p>"
    )
    padding_map = getattr(viz, "padding_map", None)
    if padding_map is not None:
        parts.append(page.figure(padding_map(metas)))
    else:
        parts.append(
            "<p class='note'>viz.padding_map is not installed in this checkout; showing viz.padded_batch "
            "(padded rows grey, labelled with their state index).</p>"
        )
        parts.append(page.figure(viz.padded_batch(metas)))
    tables = "\n\n".join(m.table() for m in metas)
    parts.append(f"<details><summary>metadata tables ({len(metas)})</summary><pre>{esc(tables)}</pre></details>")


# -- capture / replay -----------------------------------------------------------------------------------
def replay_check_section(parts: list[str]) -> None:
    from workbench.batch import Batch
    from workbench.layers import GatedDeltaNetLayer, GDNConfig
    from workbench.pool import StatePool
    from workbench.runner import GraphRunner

    parts.append(
        f"<p>A small Gated DeltaNet layer captured for buckets {CHECK_BUCKETS} (decode and verify, D={D}) "
        "on the CPU graph recorder; a batch of 3 requests (bucket 4) replayed and compared with the same padded "
        "step run eagerly (bit for bit) and with the unpadded float64 reference (integrity: no foreign slot "
        "changed, live rows match, padded outputs zero).</p>"
    )
    header = [
        "profile", "state layout", "mode", "raw bs", "bucket", "replayed", "bitwise = eager", "max |out - eager|",
        "integrity",
    ]  # fmt: skip
    rows, classes = [], []
    torch.manual_seed(0)
    from workbench.profiles import PROFILES

    for name, profile in PROFILES.items():
        pool = StatePool(16, name, slots_per_request=profile.slots_per_request(D))
        layer = GatedDeltaNetLayer(GDNConfig.small(), seed=3, impl="reference", state_layout=profile.state_layout)
        runner = GraphRunner(
            layer, pool, buckets=CHECK_BUCKETS, draft_tokens=D, backend="cpu", state=layer.new_state(16, seed=7)
        )
        runner.capture(progress=False)
        live = pool.alloc(3)
        for mode in ("decode", "target_verify"):
            seq = [5, 9, 3]
            batch = Batch.decode(live, seq) if mode == "decode" else Batch.target_verify(live, seq, D)
            n = 3 * (D if mode == "target_verify" else 1)
            cmp = runner.compare(batch, torch.randn(n, layer.config.hidden_size))
            verdict = "clean" if cmp.integrity.ok else str(cmp.integrity).replace("\n", "; ")
            rows.append([name, profile.state_layout, mode, cmp.raw_batch_size, cmp.bucket, cmp.replayed,
                         cmp.bitwise_equal, f"{cmp.max_output_diff:.3g}", verdict])  # fmt: skip
            good = "good" if cmp.ok else "bad"
            classes.append(["", "", "", "", "", "", good if cmp.bitwise_equal else "bad", "", good])
    parts.append(table(header, rows, classes=classes))


def state_layout_section(parts: list[str], page: Page) -> None:
    """Which recurrent-state layout each profile's pool keeps (``Profile.state_layout``; the layer above ran
    in it), and what a K-first read of the first profile's slot takes, at the small layer's K and V."""
    from workbench.layers import GDNConfig
    from workbench.profiles import PROFILES
    from workbench.viz.layout import state_layout_map

    c = GDNConfig.small()
    dims = {"k_first": "[slots, HV, K, V]", "v_first": "[slots, HV, V, K]"}
    rows = [[name, p.state_layout, dims.get(p.state_layout, "")] for name, p in PROFILES.items()]
    first = next(iter(PROFILES.values()))
    parts.append(
        "<p>Each profile's layer above kept its gated-delta-rule state the way the engine's pool does. A kernel "
        f"that reads a {esc(first.state_layout)} slot K-first takes the elements below (the small layer: "
        f"K={c.head_k_dim}, V={c.head_v_dim}; at K == V the shapes agree and only the values show it).</p>"
    )
    parts.append(table(["profile", "state layout", "pool shape"], rows))
    parts.append(page.figure(state_layout_map(c.head_k_dim, c.head_v_dim, written=first.state_layout, read="k_first")))


# -- bug zoo --------------------------------------------------------------------------------------------
def zoo_section(parts: list[str]) -> None:
    try:
        zoo = importlib.import_module("workbench.zoo")
        run_all = zoo.run_all
    except (ImportError, AttributeError):
        parts.append("<p class='note'>The bug zoo (workbench.zoo) is not installed in this checkout.</p>")
        return
    try:
        pairs = run_all()
    except Exception as exc:  # the report still shows the rest; the failure is reported, not hidden
        parts.append(f"<p class='bad'>The bug zoo failed to run: {esc(type(exc).__name__)}: {esc(exc)}</p>")
        return
    header = ["case", "broken: bug shows", "broken: evidence", "fixed: clean", "fixed: evidence"]
    rows, classes = [], []
    for broken, fixed in pairs:
        rows.append([broken.case, broken.broken, broken.summary, not fixed.broken, fixed.summary])
        classes.append(["", "good" if broken.broken else "bad", "", "good" if not fixed.broken else "bad", ""])
    parts.append(f"<p>{len(pairs)} cases, each run broken and fixed.</p>")
    parts.append(table(header, rows, classes=classes))


# -- timings --------------------------------------------------------------------------------------------
def _impl_for(device: str) -> str:
    from workbench.sweeps.common import recorded_impl

    return recorded_impl("auto", device)  # the kernels' own rule: the reference on the CPU, Triton elsewhere


def speedup_rows(res: Any) -> tuple[list[list[Any]], list[list[str]]]:
    """Rows of the replay speed-up table (batch size, impl, eager / replay, n, note) of a replay sweep's
    ``Results``, and their cell classes: a ratio whose eager or replay record is noisy (IQR over
    ``NOISY_IQR`` of the median) is marked "noisy" in words, its ratio cell "bad"."""
    from workbench.measure.timing import ratio

    by_mode = {m: {(r.shape["bs"], r.impl): r for r in res.filter(mode=m)} for m in ("eager", "replay")}
    rows, classes = [], []
    for k, speedup in ratio(res.filter(mode="eager"), res.filter(mode="replay")).rows:
        key = (k["shape"]["bs"], k["impl"])
        recs = {m: by_mode[m].get(key) for m in by_mode}
        noisy = [m for m, r in recs.items() if r is not None and is_noisy(r)]
        ns = "/".join(str(r.n) for r in recs.values() if r is not None)
        note = (
            f"noisy: {' and '.join(noisy)} IQR over {NOISY_IQR:.0%} of the median; not a measured difference"
            if noisy
            else ""
        )
        rows.append([key[0], key[1], f"{speedup:.2f}x", ns, note])
        classes.append(["", "", "bad" if noisy else "", "", "bad" if noisy else ""])
    return rows, classes


def timing_section(parts: list[str], page: Page, device: str, quick: bool, progress: bool) -> None:
    from workbench.sweeps.replay import sweep
    from workbench.viz import latency

    sizes = [1, 2, 4] if quick else [1, 2, 4, 8, 16, 32]
    # quick: the test layer; a full run: a quarter-width layer on the CPU, the engine's on a device
    preset = "small" if quick else ("quarter" if device == "cpu" else "engine")
    res = sweep(sizes, impls=(_impl_for(device),), preset=preset, device=device, progress=progress,
                min_run_time=0.02 if quick else 0.1)  # fmt: skip
    cfg = res.meta["config"]
    parts.append(
        f"<p>Gated DeltaNet decode step (preset {esc(preset)}: hidden {cfg['hidden_size']}, {cfg['num_v_heads']} "
        f"value heads), graph backend {esc(res.meta['graph_backend'])}. Medians over n repetitions (n per row "
        "in the table below); the band is as wide as the interquartile range.</p>"
    )
    parts.append(page.figure(latency(res)))
    rows, classes = speedup_rows(res)
    parts.append(
        "<p>Replay speed-up (eager median / replay median). A ratio is marked noisy where the eager or replay "
        f"IQR exceeds {NOISY_IQR:.0%} of its median: at that n it is within the noise, not a difference.</p>"
    )
    parts.append(table(["batch size", "impl", "eager / replay", "n (eager/replay)", "note"], rows, classes=classes))
    parts.append(res._repr_html_())


def roofline_section(parts: list[str], page: Page, device: str, quick: bool, progress: bool) -> None:
    from workbench.measure.ceilings import measure_ceilings
    from workbench.sweeps.kernels import sweep
    from workbench.viz import roofline

    if quick:
        # the default copy size (past the last-level cache: DRAM), fewer and shorter repeats
        ceil = measure_ceilings(device, matmul_n=256, min_run_time=0.05, repeats=3)
        res = sweep([1, 4], preset="quarter", device=device, impl=_impl_for(device), progress=progress,
                    min_run_time=0.02)  # fmt: skip
    else:
        ceil = measure_ceilings(device, min_run_time=0.2)
        res = sweep([1, 4, 16], preset="engine", device=device, impl=_impl_for(device), progress=progress,
                    min_run_time=0.1)  # fmt: skip
    parts.append(
        f"<p>Ceilings measured in this run: copy {ceil.copy_gbps:.1f} GB/s (a {ceil.copy_bytes / 2**20:.0f} MiB "
        f"clone, read + write), matmul {ceil.matmul_tflops:.3f} TFLOP/s ({ceil.matmul_n}^2 {ceil.matmul_dtype}). "
        f"Decode kernels ({esc(_impl_for(device))}, preset {esc(res.meta['preset'])}), bytes and FLOPs from the "
        "kernels' cost functions: a memory-bound step near 100% of copy bandwidth has nothing left to gain; "
        "above 100%, its state stayed in a cache the larger copy buffer does not fit in.</p>"
    )
    if res.meta["errors"]:
        errs = "; ".join(f"{k}: {v}" for k, v in res.meta["errors"].items())
        parts.append(f"<p class='bad'>kernels that failed: {esc(errs)}</p>")
    if len(res):
        parts.append(page.figure(roofline(res, ceil)))
        rows = []
        for r in res:
            fc, fm = ceil.fraction_of_copy(r), ceil.fraction_of_matmul(r)
            rows.append([r.what, r.shape["bs"], f"{r.median_us:.1f}", f"{r.gbps or 0:.2f}",
                         f"{fc:.1%}" if fc is not None else "", f"{fm:.2%}" if fm is not None else ""])  # fmt: skip
        parts.append(table(["kernel", "bs", "median us", "GB/s", "of copy", "of matmul"], rows))


# -- buckets --------------------------------------------------------------------------------------------
def bucket_section(parts: list[str], page: Page) -> None:
    from workbench.profiles import sglang_buckets
    from workbench.viz import bucket_waste

    lists = {"sglang default": sglang_buckets(64), "a user's list (1..32 by 2x, 48)": [1, 2, 4, 8, 16, 32, 48]}
    parts.append(
        "<p>Padded rows per step for every raw batch size up to 64, for the engine's default list and a "
        "user's. Rows above the largest bucket run eagerly (x). The bottom row is the state traffic the padded "
        "rows cost on a profile that processes them on the dummy slot (Ascend).</p>"
    )
    parts.append(page.figure(bucket_waste(lists, 64)))


# -- environment ----------------------------------------------------------------------------------------
def _version(mod: str) -> str:
    try:
        return str(importlib.import_module(mod).__version__)
    except Exception as exc:  # a missing optional package is information, not an error
        return f"not available ({type(exc).__name__})"


def environment_section(parts: list[str], device: str) -> None:
    from workbench.devices import devices

    versions: list[list[Any]] = [
        ["python", platform.python_version()],
        ["platform", platform.platform()],
        ["torch", torch.__version__],
        ["torch threads (while the report runs)", torch.get_num_threads()],
    ]
    versions += [[m, _version(m)] for m in ("triton", "numpy", "plotly", "pandas")]
    parts.append(table(["package", "version"], versions))
    rows, classes = [], []
    for d in devices(probe_npu=True):
        rows.append([d.name, "yes" if d.usable else "no", d.detail])
        classes.append(["", "good" if d.usable else "bad", ""])
    parts.append(f"<p>Timings above ran on <b>{esc(device)}</b>. Devices here, and why one is not usable:</p>")
    parts.append(table(["device", "usable", "detail"], rows, classes=classes))
