"""Every step of a trace through the graph runner, checked against a float64 shadow of every request.

The runner captures the trace's buckets on the CPU recorder (or a device); each step then runs as the
engines run it: decode and verify through the graph of the smallest bucket that holds them (eagerly above
the largest), extend and mixed steps eagerly, an idle step through the decode graph with no live row.
Beside it a float64 *shadow* pool advances by the reference recurrence only, from the trace's own history:
so after every step each live request's state must equal the float64 recurrence over all of its tokens so
far (chunk boundaries and accepted drafts included) — which catches a reallocated slot read as initial
state, a chunk that loses or repeats its initial state, a wrong accept — and no slot that no live request
owns may change. Recorded metadata (a trace dumped from an engine) is checked against the profile's
invariants and against what the workbench builds for the same step.

The first divergence is a :class:`TraceDivergence` (step, request, row, field, slot, expected, got) that
renders itself; :class:`TraceResult` holds the run. A trace that replays nothing is never OK.

A mixed step with verify rows runs as two eager batches, one after the other on their disjoint slots, each
checked against the shadow: its verify rows as a target_verify batch (accepted as the profile accepts), then
the others as an extend batch (:func:`~workbench.traces.steps.split_step`; vLLM's GDN builder splits it so,
``spec_*`` / ``non_spec_*``, and records under those names are compared with each part's build).
With ``record=True`` the replay keeps what each step's metadata was as the step used it (bucket,
``state_indices``, ``query_start_loc``, vLLM's ``num_accepted_tokens``; a split step's ``spec_*`` /
``non_spec_*`` keys): :meth:`TraceReplayer.recorded_trace` is the trace with it, a complete example of a dump.

Each step hands its prefix-cache and track checks a :class:`~workbench.traces.context.StepContext`
(:mod:`~workbench.traces.checkpoints`, :mod:`~workbench.traces.tracking`); they never see the replayer.
The replay times nothing itself: a :class:`PhaseTimer` given as ``timer`` is told as each phase of a step
starts (:func:`replay_trace` gives one, so ``TraceResult.seconds`` is filled; ``workbench bench trace``
keeps each forward's split).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

import torch

from kernels.dtypes import cast
from kernels.snapshots import Snapshots, take_states
from workbench import html
from workbench.backends import MetadataBackend
from workbench.batch import Batch
from workbench.errors import MetadataError, WorkbenchError
from workbench.layers import FLOAT32_TOLERANCE, Intermediate, LayerError, LayerState, float64_reference
from workbench.layers import make_layer as make_registered_layer
from workbench.measure.integrity import IntegrityReport
from workbench.measure.integrity import check as integrity_check
from workbench.metadata import Metadata, build_metadata, validate
from workbench.profiles import get_profile
from workbench.runner import GraphRunner
from workbench.traces.budget import replay_budget
from workbench.traces.cache_record import embed_tokens
from workbench.traces.checkpoints import CheckpointBook
from workbench.traces.context import StepContext, VerifiedIntermediates
from workbench.traces.divergence import DIVERGENCE_KINDS, TraceDivergence
from workbench.traces.ledger import TokenLedger
from workbench.traces.model import (
    CHUNK_TRACK_FIELDS,
    FINAL_TRACK_FIELDS,
    SPLIT_KEYS,
    TRACK_FIELDS,
    TREE_KEYS,
    VERIFY_TRACK_FIELDS,
    Trace,
    TraceHeader,
    TraceStep,
    accepted_paths,
    engine_note,
    tree_step_problem,
)
from workbench.traces.steps import new_pool, to_batches
from workbench.traces.tracking import chunk_positions

RECORDED_FIELDS = ("state_indices", "query_start_loc", "seq_lens", "req_pool_indices", "has_initial_state")
NULL_IS_UNRECORDED = ("seq_lens", "req_pool_indices", "has_initial_state")
"""Recorded fields whose null means "not recorded" (vLLM's builder leaves ``has_initial_state`` None in a step
without prefill rows); a null split key (``SPLIT_KEYS``) means "none built" and is compared."""
CHECKED_KEYS = ("bucket", *RECORDED_FIELDS, *SPLIT_KEYS)
"""The recorded ``metadata`` keys the replay compares with what the profile builds."""
GRAPH_STEP_MODES = ("decode", "target_verify", "idle")
_TRACK_KEYS = frozenset((*TRACK_FIELDS, *VERIFY_TRACK_FIELDS, *CHUNK_TRACK_FIELDS, *FINAL_TRACK_FIELDS))
_Parts = tuple[tuple[TraceStep, Batch], ...]


class TraceInputError(WorkbenchError, ValueError):
    """The trace cannot be replayed as given (a row the pool cannot place, a mode the layer lacks)."""


REPORT_PROBLEMS: dict[str, tuple[str, str]] = {
    "changed_slots": ("foreign", "foreign slot changed"),
    "state_mismatches": ("state", "state off reference"),
    "intermediate_mismatches": ("state", "row off reference"),
    "output_mismatches": ("output", "output off reference"),
    "nonzero_padded_outputs": ("padded", "padded output not zero"),
}
"""Each problem list of an :class:`~workbench.measure.integrity.IntegrityReport`: the divergence kind it is, and
what the divergence says."""

PHASES = ("metadata", "replay", "reference", "check", "prefix")
"""The phases of a step a :class:`PhaseTimer` is told of (``prefix``: the prefix cache's checks and copies)."""


class PhaseTimer:
    """Seconds per phase of a replay's steps, summed in ``seconds`` (one timer per replayer).

    A :class:`TraceReplayer` given one as ``timer`` calls it as each phase of a step starts (one of
    :data:`PHASES`), and with None as untimed work starts; each phase's seconds go to :meth:`lap` as it ends.
    Subclass :meth:`lap` to see them one by one (``workbench bench trace`` keeps each forward's split).
    """

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._phase: str | None = None
        self._start = 0.0

    def __call__(self, phase: str | None) -> None:
        now = time.perf_counter()
        if self._phase is not None:
            self.lap(self._phase, now - self._start)
        self._phase, self._start = phase, now

    def lap(self, phase: str, seconds: float) -> None:
        """``phase`` of a step just took ``seconds``."""
        self.seconds[phase] += seconds


def _untimed(phase: str | None) -> None:
    """A replay without a timer: no clock read."""


@dataclass
class TraceResult:
    """A replayed trace: steps run (graph, eager, idle), divergences, prefix-cache counts (hits, checkpoints
    published and verified), seconds per phase (``prefix``: the prefix cache's checks and copies)."""

    header: TraceHeader
    steps: int = 0
    graph_steps: int = 0
    eager_steps: int = 0
    idle_steps: int = 0
    divergences: list[TraceDivergence] = field(default_factory=list)
    hits: int = 0
    checkpoints: int = 0
    verified: int = 0
    budget_bytes: int = 0  # the most the replay holds at once, as checked before it started (traces.budget)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))  # zeros when untimed
    recorded: Trace | None = None  # replay_trace(..., record=True): the trace with each step's metadata as used

    @property
    def ok(self) -> bool:
        """At least one step ran and none diverged."""
        return self.steps > 0 and not self.divergences

    @property
    def first(self) -> TraceDivergence | None:
        return self.divergences[0] if self.divergences else None

    def summary(self) -> str:
        h = self.header
        what = f"{self.steps} steps ({self.graph_steps} graph, {self.eager_steps} eager, {self.idle_steps} idle)"
        head = f"{h.profile} {h.layer}: {what} in {sum(self.seconds.values()):.1f} s"
        if self.steps == 0:
            return f"FAIL: {head}: the trace replays nothing"
        if self.checkpoints or self.hits:
            head += (
                f"; prefix cache: {self.hits} hit(s), {self.checkpoints} checkpoint(s) published, {self.verified} "
                "verified against the float64 state of exactly their prefix"
            )
        note = engine_note(h)
        if note:  # a release the profile's rules were not verified on: say so beside the verdict
            head += f" ({note})"
        if self.ok:
            return f"OK: {head}, every request on its float64 recurrence, nothing foreign written"
        return f"FAIL: {head}; first divergence: {self.divergences[0]}"

    def __str__(self) -> str:
        return "\n".join([*(str(d) for d in self.divergences), self.summary()])

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "profile": self.header.profile,
            "layer": self.header.layer,
            "steps": self.steps,
            "graph_steps": self.graph_steps,
            "eager_steps": self.eager_steps,
            "idle_steps": self.idle_steps,
            "hits": self.hits,
            "checkpoints": self.checkpoints,
            "verified": self.verified,
            "memory_budget_bytes": self.budget_bytes,
            "divergences": [d.to_dict() for d in self.divergences],
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
        }

    def _repr_html_(self) -> str:
        parts = [html.badge(self.ok, self.summary())]
        if self.divergences:
            rows = [[d.step, d.kind, d.field, d.request, d.row, d.slot, d.expected, d.got] for d in self.divergences]
            cols = ("step", "kind", "field", "request", "row", "slot", "expected", "got")
            parts.append(html.table(cols, rows, row_kinds=["fail"] * len(rows)))
        return html.block(*parts, title="Trace replay")


def make_layer(name: str, state_layout: str | None = None) -> Any:
    """The small layer of ``name`` (seed 0): what the trace's steps run (``workbench.layers.make_layer``), its
    state in ``state_layout`` (the header profile's ``state_layout`` in a replay; None: "k_first"); an unknown
    name is a ``TraceInputError`` naming the registry's choices."""
    try:
        return make_registered_layer(name, state_layout=state_layout)
    except LayerError as e:
        raise TraceInputError(str(e)) from None


class TraceReplayer:
    """Replays a trace step by step (:meth:`step`), or all of it (:meth:`run`); see the module.

    ``metadata_backend``: the :class:`~workbench.backends.MetadataBackend` subclass the runner prepares each
    step with (default: the device family's). ``zero_on_alloc``: zero a slot's state when a request is
    admitted to it, as an allocator that zeroes on (re)allocation does; None (the default): as the header's
    ``zero_on_alloc`` says, false unless given (vLLM 0.33.0 does not zero mamba blocks: a new tenant finds its
    slot as the previous one left it, so a read of a slot before the tenant's first write shows); a bool
    overrides the header. ``timer``: a :class:`PhaseTimer` told of each phase of each step (its ``seconds``
    become the result's); without one the replay reads no clock. ``record``: keep each step's metadata as
    the step used it (:meth:`recorded_trace`).
    """

    def __init__(
        self,
        trace: Trace,
        *,
        backend: str = "cpu",
        seed: int = 0,
        max_divergences: int = 20,
        metadata_backend: type[MetadataBackend] | None = None,
        zero_on_alloc: bool | None = None,
        timer: PhaseTimer | None = None,
        record: bool = False,
    ) -> None:
        h = trace.header
        self.trace, self.seed, self.max_divergences = trace, seed, max_divergences
        self.zero_on_alloc = h.zero_on_alloc if zero_on_alloc is None else zero_on_alloc
        self.record = record
        self.used: dict[int, dict[str, Any]] = {}  # step number -> its metadata as the step used it (record)
        self.result = TraceResult(h)
        self.timer = timer
        self._mark: Callable[[str | None], None] = _untimed if timer is None else timer
        if timer is not None:
            self.result.seconds = timer.seconds
        # the layer keeps its state as the trace's engine does (Profile.state_layout); its float64 reference,
        # the shadow and the checkpoints follow it (float64_reference and new_state keep the layer's layout)
        layer = make_layer(h.layer, get_profile(h.profile).state_layout)
        # everything the replay will hold, against what is free, before the pool's first byte
        self.budget = replay_budget(trace, layer)
        self.budget.check("cpu" if backend in ("cpu", "auto") else backend)
        self.result.budget_bytes = self.budget.total
        pool = new_pool(h)
        modes = [m for m in ("decode", "target_verify") if m in h.buckets]
        buckets: dict[str, Sequence[int]] = {m: list(h.buckets[m]) for m in modes}
        self.runner = GraphRunner(
            layer,
            pool,
            buckets=buckets,
            modes=modes,
            backend=backend,
            draft_tokens=h.draft_tokens,
            state_seed=1,
            metadata_backend=metadata_backend,
            tree=h.topk > 1,  # sglang's topk > 1: every verify batch carries its rows' draft trees
        )
        self.pool = pool
        # only the buckets the steps replay, before the first step as a full capture was; one the guess misses
        # is captured when first replayed (the default trace never verifies: no verify graph)
        with torch.inference_mode():  # as the steps replay them (CpuGraph replays in its capture's mode)
            self.runner.capture(progress=False, lazy=True, now=_replayed_buckets(trace, self.runner))
        self.ref = float64_reference(layer)
        self.shadow = self.runner.state.to(torch.float64)  # advanced by the reference only
        self.live: dict[int, int] = {}  # request id -> request-pool row
        self.tenants: dict[int, list[int]] = {}  # slot -> request ids that held it, in order
        self.accepted: dict[int, int] = {}  # vLLM: request id -> tokens accepted at its last verify
        self.read_columns: dict[int, int] = {}  # vLLM verify: request id -> the column of its slots it read
        # the step's batch, inputs, states before it and the states its forward handed out (runner, shadow):
        # the prefix cache's stand-in for the kernel's chunk states; None until its forward runs
        self._ran: tuple[Batch, torch.Tensor, tuple[LayerState, LayerState], tuple[Snapshots, Snapshots]] | None = None
        # the step's verify rows (request-pool rows, in batch order) with the runner's and the float64
        # reference's intermediate states, for sglang's tracking at commit; None after other steps
        self.verified_intermediates: VerifiedIntermediates | None = None
        # a batch's unpadded metadata as the recorded-metadata check built it, which the shadow then runs on
        self._unpadded: tuple[Batch, Metadata] | None = None
        self.profile = h.profile
        # vLLM: a verify commits by count (one slot per draft, the count read at the next verify); sglang
        # scatters the accepted step's state back
        self.carries_accepted = get_profile(h.profile).num_accepted_fill is not None
        self.book = CheckpointBook(layer, self.ref, pool.profile)  # prefix-cache work: checkpoints, hits, copies
        self.ledger = TokenLedger(h)  # each live request's token count across steps

    # -- one step ----------------------------------------------------------------------------------------
    def step(self, step: TraceStep) -> list[TraceDivergence]:
        """Run one step and return its divergences (also kept in ``result``).

        The step runs in ``torch.inference_mode``: nothing in a replay needs autograd, and without its
        dispatch layers (and version counters of the tensors a step makes) the small ops of a step cost a
        fifth less (issue 33). The pools keep being ordinary tensors, written in place."""
        with torch.inference_mode():
            return self._step(step)

    def _step(self, step: TraceStep) -> list[TraceDivergence]:
        mark = self._mark
        self.verified_intermediates, self._ran, self.read_columns, self._unpadded = None, None, {}, None
        ctx = self._context(step)
        mark("prefix")
        found: list[TraceDivergence] = self.book.evict(ctx)  # first: admissions may take the freed slots
        mark(None)
        try:
            self._admit(step)
        except (WorkbenchError, ValueError) as e:
            raise TraceInputError(f"step {step.step}: {e}") from e
        mark("prefix")
        # hits, copies before the forward and moves: the step's batch is laid out on the slots they leave (a
        # move also resets vLLM's accepted count, which the verify reads)
        found += self.book.before(ctx)
        found += self._check_slots(step)
        found += self.book.written(ctx)  # a running request's forward onto the checkpoint it published
        miscounted = self._check_tokens(step)
        found += miscounted
        mark(None)
        if not any(d.field == "seq_len" for d in miscounted):  # else no batch can be built from the rows
            found += self._build_and_run(step)
        batch, inputs, before, taken = self._ran if self._ran is not None else (None, None, None, None)
        ctx = ctx.after_forward(
            batch=batch, inputs=inputs, before=before, taken=taken, read_columns=self.read_columns,
            verified=self.verified_intermediates,
        )  # fmt: skip
        mark("prefix")
        self.book.remember(step, self.trace.header.accepted)
        found += self.book.after(ctx)  # copies after the forward, checkpoints published and verified
        self.ledger.advance(step)
        self._finish(ctx)
        mark(None)
        self.result.steps += 1
        self.result.hits, self.result.checkpoints, self.result.verified = (
            self.book.hits,
            self.book.published,
            self.book.verified,
        )
        self.result.divergences += found[: max(0, self.max_divergences - len(self.result.divergences))]
        return found

    def _context(self, step: TraceStep) -> StepContext:
        """The step as its checkers see it, before its forward."""
        return StepContext(
            step=step, pool=self.pool, state=self.runner.state, shadow=self.shadow, layer=self.runner.layer,
            reference=self.ref, draft_tokens=self.trace.header.draft_tokens, live=self.live, accepted=self.accepted,
            accepted_unit=self.trace.header.accepted, topk=self.trace.header.topk,
        )  # fmt: skip

    def _check_tokens(self, step: TraceStep) -> list[TraceDivergence]:
        return [
            TraceDivergence(
                step.step, "tokens", m.field, m.detail, request=m.request, row=m.row, expected=m.expected, got=m.got
            )
            for m in self.ledger.check(step)
        ]

    def _build_and_run(self, step: TraceStep) -> list[TraceDivergence]:
        h = self.trace.header
        if step.splits and _TRACK_KEYS & set(step.metadata or {}):
            keys = sorted(_TRACK_KEYS & set(step.metadata or {}))
            raise TraceInputError(
                f"step {step.step}: sglang's track fields ({', '.join(keys)}) in a mixed step with verify rows: sglang "
                "runs no verify rows in a mixed step, and the replay tracks none there"
            )
        problem = tree_step_problem(step, h)  # what the reader refuses, for a trace built in Python
        if problem is not None:
            where, expected, got = problem
            raise TraceInputError(f"step {step.step}: {where}: expected {expected}, got {got}")
        try:
            known = self.accepted if self.carries_accepted else None
            parts = to_batches(step, self.profile, h.draft_tokens, num_accepted=known, accepted=h.accepted, topk=h.topk)
        except (WorkbenchError, ValueError) as e:
            raise TraceInputError(f"step {step.step}: {e}") from e
        if self.carries_accepted:  # vLLM's verify reads the slot of the last accepted draft
            self.read_columns = {
                r.id: self.accepted.get(r.id, 1) - 1
                for part, _ in parts
                if part.mode == "target_verify"
                for r in part.rows
            }
        found: list[TraceDivergence] = []
        self._mark("metadata")
        if step.metadata is not None and any(k in step.metadata for k in CHECKED_KEYS):
            found += self._check_recorded(step, parts)
        self._mark(None)
        try:
            found += self._forward(step, parts)
        except (WorkbenchError, RuntimeError, ValueError, TypeError) as e:
            found.append(TraceDivergence(step.step, "error", step.mode, f"{type(e).__name__}: {e}"))
        self._mark(None)
        return found

    def _forward(self, step: TraceStep, parts: _Parts) -> list[TraceDivergence]:
        """Run the step's batches (two, eagerly, for a mixed step with verify rows), count it once, and keep
        what its metadata was (``record``)."""
        found: list[TraceDivergence] = []
        hows: list[str] = []
        used: list[dict[str, Any] | None] = []
        for index, (part, batch) in enumerate(parts):
            got, how, meta = self._run(step, part, batch, index, eager=len(parts) > 1)
            found += got
            hows.append(how)
            used.append(meta)
        if "idle" in hows:
            self.result.idle_steps += 1
        elif hows == ["graph"]:
            self.result.graph_steps += 1
        else:
            self.result.eager_steps += 1
        if self.record:
            self.used[step.step] = _as_used(step, parts, used)
        return found

    def _admit(self, step: TraceStep) -> None:
        rows = {r.id: r for r in step.rows}
        for rid in step.admit:
            if rid in self.live:
                raise TraceInputError(f"admit: request {rid} is already live")
            row = rows.get(rid)
            if row is None:
                raise TraceInputError(f"admit: request {rid} has no row in the step that admits it")
            if self.pool.slots_per_request == 1 or row.slots is not None:
                self.pool.alloc_at(row.req_pool_index, list(row.slots or [row.slot]))
            else:  # vLLM verify: D slots, the trace names the first; they are placed as the pool places them
                got = int(self.pool.alloc(1)[0])
                if got != row.req_pool_index or int(self.pool.mapping[got, 0]) != row.slot:
                    raise TraceInputError(
                        f"admit: request {rid} at row {row.req_pool_index} slot {row.slot}: a pool of D slots per "
                        f"request places it at row {got} slot {int(self.pool.mapping[got, 0])}"
                    )
            self.live[rid] = row.req_pool_index
            slots = self.pool.slots_of(row.req_pool_index)
            for slot in slots:
                self.tenants.setdefault(slot, []).append(rid)
            if self.zero_on_alloc:  # the allocator's fix of vLLM PR 56524: a new tenant finds zeros
                for pool in (*self.runner.state.tensors().values(), *self.shadow.tensors().values()):
                    pool[slots] = 0
        for row in step.rows:
            if self.live.get(row.id) != row.req_pool_index:
                raise TraceInputError(f"rows: request {row.id} is not live at row {row.req_pool_index}")

    def _check_slots(self, step: TraceStep) -> list[TraceDivergence]:
        """Rows that name all their slots (``slots``) name those the request owns after the step's moves."""
        out: list[TraceDivergence] = []
        for i, row in enumerate(step.rows):
            if row.slots is None or row.id not in self.live:
                continue
            have = self.pool.slots_of(self.live[row.id])
            if list(row.slots) != have:
                detail = f"rows[{i}].slots = {list(row.slots)}, but after the step's moves the request owns {have}"
                out.append(TraceDivergence(step.step, "prefix", "slots", detail, request=row.id, row=i))
        return out

    def owner(self, slot: int) -> int | None:
        """The live request that owns ``slot`` now (None: no live request does)."""
        return next((rid for rid, row in self.live.items() if slot in self.pool.slots_of(row)), None)

    def previous_tenant(self, slot: int, request: int) -> int | None:
        """The request that held ``slot`` before ``request`` was admitted to it (None: it was the first)."""
        held = self.tenants.get(slot, [])
        at = held.index(request) if request in held else len(held)
        return held[at - 1] if at > 0 else None

    def _finish(self, ctx: StepContext) -> None:
        for rid in ctx.step.finish:
            self.accepted.pop(rid, None)
            if rid in self.live:
                self.book.finish(ctx, rid, self.live.pop(rid))  # a published own slot is donated, else freed

    # -- checks -----------------------------------------------------------------------------------------
    def _check_recorded(self, step: TraceStep, parts: _Parts) -> list[TraceDivergence]:
        """The recorded metadata against what the profile builds for the step: each recorded field (and the
        profile's invariants on them), the bucket, vLLM's split keys (a mixed step with verify rows: each
        part's under its names, the step's ``query_start_loc`` over all rows) and the row counts by kind."""
        rec = step.metadata or {}
        if step.splits:
            return self._check_split(step, parts, rec)
        ((_, batch),) = parts
        pairs: list[tuple[str, str | None]] = [(name, name) for name in RECORDED_FIELDS]
        pairs.append(("num_accepted_tokens", "num_accepted_tokens"))
        if batch.mode != "idle":  # vLLM's dummy run is a one-token request: its split keys are not the rows'
            ours, other = ("spec", "non_spec") if batch.mode == "target_verify" else ("non_spec", "spec")
            pairs += [(f"{ours}_state_indices_tensor", "state_indices"), (f"{ours}_query_start_loc", "query_start_loc")]
            pairs += [(f"{other}_state_indices_tensor", None), (f"{other}_query_start_loc", None)]
        return self._check_part(step, batch, rec, pairs, rec.get("bucket")) + _check_counts(step, rec)

    def _check_split(self, step: TraceStep, parts: _Parts, rec: dict[str, Any]) -> list[TraceDivergence]:
        """A mixed step with verify rows: eager (no bucket); its verify rows' build against the ``spec_*`` keys
        and ``num_accepted_tokens``, the other rows' against the ``non_spec_*`` keys and ``has_initial_state``
        (vLLM's builder keeps it for those rows only), ``query_start_loc`` over all rows in row order."""
        out: list[TraceDivergence] = []
        if rec.get("bucket") is not None:
            detail = "a mixed step with verify rows runs eagerly: no bucket"
            out.append(TraceDivergence(step.step, "metadata", "bucket", detail, expected="null", got=rec["bucket"]))
        (_, verify), *others = parts
        spec: list[tuple[str, str | None]] = [
            ("spec_state_indices_tensor", "state_indices"), ("spec_query_start_loc", "query_start_loc"),
            ("num_accepted_tokens", "num_accepted_tokens"),
        ]  # fmt: skip
        out += self._check_part(step, verify, rec, spec, None)
        rest: list[tuple[str, str | None]] = [
            ("non_spec_state_indices_tensor", None),
            ("non_spec_query_start_loc", None),
        ]
        if others:
            rest = [
                ("non_spec_state_indices_tensor", "state_indices"), ("non_spec_query_start_loc", "query_start_loc"),
                ("has_initial_state", "has_initial_state"),
            ]  # fmt: skip
        out += self._check_part(step, others[0][1] if others else verify, rec, rest, None)
        if "query_start_loc" in rec:
            offsets = [0]
            for r in step.rows:
                offsets.append(offsets[-1] + r.new_tokens)
            d = _first_row_difference(torch.tensor(offsets), torch.tensor(rec["query_start_loc"]))
            if d is not None:
                detail = "the recorded value is not the offsets of the step's rows in row order"
                out.append(
                    TraceDivergence(step.step, "metadata", "query_start_loc", detail, row=d[0], expected=d[1], got=d[2])
                )
        return out + _check_counts(step, rec)

    def _check_part(
        self, step: TraceStep, batch: Batch, rec: dict[str, Any], pairs: list[tuple[str, str | None]], bucket: Any
    ) -> list[TraceDivergence]:
        """Each recorded key of ``pairs`` (recorded key, the built field it holds; None: the profile builds
        none for this step, so only null matches) against ``batch``'s metadata built at ``bucket``; the
        recorded values under the profile's invariants too."""
        mode = batch.mode
        captured = mode in ("decode", "target_verify", "idle")
        graph_mode = "decode" if mode == "idle" else mode
        buckets = self.runner.buckets(graph_mode) if captured and graph_mode in self.runner.modes else None
        try:
            built = build_metadata(batch, self.pool, bucket=bucket, buckets=buckets)
        except WorkbenchError as e:
            return [TraceDivergence(step.step, "metadata", "bucket", str(e), expected=None, got=bucket)]
        if bucket is None:  # what the shadow builds too (nothing between here and its forward changes the pool)
            self._unpadded = (batch, built)
        recorded = built  # cloned at the first recorded value that is not the built one
        out: list[TraceDivergence] = []
        compared: list[tuple[str, str, torch.Tensor | None]] = []  # None: recorded as built, nothing to compare
        for key, name in pairs:
            value = rec.get(key)
            if key not in rec or (value is None and key in NULL_IS_UNRECORDED):
                continue
            want = getattr(built, name) if name is not None else None
            if name is None or value is None or want is None:
                if value is not None or want is not None:
                    out.append(_null_difference(step, key, want, value))
                continue
            taken = any(n == name for _, n, _ in compared)
            if value == want.tolist():  # the usual case: equal lists make an equal tensor, so no tensor is made
                compared.append((key, name, None))
                continue
            try:
                got = torch.tensor(value, dtype=want.dtype)
            except (TypeError, ValueError, RuntimeError) as e:
                out.append(TraceDivergence(step.step, "metadata", key, f"not a tensor of {want.dtype}: {e}"))
                continue
            if not taken:
                if recorded is built:
                    recorded = built.clone()
                setattr(recorded, name, got)
            compared.append((key, name, got))
        try:
            validate(recorded, self.pool)
        except MetadataError as e:  # named by the recorded key that holds the field
            key = next((k for k, n, _ in compared if n == e.field), e.field or "metadata")
            out.append(TraceDivergence(step.step, "invariant", key, str(e), row=e.row))
        for key, name, given in compared:
            d = None if given is None else _first_row_difference(getattr(built, name), given)
            if d is not None:
                assert given is not None
                row, want, value = d
                slot = _slot_of(given, row) if name == "state_indices" else None
                out.append(
                    TraceDivergence(
                        step.step, "metadata", key, "the recorded value is not what the profile builds for this step",
                        request=self._request_at(batch, row), row=row, slot=slot, expected=want, got=value,
                    )
                )  # fmt: skip
                break
        return out

    def _request_at(self, batch: Batch, row: int | None) -> int | None:
        if row is None or row >= batch.raw_batch_size:
            return None
        rpi = int(batch.req_pool_indices[row])
        return next((rid for rid, r in self.live.items() if r == rpi), None)

    def _run(
        self, step: TraceStep, part: TraceStep, batch: Batch, index: int, eager: bool
    ) -> tuple[list[TraceDivergence], str, dict[str, Any] | None]:
        """One batch of ``step`` (``part``: its rows; ``index``: which of the step's batches), through its graph
        or eagerly (``eager``: a mixed step's two batches), beside the shadow; its divergences, how it ran
        (``"graph"``, ``"eager"``, ``"idle"``) and, with ``record``, its metadata as used."""
        r = self.runner
        self._mark("replay")
        n = _tokens(batch)
        x = self._inputs(step, part, n, index)
        before = r.state.clone()
        # the inputs and states before the step, and the states the references pass at the tracked positions:
        # the prefix cache's stand-in for the kernel's chunk states (tracking.chunk_state)
        tracks = "mamba_chunk_size" in (step.metadata or {})
        wanted = chunk_positions(step) if tracks else {}
        taken = (Snapshots(wanted), Snapshots(wanted))
        self._ran = (batch, x, (before, self.shadow.clone()) if tracks else (before, self.shadow), taken)
        graph_mode = "decode" if batch.mode == "idle" else batch.mode
        with _taking(taken[0]):
            if not eager and batch.mode in GRAPH_STEP_MODES and graph_mode in r.modes:
                res = r.replay(batch, x)
                how = "idle" if batch.mode == "idle" else "graph" if res.replayed else "eager"
                padded = r.graph(r.meta_backend.graph_mode_of(batch), res.bucket).outputs[n:] if res.replayed else None
            else:
                res = r.eager(batch, x)
                how, padded = "eager", None
        used = _used_metadata(r.last_metadata, res.bucket if res.replayed else None) if self.record else None
        out = res.output[:n].clone()
        self._mark("reference")
        # the shadow: the float64 recurrence from the trace's own history, unpadded
        unpadded = self._unpadded
        meta = (
            unpadded[1]
            if unpadded is not None and unpadded[0] is batch
            else build_metadata(batch, self.pool, bucket=None)
        )
        inter = (
            self.ref.new_intermediate(batch.raw_batch_size, r.draft_tokens, torch.float64)
            if batch.mode == "target_verify"
            else None
        )
        with _taking(taken[1]):
            ref_out = self.ref.forward(x.double(), meta, self.shadow, inter) if n else out.double()
        self._mark("check")
        found = self._compare(step, batch, meta, before, ref_out, out, padded)
        if batch.mode == "target_verify":
            found += self._accept(step, part, batch, meta, inter)
        self._mark(None)
        return found, how, used

    def _inputs(self, step: TraceStep, part: TraceStep, n: int, index: int) -> torch.Tensor:
        """The batch's ``n`` input tokens: drawn from the step's seed, and each row with token ids fed their
        embedding instead (a shared prefix, the same inputs)."""
        r = self.runner
        rows = part.rows
        if rows and all(row.tokens is not None and len(row.tokens) == row.new_tokens for row in rows):
            ids = [t for row in rows for t in row.tokens or ()]
            if len(ids) == n:  # every token embedded: the draw would be overwritten whole, so none is made
                return embed_tokens(self.book.table, ids).to(r.layer.dtype)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step.step + 500_009 * index)
        x = torch.randn(n, r.layer.config.hidden_size, generator=g).to(r.layer.dtype)
        at = 0
        for row in rows:  # rows with token ids feed their embedding: a shared prefix, the same inputs
            if row.tokens is not None:
                x[at : at + row.new_tokens] = embed_tokens(self.book.table, list(row.tokens))
            at += row.new_tokens
        return x

    def _accept(
        self, step: TraceStep, part: TraceStep, batch: Batch, meta: Metadata, inter: Intermediate | None
    ) -> list[TraceDivergence]:
        """Commit each verify row's accepted drafts (``part``: the verify rows; their ``accepted`` read in the
        header's unit): sglang scatters the accepted step's state back (runner and shadow alike); vLLM keeps one
        slot per draft and carries the count to the request's next verify."""
        by_row = {r.req_pool_index: r for r in part.rows}
        unit = self.trace.header.accepted
        acc = [by_row[int(p)].kept(unit) for p in batch.req_pool_indices.tolist()]
        if self.carries_accepted:
            for p, a in zip(batch.req_pool_indices.tolist(), acc, strict=True):
                self.accepted[by_row[int(p)].id] = a
            return []
        if not acc:
            return []
        counts = torch.tensor(acc, dtype=torch.int32)
        assert inter is not None  # a verify batch's reference buffers
        found: list[TraceDivergence] = []
        md = step.metadata or {}
        trees = self.trace.header.topk > 1 or any(md.get(k) is not None for k in TREE_KEYS)
        if trees:  # each row commits its accepted path's last node (a chain's: its kept - 1)
            paths = accepted_paths(step, unit)
            ends = [paths[by_row[int(p)].id][-1] for p in batch.req_pool_indices.tolist()]
            engine = md.get("last_correct_step_indices")
            if engine is not None:  # the runner commits what the engine committed; a node off the path diverges
                engine = [int(v) for v in engine]
                found += _commit_differences(step, part, paths, engine)
                self.runner.accept(counts, accepted_steps=engine)
            else:  # as sglang reads it: accept_index[b, accept_len - 1] - b * D
                d = self.trace.header.draft_tokens
                index = [[b * d + n for n in paths[r.id]] for b, r in enumerate(part.rows)]
                self.runner.accept(counts, accept_index=[g + [-1] * (d - len(g)) for g in index])
            self.ref.accept(self.shadow, inter, meta, counts, accepted_steps=torch.tensor(ends, dtype=torch.int32))
        else:
            self.runner.accept(counts)
            self.ref.accept(self.shadow, inter, meta, counts)
        assert self.runner.last_intermediate is not None
        rows = [int(p) for p in batch.req_pool_indices.tolist()]
        self.verified_intermediates = VerifiedIntermediates(rows, self.runner.last_intermediate, inter)
        k = _first_off_row(self.runner.state, self.shadow, meta)
        if k is not None:
            found.append(
                TraceDivergence(
                    step.step,
                    "state",
                    "accept",
                    "the accepted state is off its float64 recurrence",
                    request=by_row[int(batch.req_pool_indices[k])].id,
                    row=k,
                )
            )
        return found

    def _compare(
        self,
        step: TraceStep,
        batch: Batch,
        meta: Metadata,
        before: Any,
        ref_out: torch.Tensor,
        out: torch.Tensor,
        padded: torch.Tensor | None,
    ) -> list[TraceDivergence]:
        dummy = self.pool.profile.dummy_slot
        live = sorted({int(s) for s in meta.state_indices.flatten().tolist()})
        # compare the runner's new state with the shadow's on the live slots; every other slot unchanged
        report = integrity_check(
            before.tensors(),
            self.runner.state.tensors(),
            allowed_slots=set(live) | {dummy},
            live_slots=live,
            reference_state=self.shadow.tensors(),
            live_outputs=out,
            reference_outputs=ref_out,
            padded_outputs=padded,
            padded_offset=out.shape[0],
        )
        if report.ok:
            return []
        rows = {
            int(s): k
            for k, s in enumerate(meta.state_indices[:, 0] if meta.state_indices.dim() == 2 else meta.state_indices)
        }
        out_list: list[TraceDivergence] = []
        for name, tensor, slot, where, error in islice(_report_problems(report), 3):  # the first three
            kind, what = REPORT_PROBLEMS[name]
            row = rows.get(slot) if slot is not None else None
            detail = what if slot is not None else f"{what} ({where})"
            if kind == "foreign" and slot is not None:
                detail += self._foreign(slot)
            out_list.append(
                TraceDivergence(
                    step.step, kind, tensor, detail,
                    request=self._request_at(batch, row), row=row, slot=slot, got=error,
                )
            )  # fmt: skip
        return out_list

    def _foreign(self, slot: int) -> str:
        """Whose ``slot`` is, which changed though no row of the step owns it."""
        held_by, cp = self.owner(slot), self.book.is_live(slot)
        if held_by is not None:
            return f": the slot of request {held_by}, which is not in this step"
        if cp is not None:
            return f": the checkpoint of request {cp.request}'s first {len(cp.tokens)} tokens"
        return ": a slot no live request owns"

    def recorded_trace(self) -> Trace:
        """The trace with each replayed step's metadata as the step used it (``record=True``; steps not
        replayed, or replayed without it, as they were). A step that already records any compared key
        (``CHECKED_KEYS``: an engine's dump) stays as it is: its keys describe one run (an eager CPU run's
        unpadded ``query_start_loc``), and mixing in the replay's (a captured bucket's padded rows) would make
        a record no run used. Other steps keep their prefix keys and gain the rest (:func:`_as_used`)."""
        steps = []
        for s in self.trace.steps:
            used = self.used.get(s.step)
            if used is None or any(k in (s.metadata or {}) for k in CHECKED_KEYS):
                steps.append(s)
                continue
            md = dict(s.metadata or {})
            for key, value in used.items():
                md.setdefault(key, value)
            steps.append(replace(s, metadata=md))
        return Trace(self.trace.header, steps)

    # -- all --------------------------------------------------------------------------------------------
    def run(self, progress: Callable[[int, int], None] | None = None, stop_at_first: bool = True) -> TraceResult:
        """Replay every step (``progress(done, total)`` after each); stop at the first divergence unless told."""
        total = len(self.trace.steps)
        for i, step in enumerate(self.trace.steps):
            found = self.step(step)
            if progress is not None:
                progress(i + 1, total)
            if found and stop_at_first:
                break
        return self.result


def replay_trace(
    trace: Trace,
    *,
    backend: str = "cpu",
    seed: int = 0,
    stop_at_first: bool = True,
    progress: Callable[[int, int], None] | None = None,
    metadata_backend: type[MetadataBackend] | None = None,
    zero_on_alloc: bool | None = None,
    timer: PhaseTimer | None = None,
    record: bool = False,
) -> TraceResult:
    """Replay ``trace`` through the graph runner with the float64 shadow; see the module.

    ``metadata_backend``: a :class:`~workbench.backends.MetadataBackend` subclass to run the steps with
    (yours, or an engine's through :func:`workbench.engines.subject.engine_backend`); ``zero_on_alloc``: see
    :class:`TraceReplayer`. The steps are timed by phase (``timer``, a new :class:`PhaseTimer` if not given).
    ``record``: the result's ``recorded`` is the trace with each step's metadata as used
    (:meth:`TraceReplayer.recorded_trace`)."""
    replayer = TraceReplayer(
        trace, backend=backend, seed=seed, metadata_backend=metadata_backend, zero_on_alloc=zero_on_alloc,
        timer=timer if timer is not None else PhaseTimer(), record=record,
    )  # fmt: skip
    result = replayer.run(progress, stop_at_first)
    if record:
        result.recorded = replayer.recorded_trace()
    return result


def _replayed_buckets(trace: Trace, runner: GraphRunner) -> list[tuple[str, int]]:
    """The ``(graph mode, bucket)`` pairs ``trace``'s graph steps run in (an idle step: the decode graph's
    smallest), as :meth:`TraceReplayer._run` picks them; a step that ends up eager only costs a capture."""
    pairs: set[tuple[str, int]] = set()
    for s in trace.steps:
        if s.mode not in GRAPH_STEP_MODES:
            continue
        mode = "decode" if s.mode == "idle" else s.mode
        if mode not in runner.modes:
            continue
        bs = runner.meta_backend.buffers[mode].bucket_for(0 if s.mode == "idle" else len(s.rows))
        if bs is not None:
            pairs.add((mode, bs))
    return sorted(pairs)


def _used_metadata(meta: Metadata | None, bucket: int | None) -> dict[str, Any] | None:
    """What a batch's metadata was as the runner used it (read now: a graph's buffers are rewritten by the
    next replay): its bucket (None: eager), ``state_indices``, ``query_start_loc`` and, where the profile
    builds it, ``num_accepted_tokens``."""
    if meta is None:
        return None
    used: dict[str, Any] = {
        "bucket": bucket,
        "state_indices": meta.state_indices.tolist(),
        "query_start_loc": meta.query_start_loc.tolist(),
    }
    if meta.num_accepted_tokens is not None:
        used["num_accepted_tokens"] = meta.num_accepted_tokens.tolist()
    return used


def _as_used(step: TraceStep, parts: _Parts, used: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The step's metadata as used: its one batch's (:func:`_used_metadata`), or a mixed step's with verify
    rows under vLLM's names: no bucket, ``query_start_loc`` over all rows, the verify rows' ``spec_*`` keys and
    ``num_accepted_tokens``, the others' ``non_spec_*`` keys (null without such rows), the row counts."""
    if len(parts) == 1:
        return used[0] or {}
    spec, rest = used[0] or {}, (used[1] if len(used) > 1 else None) or {}
    offsets = [0]
    for r in step.rows:
        offsets.append(offsets[-1] + r.new_tokens)
    kinds = step.kinds
    out: dict[str, Any] = {
        "bucket": None,
        "query_start_loc": offsets,
        "spec_state_indices_tensor": spec.get("state_indices"),
        "non_spec_state_indices_tensor": rest.get("state_indices"),
        "spec_query_start_loc": spec.get("query_start_loc"),
        "non_spec_query_start_loc": rest.get("query_start_loc"),
        "num_spec_decodes": kinds.count("verify"),
        "num_decodes": kinds.count("decode"),
        "num_prefills": kinds.count("extend"),
    }
    if "num_accepted_tokens" in spec:
        out["num_accepted_tokens"] = spec["num_accepted_tokens"]
    return out


def _commit_differences(
    step: TraceStep, part: TraceStep, paths: dict[int, tuple[int, ...]], engine: list[int]
) -> list[TraceDivergence]:
    """The engine's ``last_correct_step_indices`` (``engine``, one node per verify row of ``part``) against the
    last node of each row's accepted path: a row that committed another node's state is a divergence (field
    ``accept``), the depth read as a node (sglang PR 27463) named as such."""
    out: list[TraceDivergence] = []
    at = {r.id: i for i, r in enumerate(step.rows)}
    for b, row in enumerate(part.rows):
        path = list(paths[row.id])
        if engine[b] == path[-1]:
            continue
        why = (
            "the depth read as a node: sglang PR 27463"
            if engine[b] == len(path) - 1
            else f"the state of node {engine[b]}, which is not the path's end"
        )
        detail = (
            f"row {at[row.id]}: last_correct_step_indices = {engine[b]}, but its accepted path {path} ends at node "
            f"{path[-1]} ({why})"
        )
        out.append(
            TraceDivergence(
                step.step, "metadata", "accept", detail, request=row.id, row=at[row.id], expected=path[-1],
                got=engine[b],
            )
        )  # fmt: skip
    return out


def _check_counts(step: TraceStep, rec: dict[str, Any]) -> list[TraceDivergence]:
    """vLLM's row counts (``num_spec_decodes``, ``num_decodes``, ``num_prefills``) against the step's rows by
    kind (verify, decode, extend); an idle step (vLLM's dummy run) is not compared."""
    if step.mode == "idle":
        return []
    kinds = step.kinds
    out: list[TraceDivergence] = []
    for key, kind in (("num_spec_decodes", "verify"), ("num_decodes", "decode"), ("num_prefills", "extend")):
        want = kinds.count(kind)
        if key in rec and rec[key] is not None and rec[key] != want:
            detail = f"the step has {want} {kind} row{'s' * (want != 1)}"
            out.append(TraceDivergence(step.step, "metadata", key, detail, expected=want, got=rec[key]))
    return out


def _null_difference(step: TraceStep, key: str, want: torch.Tensor | None, value: Any) -> TraceDivergence:
    """A recorded null where the profile builds a tensor, or a recorded value where it builds none."""
    if value is None:
        assert want is not None
        detail = "recorded null, but the profile builds it for this step"
        return TraceDivergence(step.step, "metadata", key, detail, expected=want.tolist(), got="null")
    detail = "recorded, but the profile builds none for this step (null)"
    return TraceDivergence(step.step, "metadata", key, detail, expected="null", got=value)


def _taking(snaps: Snapshots) -> AbstractContextManager[Any]:
    """``take_states(snaps)`` when it asks for a state; else no context (and no cost)."""
    return take_states(snaps) if snaps.wanted else nullcontext()


def _tokens(batch: Batch) -> int:
    if batch.mode == "idle":
        return 0
    if batch.extend_lens is not None:
        return int(batch.extend_lens.sum())
    return batch.raw_batch_size * (batch.draft_tokens if batch.mode == "target_verify" else 1)


def _first_off_row(state: Any, shadow: Any, meta: Metadata) -> int | None:
    """The first row whose recurrent state (at its first slot) is not ``allclose`` to the shadow's (cast to the
    state's dtype, ``FLOAT32_TOLERANCE``), or None: one test for all rows, as ``torch.allclose`` row by row
    (``isclose(...).all()``) would give, and the row looked for only when that test fails."""
    idx = meta.state_indices if meta.state_indices.dim() == 1 else meta.state_indices[:, 0]
    if not idx.numel():
        return None
    slots = idx.long()
    got = state.ssm.index_select(0, slots)
    want = cast(shadow.ssm.index_select(0, slots), got.dtype)
    tol = FLOAT32_TOLERANCE
    if torch.allclose(got, want, atol=tol.atol, rtol=tol.rtol):
        return None
    close = torch.isclose(got, want, atol=tol.atol, rtol=tol.rtol).reshape(len(slots), -1).all(dim=1)
    return int((~close).nonzero()[0, 0])


def _first_row_difference(want: torch.Tensor, got: torch.Tensor) -> tuple[int | None, Any, Any] | None:
    if want.shape != got.shape:
        return None, list(want.shape), list(got.shape)
    if torch.equal(want, got):
        return None
    bad = (want != got).reshape(want.shape[0], -1).any(dim=1) if want.dim() else torch.tensor([True])
    row = int(bad.nonzero()[0, 0])
    return row, want[row].tolist(), got[row].tolist()


def _slot_of(indices: torch.Tensor, row: int | None) -> int | None:
    """The (first) slot row ``row`` of recorded state indices names, or None."""
    if row is None or indices.dim() == 0 or row >= indices.shape[0]:
        return None
    return int(indices[row].flatten()[0])


def _report_problems(report: IntegrityReport) -> Iterator[tuple[str, str, int | None, str, float | None]]:
    """Every problem of ``report`` as ``(its list, tensor, slot, where, error)``, in the report's order: a slot
    for a pool slot's problem (else None), ``where`` the row or token otherwise."""
    for c in report.changed_slots:
        yield "changed_slots", c.tensor, c.slot, f"slot {c.slot}", None
    for m in report.state_mismatches:
        yield "state_mismatches", m.tensor, m.slot, f"slot {m.slot}", m.error
    for r in report.intermediate_mismatches:
        yield "intermediate_mismatches", r.tensor, None, f"row {r.row}", r.error
    for o in report.output_mismatches:
        yield "output_mismatches", "output", None, f"token {o.token}", o.error
    for t in report.nonzero_padded_outputs:
        yield "nonzero_padded_outputs", "output", None, f"token {t}", None


__all__ = [
    "DIVERGENCE_KINDS",
    "GRAPH_STEP_MODES",
    "PHASES",
    "RECORDED_FIELDS",
    "REPORT_PROBLEMS",
    "PhaseTimer",
    "TraceDivergence",
    "TraceInputError",
    "TraceReplayer",
    "TraceResult",
    "make_layer",
    "replay_trace",
]
