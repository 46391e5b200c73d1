"""What the current device can do at best, measured in the same run as the kernels it is a ceiling for.

Two ceilings: copy bandwidth (one large ``copy_``: read + write of the same bytes) and a dense matmul rate.
A kernel's fraction of them is its ``bytes`` (or ``flops``, from ``kernels/*/cost.py``) over its median time
divided by the ceiling: a memory-bound decode step near 1.0 of copy bandwidth has nothing left to gain.

One timing of a copy on a shared machine is not a ceiling: four runs of the same 64 MiB copy on a 2-core CPU
gave 8.5, 14.1, 32.4 and 42.0 GB/s. So each ceiling is the median of several repeats (interleaved copy,
matmul, copy, ..., so they sample different moments), and every repeat is kept (``copy_runs``,
``matmul_runs``) to show the spread. The copy is sized past the last-level cache, so it measures DRAM; a
kernel whose bytes fit that cache (``fits_cache``) reads them from the cache on every repeated call and can
go past 100% of it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

import torch

from workbench import html
from workbench.limits import check_memory, gib
from workbench.measure.timing import TimingError, TimingRecord, device_type, iqr, l2_cache_bytes, time_fn

CPU_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
DEFAULT_CACHE_BYTES = 32 * 2**20
"""The last-level cache assumed where none can be read (said as "assumed" wherever it is used)."""
REPEATS = 5


def _size(text: str) -> int:
    """ "32768K" / "1M" / "512" (sysfs cache sizes) in bytes."""
    text = text.strip().upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def cpu_last_level_cache(root: Path = CPU_CACHE_DIR) -> tuple[int, str]:
    """(bytes, name) of the highest-level data or unified cache of cpu0 read from sysfs, e.g.
    ``(33554432, "L3")``; ``(DEFAULT_CACHE_BYTES, "L3 (assumed 32 MiB: none readable)")`` where sysfs says
    nothing (not Linux, a container without it)."""
    best: tuple[int, int] | None = None  # (level, bytes)
    for index in sorted(root.glob("index*")):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level, size = int((index / "level").read_text()), _size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if best is None or level > best[0]:
            best = (level, size)
    if best is None:
        return DEFAULT_CACHE_BYTES, f"L3 (assumed {gib(DEFAULT_CACHE_BYTES)}: none readable)"
    return best[1], f"L{best[0]}"


def last_level_cache(device: str) -> tuple[int | None, str]:
    """(bytes, name) of the last cache before DRAM on ``device``: sysfs on the CPU, the L2 a GPU/NPU reports
    (``get_device_properties``); ``(None, "")`` where the device reports none."""
    if device_type(device) == "cpu":
        return cpu_last_level_cache()
    size = l2_cache_bytes(device)
    return (size, "L2") if size else (None, "")


def _spread(runs: tuple[float, ...]) -> tuple[float, float] | None:
    return (min(runs), max(runs)) if runs else None


@dataclass(frozen=True)
class Ceilings:
    """Measured peak rates of one device.

    Attributes:
        copy_gbps: GB/s of a large copy (``dst.copy_(src)`` into preallocated memory) counting read + write
            (``2 * nbytes / median``): the median over ``copy_runs``. A kernel whose bytes fit the cache can
            exceed it.
        matmul_tflops: TFLOP/s of an ``n x n`` matmul (``2 n^3 / median``) in ``matmul_dtype``, the median over
            ``matmul_runs``.
        device: "cpu" | "cuda" | "npu".
        copy_bytes: size of the copied tensor; matmul_n, matmul_dtype: the matmul measured.
        copy_runs, matmul_runs: each repeat's rate (GB/s, TFLOP/s); empty in files written before repeats.
        cache_bytes, cache_name: the last-level cache ("L3", a GPU's "L2"; None when unknown): records whose
            bytes fit in it are read from the cache, not DRAM (``fits_cache``).
    """

    copy_gbps: float
    matmul_tflops: float
    device: str = "cpu"
    copy_bytes: int = 0
    matmul_n: int = 0
    matmul_dtype: str = "float32"
    copy_runs: tuple[float, ...] = ()
    matmul_runs: tuple[float, ...] = ()
    cache_bytes: int | None = None
    cache_name: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["copy_runs"], d["matmul_runs"] = list(self.copy_runs), list(self.matmul_runs)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Ceilings:
        """Inverse of :meth:`to_dict`; a dict without the repeat fields (older files) reads as no spread."""
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise TimingError(f"ceilings: unknown fields {unknown}")
        try:
            runs = {k: tuple(float(x) for x in d.get(k, ())) for k in ("copy_runs", "matmul_runs")}
            return cls(**{**d, **runs})
        except (TypeError, ValueError) as e:
            raise TimingError(f"ceilings: {e}") from None

    @property
    def copy_spread(self) -> tuple[float, float] | None:
        """(min, max) GB/s over the copy repeats; None without repeats."""
        return _spread(self.copy_runs)

    @property
    def matmul_spread(self) -> tuple[float, float] | None:
        """(min, max) TFLOP/s over the matmul repeats; None without repeats."""
        return _spread(self.matmul_runs)

    @property
    def copy_iqr(self) -> float | None:
        """Interquartile range of the copy repeats (GB/s); None for fewer than two."""
        return iqr(self.copy_runs) if len(self.copy_runs) >= 2 else None

    def fraction_of_copy(self, rec: TimingRecord) -> float | None:
        """``rec``'s achieved bandwidth over the copy ceiling, or None when it has no byte count."""
        return rec.gbps / self.copy_gbps if rec.gbps is not None and self.copy_gbps > 0 else None

    def fraction_of_matmul(self, rec: TimingRecord) -> float | None:
        """``rec``'s achieved FLOP rate over the matmul ceiling, or None when it has no FLOP count."""
        return rec.tflops / self.matmul_tflops if rec.tflops is not None and self.matmul_tflops > 0 else None

    @property
    def copy_in_cache(self) -> bool:
        """Whether the copy's source and destination fit the last-level cache: then the "copy ceiling"
        measured the cache, not DRAM (a quick run's small copy)."""
        return bool(self.cache_bytes and 2 * self.copy_bytes <= self.cache_bytes)

    def fits_cache(self, rec: TimingRecord) -> bool | None:
        """Whether the bytes ``rec`` moves per call fit the last-level cache (then back-to-back calls find them
        there, faster than the DRAM copy); None without a byte count or a cache size."""
        if rec.bytes is None or not self.cache_bytes:
            return None
        return rec.bytes <= self.cache_bytes

    def copy_text(self) -> str:
        """``14.1 GB/s (median of 5: 8.5-42.0)``, or ``14.1 GB/s (1 run: spread unknown)``."""
        s = self.copy_spread
        if s is None:
            return f"{self.copy_gbps:.1f} GB/s (1 run: spread unknown)"
        return f"{self.copy_gbps:.1f} GB/s (median of {len(self.copy_runs)}: {s[0]:.1f}-{s[1]:.1f})"

    def matmul_text(self) -> str:
        """``0.123 TFLOP/s (median of 5: 0.101-0.130)``, or ``... (1 run: spread unknown)``."""
        s = self.matmul_spread
        if s is None:
            return f"{self.matmul_tflops:.3f} TFLOP/s (1 run: spread unknown)"
        return f"{self.matmul_tflops:.3f} TFLOP/s (median of {len(self.matmul_runs)}: {s[0]:.3f}-{s[1]:.3f})"

    def cache_text(self) -> str:
        """``L3 32 MiB`` or ``cache unknown``."""
        return f"{self.cache_name} {gib(self.cache_bytes)}" if self.cache_bytes else "cache unknown"

    def __repr__(self) -> str:
        return (
            f"Ceilings({self.device}: copy {self.copy_text()}, {self.copy_bytes / 2**20:.0f} MiB copy; "
            f"matmul {self.matmul_text()}, {self.matmul_n}^2 {self.matmul_dtype}; {self.cache_text()})"
        )

    def _repr_html_(self) -> str:
        def spread(s: tuple[float, float] | None, fmt: str) -> str:
            return "1 run: unknown" if s is None else f"{s[0]:{fmt}} - {s[1]:{fmt}}"

        c, m = self.copy_spread, self.matmul_spread
        # a spread wider than half the median: the ceiling itself is unsure, and every fraction with it
        wide = c is not None and self.copy_gbps > 0 and (c[1] - c[0]) > 0.5 * self.copy_gbps
        row = [
            self.device,
            f"{self.copy_gbps:.1f}",
            spread(c, ".1f"),
            f"{self.matmul_tflops:.3f}",
            spread(m, ".3f"),
            f"{self.matmul_n}^2 {self.matmul_dtype}",
            f"{gib(self.copy_bytes)} copy; {self.cache_text()}",
        ]
        cols = ["device", "copy GB/s", "copy min - max", "matmul TFLOP/s", "matmul min - max", "matmul", "sizes"]
        out = html.table(cols, [row], left=("device", "matmul", "sizes"), row_kinds=["warn" if wide else "live"])
        runs = max(len(self.copy_runs), 1)
        where = f"the {self.cache_text()}" if self.cache_bytes else "a cache (its size not recorded)"
        note = (
            f"Each ceiling is the median of {runs} repeat(s); min - max is their spread"
            + (": wide, so every fraction of it is as unsure." if wide else ".")
            + f" Records whose bytes fit {where} are read from the cache and can pass 100%."
        )
        return out + html.note(note)


def measure_ceilings(
    device: str = "cpu",
    *,
    copy_bytes: int | None = None,
    matmul_n: int | None = None,
    min_run_time: float = 0.2,
    threads: int | None = None,
    repeats: int = REPEATS,
) -> Ceilings:
    """Measure copy bandwidth and the matmul rate on ``device``: ``repeats`` timings of each, interleaved,
    their medians the ceilings and every repeat kept.

    Defaults: a copy of 64 MiB or twice the last-level cache, whichever is larger (source and destination
    then hold four times the cache: DRAM is measured), and a 1024^2 float32 matmul on the CPU (a few
    seconds in all); 1 GiB and 8192^2 bfloat16 on a GPU/NPU. ``min_run_time`` is per repeat.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise TimingError(f"repeats: expected an int >= 1, got {repeats!r}")
    kind = device_type(device)
    gpu = kind != "cpu"
    cache, cache_name = last_level_cache(device)
    nbytes = copy_bytes or (2**30 if gpu else max(2**26, 2 * (cache or 0)))
    n = matmul_n or (8192 if gpu else 1024)
    check_memory(f"copy_bytes={nbytes}", 2 * nbytes, "the copy ceiling's source and destination", device)
    dtype = torch.bfloat16 if gpu else torch.float32
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    # a copy into memory allocated once: a fresh CPU allocation of this size is mmap'ed and page-faulted on
    # every call, which times the kernel's page handling, not the memory (GPU allocators cache: no change)
    dst = torch.empty_like(src)
    copy_into = partial(dst.copy_, src)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    matmul = partial(torch.matmul, a, b)
    copy_runs, matmul_runs = [], []
    timed = partial(time_fn, device=device, min_run_time=min_run_time, threads=threads)
    for _ in range(repeats):
        copy = timed(copy_into, what="copy", shape={"bytes": nbytes})
        mm = timed(matmul, what="matmul", shape={"n": n})
        copy_runs.append(2 * nbytes / (copy.median_us * 1e3))
        matmul_runs.append(2 * n**3 / (mm.median_us * 1e6))
    del src, dst, copy_into, a, b, matmul
    return Ceilings(
        copy_gbps=statistics.median(copy_runs),
        matmul_tflops=statistics.median(matmul_runs),
        device=kind,
        copy_bytes=nbytes,
        matmul_n=n,
        matmul_dtype=str(dtype).removeprefix("torch."),
        copy_runs=tuple(copy_runs),
        matmul_runs=tuple(matmul_runs),
        cache_bytes=cache,
        cache_name=cache_name,
    )
