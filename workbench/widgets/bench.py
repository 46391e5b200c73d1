"""`workbench bench widgets`: how fast the MetadataExplorer answers a control change (``workbench.cli`` routes
the command here, so that the bench package does not import the widgets).

One interaction = set a control's ``.value`` (as the browser does through the comm), which rebuilds the
metadata of every profile shown and updates the padding map, slot map, qsl staircase and table in place
(``batch_update``). Timed on the Python side, without a browser: the goal is under 100 ms median at a
raw batch size of 64 with the three profiles side by side. Each timed change alternates between two values
so that every call really rebuilds.

What it leaves out (:data:`LEAVES_OUT`, printed with the figures and kept in ``meta["leaves_out"]``): the
browser's side. With no front end attached, ipywidgets still builds each update message (the changed
traits' state) but hands it to ``comm``'s DummyComm, which sends nothing: neither the message's encoding
and transport to the page nor the redraw (plotly.js re-rendering the figures, the table's DOM update,
layout and paint) is timed. A user sees the update this long plus that.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from workbench.measure.legend import mark, print_legend
from workbench.measure.timing import Results, TimingRecord, environment

GOAL_MS = 100.0
LEAVES_OUT = (
    "the browser's side: the update messages are built (each changed trait's state) but never encoded or sent "
    "to a page, and nothing redraws (plotly.js re-rendering the figures, the table's DOM update, layout and "
    "paint); a user waits this long plus that"
)


def _time_changes(change: Callable[[int], None], n: int) -> list[float]:
    """The time of each of ``n`` calls of ``change`` after a warm-up one, in microseconds."""
    change(0)  # warm-up
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        change(i)
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def run(quick: bool = False, json_path: str | None = None, device: str = "cpu") -> Results:
    """Time control changes of the MetadataExplorer; print a table and what it does not time (the browser's
    redraw, :data:`LEAVES_OUT`); save the records when ``json_path`` is given (one record per interaction and
    batch size, ``mode="control change"``, times in us; ``meta["leaves_out"]``, ``meta["threads"]``)."""
    from workbench.widgets.explorer import MetadataExplorer  # ipywidgets: imported only when timed

    n = 10 if quick else 40
    sizes = (8, 64) if quick else (8, 64, 256)
    # (interaction, raw batch size, profiles shown, control, its value at step i)
    cases: list[tuple[str, int, str, str, Callable[[int, int], Any]]] = []
    for bs in sizes:
        cases += [
            ("raw batch size +-1", bs, "all", "raw_batch_size", lambda i, bs: bs - i % 2),
            ("mode decode/verify", bs, "all", "mode", lambda i, bs: ("decode", "target_verify")[i % 2]),
            ("fragmentation", bs, "all", "fragmentation", lambda i, bs: (0.25, 0.75)[i % 2]),
            (
                "typed seq lens",
                bs,
                "sglang",
                "seq_lens",
                lambda i, bs: ", ".join(str(7 + (j + i) % 5) for j in range(bs)),
            ),
        ]
    res = Results(
        meta={
            "benchmark": "widgets",
            "device": device,
            "goal_ms": GOAL_MS,
            "timed": "a control's new value to the explorer's figures and table updated, in Python (no browser)",
            "leaves_out": LEAVES_OUT,
            "threads": torch.get_num_threads(),
        }
    )
    env = environment(device)
    print(f"{'interaction':22} {'profiles':8} {'bs':>4} {'median ms':>10} {'IQR ms':>8} {'max ms':>8}")
    for what, bs, profile, control, value in cases:
        e = MetadataExplorer(profile=profile, raw_batch_size=bs, pool_size=max(64, 4 * bs))
        widget = e.controls[control]

        def change(i: int, widget: Any = widget, value: Callable[[int, int], Any] = value, bs: int = bs) -> None:
            widget.value = value(i, bs)

        times = _time_changes(change, n)
        assert not any(w.value for w in e.errors.values()), f"{what}: the explorer reported an error"
        rec = TimingRecord.from_times(
            times,
            what=f"explorer: {what}",
            device=device,
            shape={"raw_batch_size": bs, "profiles": 3 if profile == "all" else 1},
            impl="MetadataExplorer",
            mode="control change",
            threads=torch.get_num_threads(),
            env=env,
        )
        res.append(rec)
        med, spread, top = rec.median_us / 1e3, rec.iqr_us / 1e3, max(times) / 1e3
        print(f"{what:22} {profile:8} {bs:4d} {med:9.1f}{mark(rec)} {spread:8.1f} {top:8.1f}")
    at64 = [r.median_us / 1e3 for r in res if r.shape["raw_batch_size"] == 64]
    worst = max(at64) if at64 else float("nan")
    verdict = "meets" if worst < GOAL_MS else "MISSES"
    print(f"worst median at bs 64: {worst:.1f} ms ({verdict} the {GOAL_MS:.0f} ms goal, Python side only)")
    print(f"not timed: {LEAVES_OUT}")
    print_legend(["median ms: from a control's new value to the explorer's figures and table updated (in Python)"])
    res.meta["worst_median_ms_at_bs64"] = worst
    if json_path:
        res.save(json_path)
        print(f"wrote {json_path}")
    return res
