"""Ascend NPU graphs through torch_npu's ``torch.npu.NPUGraph`` (aclgraph).

What is captured: the NPU operators ``fn()`` launches on the capture stream (only aclnn operators can be
captured, per torch_npu's docs); host Python runs once, at capture. Warm-up runs on the capture stream
first, as on cuda, and graphs sharing a ``new_pool()`` handle use the same capture stream.

Not supported: graphs whose operators take host inputs that change per step. torch_npu updates those
with ``NPUGraph.update(cpu_update_input=...)``, which works only for graphs captured with
``torch.npu.graph(..., auto_dispatch_capture=True)``; sglang's NPU runner does both for its attention's
host ``actual_seq_lengths``. The linear-attention steps captured here read every per-step value from
device buffers refreshed in place, so captures use the default dispatch and replays call no ``update``.

torch_npu is imported here only, lazily and defensively: installed without Ascend's CANN libraries it
fails to import (``libhccl.so`` not found), and it must never break ``import workbench.graphs``.

Every torch_npu name this module touches goes through the local alias ``npu`` (``torch.npu`` once
torch_npu is imported), so tests/graphs/test_graph_npu_api.py can read the calls off this file's syntax tree and
check each name, positional count and keyword against the real torch_npu wheel. Methods called on
torch_npu objects are listed in ``TORCH_NPU_METHODS`` for the same check.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar

import torch

from workbench.errors import CaptureError, DeviceUnavailable
from workbench.extras import install_command
from workbench.graphs.base import Graph, GraphBackend, Outputs, check_outputs, check_warmup

#: Methods called on torch_npu objects, by class under ``torch.npu``: name -> positional args passed.
TORCH_NPU_METHODS: dict[str, dict[str, int]] = {
    "NPUGraph": {"replay": 0, "reset": 0},
    "Stream": {"wait_stream": 1},
}


@functools.lru_cache(maxsize=1)
def _load() -> tuple[ModuleType | None, str]:
    """(``torch.npu``, "ok") once torch_npu imports, else (None, why not). Cached: imports are slow."""
    if importlib.util.find_spec("torch_npu") is None:
        return None, f"torch_npu not installed ({install_command('npu')} on a machine with CANN)"
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ImportError as e:  # missing CANN shared libraries surface here (libhccl.so, libascendcl.so)
        return None, f"torch_npu failed to import: {e}"
    except OSError as e:
        return None, f"torch_npu failed to import: {e}"
    except Exception as e:  # a version mismatch with torch and the like
        return None, f"torch_npu failed to import: {type(e).__name__}: {e}"
    npu = getattr(torch, "npu", None)
    if npu is None:
        return None, "torch_npu imported but did not register torch.npu"
    return npu, "ok"


def _torch_npu() -> ModuleType:
    npu, why = _load()
    if npu is None:
        raise DeviceUnavailable(f"graph backend 'npu' is unavailable: {why}")
    return npu


class NpuGraph(Graph):
    """A ``torch.npu.NPUGraph`` and the static outputs of its capture."""

    def __init__(self, backend: NpuBackend, outputs: Outputs, graph: Any) -> None:
        super().__init__(backend, outputs)
        self._graph = graph

    def replay(self) -> None:
        """Enqueue the graph on the current NPU stream (ordered after the caller's ``copy_`` there)."""
        self._check_live()
        self._graph.replay()

    def reset(self) -> None:
        """Free the graph (``NPUGraph.reset``)."""
        self._graph.reset()
        self._reset = True


class NpuBackend(GraphBackend):
    """NPU graph capture on one Ascend device."""

    name: ClassVar[str] = "npu"

    def __init__(self, device: torch.device | str | int | None = None) -> None:
        self._require()
        npu = _torch_npu()
        if device is None:
            dev = torch.device("npu", npu.current_device())
        else:
            dev = torch.device("npu", device) if isinstance(device, int) else torch.device(device)
            if dev.type != "npu":
                raise ValueError(f"the npu graph backend needs an npu device, got {dev}")
            if dev.index is None:
                dev = torch.device("npu", npu.current_device())
        self.device = dev
        npu.set_device(dev)
        self._stream = npu.Stream(device=dev)

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        """(True, "ok") when torch_npu imports and sees an Ascend device; else why not."""
        try:
            npu, why = _load()
            if npu is None:
                return False, why
            if not npu.is_available() or npu.device_count() < 1:
                return (
                    False,
                    "torch_npu imported but sees no Ascend device (torch.npu.is_available() is False)",
                )
        except Exception as e:
            return False, f"NPU check failed: {type(e).__name__}: {e}"
        return True, "ok"

    def new_pool(self) -> Any:
        """A fresh ``torch.npu.graph_pool_handle()`` to share among captures (buckets)."""
        npu = _torch_npu()
        return npu.graph_pool_handle()

    def capture(self, fn: Callable[[], Outputs], *, pool: Any | None = None, warmup: int = 2) -> NpuGraph:
        """Warm up ``fn`` on the capture stream ``warmup`` times, then capture it into an ``NPUGraph``."""
        check_warmup(warmup)
        npu = _torch_npu()
        graph = npu.NPUGraph()
        with torch.no_grad():
            current = npu.current_stream(self.device)
            self._stream.wait_stream(current)
            with npu.stream(self._stream):
                for _ in range(warmup):
                    fn()
            current.wait_stream(self._stream)
            npu.synchronize(self.device)
            try:
                with npu.graph(graph, pool=pool, stream=self._stream):
                    outputs = fn()
            except CaptureError:
                raise
            except Exception as e:
                raise CaptureError(
                    f"npu capture failed: {type(e).__name__}: {e}. Common causes: a host sync (.item(), "
                    ".tolist(), .cpu(), printing), an operator that is not aclnn, a data-dependent shape."
                ) from e
        check_outputs(outputs, self.name)
        return NpuGraph(self, outputs, graph)
