"""linattn-workbench: metadata, padding, graph capture and replay for linear-attention layers.

>>> from workbench import StatePool, Batch, build_metadata
>>> pool = StatePool(num_slots=16, profile="sglang")
>>> meta = build_metadata(Batch.decode(pool.alloc(3), [7, 3, 9]), pool, bucket="auto")
>>> meta.state_indices.tolist(), meta.query_start_loc.tolist()
([1, 2, 3, -1], [0, 1, 2, 3, 3])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from workbench.devices import devices  # eager: the name would otherwise be the submodule's
from workbench.errors import CaptureError, DeviceUnavailable, MetadataError, WorkbenchError

if TYPE_CHECKING:
    from workbench.batch import Batch
    from workbench.buckets import capture_buckets, choose_bucket
    from workbench.metadata import DraftTree, Metadata, MetadataBuffers, build_metadata, validate
    from workbench.pool import StatePool
    from workbench.profiles import PROFILES, Profile, get_profile

# Loaded on first use (PEP 562), so that `import workbench.cli` and `workbench --help` never import torch.
_LAZY = {
    "Batch": "workbench.batch",
    "capture_buckets": "workbench.buckets",
    "choose_bucket": "workbench.buckets",
    "DraftTree": "workbench.metadata",
    "Metadata": "workbench.metadata",
    "MetadataBuffers": "workbench.metadata",
    "build_metadata": "workbench.metadata",
    "validate": "workbench.metadata",
    "StatePool": "workbench.pool",
    "PROFILES": "workbench.profiles",
    "Profile": "workbench.profiles",
    "get_profile": "workbench.profiles",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup skips this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "PROFILES",
    "Batch",
    "CaptureError",
    "DeviceUnavailable",
    "DraftTree",
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
