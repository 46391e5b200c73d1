"""Shared plumbing of the zoo's cases: where to run, small layers and runners, and the checks that turn a
step into evidence (an integrity report against the float64 reference, a caught exception)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any

import torch

from workbench.backends import MetadataBackend
from workbench.batch import Batch
from workbench.errors import CaptureError
from workbench.graphs import get_backend
from workbench.layer_names import GDN
from workbench.layers import GatedDeltaNetLayer, LayerState, float64_reference, make_layer
from workbench.measure.integrity import IntegrityReport, changed_slots, check, snapshot
from workbench.metadata import build_metadata
from workbench.pool import StatePool
from workbench.profiles import Profile, get_profile
from workbench.runner import GraphRunner
from workbench.traces.model import Trace, TraceStep
from workbench.traces.replay import TraceDivergence, TraceReplayer
from workbench.zoo.result import (
    AddressMismatch,
    Evidence,
    IntegrityEvidence,
    RaisedError,
    RowsDiffer,
    SlotTimeline,
    Survived,
    TraceEvidence,
    ZooError,
)

BACKEND_NAMES = ("auto", "cpu", "cuda", "npu")


def resolve_backend(backend: str) -> tuple[str, torch.device]:
    """The graph backend a case runs on and the device its pool and layer live on.

    "auto" is the CPU recorder, on every machine: the cases show mechanisms, and the recorder shows them
    the same way everywhere (and names the op and line of a host sync). "cuda" and "npu" put the pool, the
    layer and the graphs on that device; they are written against the device backends but have not been
    run on one in this repository's test suite.
    """
    if backend not in BACKEND_NAMES:
        raise ZooError(f"backend: {backend!r} is not one of {BACKEND_NAMES}")
    gb = get_backend("cpu" if backend == "auto" else backend)
    return gb.name, gb.device


def gdn_layer(device: torch.device, profile: str | Profile) -> GatedDeltaNetLayer:
    """The small Gated DeltaNet layer every GDN case uses (seed 0): ``workbench.layers.make_layer``, its state
    in ``profile``'s layout (``Profile.state_layout``), as the engine's pool keeps it."""
    layer: GatedDeltaNetLayer = make_layer(GDN, device=device, state_layout=get_profile(profile).state_layout)
    return layer


def make_runner(
    layer,
    pool: StatePool,
    backend: str,
    *,
    buckets: Sequence[int] = (1, 2, 4),
    modes: Sequence[str] = ("decode",),
    metadata_backend: type[MetadataBackend] | None = None,
    draft_tokens: int = 2,
    tree: bool = False,
) -> GraphRunner:
    """A runner over a seeded (never zero) state pool (``tree``: its verify graphs take draft trees)."""
    return GraphRunner(
        layer,
        pool,
        buckets=list(buckets),
        modes=modes,
        backend=backend,
        metadata_backend=metadata_backend,
        draft_tokens=draft_tokens,
        state_seed=1,
        tree=tree,
    )


def inputs_for(runner: GraphRunner, batch: Batch, seed: int) -> torch.Tensor:
    """Fresh random live inputs ``[live tokens, hidden]`` for ``batch`` (never zeros)."""
    n = batch.raw_batch_size * (runner.draft_tokens if batch.mode == "target_verify" else 1)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, runner.layer.config.hidden_size, generator=g)
    return x.to(dtype=runner.layer.dtype, device=runner.pool.device)


def owners(pool: StatePool, slots: Iterable[int]) -> dict[int, int | None]:
    """Slot -> the request-pool row that owns it now (None: no live request)."""
    by_slot = {s: row for row in pool.live_rows for s in pool.slots_of(row)}
    return {int(s): by_slot.get(int(s)) for s in slots}


def replay_and_check(
    runner: GraphRunner,
    batch: Batch,
    inputs: torch.Tensor,
    *,
    what: str,
    before: LayerState | None = None,
    may_write: Iterable[int] = (),
) -> IntegrityEvidence:
    """Replay ``batch`` and check it against the float64 reference run from ``before``.

    ``before`` is the state as it should be before this step (default: the state now). Slots the step may
    write: its live rows' slots and ``may_write`` (e.g. a dummy slot nobody owns); any other slot that
    changed is reported, and every live slot and output row must match the reference.
    """
    pool = runner.pool
    start = runner.state.clone() if before is None else before
    pre = snapshot(start.tensors())
    meta_r = build_metadata(batch, pool, bucket=None)
    layer: Any = runner.layer
    ref = float64_reference(layer)
    st_r = start.to(torch.float64)
    out_r = ref.forward(inputs.double(), meta_r, st_r, None)
    res = runner.replay(batch, inputs)
    n = inputs.shape[0]
    out_g = res.output.clone()
    padded = (
        runner.graph(res.mode if res.mode != "idle" else "decode", res.bucket).outputs[n:] if res.replayed else None
    )
    live = sorted({int(s) for s in meta_r.state_indices.flatten().tolist()})
    report = check(
        pre,
        runner.state.tensors(),
        allowed_slots=set(live) | set(may_write),
        live_slots=live,
        reference_state=st_r.tensors(),
        live_outputs=out_g,
        reference_outputs=out_r,
        padded_outputs=padded,
        padded_offset=n,
    )
    return integrity_evidence(what, report, pool, pre, runner.state.tensors(), live, may_write)


def integrity_evidence(
    what: str,
    report: IntegrityReport,
    pool: StatePool,
    before: dict[str, torch.Tensor],
    after: dict[str, torch.Tensor],
    live: Iterable[int],
    may_write: Iterable[int] = (),
) -> IntegrityEvidence:
    """``report`` as evidence: the owners of the slots it names, and what a figure of the pool needs (every
    slot the step wrote, ``before`` against ``after``; the live rows' slots; the dummy slot when it may be
    written; the pool's size)."""
    named = {s for _, s in report.changed_slots} | {s for _, s, _ in report.state_mismatches}
    written = sorted({s for _, s in changed_slots(before, after)})
    dummy = pool.profile.dummy_slot
    return IntegrityEvidence(
        what,
        report,
        owners(pool, named),
        written=tuple(written),
        live=tuple(sorted({int(s) for s in live})),
        dummy=dummy if dummy in set(may_write) else None,
        num_slots=pool.num_slots,
    )


def decode_after_capture(runner: GraphRunner, pool: StatePool, device: torch.device) -> list[Evidence]:
    """After a capture that survived: one decode step of three requests, replayed and checked (the dummy
    slot may be written); the evidence that the fixed variant runs clean."""
    batch = Batch.decode(pool.alloc(3), [5, 6, 7], device=device)
    step = replay_and_check(
        runner, batch, inputs_for(runner, batch, 0), what="decode replay", may_write=[pool.profile.dummy_slot]
    )
    return [Survived(f"captured {len(runner.captured)} graphs"), step]


def _frame_locals(tb: TracebackType | None, func: str, keys: Sequence[str]) -> dict[str, object]:
    """The locals of the innermost traceback frame running a function named ``func`` that has every one
    of ``keys`` (empty if none)."""
    found: dict[str, object] = {}
    while tb is not None:
        loc = tb.tb_frame.f_locals
        if tb.tb_frame.f_code.co_name == func and all(k in loc for k in keys):
            found = dict(loc)
        tb = tb.tb_next
    return found


def capture_failure(exc: BaseException, runner: GraphRunner) -> RaisedError:
    """A caught capture exception, with the bucket ``GraphRunner.capture`` was on when it died."""
    loc = _frame_locals(exc.__traceback__, "capture", ("mode", "bs"))
    where = "GraphRunner.capture"
    if loc:
        n = len(runner.captured)
        before = "the first bucket" if n == 0 else f"after {n} graph(s)"
        where += f" at {loc['mode']} bucket {loc['bs']}, {before}"
    return RaisedError.of(exc, where)


def metadata_rows_differ(
    runner: GraphRunner, batch: Batch, field_name: str = "state_indices", rows: Iterable[int] | None = None
) -> RowsDiffer:
    """Rows of the runner's last graph metadata that differ from the metadata built eagerly for ``batch``
    at the same bucket (``workbench.metadata.build_metadata``, the ground truth of padding); only ``rows``
    when given (e.g. the live ones)."""
    meta = runner.last_metadata
    if meta is None:
        raise ZooError("metadata_rows_differ: the runner has run no step yet")
    want = build_metadata(batch, runner.pool, bucket=meta.batch_size, buckets=[meta.batch_size])
    exp = getattr(want, field_name).tolist()
    got_t = getattr(meta, field_name)
    what = field_name if rows is None else f"{field_name} (live rows)"
    kept = (meta.clone(), want)  # the graph's buffers are rewritten by the next replay
    if got_t is None:  # the backend left the field out: every row differs
        n = len(exp)
        return RowsDiffer(
            f"{field_name} (missing)",
            list(range(n)),
            got=[None] * n,
            expected=exp,
            field_name=field_name,
            metadata=kept,
        )
    got = got_t.tolist()
    keep = set(range(len(exp))) if rows is None else set(rows)
    differ = [i for i, (g, e) in enumerate(zip(got, exp, strict=True)) if g != e and i in keep]
    return RowsDiffer(
        what,
        differ,
        got=[got[i] for i in differ],
        expected=[exp[i] for i in differ],
        field_name=field_name,
        metadata=kept,
    )


def is_host_sync(exc: BaseException, graph_backend: str) -> bool:
    """Whether a capture error is a host read: the CPU recorder says "host sync" (its other refusals, a
    dynamic shape or a storage swap, are other bugs); on a device any capture RuntimeError counts (torch's
    messages differ per device)."""
    if graph_backend == "cpu":
        return isinstance(exc, CaptureError) and "host sync" in str(exc)
    return isinstance(exc, RuntimeError)


def watched(cls: type[MetadataBackend]) -> type[MetadataBackend]:
    """``cls`` unchanged but for a record of the ``data_ptr`` of every metadata tensor its host-side hook
    hands out, per bucket: ``recorded`` at capture (what the graph reads), ``written`` at the last replay.

    The override forwards its arguments exactly as it got them, so a hook that cannot take them fails as
    it would unwatched.
    """

    class Watched(cls):  # type: ignore[valid-type, misc]
        def init_forward_metadata_out_graph(self, batch: Batch, *args: Any, **kwargs: Any) -> Any:
            meta = super().init_forward_metadata_out_graph(batch, *args, **kwargs)
            in_capture = bool(kwargs.get("in_capture", args[0] if args else False))
            book = self.__dict__.setdefault("_zoo_recorded" if in_capture else "_zoo_written", {})
            book[meta.batch_size] = {n: t.data_ptr() for n, t in meta.tensors().items()}
            return meta

    Watched.__name__, Watched.__qualname__ = cls.__name__, cls.__qualname__
    Watched.__module__ = cls.__module__
    return Watched


def address_evidence(backend: MetadataBackend, bucket: int) -> list[AddressMismatch]:
    """For a ``watched`` backend: each metadata tensor of ``bucket`` handed out at the last replay at
    another address than the graph recorded (one clean ``state_indices`` entry when none moved)."""
    recorded = backend.__dict__.get("_zoo_recorded", {}).get(bucket, {})
    written = backend.__dict__.get("_zoo_written", {}).get(bucket, {})
    if not recorded or not written:
        raise ZooError(f"address_evidence: bucket {bucket} was not both captured and replayed")
    moved = [
        AddressMismatch(n, recorded[n], written[n]) for n in recorded if n in written and recorded[n] != written[n]
    ]
    field_name = "state_indices"
    return moved or [AddressMismatch(field_name, recorded[field_name], written[field_name])]


def replay_trace(
    trace: Trace,
    cls: type[MetadataBackend] | None,
    backend: str,
    *,
    what: str,
    reading: Callable[[TraceReplayer, TraceDivergence], tuple[bool, str]],
    zero_on_alloc: bool = False,
    boot_zeroed: bool = False,
) -> TraceEvidence:
    """Replay ``trace`` with ``cls`` as the runner's metadata backend, to its first divergence, as evidence.

    ``reading(replayer, divergence)``: whether the divergence is the case's mechanism, and what the case
    reads off it (who held the slot before, which chunk it was). ``boot_zeroed``: the pool starts zeroed,
    as an engine allocates its cache (vLLM 0.33.0's ``allocate_kv_cache`` takes ``torch.zeros``), not
    seeded; ``zero_on_alloc``: see :class:`~workbench.traces.replay.TraceReplayer`.
    """
    name, _ = resolve_backend(backend)
    rep = TraceReplayer(trace, backend=name, metadata_backend=cls, zero_on_alloc=zero_on_alloc)
    if boot_zeroed:
        for t in (*rep.runner.state.tensors().values(), *rep.shadow.tensors().values()):
            t.zero_()
    book = _TimelineBook(rep)
    for step in trace.steps:  # TraceReplayer.run(stop_at_first=True), the slot owners recorded per step
        held = book.before(step)
        found = rep.step(step)
        book.after(step, held, found)
        if found:
            break
    res = rep.result
    d = res.first
    matches, facts = reading(rep, d) if d is not None else (False, "")
    return TraceEvidence(what, res.steps, len(trace), d, matches, facts, timeline=book.timeline())


class _TimelineBook:
    """The slot owners, foreign writes, prefix-cache checkpoints and copies of each step a replayer runs:
    a :class:`SlotTimeline` for a figure."""

    def __init__(self, rep: TraceReplayer) -> None:
        self.rep = rep
        self.steps: list[int] = []
        self.owners: list[tuple[int | None, ...]] = []
        self.foreign: set[tuple[int, int]] = set()
        self.bad: set[tuple[int | None, int]] = set()  # (slot, step that published it off its prefix)
        self.checkpoints: dict[tuple[int, int], tuple[int, int, int, int, bool]] = {}
        self.copies: list[tuple[int, int, int, bool]] = []

    def before(self, step: TraceStep) -> dict[int, tuple[int, ...]]:
        pool = self.rep.pool
        return {rid: tuple(pool.slots_of(row)) for rid, row in self.rep.live.items()}

    def after(self, step: TraceStep, held: dict[int, tuple[int, ...]], found: list[TraceDivergence]) -> None:
        pool = self.rep.pool
        for rid, row in self.rep.live.items():  # admitted at this step
            held.setdefault(rid, tuple(pool.slots_of(row)))
        for r in step.rows:  # admitted and finished at this step: its pool row is already freed
            held.setdefault(r.id, (r.slot,))
        line: list[int | None] = [None] * pool.num_slots
        for rid, owned in held.items():
            for s in owned:
                if 0 <= s < pool.num_slots:
                    line[s] = rid
        self.steps.append(step.step)
        self.owners.append(tuple(line))
        self.foreign |= {(step.step, d.slot) for d in found if d.kind == "foreign" and d.slot is not None}
        self.bad |= {(d.slot, step.step) for d in found if d.kind == "prefix" and d.field == "checkpoint"}
        for slot, cp in self.rep.book.live.items():
            ok = (slot, cp.step) not in self.bad
            self.checkpoints[(step.step, slot)] = (step.step, slot, cp.request, len(cp.tokens), ok)
        md = step.metadata or {}
        for key, before in (("copies_before", True), ("copies_after", False)):
            self.copies += [(step.step, int(p[0]), int(p[1]), before) for p in md.get(key, [])]

    def timeline(self) -> SlotTimeline:
        return SlotTimeline(
            steps=tuple(self.steps),
            slots=tuple(range(self.rep.pool.num_slots)),
            owners=tuple(self.owners),
            dummy=self.rep.pool.profile.dummy_slot,
            foreign=tuple(sorted(self.foreign)),
            checkpoints=tuple(self.checkpoints.values()),
            copies=tuple(self.copies),
        )


def tokens_in_state(trace: Trace, request: int, step: int) -> int:
    """Tokens in ``request``'s state after ``step``: its rows' ``cached_tokens`` plus what each step kept
    (a verify keeps ``accepted``), read off the trace."""
    held = 0
    for s in trace.steps[: step + 1]:
        for r in s.rows:
            if r.id == request:
                kept = r.accepted if (s.mode == "target_verify" and r.accepted is not None) else r.new_tokens
                held = r.cached_tokens + kept
    return held
