"""Small timing helpers over torch.utils.benchmark (medians, device-synchronised where needed)."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils import benchmark


@dataclass(frozen=True)
class Timing:
    """Median and interquartile range of one timed callable, in microseconds."""

    label: str
    median_us: float
    iqr_us: float
    runs: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def time_callable(fn: Callable[[], Any], label: str, min_run_time: float = 0.2) -> Timing:
    """Time ``fn()`` with ``Timer.blocked_autorange`` (which syncs CUDA around each block)."""
    fn()  # warm-up: first-call costs (allocator, lazy init) are not the steady state
    m = benchmark.Timer(stmt="fn()", globals={"fn": fn}, label=label).blocked_autorange(min_run_time=min_run_time)
    return Timing(label, m.median * 1e6, m.iqr * 1e6, len(m.times))


def environment() -> dict[str, Any]:
    """What a result JSON records about the machine that produced it."""
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return env


def write_json(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """Write ``payload`` (plus the environment) as indented JSON, creating the folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"environment": environment(), **payload}, f, indent=2)
        f.write("\n")
