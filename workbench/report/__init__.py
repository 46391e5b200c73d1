"""`workbench report`: one self-contained HTML file of what the workbench shows, opening offline.

Sections: the metadata tour per profile with its padding figure, a capture/replay check with its integrity
result, the bug zoo (when installed), timings (eager vs replay) and the roofline on the available device,
the waste of two bucket lists, and the environment (versions, devices, why a device is unavailable).

    >>> from workbench.report import write_report          # doctest: +SKIP
    >>> write_report("report.html", quick=True)             # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from workbench import threads
from workbench.errors import WorkbenchError
from workbench.measure.timing import resolve_device
from workbench.report.sections import (
    bucket_section,
    environment_section,
    metadata_section,
    replay_check_section,
    roofline_section,
    state_layout_section,
    timing_section,
    zoo_section,
)
from workbench.viz.page import Page

SECTIONS = ("metadata", "replay-check", "zoo", "timings", "roofline", "buckets", "environment")


def build_report(*, device: str = "auto", quick: bool = False, progress: bool = False) -> str:
    """The report as one HTML string. ``device``: "auto" (cuda, then npu, else cpu) or a device name;
    ``quick``: fewer sizes and shorter timings (seconds on a CPU). On the CPU it runs at
    :func:`workbench.threads.configure`'s count (``LINATTN_THREADS``, else one) and gives the caller's back."""
    dev = resolve_device(device)
    before = torch.get_num_threads()
    if dev == "cpu":
        # one thread unless asked: on a shared machine intra-op threads spin against each other and the small
        # steps of the tour slow down tenfold; every timing record says the thread count it ran with
        threads.configure()
    try:
        return _build(dev, quick, progress)
    finally:
        torch.set_num_threads(before)


def _build(dev: str, quick: bool, progress: bool) -> str:
    t0 = time.perf_counter()
    page = Page(f"linattn-workbench report ({dev}{', quick' if quick else ''})")
    metadata_section(page.section("metadata", "Metadata tour: padding per profile"), page)
    replay = page.section("replay-check", "Capture / replay check and integrity")
    replay_check_section(replay)
    state_layout_section(replay, page)
    zoo_section(page.section("zoo", "Bug zoo"))
    timing_section(page.section("timings", f"Timings on {dev}: eager vs replay"), page, dev, quick, progress)
    roofline_section(page.section("roofline", f"Roofline on {dev}"), page, dev, quick, progress)
    bucket_section(page.section("buckets", "Bucket waste"), page)
    env = page.section("environment", "Environment")
    environment_section(env, dev)
    env.append(f"<p class='note'>report built in {time.perf_counter() - t0:.1f} s</p>")
    return page.render()


def check_out_path(path: str | os.PathLike) -> Path:
    """``path`` as a Path a report can be written to (its folder exists, it is no folder), else WorkbenchError."""
    p = Path(path)
    if not p.parent.is_dir():
        raise WorkbenchError(f"--out: folder {str(p.parent)!r} of {str(p)!r} does not exist")
    if p.is_dir():
        raise WorkbenchError(f"--out: {str(p)!r} is a folder; give a file name such as report.html")
    return p


def write_report(path: str | os.PathLike = "report.html", **kwargs: object) -> Path:
    """Build the report (``build_report(**kwargs)``) and write it to ``path``, whose folder must exist."""
    p = check_out_path(path)
    p.write_text(build_report(**kwargs), encoding="utf-8")  # type: ignore[arg-type]
    return p


__all__ = ["SECTIONS", "build_report", "check_out_path", "write_report"]
