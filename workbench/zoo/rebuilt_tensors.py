"""rebuilt_tensors: metadata rebuilt into fresh tensors at replay instead of written in place; the graph
keeps reading the tensors it captured (sglang issue 26019)."""

from __future__ import annotations

from workbench.backends import MetadataBackend
from workbench.batch import Batch
from workbench.metadata import Metadata, build_metadata
from workbench.pool import StatePool
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import AddressMismatch, Evidence

EXPLANATION = (
    "A captured graph holds the addresses of the tensors it read at capture, not Python names. Metadata "
    "preparation that builds new tensors each step (`torch.tensor(...)`, `arange`, a fresh dataclass) and "
    "rebinds the backend's attributes to them leaves the graph reading the old storage: on a device that "
    "storage may already be freed and reused (the sglang issue), and at best it still holds whatever capture "
    "left there. Here a backend rebuilds each replay's metadata with the eager builder and swaps it in for "
    "the bucket's static set. The new `state_indices` live at another address than the one recorded, so the "
    "graph keeps running the capture metadata, every row on the dummy slot: live requests' slots are not "
    "updated and their outputs come from the dummy state. The fix writes each step into the captured tensors "
    "with in-place ops (`copy_`, `fill_`, `index_select(out=)`), as `MetadataBuffers.update` does."
)


class RebuildingBackend(MetadataBackend):
    """Rebuilds each replay's metadata into fresh tensors and swaps them in for the bucket's static set
    (the bug)."""

    def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
        if in_capture:
            return super().init_forward_metadata_out_graph(batch, in_capture=in_capture)
        bufs = self.buffers[self.graph_mode_of(batch)]
        bs = bufs.bucket_for(batch.raw_batch_size)
        assert bs is not None
        meta = build_metadata(self.to_pool_device(batch), self.pool, bucket=bs, buckets=bufs.buckets)
        bufs.static[bs] = meta  # new tensors under the old name
        self.forward_metadata = meta
        return meta


class InPlaceBackend(MetadataBackend):
    """Writes each step into the captured tensors (the base's ``MetadataBuffers.update``): the fix."""


def variant(fixed: bool) -> type[MetadataBackend]:
    return InPlaceBackend if fixed else RebuildingBackend


def scenario(cls: type[MetadataBackend], profile: str, backend: str) -> list[Evidence]:
    """Capture decode buckets 1, 2, 4 with ``cls`` (watched: the address of each metadata tensor it hands
    out is recorded), replay one decode step of three requests and check it. Evidence of the bug: a
    metadata tensor handed out at replay at another address than the graph recorded."""
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, profile, device=device)
    runner = h.make_runner(h.gdn_layer(device, pool.profile), pool, name, metadata_backend=h.watched(cls))
    runner.capture(progress=False)
    rows = pool.alloc(3)
    batch = Batch.decode(rows, [5, 6, 7], device=device)
    step = h.replay_and_check(
        runner, batch, h.inputs_for(runner, batch, 0), what="decode replay", may_write=[pool.profile.dummy_slot]
    )
    assert runner.last_metadata is not None  # replay_and_check replayed
    return [*h.address_evidence(runner.meta_backend, runner.last_metadata.batch_size), step]


CASE = ZooCase(
    name="rebuilt_tensors",
    title="metadata rebuilt into fresh tensors at replay: the graph reads the captured ones",
    issue="sglang issue 26019",
    profile="sglang",
    explanation=EXPLANATION,
    subject="metadata_backend",
    scenario=scenario,
    variant=variant,
    mechanism=(AddressMismatch,),
    steps="pool of 16 slots, GDN layer (small, seed 0), decode buckets 1, 2, 4; capture(), keeping the "
    "data_ptr of every metadata tensor handed out; one decode step of 3 requests (seq_lens 5, 6, 7) padded "
    "to 4: addresses compared with capture's, output and slots checked against the float64 reference",
)
