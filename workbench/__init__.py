"""linattn-workbench: metadata, padding, graph capture and replay for linear-attention layers.

>>> from workbench import StatePool, Batch, build_metadata
>>> pool = StatePool(num_slots=16, profile="sglang")
>>> meta = build_metadata(Batch.decode(pool.alloc(3), [7, 3, 9]), pool, bucket="auto")
>>> meta.state_indices.tolist(), meta.query_start_loc.tolist()
([1, 2, 3, -1], [0, 1, 2, 3, 3])
"""

from workbench.batch import Batch
from workbench.buckets import capture_buckets, choose_bucket
from workbench.devices import devices
from workbench.errors import CaptureError, DeviceUnavailable, MetadataError, WorkbenchError
from workbench.metadata import Metadata, MetadataBuffers, build_metadata, validate
from workbench.pool import StatePool
from workbench.profiles import PROFILES, Profile, get_profile

__all__ = [
    "PROFILES",
    "Batch",
    "CaptureError",
    "DeviceUnavailable",
    "Metadata",
    "MetadataBuffers",
    "MetadataError",
    "Profile",
    "StatePool",
    "WorkbenchError",
    "build_metadata",
    "capture_buckets",
    "choose_bucket",
    "devices",
    "get_profile",
    "validate",
]
__version__ = "0.1.0"
