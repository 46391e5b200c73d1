"""stale_rows: under dummy-slot padding, padded rows keep a previous step's request-pool indices, so they
process a live request's slot (sglang PR 26292)."""

from __future__ import annotations

import torch

from workbench.backends import MetadataBackend, NpuMetadataBackend
from workbench.batch import Batch
from workbench.metadata import Metadata
from workbench.pool import StatePool
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence

EXPLANATION = (
    "The graph runner keeps one static `req_pool_indices` buffer of max batch size; each step copies the "
    "live rows into its head, and the backend gathers every row's slot through the request-to-slot mapping. "
    "On Ascend padded rows are not skipped: they are processed on whatever slot they name, which must be the "
    "dummy slot that request row 0 maps to. Before PR 26292 the padded part of the buffer was not reset, so "
    "after a larger step it still held the request rows of that step. Here a step of four requests is "
    "followed by a step of three padded to the same bucket: the padded row still names the fourth request, "
    "which is alive but not scheduled, and the graph advances that request's state with stale input. The "
    "integrity check names exactly that request's slot. The fix zeroes the padded rows' request indices "
    "every step, so they map to the dummy slot."
)


def _backend(zero_padded_rows: bool) -> type[MetadataBackend]:
    class AscendGatherBackend(NpuMetadataBackend):
        """Gathers every row's slot from a static request-index buffer, as the engine's replay does."""

        def __init__(self, pool: StatePool, *args, **kwargs) -> None:
            super().__init__(pool, *args, **kwargs)
            max_bs = max(b.buckets[-1] for b in self.buffers.values())
            self.static_rpi = torch.zeros(max_bs, dtype=torch.int64, device=pool.device)

        def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
            meta = super().init_forward_metadata_out_graph(batch, in_capture=in_capture)
            if in_capture:
                return meta
            bs, r = meta.batch_size, batch.raw_batch_size
            if zero_padded_rows:
                self.static_rpi.zero_()  # the fix: padded rows point at request row 0 (the dummy slot)
            self.static_rpi[:r].copy_(self.to_pool_device(batch).req_pool_indices)
            meta.req_pool_indices.copy_(self.static_rpi[:bs])
            torch.index_select(self.pool.mapping[:, 0], 0, self.static_rpi[:bs], out=meta.state_indices)
            return meta

    return AscendGatherBackend


def _run(fixed: bool, backend: str) -> list[Evidence]:
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, "sglang-ascend", device=device)
    runner = h.make_runner(h.gdn_layer(device), pool, name, metadata_backend=_backend(zero_padded_rows=fixed))
    runner.capture(progress=False)
    rows = pool.alloc(4)
    first = Batch.decode(rows, [5, 6, 7, 8], device=device)
    runner.replay(first, h.inputs_for(runner, first, 0))
    second = Batch.decode(rows[:3], [6, 7, 8], device=device)  # the fourth request waits this step
    step = h.replay_and_check(
        runner, second, h.inputs_for(runner, second, 1), what="second decode", may_write=[pool.profile.dummy_slot]
    )
    return [step, h.metadata_rows_differ(runner, second, "req_pool_indices"), h.metadata_rows_differ(runner, second)]


CASE = ZooCase(
    name="stale_rows",
    title="padded rows keep stale request indices and process a live request's slot",
    issue="sglang PR 26292",
    profile="sglang-ascend",
    explanation=EXPLANATION,
    run_fn=_run,
)
