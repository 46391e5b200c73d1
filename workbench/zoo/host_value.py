"""host_value: a value read on the host every step inside the captured part (a ``.item()``): a device
graph cannot hold it, and the CPU recorder refuses it naming the op and the line (sglang PR 16186)."""

from __future__ import annotations

import torch

from workbench.backends import MetadataBackend
from workbench.batch import Batch
from workbench.pool import StatePool
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence, RaisedError, RecorderError

EXPLANATION = (
    "A graph replays device work on fixed addresses; host code inside the captured region runs once, at "
    "capture. A per-step value taken to the host there (`.item()`, `int(t)`, a copy from a CPU scalar tensor) "
    "is either a device-to-host sync that a capturing stream refuses, or a constant frozen at its capture "
    "value; outside a graph the same line is a stream sync on every step, which sglang removed in PR 16186 "
    "(a copy from a host scalar became a `fill_`). Here a metadata backend's recorded hook re-derives the "
    "padded rows from the number of live tokens read with `.item()`: the CPU recorder, like CUDA, refuses "
    "the host sync at the first capture and names the op, `aten._local_scalar_dense`, and the source line "
    "that issued it. The fix derives the same mask on the device (`rows >= query_start_loc[-1]`), so the "
    "graph recomputes it from each step's metadata, and replay matches the float64 reference."
)


def _backend(on_device: bool) -> type[MetadataBackend]:
    class RecordedPaddingBackend(MetadataBackend):
        """Re-marks the padded rows inside the graph, from the number of live tokens."""

        def init_forward_metadata_in_graph(self, batch: Batch) -> None:
            meta = self.forward_metadata
            assert meta is not None
            sentinel = meta.profile.sentinel
            if on_device:
                rows = torch.arange(meta.batch_size, device=meta.state_indices.device)
                meta.state_indices.masked_fill_(rows >= meta.query_start_loc[-1], sentinel)
            else:
                live = meta.query_start_loc[-1].item()  # a host read on every step
                meta.state_indices[int(live) :].fill_(sentinel)

    return RecordedPaddingBackend


def variant(fixed: bool) -> type[MetadataBackend]:
    """The case's own backend: a host read (unfixed) or the same mask on the device (fixed)."""
    return _backend(on_device=fixed)


def scenario(cls: type[MetadataBackend], profile: str, backend: str) -> list[Evidence]:
    """Capture decode buckets 1, 2, 4 with ``cls``; if capture survives, replay one decode step of three
    requests and check it. Evidence of the bug: the recorder's refusal of a host read (op and line)."""
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, profile, device=device)
    runner = h.make_runner(h.gdn_layer(device, pool.profile), pool, name, metadata_backend=cls)
    try:
        runner.capture(progress=False)
    except RuntimeError as exc:  # CaptureError on the CPU recorder; torch's own error on a device
        if not h.is_host_sync(exc, name):
            raise  # a dynamic shape, a storage swap...: not this case's bug
        parsed = RecorderError.parse(exc)
        return [parsed if parsed is not None else h.capture_failure(exc, runner)]
    return h.decode_after_capture(runner, pool, device)


CASE = ZooCase(
    name="host_value",
    title="a per-step .item() inside the captured region: refused at capture",
    issue="sglang PR 16186",
    profile="sglang",
    explanation=EXPLANATION,
    subject="metadata_backend",
    scenario=scenario,
    variant=variant,
    mechanism=(RecorderError, RaisedError),
    steps="pool of 16 slots, GDN layer (small, seed 0), decode buckets 1, 2, 4; capture() on the recorder, "
    "which refuses a host read inside init_forward_metadata_in_graph; then one decode step of 3 requests "
    "(seq_lens 5, 6, 7) padded to 4, replayed and checked",
)
