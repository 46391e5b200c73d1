"""The model behind ``TimingDashboard``: sweep batch sizes x impl x eager/replay, measure the device's
ceilings and the kernels for the roofline, compare bucket lists, load and overlay saved result files.

Plain Python (no ipywidgets). Bad input comes back as ``error`` (words) beside the control ``error_on``
names, never as an exception. Three rules keep what the dashboard shows true:

- Sizes are checked before any work (:func:`check_sweep`): a sweep is refused when its largest step would
  move more state than ``STATE_BUDGET`` or hold more rows than ``MAX_BATCH`` on the CPU (a batch of 100,000
  swept for 274 s, blocking the kernel), or its state would not fit the device's free memory.
- The implementations default to what runs here (``kernels.dispatch.resolve_impl``); choosing Triton where
  it cannot run (:func:`impl_problem`) says how to restart, beside the control, before any work.
- A failed action marks its figure stale (``stale[figure]``: one line) and leaves no success line standing
  (``status`` is cleared); a saved run of another benchmark kind is refused, not overlaid.

The inputs are plain attributes the view (or a notebook) sets; whatever they hold, :meth:`TimingModel.problems`
and every action answer in words beside the control, before any work: texts that are no text, impls and
modes that are no list of known names, a device torch cannot allocate on, a ``min_run_time`` outside
``(0, MAX_RUN_TIME]`` seconds, arguments of the wrong kind. Nothing of a refused action is kept.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from kernels.dispatch import resolve_impl, triton_importable
from workbench.devices import TRITON_RESTART, canonical_device, triton_cpu_problem
from workbench.errors import WorkbenchError
from workbench.layer_names import DEFAULT_LAYER
from workbench.limits import check_int, check_memory, gib
from workbench.measure.timing import Results
from workbench.profiles import sglang_buckets, vllm_buckets
from workbench.viz.timing import benchmark_kind
from workbench.widgets.explorer_model import parse_int_list, shown

Progress = Callable[[int, int], None]
IMPLS = ("reference", "triton")
MODES = ("eager", "replay")
FIGURES = ("latency", "roofline", "waste")
# what one dashboard sweep may ask of the CPU: the reference kernels run each row's state through torch ops,
# so a step's time grows with its state bytes and its rows (a quarter-width layer at 256 rows: ~30 s a sweep)
STATE_BUDGET = 64 * 2**20
MAX_BATCH = 1024
MAX_SIZES = 16
DEVICE_MAX_BATCH = 8192  # on a GPU/NPU memory is the bound (checked), and this keeps the page usable
MAX_RUN_TIME = 10.0  # seconds a case is timed for at least; a sweep times each size x impl x mode this long
KIND = "replay"  # the latency figure is the replay sweep's: layer-step latency per batch size


def relabel(res: Results, label: str) -> Results:
    """A copy of ``res`` whose records' ``impl`` carries ``label`` (so two runs overlay as separate lines)."""
    out = Results(meta=dict(res.meta))
    for r in res:
        out.append(replace(r, impl=f"{r.impl} [{label}]"))
    return out


def impl_problem(impl: str, device: str) -> str | None:
    """Why ``impl`` cannot run on ``device`` here, in one line naming the fix, or None."""
    if impl not in IMPLS:
        return f"impls: {shown(impl)} is not one of {list(IMPLS)}"
    if impl == "reference":
        return None
    if torch.device(device).type == "cpu":
        problem = triton_cpu_problem()
        return None if problem is None else f"impls: {problem}"
    if not triton_importable():
        return "impls: triton cannot be imported here (pip install triton, or choose reference)"
    return None


def device_problem(device: object) -> str | None:
    """Why the dashboard cannot time on ``device`` (no text, or torch cannot allocate there), or None."""
    if not isinstance(device, str):
        return f"device must be text ('cpu', 'cuda', ...), got {shown(device)}"
    try:
        canonical_device(device)
    except WorkbenchError as e:  # DeviceUnavailable: names the device and torch's reason
        return str(e)
    return None


def default_impls(device: str) -> tuple[str, ...]:
    """What ``impl="auto"`` runs on ``device`` (the reference on the CPU, Triton on a GPU)."""
    return (resolve_impl("auto", torch.device(device)),)


def layer_state_bytes(layer: str, preset: str) -> int:
    """float32 state bytes of one request (one slot) of the replay sweep's ``layer`` at ``preset``."""
    from workbench.layers import LAYERS
    from workbench.sweeps.replay import PRESETS

    if not isinstance(layer, str) or layer not in LAYERS:
        raise WorkbenchError(f"layer: {shown(layer)} is not one of {list(LAYERS)}")
    if not isinstance(preset, str) or preset not in PRESETS:
        raise WorkbenchError(f"preset: {shown(preset)} is not one of {list(PRESETS)}")
    # the layer's own shape rule, read without building a layer (no weights allocated)
    return 4 * LAYERS[layer].slot_elements(preset)


def kernel_state_bytes(preset: str) -> int:
    """The largest float32 state of one row among the decode kernels at ``kernels.testing.SHAPES[preset]``."""
    from kernels.testing import SHAPES

    if not isinstance(preset, str) or preset not in SHAPES:
        raise WorkbenchError(f"preset: {shown(preset)} is not one of {list(SHAPES)}")
    s = SHAPES[preset]
    return 4 * max(s["HV"] * s["K"] * s["V"], s["nheads"] * s["headdim"] * s["dstate"], s["dim"] * (s["width"] - 1))


def check_sweep(sizes: Sequence[int], per_row: int, device: str, preset: str) -> None:
    """Refuse, in one line naming the batch size, a sweep this dashboard should not start (see the module
    docstring); ``per_row`` is the state bytes of one request."""
    if len(sizes) > MAX_SIZES:
        raise WorkbenchError(f"batch sizes: {len(sizes)} typed; the dashboard sweeps at most {MAX_SIZES} at once")
    for i, bs in enumerate(sizes):
        if bs < 1:
            raise WorkbenchError(f"batch sizes: item {i} is {bs}; a batch size is an int >= 1")
    bs = max(sizes)
    cpu = torch.device(device).type == "cpu"
    top = min(MAX_BATCH, STATE_BUDGET // per_row) if cpu else DEVICE_MAX_BATCH
    if bs > top:
        bound = f"{gib(STATE_BUDGET)} of state and {MAX_BATCH:,} rows a step" if cpu else "its page stays usable"
        raise WorkbenchError(
            f"batch sizes: {bs:,} with preset {preset!r} moves {gib(bs * per_row)} of state a step; on {device} the "
            f"dashboard sweeps up to {top:,} rows ({bound}), or it blocks the kernel for minutes; `workbench bench` "
            "runs larger sweeps from a terminal"
        )
    check_memory(f"batch sizes: {bs:,}", (bs + 2) * per_row * 2, f"the state pool of {bs + 2:,} slots", device)


class TimingModel:
    """Sweeps and saved results for the dashboard.

    Args:
        batch_sizes: typed comma-separated batch sizes (each a captured bucket of the replay sweep).
        impls: kernel implementations ("reference", "triton"); None: what "auto" runs on ``device``.
        modes: "eager" and/or "replay".
        layer: a name of ``workbench.layers.LAYERS``; preset: "small" | "quarter" | "engine" (see
            ``workbench.sweeps.common``).
        device: "cpu" (or a device that is usable here).
        buckets: your bucket list for the waste figure ("" = none), beside the engines' defaults.
        min_run_time: seconds per timed case.

    Attributes besides the arguments: ``results`` (the last sweep), ``kernels`` and ``ceilings`` (the last
    roofline run), ``overlays`` (label -> a loaded run), ``error`` and ``error_on`` (the control it belongs
    beside, or "general"), ``status`` (the last success, in words; "" after a failure), ``stale`` (figure
    -> why what it shows is not of the current inputs).
    """

    def __init__(
        self,
        batch_sizes: str = "1, 2, 4, 8",
        impls: Sequence[str] | None = None,
        modes: Sequence[str] = ("eager", "replay"),
        layer: str = DEFAULT_LAYER,
        preset: str = "small",
        device: str = "cpu",
        buckets: str = "",
        min_run_time: float = 0.05,
    ) -> None:
        # sequences are kept as tuples; anything else as given, refused in words by problems()
        self.batch_sizes = batch_sizes
        self.modes = tuple(modes) if isinstance(modes, list | tuple) else modes
        if impls is None:  # what "auto" runs on the device; the reference while the device is refused
            impls = default_impls(device) if device_problem(device) is None else ("reference",)
        self.impls = tuple(impls) if isinstance(impls, list | tuple) else impls
        self.layer, self.preset, self.device = layer, preset, device
        self.buckets, self.min_run_time = buckets, min_run_time
        self.results = Results()
        self.kernels: Results | None = None
        self.ceilings: Any = None
        self.overlays: dict[str, Results] = {}
        self.error: str | None = None
        self.error_on = "general"
        self.status = ""
        self.stale: dict[str, str] = {}

    # -- outcomes ---------------------------------------------------------------------------------------
    def _start(self) -> None:
        self.error, self.error_on = None, "general"

    def _fail(self, figure: str | None, control: str, message: str) -> None:
        """Record a failure: the words beside ``control``, no success line, ``figure`` stale if it shows one."""
        self.error, self.error_on, self.status = message, control, ""
        if figure is not None and self._has(figure):
            self.stale[figure] = f"stale: this shows the last run, not these inputs ({message})"

    def _done(self, figure: str, status: str) -> None:
        self.status = status
        self.stale.pop(figure, None)

    def _has(self, figure: str) -> bool:
        return {"latency": len(self.results) > 0, "roofline": self.kernels is not None, "waste": True}[figure]

    def _sizes(self) -> list[int]:
        if not isinstance(self.batch_sizes, str):
            raise WorkbenchError(
                f"batch sizes must be text (comma-separated, e.g. 1, 2, 4, 8), got {shown(self.batch_sizes)}"
            )
        sizes = parse_int_list("batch sizes", self.batch_sizes)
        if not sizes:
            raise WorkbenchError("batch sizes: type at least one, e.g. 1, 2, 4, 8")
        for i, bs in enumerate(sizes):
            if bs < 1:
                raise WorkbenchError(f"batch sizes: item {i} is {bs}; a batch size is an int >= 1")
        return sizes

    def _impl_error(self) -> str | None:
        """Why ``impls`` cannot run (read only once the device is good: Triton's problem depends on it)."""
        if not isinstance(self.impls, list | tuple):
            return f"impls must be a list of names from {list(IMPLS)}, got {shown(self.impls)}"
        if not self.impls:
            return "impls: choose at least one"
        return next((p for p in (impl_problem(i, self.device) for i in self.impls) if p), None)

    def _modes_error(self) -> str | None:
        if not isinstance(self.modes, list | tuple) or not self.modes:
            return f"modes: choose eager and/or replay, got {shown(self.modes)}"
        bad = [m for m in self.modes if m not in MODES]
        return f"modes: {shown(bad)} not in {list(MODES)}" if bad else None

    def _run_time_error(self) -> str | None:
        t = self.min_run_time
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t <= MAX_RUN_TIME:  # NaN fails too
            return f"min_run_time = {shown(t)}: seconds each case is timed for, in (0, {MAX_RUN_TIME:g}]"
        return None

    def problems(self) -> dict[str, str]:
        """What would refuse a sweep of the current inputs, by control, without running or changing anything
        (parsing, sizes and memory, the implementations, modes, device and run time): microseconds, for a
        check on every change."""
        out: dict[str, str] = {}
        device = device_problem(self.device)
        if device:
            out["general"] = device
        try:
            sizes, per_row = self._sizes(), layer_state_bytes(self.layer, self.preset)
            if not device:
                check_sweep(sizes, per_row, self.device, self.preset)
        except WorkbenchError as e:
            out.setdefault(_control_of(str(e)), str(e))
        problem = self._modes_error()
        if problem:
            out["modes"] = problem
        problem = None if device else self._impl_error()
        if problem:
            out["impls"] = problem
        problem = self._run_time_error()
        if problem:
            out.setdefault("general", problem)
        return out

    def plan_sweep(self) -> list[int] | None:
        """The batch sizes of a sweep, or None with the first of :meth:`problems` as ``error`` (and the
        latency figure stale)."""
        found = self.problems()
        if found:
            control, message = next(iter(found.items()))
            self._fail("latency", control, message)
            return None
        return self._sizes()

    # -- actions ----------------------------------------------------------------------------------------
    def sweep(self, progress: Progress | None = None) -> Results | None:
        """Eager vs replay of one layer step for each batch size, impl and mode (one size at a time, so
        ``progress(done, total)`` can follow)."""
        from workbench.sweeps.replay import sweep

        self._start()
        sizes = self.plan_sweep()
        if sizes is None:
            return None
        try:
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
            self._fail("latency", _control_of(str(e)), self._with_hint(str(e)))
            return None
        self.results = out
        self._done("latency", f"{len(out)} records: {self.layer} step, {out.meta.get('graph_backend', '')}")
        return out

    def roofline_run(self, ops: Sequence[str] | None = None) -> Results | None:
        """Measure the ceilings (copy bandwidth, matmul rate) and time the kernels at the batch sizes."""
        from workbench.measure.ceilings import measure_ceilings
        from workbench.sweeps.kernels import sweep

        self._start()
        general = device_problem(self.device) or self._run_time_error() or _ops_error(ops)
        if general:
            self._fail("roofline", "general", general)
            return None
        try:
            sizes = self._sizes()
            check_sweep(sizes, kernel_state_bytes(self.preset), self.device, self.preset)
        except WorkbenchError as e:
            self._fail("roofline", _control_of(str(e)), str(e))
            return None
        problem = self._impl_error()
        if problem is None:
            impl = "triton" if "triton" in self.impls else "reference"
            problem = impl_problem(impl, self.device)
        if problem:
            self._fail("roofline", "impls", problem)
            return None
        try:
            ceilings = measure_ceilings(self.device, min_run_time=self.min_run_time)
            kernels = sweep(
                sizes, ops=ops, preset=self.preset, device=self.device, impl=impl, progress=False,
                min_run_time=self.min_run_time,
            )  # fmt: skip
        except (WorkbenchError, ValueError, RuntimeError) as e:
            self._fail("roofline", _control_of(str(e)), self._with_hint(str(e)))
            return None
        self.ceilings, self.kernels = ceilings, kernels
        c = ceilings
        self._done(
            "roofline",
            f"ceilings on {c.device}: copy {c.copy_text()}, matmul {c.matmul_text()}; {len(kernels)} kernel records",
        )
        return kernels

    def bucket_lists(self, max_bs: int | None = None) -> dict[str, list[int]] | None:
        """The engines' default lists (and yours, when typed) up to ``max_bs`` (default: the largest size)."""
        self._start()
        try:
            if max_bs is not None:
                check_int("max_bs", max_bs, 1, DEVICE_MAX_BATCH)
            top = max_bs or max(self._sizes() + [64])
            if top > DEVICE_MAX_BATCH:
                raise WorkbenchError(
                    f"batch sizes: {top:,}; the waste figure draws raw sizes up to {DEVICE_MAX_BATCH:,}"
                )
            lists = {"sglang default": sglang_buckets(top), "vLLM default": vllm_buckets(top)}
            if not isinstance(self.buckets, str):
                raise WorkbenchError(
                    f"buckets must be text (comma-separated batch sizes, or '' for none), got {shown(self.buckets)}"
                )
            if self.buckets.strip():
                from workbench.buckets import check_buckets

                lists["yours"] = check_buckets(parse_int_list("buckets", self.buckets))
                if lists["yours"][-1] > DEVICE_MAX_BATCH:
                    raise WorkbenchError(
                        f"buckets: {lists['yours'][-1]:,}; the waste figure draws raw sizes up to {DEVICE_MAX_BATCH:,}"
                    )
        except (WorkbenchError, ValueError) as e:
            self._fail("waste", _control_of(str(e)), str(e))
            return None
        self.stale.pop("waste", None)
        return lists

    def load(self, path: str | Path, label: str | None = None) -> Results | None:
        """Load a saved result file (``Results`` JSON) to overlay on the latency figure; refused when it holds
        another benchmark (metadata updates, kernels: not layer-step latency)."""
        self._start()
        if label is not None and not isinstance(label, str):
            self._fail(None, "path", f"label must be text (the overlay's name; None: the file's), got {shown(label)}")
            return None
        if not isinstance(path, str | os.PathLike) or not str(path).strip():
            self._fail(None, "path", f"file: a path to a saved result file, got {shown(path)}")
            return None
        p = Path(path)
        try:
            res = Results.load(p)
        except FileNotFoundError:
            self._fail(None, "path", f"file: {str(p)!r} does not exist")
            return None
        except (WorkbenchError, ValueError, KeyError, TypeError) as e:
            self._fail(None, "path", f"file: {str(p)!r} is not a saved result file ({e})")
            return None
        except OSError as e:  # a folder, no permission: unreadable, in words
            self._fail(None, "path", f"file: {str(p)!r} cannot be read ({e.strerror or e})")
            return None
        name = label or p.stem
        kind = benchmark_kind(res)
        if kind != KIND:  # the figure is the replay sweep's, live run or not
            whats = ", ".join(sorted({r.what for r in res})[:3])
            self._fail(
                None, "path", f"file: {str(p)!r} holds a {kind!r} benchmark ({whats}), not layer-step latency "
                f"({KIND!r}): different quantities, not one axis",
            )  # fmt: skip
            return None
        self.overlays[name] = res
        self._done("latency", f"loaded {len(res)} records from {p} as {name!r}")
        return res

    def combined(self) -> Results:
        """This session's sweep and every loaded file, as one Results (each run's ``impl`` labelled)."""
        out = Results(meta=dict(self.results.meta))
        for r in self.results:
            out.append(replace(r, impl=f"{r.impl} [this run]") if self.overlays else r)
        for name, res in self.overlays.items():
            for r in relabel(res, name):
                out.append(r)
        return out

    def _with_hint(self, message: str) -> str:
        """A failure of a Triton run on the CPU carries the one fix that helps."""
        if "triton" in self.impls and torch.device(self.device).type == "cpu" and TRITON_RESTART not in message:
            return f"{message} ({TRITON_RESTART})"
        return message


def _ops_error(ops: object) -> str | None:
    """Why ``ops`` names no kernels the roofline can time (None: the decode ops), or None."""
    if ops is None:
        return None
    from kernels.testing import OPS

    if not isinstance(ops, list | tuple) or not ops:
        return f"ops: a list of op names from {list(OPS)}, or None for the decode ops; got {shown(ops)}"
    bad = [o for o in ops if not isinstance(o, str) or o.partition("[")[0] not in OPS]
    return f"ops: unknown {shown(bad)}, known {list(OPS)}" if bad else None


def _control_of(message: str) -> str:
    """The control an error belongs beside, from its leading word ("buckets[1] must ..." -> buckets)."""
    table = {"batch sizes": "batch_sizes", "batch_sizes": "batch_sizes", "buckets": "buckets", "impl": "impls"}
    table |= {"layer": "layer", "preset": "preset", "modes": "modes", "file": "path"}
    return next((control for head, control in table.items() if message.startswith(head)), "general")
