"""The engine's own backend as the subject: its three hooks drive the workbench's graph runner.

:func:`engine_backend` makes a :class:`~workbench.backends.MetadataBackend` class whose hooks call the
engine's code through an :class:`~workbench.engines.base.EngineAdapter`: ``init_forward_metadata`` is the
engine's eager path, ``init_forward_metadata_out_graph(batch, in_capture=True)`` its capture path and, after
that, its host-side update before each replay. What the engine computes is written into the bucket's static
buffers, so the captured graph reads the engine's values; the workbench layer and its integrity checks
then say whether anything was lost. The profile's values for the same step are kept beside them: each
difference is recorded (:attr:`EngineBackend.divergences`), never hidden, and an engine error (the seed's
``TypeError`` at capture) propagates from the runner's call.
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.backends import MetadataBackend
from workbench.batch import Batch
from workbench.engines.base import EngineAdapter, EngineError
from workbench.engines.oracle import Divergence, describe, first_difference
from workbench.layer_names import DEFAULT_LAYER
from workbench.metadata import GRAPH_MODES, Metadata, build_metadata
from workbench.pool import StatePool


class LayoutMismatch(RuntimeError):
    """The engine's tensor has another shape than the graph's buffer: a finding, not a usage error."""


class EngineBackend(MetadataBackend):
    """A metadata backend whose hooks run an engine's code; made by :func:`engine_backend`.

    Attributes:
        adapter: the engine adapter (``adapter.label`` names the engine class and version).
        divergences: every step where the engine's metadata differed from the profile's.
    """

    adapter_class: type[EngineAdapter]
    layer: str = DEFAULT_LAYER
    backend_class: type | None = None
    topk: int = 1

    def __init__(
        self,
        pool: StatePool,
        buckets: Sequence[int] | dict[str, Sequence[int]] | None = None,
        draft_tokens: int = 2,
        modes: Sequence[str] = GRAPH_MODES,
        *,
        tree: bool = False,
    ) -> None:
        if tree != (self.topk > 1):  # the runner's tree graphs and the engine's topk must agree
            raise EngineError(f"tree: the runner's tree={tree}, the engine backend's topk={self.topk}")
        super().__init__(pool, buckets, draft_tokens, modes, tree=tree)
        captured = sorted({b for bufs in self.buffers.values() for b in bufs.buckets})
        self.adapter = self.adapter_class(
            pool, captured, draft_tokens, layer=self.layer, backend_class=self.backend_class, topk=self.topk
        )
        self.divergences: list[Divergence] = []
        self.steps = 0

    def _compare(self, expected: Metadata, got: Metadata, batch: Batch, path: str) -> None:
        self.steps += 1
        diff = first_difference(expected, got, self.adapter.compared_fields(batch.mode))
        if diff is not None:
            name, row, want, have = diff
            text = describe(batch)
            self.divergences.append(Divergence(batch.mode, path, self.steps, text, got.bucket, name, row, want, have))

    def init_forward_metadata(self, batch: Batch) -> Metadata:
        """The engine's eager path; the profile's unpadded metadata is the comparison."""
        batch = self.to_pool_device(batch)
        got = self.adapter.eager(batch)
        self._compare(build_metadata(batch, self.pool, bucket=None), got, batch, "eager")
        self.forward_metadata = got
        return got

    def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
        """The engine's capture (``in_capture=True``) or replay update, written into the bucket's buffers."""
        mode = self.graph_mode_of(batch)
        bufs = self.buffers[mode]
        if in_capture:
            static = bufs.reset_for_capture(batch.raw_batch_size)
            got = self.adapter.capture(mode, batch.raw_batch_size)
        else:
            batch = self.to_pool_device(batch)
            static = bufs.update(batch)  # the profile's values, in place: the comparison
            got = self.adapter.replay(batch, static.batch_size)
        self._compare(static, got, batch, "capture" if in_capture else "replay")
        for name in self.adapter.compared_fields(batch.mode):
            target, value = getattr(static, name), getattr(got, name)
            if target is None or value is None:
                continue
            if target.shape != value.shape:
                raise LayoutMismatch(
                    f"{self.adapter.label}: {name} has shape {tuple(value.shape)} for bucket {static.batch_size}, "
                    f"the graph's buffer {tuple(target.shape)}: the engine's layout is not the profile's"
                )
            target.copy_(value)  # the captured graph reads the engine's values
        self.forward_metadata = static
        return static


def engine_backend(
    adapter_class: type[EngineAdapter],
    *,
    layer: str = DEFAULT_LAYER,
    backend_class: type | None = None,
    topk: int = 1,
) -> type[EngineBackend]:
    """A :class:`EngineBackend` subclass for ``GraphRunner(..., metadata_backend=...)``: the engine's own
    ``layer`` backend (or ``backend_class``, a user's subclass of it) behind the runner's three hooks; with
    ``topk`` > 1 its verify graphs take trees (``GraphRunner(..., tree=True)``)."""
    name = backend_class.__name__ if backend_class is not None else adapter_class.__name__
    attrs = {"adapter_class": adapter_class, "layer": layer, "backend_class": backend_class, "topk": topk}
    return type(f"Engine{name}", (EngineBackend,), attrs)
