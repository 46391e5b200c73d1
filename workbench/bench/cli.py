"""`workbench bench <what>`: run one benchmark on a device, save its records, optionally draw them.

Each benchmark is a ``run(quick, json_path, device) -> Results``; ``workbench.cli`` picks it (the bench
modules here, and ``workbench.widgets.bench`` for ``widgets``) and hands it to :func:`run_bench`.

Results go to ``bench-results/<what>_<device>.json`` (git-ignored) unless ``--json`` names a file whose
folder exists; the device is always in the name and a ``--json`` name that says another device is refused.
``--plot FILE.html`` draws the figures of the run (or of ``--from FILE.json``, without running anything).
Every run prints a header line first, with the torch thread count its figures were measured at
(:func:`header`); ``workbench.cli`` set that count (``--threads``, else LINATTN_THREADS, else one).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.extras import require
from workbench.measure.timing import Results, device_type, resolve_device

DEFAULT_DIR = Path("bench-results")


# what a benchmark is: run(quick=..., json_path=..., device=...) -> Results
Benchmark = Callable[..., Results]


def json_path_for(what: str, device: str, given: str | None) -> Path:
    """Where results go; raises when ``given``'s folder is missing or its name says another device."""
    if given is None:
        DEFAULT_DIR.mkdir(exist_ok=True)  # the documented default, git-ignored; one level, never a chain
        return DEFAULT_DIR / f"{what}_{device}.json"
    p = Path(given)
    if not p.parent.is_dir():
        raise WorkbenchError(f"--json: folder {str(p.parent)!r} does not exist (create it first)")
    named = re.search(r"_(cpu|cuda|npu)\.json$", p.name)
    if named and named.group(1) != device:
        raise WorkbenchError(f"--json: {p.name!r} names device {named.group(1)!r} but this run is on {device!r}")
    return p


def plot_results(res: Results, path: str | Path) -> Path:
    """Draw the figures of ``res`` (latency; the roofline when ceilings are recorded) into one HTML file."""
    from workbench.measure.ceilings import Ceilings
    from workbench.viz import latency, roofline
    from workbench.viz.page import Page

    p = Path(path)
    if not p.parent.is_dir():
        raise WorkbenchError(f"--plot: folder {str(p.parent)!r} does not exist (create it first)")
    name = res.meta.get("benchmark", "bench")
    page = Page(f"workbench bench {name}")
    parts = page.section("latency", "Latency by batch size")
    parts.append(page.figure(latency(res)))
    kernels = Results([r for r in res if r.mode != "copy-floor"], res.meta)  # a copy is no kernel to rate
    if res.meta.get("ceilings") and any(r.bytes for r in kernels):
        page.section("roofline", "Roofline").append(
            page.figure(roofline(kernels, Ceilings.from_dict(res.meta["ceilings"])))
        )
    page.section("records", "Records").append(res._repr_html_())
    p.write_text(page.render(), encoding="utf-8")
    return p


def header(what: str, device: str, quick: bool) -> str:
    """The line a bench prints before its figures: ``bench kernels on cpu, 1 torch thread, quick``."""
    from workbench import threads

    return f"bench {what} on {device}, {threads.describe()}{', quick' if quick else ''}"


def run_bench(args: argparse.Namespace, run: Benchmark) -> int:
    """The `bench` command (see the module docstring): ``run`` is the benchmark ``args.what`` names (not
    called with ``--from``, which only redraws)."""
    if args.from_json:
        if not args.plot:
            raise WorkbenchError("--from: redraws figures, so it needs --plot FILE.html")
        try:
            res = Results.load(args.from_json)
        except WorkbenchError as e:  # Results.load says "path: ..."; here the path is --from's, as typed
            raise WorkbenchError(f"--from {args.from_json!r}: {str(e).removeprefix('path: ')}") from None
        print(f"wrote {plot_results(res, args.plot)}")
        return 0
    if args.plot and not Path(args.plot).parent.is_dir():
        raise WorkbenchError(f"--plot: folder {str(Path(args.plot).parent)!r} does not exist (create it first)")
    if args.plot:  # refused before the run, not after it
        require("plotly", None, "--plot FILE.html")
    device = resolve_device(args.device)
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:  # argparse checks [1, cores]; a Namespace built by hand may still say 0
            raise WorkbenchError(f"--threads: expected an int >= 1, got {threads}")
        import torch

        torch.set_num_threads(threads)  # the timers record the count they really ran with
    path = json_path_for(args.what, device_type(device), args.json)
    print(header(args.what, device, args.quick), flush=True)  # before a run that may take minutes
    out: Results = run(quick=args.quick, json_path=str(path), device=device)
    if args.plot:
        print(f"wrote {plot_results(out, args.plot)}")
    errors = out.meta.get("errors")
    if errors:  # the others ran and were saved; the exit status still says something failed
        print(f"bench {args.what}: failed: {', '.join(errors)} (see meta['errors'] in {path})", file=sys.stderr)
        return 1
    return 0
