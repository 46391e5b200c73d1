"""rebuilt_tensors: metadata rebuilt into fresh tensors at replay instead of written in place; the graph
keeps reading the tensors it captured (sglang issue 26019)."""

from __future__ import annotations

from typing import Any

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
    """Remembers the ``state_indices`` address each bucket's graph recorded and the one each step wrote;
    with ``in_place = False`` it rebuilds the metadata every step (the bug)."""

    in_place = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recorded: dict[int, int] = {}
        self.written: dict[int, int] = {}

    def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
        if in_capture or self.in_place:
            meta = super().init_forward_metadata_out_graph(batch, in_capture=in_capture)
        else:
            bufs = self.buffers[self.graph_mode_of(batch)]
            bs = bufs.bucket_for(batch.raw_batch_size)
            assert bs is not None
            meta = build_metadata(self.to_pool_device(batch), self.pool, bucket=bs, buckets=bufs.buckets)
            bufs.static[bs] = meta  # new tensors under the old name
            self.forward_metadata = meta
        (self.recorded if in_capture else self.written)[meta.batch_size] = meta.state_indices.data_ptr()
        return meta


class InPlaceBackend(RebuildingBackend):
    in_place = True


def _run(fixed: bool, backend: str) -> list[Evidence]:
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, "sglang", device=device)
    cls = InPlaceBackend if fixed else RebuildingBackend
    runner = h.make_runner(h.gdn_layer(device), pool, name, metadata_backend=cls)
    runner.capture(progress=False)
    rows = pool.alloc(3)
    batch = Batch.decode(rows, [5, 6, 7], device=device)
    step = h.replay_and_check(
        runner, batch, h.inputs_for(runner, batch, 0), what="decode replay", may_write=[pool.profile.dummy_slot]
    )
    be = runner.meta_backend
    assert isinstance(be, RebuildingBackend) and runner.last_metadata is not None
    bs = runner.last_metadata.batch_size
    address = AddressMismatch("state_indices", be.recorded[bs], be.written[bs])
    return [address, step]


CASE = ZooCase(
    name="rebuilt_tensors",
    title="metadata rebuilt into fresh tensors at replay: the graph reads the captured ones",
    issue="sglang issue 26019",
    profile="sglang",
    explanation=EXPLANATION,
    run_fn=_run,
)
