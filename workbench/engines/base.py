"""What every engine adapter offers: the engine's own metadata code, driven by a workbench batch.

An adapter imports the installed engine (with the stand-ins of :mod:`workbench.engines.standins` for
device-only modules), builds the engine's metadata backend (sglang) or builder (vLLM) for a
:class:`~workbench.pool.StatePool`, feeds it a :class:`~workbench.batch.Batch` the way the engine's model
runner would, and translates what it computes back into a workbench
:class:`~workbench.metadata.Metadata`. Nothing is faked: an error the engine raises reaches the caller.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from workbench.batch import Batch
from workbench.engines.identity import identify
from workbench.engines.versions import EngineError
from workbench.layer_names import DEFAULT_LAYER
from workbench.metadata import Metadata, MetadataBuffers
from workbench.pool import StatePool


def probe_pool(adapter: type[EngineAdapter], draft_tokens: int = 2) -> StatePool:
    """A small pool of the profile the adapter's engine family builds for (vLLM: its own; sglang: sglang's,
    the Ascend classes say theirs through ``profile``), to ask an adapter for its ``profile`` and ``label``."""
    if adapter.engine == "vllm":
        return StatePool(4 * draft_tokens + 2, "vllm", slots_per_request=draft_tokens)
    return StatePool(8, "sglang")


def capture_skeleton(pool: StatePool, mode: str, bucket: int, draft_tokens: int) -> Metadata:
    """The workbench's metadata of a capture of ``bucket`` (every row on the dummy slot, no padding): the
    frame an adapter writes the engine's capture values into (a fresh copy, not a graph's buffer)."""
    d = draft_tokens if mode == "target_verify" else 1
    return MetadataBuffers(pool, mode, [bucket], d).reset_for_capture(bucket).clone()


def check_topk(adapter: type[EngineAdapter], topk: int, draft_tokens: int) -> None:
    """``topk`` is an int >= 1, and 1 unless the engine verifies trees, whose D must have room to branch
    (a tree of 2 drafts is a chain); else an :class:`EngineError` naming the value."""
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise EngineError(f"topk: expected an int >= 1, got {topk!r}")
    if topk > 1 and not adapter.tree_verify:
        raise EngineError(f"topk: {adapter.engine} {adapter.no_tree}; topk must be 1, got {topk}")
    if topk > 1 and draft_tokens < 3:
        raise EngineError(f"draft_tokens: a tree (topk {topk}) needs D >= 3 draft tokens to branch, got {draft_tokens}")


class EngineAdapter(ABC):
    """One engine version's metadata code behind the workbench's three hooks.

    Args:
        pool: the state pool; its request-row -> slot mapping is what the engine's request pool or block
            table holds.
        buckets: the captured batch sizes (the engine's graph buckets).
        draft_tokens: D of target-verify steps.
        layer: a name of ``layers`` (names of ``workbench.layers.LAYERS``): which of the engine's backends or
            builders.
        backend_class: the engine class to build (a subclass of the engine's base: a user's modified file);
            default: the engine's own class for ``layer``.
        topk: the speculative branching factor: 1 verifies chains of D drafts; K > 1 trees (``Batch.tree``), on
            an engine whose verify takes trees (``tree_verify``); refused by name elsewhere.

    ``profile`` names the workbench profile whose conventions the engine's code implements (``"sglang"``,
    ``"sglang-ascend"``, ``"vllm"``); the oracle compares the two.
    """

    engine: ClassVar[str]
    version: ClassVar[str]
    layers: ClassVar[tuple[str, ...]] = ()
    """The workbench layers (names of ``workbench.layers.LAYERS``) this engine version has a backend or builder
    for: each adapter's own table, so a new workbench layer is never taken for one the engine has."""
    tree_verify: ClassVar[bool] = False
    """Whether the engine verifies tree drafts (speculative topk > 1); ``no_tree`` says why not."""
    no_tree: ClassVar[str] = "its verify takes chains of drafts only"

    def __init__(
        self,
        pool: StatePool,
        buckets: Sequence[int],
        draft_tokens: int = 2,
        *,
        layer: str = DEFAULT_LAYER,
        backend_class: type | None = None,
        topk: int = 1,
    ) -> None:
        if layer not in self.layers:
            raise EngineError(f"layer: {layer!r} is not one of {self.layers} for {self.engine} {self.version}")
        check_topk(type(self), topk, draft_tokens)
        self.pool, self.buckets, self.draft_tokens, self.layer = pool, tuple(buckets), draft_tokens, layer
        self.backend_class = backend_class
        self.topk = topk

    @property
    @abstractmethod
    def profile(self) -> str:
        """The workbench profile the engine's class implements."""

    release_notes: ClassVar[str] = ""
    """What differs in this release from the one whose adapter it runs on (``workbench.engines.releases``)."""

    @property
    def label(self) -> str:
        """``"sglang 0.5.23 GDNAttnBackend (real code)"``: the engine's own version (a clone's
        ``0.5.24.dev12+g...`` on the newest adapter)."""
        cls = self.backend_class.__name__ if self.backend_class else self.default_class_name
        try:
            version = identify(self.engine).version
        except EngineError:  # an adapter of an engine that is not here (a test's fake): its release
            version = self.version
        return f"{self.engine} {version} {cls} (real code)"

    @property
    @abstractmethod
    def default_class_name(self) -> str:
        """The engine class built when ``backend_class`` is not given."""

    @abstractmethod
    def compared_fields(self, mode: str) -> tuple[str, ...]:
        """The :class:`Metadata` fields the engine computes for ``mode`` (the others come from the batch)."""

    @abstractmethod
    def eager(self, batch: Batch) -> Metadata:
        """The engine's eager path (``init_forward_metadata`` / ``build``) for ``batch``, unpadded."""

    @abstractmethod
    def replay(self, batch: Batch, bucket: int) -> Metadata:
        """The engine's host-side update before a replay of ``bucket`` (``init_forward_metadata_out_graph`` /
        ``build`` on the padded batch its runner makes)."""

    @abstractmethod
    def capture(self, mode: str, bucket: int) -> Metadata:
        """What the engine computes while capturing ``bucket`` in ``mode`` (``in_capture=True`` /
        ``build_for_cudagraph_capture`` on its runner's capture batch)."""
