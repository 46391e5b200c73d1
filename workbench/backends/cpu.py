"""CPU metadata backend: the base behaviour, replayed by the CPU graph recorder."""

from __future__ import annotations

from workbench.backends.base import MetadataBackend


class CpuMetadataBackend(MetadataBackend):
    """Metadata for the CPU recorder: the base behaviour; the recorder sees only the tensor ops."""

    device_type = "cpu"
