"""The graph interface shared by the cuda, npu and cpu backends.

A *graph* here is what a device graph is: a function ``fn`` run once under capture, whose tensor work is
kept and replayed later on the same tensors. What ``fn`` returned at capture (``Graph.outputs``) are the
*static outputs*: the same tensor objects, overwritten by each replay. Inputs are static too: to feed new
values, ``copy_`` them into the tensors ``fn`` read at capture, then ``replay()``. Host Python in ``fn``
(prints, counters, ``if`` on Python values) ran at capture only and is frozen in the graph.

Every backend runs warm-up, capture and replay under ``torch.no_grad()``: graphs here serve inference.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.utils._pytree import tree_flatten

from workbench.errors import CaptureError, DeviceUnavailable

#: What ``fn`` may return: a tensor, a tuple/list or dict of tensors (nested), or None.
Outputs = Any


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype of one tensor argument of a recorded op."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def __str__(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        return f"{dt}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class OpRecord:
    """One op of a captured graph, as a user reads it (``Graph.ops``).

    ``replay`` says what replay does for it: ``"out="`` (the op's out variant writes into the static
    output), ``"rerun+copy"`` (run again, ``copy_`` into the static output), ``"in place"`` (run again:
    it mutates its inputs), ``"view"`` / ``"alloc"`` (nothing to do: the tensor already aliases the right
    storage, or is uninitialised memory). ``note`` flags what a device graph would not allow, e.g. a custom
    op whose CPU implementation syncs with the host.
    """

    index: int
    name: str
    inputs: tuple[TensorMeta, ...]
    mutates: tuple[str, ...]
    outputs: tuple[TensorMeta, ...]
    replay: str
    source: str
    note: str = ""


class Graph(ABC):
    """A captured graph: ``outputs`` are the static tensors each ``replay()`` overwrites."""

    def __init__(self, backend: GraphBackend, outputs: Outputs) -> None:
        self.backend = backend
        self.outputs = outputs
        self._reset = False

    @abstractmethod
    def replay(self) -> None:
        """Run the captured work again on the same tensors (inputs as they are now)."""

    @abstractmethod
    def reset(self) -> None:
        """Drop the captured work (and, on a device, its graph); ``replay()`` is an error afterwards."""

    @property
    def ops(self) -> list[OpRecord] | None:
        """The recorded ops, where the backend can list them (cpu); None on a device graph."""
        return None

    def summary(self) -> str:
        """A readable table of the recorded ops (or a one-line description on a device graph)."""
        n = len(tree_flatten(self.outputs)[0])
        where = f"{self.backend.name} graph on {self.backend.device}"
        return f"{where}: {n} static output tensor(s); the device does not list its ops"

    def _check_live(self) -> None:
        if self._reset:
            raise CaptureError(f"{self.backend.name} graph: replay() after reset(); capture again")

    def __repr__(self) -> str:
        n = len(tree_flatten(self.outputs)[0])
        state = "reset" if self._reset else "live"
        return f"<{type(self).__name__} {self.backend.name}:{self.backend.device} outputs={n} {state}>"


class GraphBackend(ABC):
    """Captures functions into graphs on one device.

    ``new_pool()`` gives a memory-pool handle to share between the captures of several buckets (one
    pool, captured and replayed in the same order, is how serving engines keep graph memory small);
    None where the device has no such pool.
    """

    name: ClassVar[str]
    device: torch.device

    @abstractmethod
    def __init__(self, device: torch.device | str | int | None = None) -> None:
        """Bind the backend to ``device`` (default: the current device of its type)."""

    @classmethod
    @abstractmethod
    def is_available(cls) -> tuple[bool, str]:
        """(True, "ok") if graphs can be captured here, else (False, why not, in words). Never raises."""

    @abstractmethod
    def new_pool(self) -> Any | None:
        """A memory-pool handle to pass as ``capture(pool=...)`` for several graphs, or None."""

    @abstractmethod
    def capture(self, fn: Callable[[], Outputs], *, pool: Any | None = None, warmup: int = 2) -> Graph:
        """Run ``fn()`` ``warmup`` times eagerly, then capture one call of it into a graph.

        ``fn`` takes no arguments (close over the static inputs) and returns the static outputs.
        """

    def _require(self) -> None:
        ok, why = self.is_available()
        if not ok:
            raise DeviceUnavailable(f"graph backend {self.name!r} is unavailable: {why}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} device={self.device}>"


def check_warmup(warmup: int) -> int:
    """Validate the warm-up count (a non-negative int)."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    return warmup


def check_outputs(outputs: Outputs, backend: str) -> Outputs:
    """Check that ``fn`` returned tensors only (in tuples, lists, dicts) or None; return them unchanged."""
    leaves, _ = tree_flatten(outputs)
    for leaf in leaves:
        if leaf is not None and not isinstance(leaf, torch.Tensor):
            raise CaptureError(
                f"{backend} capture: fn must return tensors (a tensor, tuple, list or dict of them), "
                f"got a {type(leaf).__name__} ({leaf!r:.60}): a graph can only overwrite tensors"
            )
    return outputs
