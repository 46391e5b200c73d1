"""Graph capture and replay on cuda, npu or the cpu, behind one small interface.

>>> import torch
>>> from workbench.graphs import get_backend
>>> backend = get_backend("cpu")             # "auto": cuda if present, else npu, else the cpu recorder
>>> x = torch.zeros(4, device=backend.device)  # a static input
>>> g = backend.capture(lambda: x * 2 + 1)   # warm-up, then capture
>>> out = g.outputs                          # the same tensor after every replay, overwritten
>>> _ = x.copy_(torch.arange(4.0))           # new values in place (the graph recorded x's address)
>>> g.replay()
>>> out, g.outputs is out
(tensor([1., 3., 5., 7.]), True)

Importing this package never imports torch_npu; ``available_backends()`` and ``get_backend`` try it
(defensively) only when asked about npu or "auto".
"""

from __future__ import annotations

import torch

from workbench.errors import DeviceUnavailable
from workbench.graphs.base import Graph, GraphBackend, OpRecord, TensorMeta
from workbench.graphs.cpu import CpuBackend, CpuGraph
from workbench.graphs.cuda import CudaBackend, CudaGraph
from workbench.graphs.npu import NpuBackend, NpuGraph

BACKENDS: dict[str, type[GraphBackend]] = {"cuda": CudaBackend, "npu": NpuBackend, "cpu": CpuBackend}
NAMES = ("auto", *BACKENDS)


def available_backends() -> dict[str, str]:
    """Each backend's name -> "ok", or why it cannot run here (in words). Never raises."""
    out: dict[str, str] = {}
    for name, cls in BACKENDS.items():
        try:
            ok, why = cls.is_available()
            out[name] = "ok" if ok else why
        except Exception as e:  # is_available should not raise; a report must come back regardless
            out[name] = f"check failed: {type(e).__name__}: {e}"
    return out


def get_backend(name: str = "auto", device: torch.device | str | int | None = None) -> GraphBackend:
    """The graph backend ``name`` ("auto", "cuda", "npu" or "cpu") on ``device``.

    "auto" takes ``device``'s type when a device is given, else cuda if torch sees a CUDA device, else npu
    if torch_npu imports and sees an Ascend device, else cpu. Raises ``DeviceUnavailable`` (saying why)
    when the named backend cannot run here.
    """
    if name not in NAMES:
        raise ValueError(f"graph backend must be one of {NAMES}, got {name!r}")
    if name == "auto":
        if device is not None and not isinstance(device, int):
            name = torch.device(device).type
            if name not in BACKENDS:
                raise DeviceUnavailable(f"no graph backend for device {device!r}; backends: {list(BACKENDS)}")
        else:
            name = next((n for n in ("cuda", "npu") if BACKENDS[n].is_available()[0]), "cpu")
    cls = BACKENDS[name]
    ok, why = cls.is_available()
    if not ok:
        raise DeviceUnavailable(f"graph backend {name!r} is unavailable: {why}")
    return cls(device)


__all__ = [
    "BACKENDS",
    "CpuBackend",
    "CpuGraph",
    "CudaBackend",
    "CudaGraph",
    "Graph",
    "GraphBackend",
    "NpuBackend",
    "NpuGraph",
    "OpRecord",
    "TensorMeta",
    "available_backends",
    "get_backend",
]
