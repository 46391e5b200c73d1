"""CPU metadata backend: the base behaviour, replayed by the CPU graph recorder."""

from __future__ import annotations

from workbench.backends.base import MetadataBackend
from workbench.batch import Batch
from workbench.metadata import Metadata


class CpuMetadataBackend(MetadataBackend):
    """Metadata for the CPU recorder: identical to the base; the recorder sees only tensor ops."""

    device_type = "cpu"

    def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
        return super().init_forward_metadata_out_graph(batch, in_capture=in_capture)
