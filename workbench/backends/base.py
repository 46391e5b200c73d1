"""The base metadata backend: eager build, in-place graph update, nothing recorded in the graph."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from workbench.batch import Batch
from workbench.errors import MetadataError
from workbench.metadata import GRAPH_MODES, Metadata, MetadataBuffers, build_metadata
from workbench.pool import StatePool

BATCH_TENSORS = ("req_pool_indices", "seq_lens", "extend_lens", "prefix_lens", "num_accepted_tokens")


class MetadataBackend:
    """Prepares a linear-attention layer's metadata for eager steps, capture and replay.

    Args:
        pool: the state pool (profile, mapping, device).
        buckets: captured batch sizes for each graph mode, or one list for both; default: the profile's.
        draft_tokens: D of target-verify graphs.
        modes: the graph modes that get static buffers (those the runner captures).
        tree: the target-verify buffers carry each row's draft tree (``MetadataBuffers(..., tree=True)``;
            sglang's ``topk > 1``): every verify batch then gives its trees (``batch.tree``).
    """

    device_type = "cpu"

    def __init__(
        self,
        pool: StatePool,
        buckets: Sequence[int] | dict[str, Sequence[int]] | None = None,
        draft_tokens: int = 2,
        modes: Sequence[str] = GRAPH_MODES,
        *,
        tree: bool = False,
    ) -> None:
        self.pool = pool
        self.draft_tokens = draft_tokens
        self.tree = tree
        per_mode = buckets if isinstance(buckets, dict) else dict.fromkeys(GRAPH_MODES, buckets)
        self.buffers: dict[str, MetadataBuffers] = {}
        for mode in modes:
            if mode not in GRAPH_MODES:
                raise MetadataError(
                    f"modes: {mode!r} is not a graph mode; graphs exist for {GRAPH_MODES}", field="modes"
                )
            verify = mode == "target_verify"
            d = draft_tokens if verify else 1
            self.buffers[mode] = MetadataBuffers(pool, mode, per_mode.get(mode), d, tree=tree and verify)
        self.forward_metadata: Metadata | None = None

    def graph_mode_of(self, batch: Batch) -> str:
        """Which graph runs ``batch``: its own mode; an idle batch runs the decode graph."""
        mode = "decode" if batch.mode == "idle" else batch.mode
        if mode not in self.buffers:
            raise MetadataError(
                f"forward_mode: {batch.mode!r} is not captured; graphs exist for {tuple(self.buffers)}",
                field="forward_mode",
            )
        return mode

    def to_pool_device(self, batch: Batch) -> Batch:
        """``batch`` with its tensors on the pool's device (a host batch is copied once, here)."""
        dev = self.pool.device
        if batch.device == dev:
            return batch
        moved = {n: getattr(batch, n).to(dev) for n in BATCH_TENSORS if getattr(batch, n) is not None}
        return replace(batch, **moved)

    def init_forward_metadata(self, batch: Batch) -> Metadata:
        """Eager step: build fresh, unpadded metadata."""
        self.forward_metadata = build_metadata(self.to_pool_device(batch), self.pool, bucket=None)
        return self.forward_metadata

    def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
        """Host side of a graph step: write ``batch``'s metadata into its bucket's static buffers.

        With ``in_capture=True``, ``batch`` is a capture batch (``Batch.for_capture``): its size is the
        bucket, and the buffers are put in their capture state instead (no padding, dummy slot).
        """
        bufs = self.buffers[self.graph_mode_of(batch)]
        if in_capture:
            self.forward_metadata = bufs.reset_for_capture(batch.raw_batch_size)
        else:
            self.forward_metadata = bufs.update(self.to_pool_device(batch))
        return self.forward_metadata

    def init_forward_metadata_in_graph(self, batch: Batch) -> None:
        """Recorded inside the graph: nothing for these layers (all metadata is written outside)."""
        return None
