"""CUDA metadata backend: batch tensors move to the device without a host sync before the in-place write."""

from __future__ import annotations

from dataclasses import replace

from workbench.backends.base import MetadataBackend
from workbench.batch import Batch
from workbench.metadata import Metadata


class CudaMetadataBackend(MetadataBackend):
    """Metadata for CUDA graphs. A batch built on the host is copied to the device asynchronously
    (``non_blocking``), so preparing a step never waits for the GPU."""

    device_type = "cuda"

    def _on_device(self, batch: Batch) -> Batch:
        dev = self.pool.device
        if batch.device == dev:
            return batch
        move = {
            name: getattr(batch, name).to(dev, non_blocking=True)
            for name in ("req_pool_indices", "seq_lens", "extend_lens", "prefix_lens", "num_accepted_tokens")
            if getattr(batch, name) is not None
        }
        return replace(batch, **move)

    def init_forward_metadata(self, batch: Batch) -> Metadata:
        return super().init_forward_metadata(self._on_device(batch))

    def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
        return super().init_forward_metadata_out_graph(self._on_device(batch), in_capture=in_capture)
