"""in_capture: a device backend's override of the host-side metadata hook lacks the ``in_capture`` keyword
the base (and the graph runner) pass; capture dies at its first bucket (sglang PR 29598)."""

from __future__ import annotations

from workbench.backends import MetadataBackend, NpuMetadataBackend
from workbench.batch import Batch
from workbench.metadata import Metadata
from workbench.pool import StatePool
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence, RaisedError

EXPLANATION = (
    "sglang split graph metadata into an eager hook, a host-side hook run outside the graph and a recorded "
    "hook, and the base class grew `init_forward_metadata_out_graph(batch, in_capture=False)`: the graph "
    "runner passes `in_capture=True` while capturing, when there is no padding and every row points at the "
    "dummy slot. The Ascend backend overrode that hook with the old signature `(self, batch)`. Nothing on the "
    "CUDA or CPU path ever called the NPU class, so the mismatch surfaced only when the NPU scheduler started "
    "capturing and Python raised `TypeError: ... unexpected keyword argument 'in_capture'`. Here the same "
    "override, on the workbench's NPU metadata backend, kills `GraphRunner.capture()` at its first bucket; "
    "`workbench check-contracts` finds it from source without running it. The fix accepts the keyword and "
    "forwards it to the base."
)


def _broken_backend() -> type[MetadataBackend]:
    class AscendBackendWithoutInCapture(NpuMetadataBackend):  # check-contracts: ignore (the zoo's bug)
        def init_forward_metadata_out_graph(self, batch: Batch) -> Metadata:  # type: ignore[override]
            return super().init_forward_metadata_out_graph(batch)

    return AscendBackendWithoutInCapture


def _fixed_backend() -> type[MetadataBackend]:
    class AscendBackend(NpuMetadataBackend):
        def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
            return super().init_forward_metadata_out_graph(batch, in_capture=in_capture)

    return AscendBackend


def backend_class(fixed: bool) -> type[MetadataBackend]:
    """The Ascend-style metadata backend of each variant (a fresh class per call)."""
    return _fixed_backend() if fixed else _broken_backend()


def scenario(cls: type[MetadataBackend], profile: str, backend: str) -> list[Evidence]:
    """Capture buckets 1, 2, 4 with ``cls`` on a pool of 16 slots; if capture survives, replay one decode step
    of three requests and check it. Evidence of the bug: the ``TypeError`` about ``in_capture``."""
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, profile, device=device)
    runner = h.make_runner(h.gdn_layer(device, pool.profile), pool, name, metadata_backend=cls)
    try:
        runner.capture(progress=False)
    except TypeError as exc:
        if "in_capture" not in str(exc):
            raise  # another signature error: not this case's bug
        return [h.capture_failure(exc, runner)]
    return h.decode_after_capture(runner, pool, device)


CASE = ZooCase(
    name="in_capture",
    title="a device backend's metadata hook lacks the in_capture keyword: capture dies",
    issue="sglang PR 29598",
    profile="sglang-ascend",
    explanation=EXPLANATION,
    subject="metadata_backend",
    scenario=scenario,
    variant=backend_class,
    mechanism=(RaisedError,),
    steps="pool of 16 slots, GDN layer (small, seed 0), decode buckets 1, 2, 4; capture(); then one decode "
    "step of 3 requests (seq_lens 5, 6, 7) padded to 4, replayed and checked against the float64 reference",
)
