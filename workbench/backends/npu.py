"""Ascend NPU metadata backend (sglang-ascend conventions). Imports nothing from torch_npu.

What it does: the base backend's in-place metadata update under the ``sglang-ascend`` profile (padded rows
point at the dummy slot 0 and are really processed there), plus, for target-verify, the flat ``[bs * D]``
per-token index ``Metadata.intermediate_token_indices`` that sglang's Ascend backend builds (nothing in the
workbench reads it; it is there so the metadata can be compared with the engine's).

What it does not do: push host sequence lengths into a captured graph. sglang's NPU graph runner captures
with ``auto_dispatch_capture=True`` and calls ``NPUGraph.update(cpu_update_input=[{"actual_seq_lengths":
...}])`` before each replay, because its attention operator takes the lengths as a host list. None of the
linear-attention kernels here takes host lengths (they read ``query_start_loc`` from device memory, which
the in-place update refreshes), so the graphs of ``workbench.graphs.npu`` are captured without
``auto_dispatch_capture`` and replayed without ``update``. A layer with such an operator would need both.
"""

from __future__ import annotations

import torch

from workbench.backends.base import MetadataBackend
from workbench.batch import Batch
from workbench.metadata import Metadata


class NpuMetadataBackend(MetadataBackend):
    """Metadata for NPU graphs: the base in-place update, plus the verify token index sglang-ascend builds."""

    device_type = "npu"

    def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
        meta = super().init_forward_metadata_out_graph(batch, in_capture=in_capture)
        if meta.forward_mode == "target_verify" and meta.intermediate_token_indices is None:
            meta.intermediate_token_indices = torch.arange(
                meta.batch_size * meta.draft_tokens, dtype=torch.int32, device=self.pool.device
            )
        return meta
