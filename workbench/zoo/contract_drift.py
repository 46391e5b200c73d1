"""contract_drift: after ``in_capture``, the base passes a second keyword (``mamba_track_indices``) to the
same private hook; the override that added only ``in_capture`` breaks again, one taking ``**kwargs`` survives
(sglang PR 29598's hook, against sglang's later base)."""

from __future__ import annotations

from typing import Any

import torch

from workbench.backends import MetadataBackend, NpuMetadataBackend
from workbench.batch import Batch
from workbench.metadata import Metadata
from workbench.pool import StatePool
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence, Survived

EXPLANATION = (
    "In sglang the public host-side hook of the mamba backend base calls a private hook on `self`, "
    "`_replay_metadata(...)`, and device subclasses override that private hook. The Ascend override first "
    "lacked `in_capture` (PR 29598); the fix added exactly that one keyword. The base then began to pass a "
    "second keyword, `mamba_track_indices=`, to the same hook. An override that names only the keywords it "
    "knew of breaks again with the next `TypeError`, this time about `mamba_track_indices`; the one sglang "
    "kept, `(..., in_capture=False, *args, **kwargs)`, takes whatever the base adds. Here a later base passes "
    "both keywords: the one-keyword override captures fine under the earlier base and dies under the later "
    "one; the `**kwargs` override captures under both. The durable fix is `**kwargs` (forwarded to the "
    "base), and the durable guard is a contract check in CI: `workbench check-contracts FILE --base "
    "pkg.mod:LaterBase` reads the override from source and also checks the calls the base makes on itself, "
    "so it reports `self._replay_metadata(..., mamba_track_indices=...)` with the TypeError it would raise; "
    "a checker of public methods alone would miss the private hook."
)


class EarlierBase(NpuMetadataBackend):
    """The base as PR 29598 knew it: the public hook calls the private one with ``in_capture`` only."""

    def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
        return self._replay_metadata(batch, in_capture=in_capture)

    def _replay_metadata(
        self, batch: Batch, in_capture: bool = False, mamba_track_indices: torch.Tensor | None = None
    ) -> Metadata:
        self.mamba_track_indices = mamba_track_indices  # kept by the hook, as the engine's metadata keeps it
        return super().init_forward_metadata_out_graph(batch, in_capture=in_capture)


class LaterBase(EarlierBase):
    """The base later: it also passes the slots prefix caching tracks, ``mamba_track_indices=``."""

    def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
        track = None if in_capture else self.pool.mapping[self.to_pool_device(batch).req_pool_indices, 0]
        return self._replay_metadata(batch, in_capture=in_capture, mamba_track_indices=track)


def _one_keyword(base: type[EarlierBase]) -> type[MetadataBackend]:
    class AscendOneKeywordFix(base):  # type: ignore[valid-type, misc]
        def _replay_metadata(self, batch: Batch, in_capture: bool = False) -> Metadata:
            return super()._replay_metadata(batch, in_capture=in_capture)

    return AscendOneKeywordFix


def _durable(base: type[EarlierBase]) -> type[MetadataBackend]:
    class AscendKwargsFix(base):  # type: ignore[valid-type, misc]
        def _replay_metadata(self, batch: Batch, in_capture: bool = False, *args: Any, **kwargs: Any) -> Metadata:
            return super()._replay_metadata(batch, in_capture, *args, **kwargs)

    return AscendKwargsFix


def backend_class(fixed: bool, later: bool = True) -> type[MetadataBackend]:
    """The Ascend override of each variant on the earlier or the later base (a fresh class per call)."""
    base = LaterBase if later else EarlierBase
    return _durable(base) if fixed else _one_keyword(base)


def _capture(cls: type[MetadataBackend], backend: str) -> tuple[Any, StatePool, Exception | None]:
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, "sglang-ascend", device=device)
    runner = h.make_runner(h.gdn_layer(device), pool, name, buckets=(2, 4), metadata_backend=cls)
    try:
        runner.capture(progress=False)
    except TypeError as exc:
        return runner, pool, exc
    return runner, pool, None


def _run(fixed: bool, backend: str) -> list[Evidence]:
    out: list[Evidence] = []
    runner, _, exc = _capture(backend_class(fixed, later=False), backend)
    if exc is not None:
        return [h.capture_failure(exc, runner)]
    out.append(Survived(f"earlier base: captured {len(runner.captured)} graphs"))
    runner, pool, exc = _capture(backend_class(fixed, later=True), backend)
    if exc is not None:
        return [*out, h.capture_failure(exc, runner)]
    out.append(Survived(f"later base: captured {len(runner.captured)} graphs"))
    rows = pool.alloc(3)
    batch = Batch.decode(rows, [5, 6, 7], device=pool.device)
    step = h.replay_and_check(
        runner, batch, h.inputs_for(runner, batch, 0), what="decode replay", may_write=[pool.profile.dummy_slot]
    )
    return [*out, step]


CASE = ZooCase(
    name="contract_drift",
    title="the base passes a second keyword to the same hook: the one-keyword fix breaks again",
    issue="sglang PR 29598, later base",
    profile="sglang-ascend",
    explanation=EXPLANATION,
    run_fn=_run,
)
