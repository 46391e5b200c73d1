"""What the current device can do at best, measured in the same run as the kernels it is a ceiling for.

Two ceilings: copy bandwidth (one large ``clone``: read + write of the same bytes) and a dense matmul rate.
A kernel's fraction of them is its ``bytes`` (or ``flops``, from ``kernels/*/cost.py``) over its median time
divided by the ceiling: a memory-bound decode step near 1.0 of copy bandwidth has nothing left to gain.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from workbench import html
from workbench.measure.timing import TimingError, TimingRecord, device_type, time_fn


@dataclass(frozen=True)
class Ceilings:
    """Measured peak rates of one device.

    Attributes:
        copy_gbps: GB/s of a large clone (``dst.copy_(src)`` into preallocated memory) counting read +
            write (``2 * nbytes / median``). A kernel whose state fits in cache can exceed it.
        matmul_tflops: TFLOP/s of an ``n x n`` matmul (``2 n^3 / median``) in ``matmul_dtype``.
        device: "cpu" | "cuda" | "npu".
        copy_bytes: size of the cloned tensor; matmul_n, matmul_dtype: the matmul measured.
    """

    copy_gbps: float
    matmul_tflops: float
    device: str = "cpu"
    copy_bytes: int = 0
    matmul_n: int = 0
    matmul_dtype: str = "float32"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Ceilings:
        try:
            return cls(**d)
        except TypeError as e:
            raise TimingError(f"ceilings: {e}") from None

    def fraction_of_copy(self, rec: TimingRecord) -> float | None:
        """``rec``'s achieved bandwidth over the copy ceiling, or None when it has no byte count."""
        return rec.gbps / self.copy_gbps if rec.gbps is not None and self.copy_gbps > 0 else None

    def fraction_of_matmul(self, rec: TimingRecord) -> float | None:
        """``rec``'s achieved FLOP rate over the matmul ceiling, or None when it has no FLOP count."""
        return rec.tflops / self.matmul_tflops if rec.tflops is not None and self.matmul_tflops > 0 else None

    def __repr__(self) -> str:
        return (
            f"Ceilings({self.device}: copy {self.copy_gbps:.1f} GB/s ({self.copy_bytes / 2**20:.0f} MiB clone), "
            f"matmul {self.matmul_tflops:.3f} TFLOP/s ({self.matmul_n}^2 {self.matmul_dtype}))"
        )

    def _repr_html_(self) -> str:
        matmul = f"{self.matmul_n}^2 {self.matmul_dtype}"
        row = [self.device, f"{self.copy_gbps:.1f}", f"{self.matmul_tflops:.3f}", matmul]
        return html.table(["device", "copy GB/s", "matmul TFLOP/s", "matmul"], [row], left=("device", "matmul"))


def measure_ceilings(
    device: str = "cpu",
    *,
    copy_bytes: int | None = None,
    matmul_n: int | None = None,
    min_run_time: float = 0.2,
    threads: int | None = None,
) -> Ceilings:
    """Measure copy bandwidth and the matmul rate on ``device``.

    Defaults: a 64 MiB clone and a 1024^2 float32 matmul on the CPU (beyond the caches of this kind of
    machine, a second or so in all); 1 GiB and 8192^2 bfloat16 on a GPU/NPU.
    """
    kind = device_type(device)
    gpu = kind != "cpu"
    nbytes = copy_bytes or (2**30 if gpu else 2**26)
    n = matmul_n or (8192 if gpu else 1024)
    dtype = torch.bfloat16 if gpu else torch.float32
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    # a clone into memory allocated once: a fresh CPU allocation of this size is mmap'ed and page-faulted on
    # every call, which times the kernel's page handling, not the memory (GPU allocators cache: no change)
    dst = torch.empty_like(src)
    copy_into = partial(dst.copy_, src)
    copy = time_fn(
        copy_into, what="copy", device=device, shape={"bytes": nbytes}, min_run_time=min_run_time, threads=threads
    )
    del src, dst, copy_into
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    mm = time_fn(
        lambda: a @ b, what="matmul", device=device, shape={"n": n}, min_run_time=min_run_time, threads=threads
    )
    return Ceilings(
        copy_gbps=2 * nbytes / (copy.median_us * 1e3),
        matmul_tflops=2 * n**3 / (mm.median_us * 1e6),
        device=kind,
        copy_bytes=nbytes,
        matmul_n=n,
        matmul_dtype=str(dtype).removeprefix("torch."),
    )
