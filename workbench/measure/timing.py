"""One timer per device and one record schema for every benchmark.

``time_fn`` times a callable the way its device needs: CUDA events (or ``torch.npu.Event``) around each
repetition after a warm-up, synchronised, on a GPU/NPU; ``torch.utils.benchmark.Timer`` on the CPU (which
also records the thread count the timer really ran with: Timer sets its own, 1 unless told). Always medians
and interquartile ranges over many repetitions, never one run.

Two options serve device benchmarks, each said in the record it produces:

- ``graph_calls=N`` (CUDA only): ``N`` calls captured into one ``torch.cuda.CUDAGraph``, each repetition
  one replay between events; per-call time = replay time / N. Host launch overhead is amortised away, as
  in an engine's decode graph. Refused on the CPU and the NPU.
- ``flush_l2=True``: before every timed repetition a buffer twice the device's L2
  (``get_device_properties(dev).L2_cache_size``) is rewritten, so each repetition starts from a cold L2
  (``record.l2 == "flushed"``, else ``"warm"``). With ``graph_calls`` > 1 only the first call of a replay
  would be cold, so that pair is refused. On the CPU nothing is flushed (``torch.utils.benchmark`` runs
  blocks of calls back to back) and the record says ``l2 == "not flushed (cpu)"``.

Every benchmark writes :class:`TimingRecord` rows into a :class:`Results` (records + ``meta``), saved as
JSON, loaded back, shown as a pandas frame or an HTML table, and compared with :func:`ratio`.

    >>> rec = time_fn(lambda: sum(range(100)), what="sum", device="cpu", min_run_time=0.01)
    >>> rec.median_us > 0 and rec.n >= 1 and rec.threads >= 1
    True
    >>> ratio(rec, rec)
    1.0
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import MISSING, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, overload

import torch

from workbench import html
from workbench.errors import WorkbenchError
from workbench.extras import require

SCHEMA = "workbench.timing/1"
# the fields that identify what was measured (two records with the same key measured the same thing)
KEY_FIELDS = ("what", "device", "shape", "impl", "mode", "l2")
# key fields that pair records in `ratio` only where they tell records apart (see `ratio`)
QUIET_KEY_FIELDS = ("l2",)
# fewest repetitions behind a median and an IQR
MIN_REPS = 5
# a median whose IQR exceeds this fraction of it is noise at a benchmark's n (the report, every CLI table)
NOISY_IQR = 0.25
# TimingRecord.l2: the cache state each timed repetition started from
L2_WARM, L2_FLUSHED, L2_NOT_FLUSHED_CPU = "warm", "flushed", "not flushed (cpu)"


class TimingError(WorkbenchError, ValueError):
    """A bad timing request or a results file that does not follow the schema."""


class GraphCaptureError(TimingError):
    """``time_fn(graph_calls=...)``: the callable could not be captured into a CUDA graph (a host sync in
    it, an op capture does not allow); the message names the cause. Time it without ``graph_calls``."""


def _fmt_us(us: float) -> str:
    if us >= 1e4:
        return f"{us / 1e3:.1f} ms"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us"


def _shape_text(shape: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in shape.items())


@dataclass
class TimingRecord:
    """One timed thing: the median and IQR of ``n`` repetitions, in microseconds.

    Attributes:
        what: the benchmark's subject ("gated_delta_rule.recurrent", "layer_step", "metadata_update", "copy", ...).
        device: "cpu" | "cuda" | "npu" (the type only; the model name is in ``env``).
        shape: the sizes that define the case, e.g. ``{"bs": 8}``.
        impl: the implementation timed ("reference", "triton", "in_place", ...).
        mode: "eager" | "replay" | "kernel" | ... (how it ran).
        median_us, iqr_us: median and interquartile range of the per-call times.
        n: repetitions (CPU: timed blocks of ``Timer.blocked_autorange``; GPU/NPU: event pairs).
        threads: CPU threads the timed code really ran with (``torch.get_num_threads()`` inside the timer).
        bytes, flops: what one call must move and compute (from the kernels' cost functions), or None.
        env: versions and device names, as strings.
        l2: the cache state each timed repetition started from: "warm" (repetitions back to back),
            "flushed" (an L2-sized write before each), "not flushed (cpu)" (a flush was asked for on the CPU,
            where none is done). Part of the key: a warm and a flushed record measured different things.
        graph_calls: calls per captured CUDA graph when timed by graph replay (per-call time = replay time /
            graph_calls); None: each call timed on its own.
        extra: facts the benchmark attaches to this record, JSON values only (``gpu_kernels.py``: its check,
            registers and spills, footprint; see benchmarks/README.md).
        measurement: for inspection, never saved to JSON: the ``torch.utils.benchmark.Measurement`` on the
            CPU, the list of per-call event times (us) on a GPU/NPU.
    """

    what: str
    device: str
    shape: dict[str, int]
    impl: str
    mode: str
    median_us: float
    iqr_us: float
    n: int
    threads: int
    bytes: int | None = None
    flops: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    l2: str = L2_WARM
    graph_calls: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    measurement: Any = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> tuple[Any, ...]:
        """What was measured (``KEY_FIELDS``), hashable."""
        return tuple(tuple(sorted(self.shape.items())) if f == "shape" else getattr(self, f) for f in KEY_FIELDS)

    @property
    def gbps(self) -> float | None:
        """Achieved bandwidth, GB/s (``bytes`` over the median), or None without a byte count."""
        return self.bytes / (self.median_us * 1e3) if self.bytes is not None and self.median_us > 0 else None

    @property
    def tflops(self) -> float | None:
        """Achieved compute rate, TFLOP/s, or None without a FLOP count."""
        return self.flops / (self.median_us * 1e6) if self.flops is not None and self.median_us > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field but ``measurement``."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "measurement"}
        d["shape"], d["env"], d["extra"] = dict(self.shape), dict(self.env), dict(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TimingRecord:
        """Inverse of :meth:`to_dict`; raises :class:`TimingError` naming a missing or unknown field."""
        if not isinstance(d, dict):
            raise TimingError(f"record: expected a dict, got {type(d).__name__}")
        names = {f.name for f in fields(cls)} - {"measurement"}
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        missing, unknown = sorted(required - set(d)), sorted(set(d) - names)
        if missing or unknown:
            raise TimingError(f"record: missing fields {missing}, unknown fields {unknown} (schema {SCHEMA})")
        rec = cls(**{k: d[k] for k in names if k in d})
        rec.shape = {str(k): int(v) for k, v in rec.shape.items()}
        rec.env = {str(k): str(v) for k, v in rec.env.items()}
        if not isinstance(rec.extra, dict):
            raise TimingError(f"record: extra must be a dict, got {type(rec.extra).__name__}")
        return rec

    def __repr__(self) -> str:
        extra = f", {self.gbps:.1f} GB/s" if self.gbps is not None else ""
        extra += f", graph x{self.graph_calls}" if self.graph_calls else ""
        extra += f", L2 {self.l2}" if self.l2 != L2_WARM else ""
        return (
            f"TimingRecord({self.what} [{_shape_text(self.shape)}] {self.impl}/{self.mode} on {self.device}: "
            f"{_fmt_us(self.median_us)} median, IQR {_fmt_us(self.iqr_us)}, n={self.n}, "
            f"threads={self.threads}{extra})"
        )

    def _repr_html_(self) -> str:
        return Results([self])._repr_html_()

    @classmethod
    def from_times(
        cls,
        times_us: Iterable[float],
        *,
        what: str,
        device: str,
        shape: dict[str, int],
        impl: str,
        mode: str,
        threads: int,
        **rest: Any,
    ) -> TimingRecord:
        """The record of per-call times ``times_us`` (microseconds): ``median_us`` and ``iqr_us`` by
        :func:`quartiles`, ``n`` their count, ``measurement`` the times; every other field as given.

        >>> rec = TimingRecord.from_times([12.0, 10.0, 11.0, 30.0, 13.0], what="step", device="cpu", shape={},
        ...                               impl="ref", mode="eager", threads=1)
        >>> rec.median_us, rec.iqr_us, rec.n
        (12.0, 2.0, 5)
        """
        times = [float(t) for t in times_us]
        median_us, iqr_us = quartiles(times)
        return cls(
            what=what,
            device=device,
            shape=shape,
            impl=impl,
            mode=mode,
            median_us=median_us,
            iqr_us=iqr_us,
            n=len(times),
            threads=threads,
            measurement=times,
            **rest,
        )


def quartiles(xs: Iterable[float]) -> tuple[float, float]:
    """(median, IQR) of ``xs``: the one median and interquartile range of the workbench (every record of
    :func:`time_fn` and :meth:`TimingRecord.from_times`, the ceilings' spread, the bench tables).

    The quartiles interpolate linearly between order statistics (``statistics.quantiles(method="inclusive")``:
    numpy's and ``torch.quantile``'s default, the definition ``torch.utils.benchmark.Measurement.iqr`` uses).
    One value has an IQR of 0.0; none is a TimingError.

    >>> quartiles([4.0, 1.0, 3.0, 2.0, 100.0])
    (3.0, 2.0)
    >>> quartiles([7.0])
    (7.0, 0.0)
    """
    values = list(xs)
    if not values:
        raise TimingError("times: no values, so no median and no IQR")
    if len(values) < 2:
        return values[0], 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), q[2] - q[0]


def iqr(xs: Iterable[float]) -> float:
    """The interquartile range of ``xs`` (:func:`quartiles`: 0.0 for one value).

    >>> iqr([1.0, 2.0, 3.0, 4.0, 5.0])
    2.0
    """
    return quartiles(xs)[1]


def is_noisy(rec: TimingRecord) -> bool:
    """Whether ``rec``'s IQR exceeds ``NOISY_IQR`` of its median (then its median is no measured difference).

    >>> is_noisy(TimingRecord("x", "cpu", {}, "ref", "eager", 100.0, 30.0, 9, 1))
    True
    """
    return bool(rec.iqr_us > NOISY_IQR * rec.median_us)


def json_safe(value: Any) -> Any:
    """``value`` as strict JSON holds it (what :meth:`Results.save` writes: no inf, no NaN): non-finite
    floats become their text ("inf", "nan"), tuples lists, dict keys strings; for ``meta`` and ``extra``.

    >>> json_safe({"err": float("inf"), "slots": (1, 2)})
    {'err': 'inf', 'slots': [1, 2]}
    """
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


@dataclass
class Results:
    """Timing records of one run plus ``meta`` (benchmark name, environment, ceilings, settings).

    A sequence of :class:`TimingRecord`: ``len``, iteration, indexing, ``filter(**field=value)``.
    """

    records: list[TimingRecord] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[TimingRecord]:
        return iter(self.records)

    def __getitem__(self, i: int) -> TimingRecord:
        return self.records[i]

    def append(self, rec: TimingRecord) -> None:
        self.records.append(rec)

    def filter(self, **where: Any) -> Results:
        """Records whose fields equal ``where`` (``shape`` entries by name: ``filter(bs=4)``)."""
        top = {k: v for k, v in where.items() if k in {f.name for f in fields(TimingRecord)}}
        inner = {k: v for k, v in where.items() if k not in top}
        keep = [
            r
            for r in self.records
            if all(getattr(r, k) == v for k, v in top.items()) and all(r.shape.get(k) == v for k, v in inner.items())
        ]
        return Results(keep, dict(self.meta))

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "meta": self.meta, "records": [r.to_dict() for r in self.records]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Results:
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            got = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise TimingError(f"schema: expected {SCHEMA!r}, got {got!r} (re-run the benchmark to write it anew)")
        return cls([TimingRecord.from_dict(r) for r in d.get("records", [])], dict(d.get("meta", {})))

    def save(self, path: str | os.PathLike) -> Path:
        """Write JSON to ``path``; its folder must exist (nothing is created silently)."""
        p = Path(path)
        if not p.parent.is_dir():
            raise TimingError(f"path: folder {str(p.parent)!r} of {str(p)!r} does not exist")
        try:
            text = json.dumps(self.to_dict(), indent=1, allow_nan=False)
        except (TypeError, ValueError) as e:  # inf/NaN or an object JSON cannot hold: nothing is written
            raise TimingError(f"results: not strict JSON ({e}); pass meta and extra through json_safe") from None
        p.write_text(text + "\n")
        return p

    @classmethod
    def load(cls, path: str | os.PathLike) -> Results:
        p = Path(path)
        if not p.is_file():
            raise TimingError(f"path: no results file at {str(p)!r}")
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise TimingError(f"path: {str(p)!r} is not JSON ({e})") from None
        return cls.from_dict(data)

    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per record; ``shape`` entries become columns (pandas: ``lab`` extra)."""
        pd = require("pandas", "lab", "Results.to_frame()")

        rows = []
        for r in self.records:
            row = {k: v for k, v in r.to_dict().items() if k not in ("shape", "env")}
            row.update(r.shape)
            row["gbps"], row["tflops"] = r.gbps, r.tflops
            rows.append(row)
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        head = f"Results({self.meta.get('benchmark', '?')}: {len(self)} records)"
        return "\n".join([head] + [f"  {r!r}" for r in self.records[:20]] + (["  ..."] if len(self) > 20 else []))

    def _repr_html_(self) -> str:
        cols = ["what", "shape", "impl", "mode", "device", "median", "IQR", "n", "threads", "GB/s"]
        rows = [
            [
                r.what,
                _shape_text(r.shape),
                r.impl,
                r.mode,
                r.device,
                _fmt_us(r.median_us),
                _fmt_us(r.iqr_us),
                r.n,
                r.threads,
                f"{r.gbps:.1f}" if r.gbps is not None else "",
            ]
            for r in self.records
        ]
        # a spread over a quarter of the median: worth a rerun on a quiet machine
        kinds = ["warn" if is_noisy(r) else "live" for r in self.records]
        title = (
            f"{self.meta.get('benchmark', 'timings')}: {len(self)} records "
            f"(IQR above {NOISY_IQR:.0%} of the median shaded)"
        )
        return html.table(cols, rows, row_kinds=kinds, caption=title, left=("what", "shape", "impl", "mode"))


@dataclass
class Ratios:
    """``a.median / b.median`` for every key the two sides share (>1: ``a`` takes longer)."""

    rows: list[tuple[dict[str, Any], float]]
    fields: tuple[str, ...]

    def values(self) -> list[float]:
        return [r for _, r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per pair: the key fields and ``ratio`` (pandas: ``lab`` extra)."""
        pd = require("pandas", "lab", "Ratios.to_frame()")

        return pd.DataFrame([{**k, "ratio": r} for k, r in self.rows])

    def __repr__(self) -> str:
        lines = [f"Ratios(a/b over {', '.join(self.fields)}: {len(self)} pairs)"]
        lines += [f"  {k}: {r:.3f}" for k, r in self.rows[:20]]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = [[_shape_text(k[f]) if f == "shape" else k[f] for f in self.fields] + [f"{r:.3f}"] for k, r in self.rows]
        return html.table([*self.fields, "a / b"], rows, left=self.fields)


def _constant(values: Iterable[Any]) -> Any:
    vals = list(values)
    return vals[0] if vals and all(v == vals[0] for v in vals) else None


@overload
def ratio(a: TimingRecord, b: TimingRecord, *, on: Sequence[str] | None = None) -> float: ...
@overload
def ratio(a: Results, b: Results, *, on: Sequence[str] | None = None) -> Ratios: ...
def ratio(a: TimingRecord | Results, b: TimingRecord | Results, *, on: Sequence[str] | None = None) -> float | Ratios:
    """Ratios of medians, ``a / b``: two records give a float, two ``Results`` give :class:`Ratios`.

    Records are paired by ``on`` (default: the ``KEY_FIELDS`` that are not one constant value on each side
    that differs between the sides). So two runs of one benchmark pair by everything; ``ratio(
    res.filter(impl="triton"), res.filter(impl="reference"))`` pairs by shape and mode (two impls);
    ``filter(mode="eager")`` against ``filter(mode="replay")`` gives the replay speed-up per shape.
    A ``QUIET_KEY_FIELDS`` field (``l2``) joins the default only where its values differ inside the records
    (warm and flushed records side by side pair warm with warm); one value throughout pairs nothing apart.
    """
    if isinstance(a, TimingRecord) and isinstance(b, TimingRecord):
        if b.median_us <= 0:
            raise TimingError(f"b.median_us: must be > 0 to divide by, got {b.median_us}")
        return a.median_us / b.median_us
    if not (isinstance(a, Results) and isinstance(b, Results)):
        raise TimingError(
            f"ratio: expected two TimingRecords or two Results, got {type(a).__name__}, {type(b).__name__}"
        )
    if on is None:
        on = []
        for f in KEY_FIELDS:
            ca = _constant(r.key[KEY_FIELDS.index(f)] for r in a)
            cb = _constant(r.key[KEY_FIELDS.index(f)] for r in b)
            if f in QUIET_KEY_FIELDS and ca is not None and ca == cb:
                continue  # one value on both sides: pairs nothing apart, and would only add a column
            if not (ca is not None and cb is not None and ca != cb):
                on.append(f)
    bad = [f for f in on if f not in KEY_FIELDS]
    if bad:
        raise TimingError(f"on: {bad} are not record key fields {KEY_FIELDS}")
    idx = [KEY_FIELDS.index(f) for f in on]

    def sub(r: TimingRecord) -> tuple[Any, ...]:
        return tuple(r.key[i] for i in idx)

    lookup = {sub(r): r for r in b}
    rows = []
    for r in a:
        other = lookup.get(sub(r))
        if other is not None and other.median_us > 0:
            keyd = {f: (r.shape if f == "shape" else getattr(r, f)) for f in on}
            rows.append((keyd, r.median_us / other.median_us))
    return Ratios(rows, tuple(on))


# -- environment -----------------------------------------------------------------------------------------
def device_type(device: str | torch.device) -> str:
    """The device type of ``device`` ("cuda:1" gives "cuda"); raises on anything but cpu, cuda or npu.

    Parsed from the string: ``torch.device("npu")`` itself fails where torch_npu is not imported."""
    kind = device.type if isinstance(device, torch.device) else str(device).split(":", 1)[0].strip().lower()
    if kind not in ("cpu", "cuda", "npu"):
        raise TimingError(f"device: expected cpu, cuda or npu, got {str(device)!r}")
    return kind


def resolve_device(device: str) -> str:
    """The device a run uses: "auto" is cuda when usable, else npu when torch_npu is already imported and
    usable, else cpu. A named device that is not usable raises, saying why (``workbench.devices``)."""
    npu = getattr(torch, "npu", None)
    npu_ok = npu is not None and bool(npu.is_available())
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "npu" if npu_ok else "cpu"
    kind, colon, index = str(device).partition(":")
    if kind not in ("cpu", "cuda", "npu") or (colon and not index.isdigit()):
        raise TimingError(f"--device: expected auto, cpu, cuda or npu (with an optional index: cuda:1), got {device!r}")
    if kind == "cpu":
        return "cpu"  # "cpu:0" is the cpu: results are named by device type
    if kind == "cuda" and not torch.cuda.is_available():
        from workbench.devices import devices

        why = {d.name: d.detail for d in devices(probe_npu=False)}["cuda"]
        raise TimingError(f"--device: cuda is not usable here ({why})")
    if kind == "npu" and not npu_ok:
        raise TimingError("--device: npu is not usable here (torch_npu not imported or no Ascend device)")
    return device


def environment(device: str = "cpu") -> dict[str, str]:
    """Versions and device names a result records about the machine that produced it (strings only)."""
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": str(os.cpu_count()),
        "torch_threads": str(torch.get_num_threads()),
    }
    if hasattr(os, "getloadavg"):  # on a shared machine the load explains a wide IQR
        env["loadavg_1min"] = f"{os.getloadavg()[0]:.2f}"
    kind = device_type(device)
    if kind == "cuda" and torch.cuda.is_available():
        env["device_name"] = torch.cuda.get_device_name(torch.device(device))
        env["cuda"] = str(torch.version.cuda)
    elif kind == "npu":
        npu = getattr(torch, "npu", None)
        if npu is not None:
            env["device_name"] = str(npu.get_device_name(torch.device(device)))
    elif kind == "cpu":  # a device that is not usable here gets no name rather than the host's
        env["device_name"] = platform.processor() or platform.machine()
    return env


# -- timers ----------------------------------------------------------------------------------------------


def _time_cpu(
    fn: Callable[[], Any], warmup: int, min_run_time: float, threads: int | None
) -> tuple[float, float, int, int, Any]:
    from torch.utils import benchmark
    from torch.utils.benchmark.utils.common import Measurement, set_torch_threads

    seen: list[int] = []
    n_threads = threads if threads is not None else torch.get_num_threads()
    timer = benchmark.Timer(
        stmt="fn()",
        setup="seen.append(torch.get_num_threads())",  # runs under the timer's own thread setting
        globals={"fn": fn, "seen": seen, "torch": torch},
        num_threads=n_threads,
    )
    with set_torch_threads(n_threads):  # warm-up under the same thread setting as the timed runs
        for _ in range(warmup):
            fn()
    m = timer.blocked_autorange(min_run_time=min_run_time)
    times = list(m.times)  # per-call seconds, one per block
    while len(times) < MIN_REPS:
        # a slow call fills min_run_time in fewer blocks than a median and an IQR need: more blocks, sized
        # for the missing ones (Timer.timeit would add two warm-up calls to each single one)
        more = timer.blocked_autorange(min_run_time=(MIN_REPS - len(times)) * max(times))
        times += list(more.times)
    if len(times) > len(m.times):
        m = Measurement(number_per_run=1, raw_times=times, task_spec=m.task_spec)
    med, spread = quartiles(t * 1e6 for t in m.times)  # the workbench's quartiles, not Measurement's own
    return med, spread, len(m.times), seen[-1] if seen else n_threads, m


def _accelerator(kind: str, device: str | torch.device) -> Any:
    """``torch.cuda`` or ``torch.npu`` when usable here, else a TimingError saying why."""
    mod = torch.cuda if kind == "cuda" else getattr(torch, "npu", None)
    if mod is None or not mod.is_available():
        why = "torch_npu is not imported or no Ascend device" if kind == "npu" else "no CUDA device"
        raise TimingError(f"device: {str(device)!r} is not available here ({why})")
    return mod


def l2_cache_bytes(device: str | torch.device) -> int | None:
    """The L2 size ``device`` reports (``get_device_properties(dev).L2_cache_size``, bytes); None on the CPU
    or where the device reports none. Raises TimingError when the device is not usable here."""
    kind = device_type(device)
    if kind == "cpu":
        return None
    props = _accelerator(kind, device).get_device_properties(torch.device(device))
    size = getattr(props, "L2_cache_size", None)
    return int(size) if size else None


def _l2_flush(device: str | torch.device) -> Callable[[], Any]:
    """A call that rewrites (reads and writes) a uint8 buffer twice the device's L2: what the L2 held is gone."""
    size = l2_cache_bytes(device)
    if size is None:
        raise TimingError(f"flush_l2: {str(device)!r} reports no L2 size (get_device_properties(..).L2_cache_size)")
    buf = torch.zeros(2 * size, dtype=torch.uint8, device=torch.device(device))
    return partial(buf.add_, 1)


def _graph_replay(mod: Any, fn: Callable[[], Any], calls: int, warmup: int) -> Callable[[], Any]:
    """Capture ``calls`` calls of ``fn`` into one CUDA graph and return its replay.

    Warm-up runs on a side stream first, as capture requires (lazy initialisation, compilation and the
    allocator's first blocks stay out of the graph). A refused capture (a host sync inside ``fn``, an op
    that cannot be captured) raises GraphCaptureError naming the cause."""
    side = mod.Stream()
    side.wait_stream(mod.current_stream())
    with mod.stream(side):
        for _ in range(max(warmup, 1)):
            fn()
    mod.current_stream().wait_stream(side)
    mod.synchronize()
    graph = mod.CUDAGraph()
    try:
        with mod.graph(graph):
            for _ in range(calls):
                fn()
    except Exception as e:  # what capture refuses is the callable's business: say what it was
        first = (str(e).splitlines() or [""])[0][:200]
        raise GraphCaptureError(f"graph_calls: capture refused ({type(e).__name__}: {first})") from e
    return graph.replay


def _time_events(
    fn: Callable[[], Any],
    kind: str,
    warmup: int,
    min_run_time: float,
    device: str,
    graph_calls: int | None = None,
    flush_l2: bool = False,
) -> tuple[float, float, int, list[float]]:
    """Per-call event times (us) of ``fn`` on a GPU/NPU: median, IQR, repetitions, the times themselves.

    A repetition is one call, or one replay of ``graph_calls`` captured calls (its time / graph_calls); with
    ``flush_l2`` the L2 is rewritten before each repetition's start event, outside the timed span."""
    mod = _accelerator(kind, device)
    dev = torch.device(device)
    per = graph_calls or 1
    with mod.device(dev):
        if graph_calls:
            run = _graph_replay(mod, fn, graph_calls, warmup)
        else:
            run = fn
            for _ in range(max(warmup, 1)):
                fn()
        flush = _l2_flush(dev) if flush_l2 else None
        run()  # a graph's first replay uploads it: not a timed one
        mod.synchronize()
        # size the repetitions from one pass (its flush included) so the run lasts about min_run_time
        t0 = time.perf_counter()
        if flush is not None:
            flush()
        run()
        mod.synchronize()
        one = max(time.perf_counter() - t0, 1e-6)
        reps = int(min(10_000, max(10, min_run_time / one)))
        starts = [mod.Event(enable_timing=True) for _ in range(reps)]
        ends = [mod.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends, strict=True):
            if flush is not None:
                flush()
            s.record()
            run()
            e.record()
        mod.synchronize()
        # elapsed_time is ms
        times_us = [s.elapsed_time(e) * 1e3 / per for s, e in zip(starts, ends, strict=True)]
    med, spread = quartiles(times_us)
    return med, spread, reps, times_us


def _check_graph_options(kind: str, device: str, graph_calls: int | None, flush_l2: bool) -> None:
    """Refuse what ``graph_calls`` / ``flush_l2`` cannot mean on ``kind``, with a line saying why."""
    bad_calls = isinstance(graph_calls, bool) or not isinstance(graph_calls, int) or graph_calls < 1
    if graph_calls is not None and bad_calls:
        raise TimingError(f"graph_calls: expected an int >= 1 or None, got {graph_calls!r}")
    if not isinstance(flush_l2, bool):
        raise TimingError(f"flush_l2: expected True or False, got {flush_l2!r}")
    if flush_l2 and graph_calls is not None and graph_calls > 1:
        raise TimingError(
            f"flush_l2: with graph_calls={graph_calls} only the first call of each replay starts from a flushed "
            "L2; use graph_calls=1 to time cold calls, or no flush to time warm ones"
        )
    if graph_calls is not None and kind != "cuda":
        raise TimingError(
            f"graph_calls: CUDA graphs (torch.cuda.CUDAGraph) need a CUDA device, got device {str(device)!r}; "
            "time without graph_calls here"
        )


def time_fn(
    fn: Callable[[], Any],
    *,
    what: str,
    device: str = "cpu",
    shape: dict[str, int] | None = None,
    impl: str = "",
    mode: str = "kernel",
    warmup: int = 1,
    min_run_time: float = 0.2,
    threads: int | None = None,
    bytes: int | None = None,
    flops: int | None = None,
    graph_calls: int | None = None,
    flush_l2: bool = False,
    extra: dict[str, Any] | None = None,
) -> TimingRecord:
    """Time ``fn()`` on ``device`` and return its record (median and IQR over many repetitions).

    CPU: ``warmup`` calls, then ``torch.utils.benchmark.Timer.blocked_autorange(min_run_time)`` with
    ``threads`` threads (default: the caller's ``torch.get_num_threads()``; Timer's own default is 1),
    topped up with more blocks to at least ``MIN_REPS`` measurements; the thread count recorded is the
    one observed inside the timer. CUDA/NPU: ``warmup`` calls, then as many event-timed calls as fill
    ``min_run_time`` (at least 10), synchronised once at the end.

    ``graph_calls=N`` (CUDA only; TimingError elsewhere, or when capture is refused): warm-up on a side
    stream, ``N`` calls captured into one CUDA graph, each repetition one replay; per-call time = replay /
    N. ``flush_l2`` (GPU/NPU): an L2-sized rewrite before each repetition, outside the timed span; on the
    CPU nothing is flushed and ``l2`` says so. ``extra`` is copied into the record. See the module
    docstring for what each option records.
    """
    if not callable(fn):
        raise TimingError(f"fn: expected a callable, got {type(fn).__name__}")
    if not (isinstance(min_run_time, int | float) and math.isfinite(min_run_time) and min_run_time > 0):
        raise TimingError(f"min_run_time: expected seconds > 0, got {min_run_time!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise TimingError(f"warmup: expected an int >= 0, got {warmup!r}")
    kind = device_type(device)
    _check_graph_options(kind, device, graph_calls, flush_l2)
    measurement: Any = None
    if kind == "cpu":
        med, spread, n, used, measurement = _time_cpu(fn, warmup, min_run_time, threads)
        l2 = L2_NOT_FLUSHED_CPU if flush_l2 else L2_WARM
    else:
        med, spread, n, measurement = _time_events(fn, kind, warmup, min_run_time, device, graph_calls, flush_l2)
        used = torch.get_num_threads()
        l2 = L2_FLUSHED if flush_l2 else L2_WARM
    return TimingRecord(
        what=what,
        device=kind,
        shape=dict(shape or {}),
        impl=impl,
        mode=mode,
        median_us=med,
        iqr_us=spread,
        n=n,
        threads=used,
        bytes=bytes,
        flops=flops,
        env=environment(device),
        l2=l2,
        graph_calls=graph_calls,
        extra=dict(extra or {}),
        measurement=measurement,
    )


__all__ = [
    "KEY_FIELDS",
    "GraphCaptureError",
    "L2_FLUSHED",
    "L2_NOT_FLUSHED_CPU",
    "L2_WARM",
    "SCHEMA",
    "Ratios",
    "Results",
    "TimingError",
    "TimingRecord",
    "ratio",
    "device_type",
    "environment",
    "iqr",
    "is_noisy",
    "json_safe",
    "l2_cache_bytes",
    "quartiles",
    "resolve_device",
    "time_fn",
]
