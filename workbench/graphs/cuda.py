"""CUDA graphs through ``torch.cuda.CUDAGraph``.

What is captured: the CUDA kernels ``fn()`` enqueues on the capture stream (host Python runs once, at
capture). Warm-up runs on the same side stream as the capture, so lazy initialisation (cuBLAS handles,
Triton JIT and autotune, allocator growth) happens before capture and its memory is not in the graph.
The capture stream is one per backend object: graphs that share a ``new_pool()`` handle must be captured
on the same stream (and replayed in capture order) for the pool to be reused safely.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from workbench.errors import CaptureError
from workbench.graphs.base import Graph, GraphBackend, Outputs, check_outputs, check_warmup


class CudaGraph(Graph):
    """A ``torch.cuda.CUDAGraph`` and the static outputs of its capture."""

    def __init__(self, backend: CudaBackend, outputs: Outputs, graph: torch.cuda.CUDAGraph) -> None:
        super().__init__(backend, outputs)
        self._graph = graph

    def replay(self) -> None:
        """Enqueue the graph on the device's current stream.

        Work the caller enqueued on that stream before (``copy_`` into the static inputs) is ordered before
        the replay, and reading an output on the host after it synchronises; work on other streams must be
        ordered by the caller (``wait_stream``).
        """
        self._check_live()
        with torch.cuda.device(self.backend.device):
            self._graph.replay()

    def reset(self) -> None:
        """Free the graph (``CUDAGraph.reset``); its pool memory goes back to the pool."""
        self._graph.reset()
        self._reset = True


class CudaBackend(GraphBackend):
    """CUDA graph capture on one device."""

    name: ClassVar[str] = "cuda"

    def __init__(self, device: torch.device | str | int | None = None) -> None:
        self._require()
        if device is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        else:
            dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
            if dev.type != "cuda":
                raise ValueError(f"the cuda graph backend needs a cuda device, got {dev}")
            if dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        # One capture stream per backend: warm-up and every capture use it (see the module docstring).
        self._stream = torch.cuda.Stream(device=dev)

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        """(True, "ok") when torch was built with CUDA and sees a device."""
        try:
            if not torch.backends.cuda.is_built():
                return False, f"torch {torch.__version__} was built without CUDA"
            if not torch.cuda.is_available():
                return False, "torch has CUDA but sees no CUDA device (torch.cuda.is_available() is False)"
        except Exception as e:  # a broken driver must not break the caller
            return False, f"CUDA check failed: {type(e).__name__}: {e}"
        return True, "ok"

    def new_pool(self) -> Any:
        """A fresh ``torch.cuda.graph_pool_handle()`` to share among captures (buckets)."""
        return torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], Outputs], *, pool: Any | None = None, warmup: int = 2) -> CudaGraph:
        """Warm up ``fn`` on the side stream ``warmup`` times, then capture it into a ``CUDAGraph``."""
        check_warmup(warmup)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(self.device), torch.no_grad():
            current = torch.cuda.current_stream(self.device)
            # Warm-up on the capture stream, ordered after the caller's work (the static inputs' fill).
            self._stream.wait_stream(current)
            with torch.cuda.stream(self._stream):
                for _ in range(warmup):
                    fn()
            current.wait_stream(self._stream)
            try:
                with torch.cuda.graph(graph, pool=pool, stream=self._stream):
                    outputs = fn()
            except CaptureError:
                raise
            except Exception as e:  # what the driver says (a sync, an allocation off the pool...)
                raise CaptureError(
                    f"cuda capture failed: {type(e).__name__}: {e}. Common causes: a host sync (.item(), "
                    ".tolist(), .cpu(), printing), a data-dependent shape, randomness without a registered "
                    "generator, or work on another stream."
                ) from e
        check_outputs(outputs, self.name)
        return CudaGraph(self, outputs, graph)
