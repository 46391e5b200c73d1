"""The model behind ``TimingDashboard``: sweep batch sizes x impl x eager/replay, measure the device's
ceilings and the kernels for the roofline, compare bucket lists, load and overlay saved result files.

Plain Python (no ipywidgets). Bad input comes back as ``error`` (words), never as an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.measure.timing import Results
from workbench.profiles import sglang_buckets, vllm_buckets
from workbench.widgets.explorer_model import parse_int_list

Progress = Callable[[int, int], None]


def relabel(res: Results, label: str) -> Results:
    """A copy of ``res`` whose records' ``impl`` carries ``label`` (so two runs overlay as separate lines)."""
    out = Results(meta=dict(res.meta))
    for r in res:
        out.append(replace(r, impl=f"{r.impl} [{label}]"))
    return out


class TimingModel:
    """Sweeps and saved results for the dashboard.

    Args:
        batch_sizes: typed comma-separated batch sizes (each a captured bucket of the replay sweep).
        impls: kernel implementations ("reference", "triton").
        modes: "eager" and/or "replay".
        layer: "gdn" or "mamba2"; preset: "small" | "quarter" | "engine" (see ``workbench.sweeps.common``).
        device: "cpu" (or a device that is usable here).
        buckets: your bucket list for the waste figure ("" = none), beside the engines' defaults.
        min_run_time: seconds per timed case.
    """

    def __init__(
        self,
        batch_sizes: str = "1, 2, 4, 8",
        impls: Sequence[str] = ("reference",),
        modes: Sequence[str] = ("eager", "replay"),
        layer: str = "gdn",
        preset: str = "small",
        device: str = "cpu",
        buckets: str = "",
        min_run_time: float = 0.05,
    ) -> None:
        self.batch_sizes, self.impls, self.modes = batch_sizes, tuple(impls), tuple(modes)
        self.layer, self.preset, self.device = layer, preset, device
        self.buckets, self.min_run_time = buckets, min_run_time
        self.results = Results()
        self.kernels: Results | None = None
        self.ceilings: Any = None
        self.overlays: dict[str, Results] = {}
        self.error: str | None = None

    def _sizes(self) -> list[int]:
        sizes = parse_int_list("batch sizes", self.batch_sizes)
        if not sizes:
            raise WorkbenchError("batch sizes: type at least one, e.g. 1, 2, 4, 8")
        return sizes

    def sweep(self, progress: Progress | None = None) -> Results | None:
        """Eager vs replay of one layer step for each batch size, impl and mode (one size at a time, so
        ``progress(done, total)`` can follow)."""
        from workbench.sweeps.replay import sweep

        self.error = None
        try:
            sizes = self._sizes()
            out = Results()
            for k, bs in enumerate(sizes, start=1):
                part = sweep(
                    [bs],
                    impls=self.impls,
                    modes=self.modes,
                    layer=self.layer,
                    preset=self.preset,
                    device=self.device,
                    progress=False,
                    min_run_time=self.min_run_time,
                )
                out.meta = part.meta
                for r in part:
                    out.append(r)
                if progress is not None:
                    progress(k, len(sizes))
        except (WorkbenchError, ValueError, RuntimeError) as e:
            self.error = str(e)
            return None
        self.results = out
        return out

    def roofline_run(self, ops: Sequence[str] | None = None) -> Results | None:
        """Measure the ceilings (copy bandwidth, matmul rate) and time the kernels at the batch sizes."""
        from workbench.measure.ceilings import measure_ceilings
        from workbench.sweeps.kernels import sweep

        self.error = None
        try:
            sizes = self._sizes()
            self.ceilings = measure_ceilings(self.device, min_run_time=self.min_run_time)
            self.kernels = sweep(
                sizes,
                ops=ops,
                preset=self.preset,
                device=self.device,
                impl="reference" if "triton" not in self.impls else "triton",
                progress=False,
                min_run_time=self.min_run_time,
            )
        except (WorkbenchError, ValueError, RuntimeError) as e:
            self.error = str(e)
            return None
        return self.kernels

    def bucket_lists(self, max_bs: int | None = None) -> dict[str, list[int]] | None:
        """The engines' default lists (and yours, when typed) up to ``max_bs`` (default: the largest size)."""
        self.error = None
        try:
            top = max_bs or max(self._sizes() + [64])
            lists = {"sglang default": sglang_buckets(top), "vLLM default": vllm_buckets(top)}
            if self.buckets.strip():
                from workbench.buckets import check_buckets

                lists["yours"] = check_buckets(parse_int_list("buckets", self.buckets))
        except (WorkbenchError, ValueError) as e:
            self.error = str(e)
            return None
        return lists

    def load(self, path: str | Path, label: str | None = None) -> Results | None:
        """Load a saved result file (``Results`` JSON) to overlay on the latency figure."""
        self.error = None
        p = Path(path)
        try:
            res = Results.load(p)
        except FileNotFoundError:
            self.error = f"file: {str(p)!r} does not exist"
            return None
        except (WorkbenchError, ValueError, KeyError, TypeError) as e:
            self.error = f"file: {str(p)!r} is not a saved result file ({e})"
            return None
        name = label or p.stem
        self.overlays[name] = relabel(res, name)
        return self.overlays[name]

    def combined(self) -> Results:
        """This session's sweep and every loaded file, as one Results for the latency figure."""
        out = Results(meta=dict(self.results.meta))
        for r in self.results:
            out.append(replace(r, impl=f"{r.impl} [this run]") if self.overlays else r)
        for res in self.overlays.values():
            for r in res:
                out.append(r)
        return out
