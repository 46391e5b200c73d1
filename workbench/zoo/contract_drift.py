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
from workbench.profiles import Profile
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence, NotApplicable, RaisedError, Survived

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


def variant(fixed: bool) -> type[MetadataBackend]:
    """The case's own override, written against the earlier base (the scenario also puts it on the later)."""
    return backend_class(fixed, later=False)


def on_base(cls: type[MetadataBackend], base: type[EarlierBase]) -> type[MetadataBackend]:
    """``cls`` with ``base`` below its own classes: ``cls`` itself when it already derives from ``base``,
    else a class ``(cls, base)``, so that ``cls``'s ``super()`` calls reach ``base``'s hook."""
    if issubclass(cls, base):
        return cls
    both = type(cls.__name__, (cls, base), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return both


def overrides_the_hook(cls: type[MetadataBackend], profile: Profile) -> str | None:
    """The case applies to a class that overrides the private hook the base calls, ``_replay_metadata``."""
    if any("_replay_metadata" in vars(k) for k in cls.__mro__ if k not in (EarlierBase, LaterBase)):
        return None
    return (
        f"{cls.__qualname__} does not override _replay_metadata, the private hook this case's base calls with a "
        "keyword it added later (write the override against workbench.zoo.contract_drift.EarlierBase)"
    )


class _HookLoop(Exception):
    """The stacked base's public hook was entered again while it ran: the user's own hooks route back to it."""


class _BaseHook:
    """What the stacked base's public hook saw in one capture: how often it was entered, how deep it is now."""

    def __init__(self) -> None:
        self.calls = 0
        self.depth = 0


def _watching(base: type[EarlierBase], hook: _BaseHook) -> type[EarlierBase]:
    """``base`` with its public hook counted (``hook.calls``) and a re-entry refused (``_HookLoop``), so the
    scenario can tell a class whose own hooks route around the base from one that breaks under it."""

    class Watched(base):  # type: ignore[valid-type, misc]
        def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
            if hook.depth:
                raise _HookLoop
            hook.calls += 1
            hook.depth += 1
            try:
                return super().init_forward_metadata_out_graph(batch, in_capture=in_capture)
            finally:
                hook.depth -= 1

    Watched.__name__, Watched.__qualname__, Watched.__module__ = base.__name__, base.__qualname__, base.__module__
    return Watched


def own_public_hook(cls: type[MetadataBackend]) -> type | None:
    """The first class of ``cls``'s MRO that defines ``init_forward_metadata_out_graph`` itself, when it is the
    user's (not a workbench backend, not this case's bases); None when the hook is the workbench's own."""
    for k in cls.__mro__:
        if "init_forward_metadata_out_graph" in vars(k):
            ours = k.__module__.startswith("workbench.backends") or k in (EarlierBase, LaterBase)
            return None if ours else k
    return None


def _routed(cls: type[MetadataBackend], base: type[EarlierBase], looped: bool) -> str:
    """Why the scenario cannot put ``base`` under ``cls`` (its hooks loop through the base, or skip it)."""
    owner = own_public_hook(cls)
    name = owner.__qualname__ if owner is not None else cls.__qualname__
    if looped:
        how = (
            f"{name}.init_forward_metadata_out_graph calls _replay_metadata itself, and its _replay_metadata "
            "goes on to the base's init_forward_metadata_out_graph: with this case's base below it the two "
            "hooks would call each other forever"
        )
    else:
        how = (
            f"{name}.init_forward_metadata_out_graph prepares the metadata without calling the base's, so the "
            f"keyword {base.__name__} passes could never reach the override"
        )
    return (
        f"{how}. {name} stands where this case's base would: the keywords its overrides must take are the "
        f"ones {name} passes (check them from source with `workbench check-contracts FILE`)"
    )


def _capture(cls: type[MetadataBackend], profile: str, backend: str) -> tuple[Any, StatePool, Exception | None]:
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, profile, device=device)
    runner = h.make_runner(h.gdn_layer(device, pool.profile), pool, name, buckets=(2, 4), metadata_backend=cls)
    try:
        runner.capture(progress=False)
    except TypeError as exc:
        if "argument" not in str(exc):
            raise  # not a signature error: not this case's bug
        return runner, pool, exc
    return runner, pool, None


def _capture_on(
    cls: type[MetadataBackend], base: type[EarlierBase], profile: str, backend: str
) -> tuple[Any, StatePool, Exception | None]:
    """Capture with ``cls`` on ``base``. A class of the user's that does not derive from ``base`` gets it
    stacked below (``on_base``), watched: when the class's own public hook loops back through the base, or
    captures without ever reaching it, the case cannot be built around the class (``NotApplicable``, with
    the reason). A keyword its own hook passes and its override does not take is still this case's
    evidence: the same drift, between the class's own base and its override."""
    if issubclass(cls, base):
        return _capture(cls, profile, backend)
    hook = _BaseHook()
    try:
        runner, pool, exc = _capture(on_base(cls, _watching(base, hook)), profile, backend)
    except _HookLoop:
        raise NotApplicable(_routed(cls, base, looped=True)) from None
    if exc is None and hook.calls == 0 and own_public_hook(cls) is not None:
        raise NotApplicable(_routed(cls, base, looped=False))
    return runner, pool, exc


def scenario(cls: type[MetadataBackend], profile: str, backend: str) -> list[Evidence]:
    """Capture buckets 2 and 4 with ``cls`` on the earlier base, then on the later base (skipped when ``cls``
    already derives from the later one), then replay one decode step of three requests and check it.
    Evidence of the bug: a ``TypeError`` from a keyword the override does not take. A class whose own
    public hook calls ``_replay_metadata`` (its own base, standing where this case's would) cannot have the
    case's base put under it: ``NotApplicable``, saying so."""
    out: list[Evidence] = []
    if not issubclass(cls, LaterBase):
        runner, _, exc = _capture_on(cls, EarlierBase, profile, backend)
        if exc is not None:
            return [h.capture_failure(exc, runner)]
        out.append(Survived(f"earlier base: captured {len(runner.captured)} graphs"))
    runner, pool, exc = _capture_on(cls, LaterBase, profile, backend)
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
    subject="metadata_backend",
    scenario=scenario,
    variant=variant,
    mechanism=(RaisedError,),
    applies=overrides_the_hook,
    steps="pool of 16 slots, GDN layer (small, seed 0), decode buckets 2, 4; capture() with the override on "
    "the earlier base (passes in_capture=) and on the later base (also passes mamba_track_indices=); then one "
    "decode step of 3 requests (seq_lens 5, 6, 7) padded to 4, replayed and checked",
)
