"""Engine-style metadata backends: one base with the three-method contract, one subclass per device family.

The contract (sglang's, since metadata preparation was split for graph capture):

- ``init_forward_metadata(batch)``: eager step; fresh tensors, no padding.
- ``init_forward_metadata_out_graph(batch, in_capture=False)``: host side, outside the graph; writes the
  bucket's static buffers in place. At capture (``in_capture=True``) there is no padding and every row
  points at request row 0, hence the dummy slot.
- ``init_forward_metadata_in_graph(batch)``: the part recorded inside the graph (nothing, for these layers).

`workbench check-contracts` checks every subclass against these signatures.
"""

from workbench.backends.base import MetadataBackend
from workbench.backends.cpu import CpuMetadataBackend
from workbench.backends.cuda import CudaMetadataBackend
from workbench.backends.npu import NpuMetadataBackend

BACKENDS = {"cpu": CpuMetadataBackend, "cuda": CudaMetadataBackend, "npu": NpuMetadataBackend}


def metadata_backend_for(device_type: str) -> type[MetadataBackend]:
    """The metadata backend class of a device family ("cpu", "cuda", "npu")."""
    return BACKENDS[device_type]


__all__ = [
    "BACKENDS",
    "CpuMetadataBackend",
    "CudaMetadataBackend",
    "MetadataBackend",
    "NpuMetadataBackend",
    "metadata_backend_for",
]
