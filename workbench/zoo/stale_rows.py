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
from workbench.zoo.result import Evidence, RowsDiffer

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


def variant(fixed: bool) -> type[MetadataBackend]:
    """The case's own backend: padded request rows left stale (unfixed) or zeroed every step (fixed)."""
    return _backend(zero_padded_rows=fixed)


def scenario(cls: type[MetadataBackend], profile: str, backend: str) -> list[Evidence]:
    """Capture decode buckets 1, 2, 4 with ``cls``; replay a step of four requests, then one of the first
    three (padded to 4) and check the second. Evidence of the bug: the padded row's ``req_pool_indices`` or
    ``state_indices`` still naming the fourth request."""
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, profile, device=device)
    runner = h.make_runner(h.gdn_layer(device, pool.profile), pool, name, metadata_backend=cls)
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
    subject="metadata_backend",
    scenario=scenario,
    variant=variant,
    mechanism=(RowsDiffer,),
    steps="pool of 16 slots, GDN layer (small, seed 0), decode buckets 1, 2, 4; capture(); a decode step of "
    "4 requests, then one of the first 3 (seq_lens 6, 7, 8) padded to 4: its req_pool_indices and "
    "state_indices compared with build_metadata's, output and slots checked against the float64 reference",
)
