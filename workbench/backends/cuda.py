"""CUDA metadata backend."""

from __future__ import annotations

from dataclasses import replace

from workbench.backends.base import BATCH_TENSORS, MetadataBackend
from workbench.batch import Batch


class CudaMetadataBackend(MetadataBackend):
    """Metadata for CUDA graphs. A host batch is staged through pinned memory and copied asynchronously,
    so preparing a step never waits for the GPU to drain."""

    device_type = "cuda"

    def to_pool_device(self, batch: Batch) -> Batch:
        if batch.device == self.pool.device or batch.device.type != "cpu":
            return super().to_pool_device(batch)
        moved = {
            n: getattr(batch, n).pin_memory().to(self.pool.device, non_blocking=True)
            for n in BATCH_TENSORS
            if getattr(batch, n) is not None
        }
        return replace(batch, **moved)
