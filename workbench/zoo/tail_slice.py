"""tail_slice: a static index buffer of max batch size is handed out whole and the consumer slices it
from the end, ``[-bs:]``: it reads a stale tail (sglang PR 32555)."""

from __future__ import annotations

from dataclasses import replace

import torch

from workbench.backends import MetadataBackend
from workbench.batch import Batch
from workbench.metadata import Metadata
from workbench.pool import StatePool
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence, RowsDiffer

EXPLANATION = (
    "Engines keep index buffers at the largest batch size and write a step's values into their head. sglang's "
    "`mamba_track_indices` buffer was handed to the consumer at its full max-batch length; the consumer, "
    "which expected a tensor sized to the batch with the decode rows last, took `[-num_decodes:]` and so "
    "read the tail of the buffer: entries a previous, larger step had written. The corruption was silent: "
    "states were read from and written to slots of requests that were not in the step. Here the slot "
    "indices a graph reads come from such a buffer: the backend writes the step into `buf[:bs]`, the graph "
    "was captured on `buf[-bs:]`. After a step of eight requests, a step of three padded to four runs on "
    "the slots of the last four requests of the previous step: their states change although they are not "
    "scheduled, and the three live requests get no update and wrong outputs. The fix hands out `buf[:bs]`."
)


def _backend(head: bool) -> type[MetadataBackend]:
    class TrackBufferBackend(MetadataBackend):
        """Keeps one static slot-index buffer of max batch size; each graph reads its slice of it."""

        def __init__(self, pool: StatePool, *args, **kwargs) -> None:
            super().__init__(pool, *args, **kwargs)
            max_bs = max(b.buckets[-1] for b in self.buffers.values())
            self.track = torch.full((max_bs,), pool.profile.sentinel, dtype=torch.int32, device=pool.device)
            self.handed_out: dict[int, Metadata] = {}

        def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
            meta = super().init_forward_metadata_out_graph(batch, in_capture=in_capture)
            bs = meta.batch_size
            self.track[:bs].copy_(meta.state_indices)  # the writer fills the head
            if bs not in self.handed_out:  # what the graph records: the consumer's slice
                view = self.track[:bs] if head else self.track[-bs:]
                self.handed_out[bs] = replace(meta, state_indices=view)
            return self.handed_out[bs]

    return TrackBufferBackend


def variant(fixed: bool) -> type[MetadataBackend]:
    """The case's own backend: the graph reads ``buf[-bs:]`` (unfixed) or ``buf[:bs]`` (fixed)."""
    return _backend(head=fixed)


def scenario(cls: type[MetadataBackend], profile: str, backend: str) -> list[Evidence]:
    """Capture decode buckets 1, 2, 4, 8 with ``cls``; replay a step of eight requests, then one of the
    first three (padded to 4) and check the second. Evidence of the bug: the ``state_indices`` the graph was
    handed differ from what the step should hold."""
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, profile, device=device)
    runner = h.make_runner(h.gdn_layer(device, pool.profile), pool, name, buckets=(1, 2, 4, 8), metadata_backend=cls)
    runner.capture(progress=False)
    rows = pool.alloc(8)
    first = Batch.decode(rows, list(range(5, 13)), device=device)
    runner.replay(first, h.inputs_for(runner, first, 0))
    second = Batch.decode(rows[:3], [6, 7, 8], device=device)
    step = h.replay_and_check(
        runner, second, h.inputs_for(runner, second, 1), what="second decode", may_write=[pool.profile.dummy_slot]
    )
    return [step, h.metadata_rows_differ(runner, second)]


CASE = ZooCase(
    name="tail_slice",
    title="a max-size buffer sliced from the end reads a stale tail",
    issue="sglang PR 32555",
    profile="sglang",
    explanation=EXPLANATION,
    subject="metadata_backend",
    scenario=scenario,
    variant=variant,
    mechanism=(RowsDiffer,),
    steps="pool of 16 slots, GDN layer (small, seed 0), decode buckets 1, 2, 4, 8; capture(); a decode step "
    "of 8 requests, then one of the first 3 (seq_lens 6, 7, 8) padded to 4: the state_indices handed to the "
    "graph compared with build_metadata's, output and slots checked against the float64 reference",
)
