"""Ascend NPU metadata backend (sglang-ascend conventions). Imports nothing from torch_npu.

Differences from CUDA that matter to the graph: padded rows point at the dummy slot and are processed
(profile ``sglang-ascend``); the NPU graph runner pushes the step's sequence lengths to the captured graph
from the host (``NPUGraph.update(cpu_update_input=...)``), so this backend keeps a host list of them,
``Metadata.seq_lens_cpu`` (None at capture, when there is no CPU copy); verify also carries a flat
``[bs * D]`` index of per-token intermediate slots, ``Metadata.intermediate_token_indices`` (sglang-ascend's
``gdn_token_indices``).
"""

from __future__ import annotations

import torch

from workbench.backends.base import MetadataBackend
from workbench.batch import Batch
from workbench.metadata import Metadata


class NpuMetadataBackend(MetadataBackend):
    """Metadata for NPU graphs: the base in-place update, plus the host-side fields Ascend needs."""

    device_type = "npu"

    def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
        # The scheduler built the batch on the host: read the lengths there, before any device copy.
        host = None if in_capture or batch.device.type != "cpu" else batch.seq_lens.tolist()
        meta = super().init_forward_metadata_out_graph(batch, in_capture=in_capture)
        fill = self.pool.profile.seq_len_fill
        meta.seq_lens_cpu = None if host is None else host + [fill] * (meta.batch_size - len(host))
        if meta.forward_mode == "target_verify" and meta.intermediate_token_indices is None:
            meta.intermediate_token_indices = torch.arange(
                meta.batch_size * meta.draft_tokens, dtype=torch.int32, device=self.pool.device
            )
        return meta
