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

Each step hands its prefix-cache and track checks a :class:`~workbench.traces.context.StepContext`
(:mod:`~workbench.traces.checkpoints`, :mod:`~workbench.traces.tracking`); they never see the replayer.
The replay times nothing itself: a :class:`PhaseTimer` given as ``timer`` is told as each phase of a step
starts (:func:`replay_trace` gives one, so ``TraceResult.seconds`` is filled; ``workbench bench trace``
keeps each forward's split).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

import torch

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
from workbench.traces.model import Trace, TraceHeader, TraceStep, engine_note
from workbench.traces.steps import new_pool, to_batch

RECORDED_FIELDS = ("state_indices", "query_start_loc", "seq_lens", "req_pool_indices", "has_initial_state")
GRAPH_STEP_MODES = ("decode", "target_verify", "idle")


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


def make_layer(name: str) -> Any:
    """The small layer of ``name`` (seed 0): what the trace's steps run (``workbench.layers.make_layer``); an
    unknown name is a ``TraceInputError`` naming the registry's choices."""
    try:
        return make_registered_layer(name)
    except LayerError as e:
        raise TraceInputError(str(e)) from None


class TraceReplayer:
    """Replays a trace step by step (:meth:`step`), or all of it (:meth:`run`); see the module.

    ``metadata_backend``: the :class:`~workbench.backends.MetadataBackend` subclass the runner prepares each
    step with (default: the device family's). ``zero_on_alloc``: zero a slot's state when a request is
    admitted to it, as an allocator that zeroes on (re)allocation does; by default a new tenant finds its
    slot as the previous one left it (vLLM 0.33.0's block pool does not zero mamba blocks), so a read of a
    slot before the tenant's first write shows. ``timer``: a :class:`PhaseTimer` told of each phase of each
    step (its ``seconds`` become the result's); without one the replay reads no clock.
    """

    def __init__(
        self,
        trace: Trace,
        *,
        backend: str = "cpu",
        seed: int = 0,
        max_divergences: int = 20,
        metadata_backend: type[MetadataBackend] | None = None,
        zero_on_alloc: bool = False,
        timer: PhaseTimer | None = None,
    ) -> None:
        h = trace.header
        self.trace, self.seed, self.max_divergences = trace, seed, max_divergences
        self.zero_on_alloc = zero_on_alloc
        self.result = TraceResult(h)
        self.timer = timer
        self._mark: Callable[[str | None], None] = _untimed if timer is None else timer
        if timer is not None:
            self.result.seconds = timer.seconds
        layer = make_layer(h.layer)
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
        )
        self.pool = pool
        self.runner.capture(progress=False)
        self.ref = float64_reference(layer)
        self.shadow = self.runner.state.to(torch.float64)  # advanced by the reference only
        self.live: dict[int, int] = {}  # request id -> request-pool row
        self.tenants: dict[int, list[int]] = {}  # slot -> request ids that held it, in order
        self.accepted: dict[int, int] = {}  # vLLM: request id -> tokens accepted at its last verify
        self.read_columns: dict[int, int] = {}  # vLLM verify: request id -> the column of its slots it read
        # the step's batch, inputs and states before it (the prefix cache's stand-in for the kernel's chunk
        # states); None until its forward runs
        self._ran: tuple[Batch, torch.Tensor, tuple[LayerState, LayerState]] | None = None
        # the step's verify rows (request-pool rows, in batch order) with the runner's and the float64
        # reference's intermediate states, for sglang's tracking at commit; None after other steps
        self.verified_intermediates: VerifiedIntermediates | None = None
        self.profile = h.profile
        # vLLM: a verify commits by count (one slot per draft, the count read at the next verify); sglang
        # scatters the accepted step's state back
        self.carries_accepted = get_profile(h.profile).num_accepted_fill is not None
        self.book = CheckpointBook(layer, self.ref, pool.profile)  # prefix-cache work: checkpoints, hits, copies
        self.ledger = TokenLedger()  # each live request's token count across steps

    # -- one step ----------------------------------------------------------------------------------------
    def step(self, step: TraceStep) -> list[TraceDivergence]:
        """Run one step and return its divergences (also kept in ``result``)."""
        mark = self._mark
        self.verified_intermediates, self._ran = None, None
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
        miscounted = self._check_tokens(step)
        found += miscounted
        mark(None)
        if not any(d.field == "seq_len" for d in miscounted):  # else no batch can be built from the rows
            found += self._build_and_run(step)
        batch, inputs, before = self._ran if self._ran is not None else (None, None, None)
        ctx = ctx.after_forward(
            batch=batch, inputs=inputs, before=before, read_columns=self.read_columns,
            verified=self.verified_intermediates,
        )  # fmt: skip
        mark("prefix")
        self.book.remember(step)
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
        )  # fmt: skip

    def _check_tokens(self, step: TraceStep) -> list[TraceDivergence]:
        return [
            TraceDivergence(
                step.step, "tokens", m.field, m.detail, request=m.request, row=m.row, expected=m.expected, got=m.got
            )
            for m in self.ledger.check(step)
        ]

    def _build_and_run(self, step: TraceStep) -> list[TraceDivergence]:
        try:
            batch = self._with_accepted(to_batch(step, self.profile, self.trace.header.draft_tokens))
        except (WorkbenchError, ValueError) as e:
            raise TraceInputError(f"step {step.step}: {e}") from e
        found: list[TraceDivergence] = []
        self._mark("metadata")
        if step.metadata is not None and any(k in step.metadata for k in ("bucket", *RECORDED_FIELDS)):
            found += self._check_recorded(step, batch)
        self._mark(None)
        try:
            found += self._run(step, batch)
        except (WorkbenchError, RuntimeError, ValueError, TypeError) as e:
            found.append(TraceDivergence(step.step, "error", step.mode, f"{type(e).__name__}: {e}"))
        self._mark(None)
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

    def _with_accepted(self, batch: Batch) -> Batch:
        """vLLM's verify reads the slot of the last accepted draft: carry each request's count."""
        self.read_columns = {}
        if batch.mode != "target_verify" or not self.carries_accepted:
            return batch
        ids = {row: rid for rid, row in self.live.items()}
        acc = [self.accepted.get(ids[int(r)], 1) for r in batch.req_pool_indices.tolist()]
        self.read_columns = {ids[int(r)]: a - 1 for r, a in zip(batch.req_pool_indices.tolist(), acc, strict=True)}
        return replace(batch, num_accepted_tokens=torch.tensor(acc, dtype=torch.int32))

    # -- checks -----------------------------------------------------------------------------------------
    def _check_recorded(self, step: TraceStep, batch: Batch) -> list[TraceDivergence]:
        rec = dict(step.metadata or {})
        bucket = rec.get("bucket")
        mode = batch.mode
        captured = mode in ("decode", "target_verify", "idle")
        graph_mode = "decode" if mode == "idle" else mode
        buckets = self.runner.buckets(graph_mode) if captured and graph_mode in self.runner.modes else None
        try:
            built = build_metadata(batch, self.pool, bucket=bucket if bucket is not None else None, buckets=buckets)
        except WorkbenchError as e:
            return [TraceDivergence(step.step, "metadata", "bucket", str(e), expected=None, got=bucket)]
        recorded = built.clone()
        out: list[TraceDivergence] = []
        for name in RECORDED_FIELDS:
            if name not in rec:
                continue
            want = getattr(built, name)
            try:
                got = torch.tensor(rec[name], dtype=want.dtype)
            except (TypeError, ValueError, RuntimeError) as e:
                out.append(TraceDivergence(step.step, "metadata", name, f"not a tensor of {want.dtype}: {e}"))
                continue
            setattr(recorded, name, got)
        try:
            validate(recorded, self.pool)
        except MetadataError as e:
            out.append(TraceDivergence(step.step, "invariant", e.field or "metadata", str(e), row=e.row))
        for name in RECORDED_FIELDS:
            if name not in rec:
                continue
            d = _first_row_difference(getattr(built, name), getattr(recorded, name))
            if d is not None:
                row, want, got = d
                slot = _slot_of(recorded, row) if name == "state_indices" else None
                out.append(
                    TraceDivergence(
                        step.step, "metadata", name, "the recorded value is not what the profile builds for this step",
                        request=self._request_at(batch, row), row=row, slot=slot, expected=want, got=got,
                    )
                )  # fmt: skip
                break
        return out

    def _request_at(self, batch: Batch, row: int | None) -> int | None:
        if row is None or row >= batch.raw_batch_size:
            return None
        rpi = int(batch.req_pool_indices[row])
        return next((rid for rid, r in self.live.items() if r == rpi), None)

    def _run(self, step: TraceStep, batch: Batch) -> list[TraceDivergence]:
        r = self.runner
        self._mark("replay")
        n = _tokens(batch)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step.step)
        x = torch.randn(n, r.layer.config.hidden_size, generator=g).to(r.layer.dtype)
        at = 0
        for row in step.rows:  # rows with token ids feed their embedding: a shared prefix, the same inputs
            if row.tokens is not None:
                x[at : at + row.new_tokens] = embed_tokens(self.book.table, list(row.tokens))
            at += row.new_tokens
        before = r.state.clone()
        # the inputs and states before the step: the prefix cache's stand-in for the kernel's chunk states
        self._ran = (
            batch,
            x,
            (before, self.shadow.clone()) if "mamba_chunk_size" in (step.metadata or {}) else (before, self.shadow),
        )
        if batch.mode in GRAPH_STEP_MODES and ("decode" if batch.mode == "idle" else batch.mode) in r.modes:
            res = r.replay(batch, x)
            if batch.mode == "idle":
                self.result.idle_steps += 1
            elif res.replayed:
                self.result.graph_steps += 1
            else:
                self.result.eager_steps += 1
            padded = r.graph(r.meta_backend.graph_mode_of(batch), res.bucket).outputs[n:] if res.replayed else None
        else:
            res = r.eager(batch, x)
            self.result.eager_steps += 1
            padded = None
        out = res.output[:n].clone()
        self._mark("reference")
        # the shadow: the float64 recurrence from the trace's own history, unpadded
        meta = build_metadata(batch, self.pool, bucket=None)
        inter = (
            self.ref.new_intermediate(batch.raw_batch_size, r.draft_tokens, torch.float64)
            if batch.mode == "target_verify"
            else None
        )
        ref_out = self.ref.forward(x.double(), meta, self.shadow, inter) if n else out.double()
        self._mark("check")
        found = self._compare(step, batch, meta, before, ref_out, out, padded)
        if batch.mode == "target_verify":
            found += self._accept(step, batch, meta, inter)
        self._mark(None)
        return found

    def _accept(
        self, step: TraceStep, batch: Batch, meta: Metadata, inter: Intermediate | None
    ) -> list[TraceDivergence]:
        """Commit each verify row's accepted drafts: sglang scatters the accepted step's state back (runner and
        shadow alike); vLLM keeps one slot per draft and carries the count to the request's next verify."""
        by_row = {r.req_pool_index: r for r in step.rows}
        acc = [by_row[int(p)].accepted or 1 for p in batch.req_pool_indices.tolist()]
        if self.carries_accepted:
            for p, a in zip(batch.req_pool_indices.tolist(), acc, strict=True):
                self.accepted[by_row[int(p)].id] = a
            return []
        if not acc:
            return []
        counts = torch.tensor(acc, dtype=torch.int32)
        self.runner.accept(counts)
        assert inter is not None and self.runner.last_intermediate is not None
        rows = [int(p) for p in batch.req_pool_indices.tolist()]
        self.verified_intermediates = VerifiedIntermediates(rows, self.runner.last_intermediate, inter)
        self.ref.accept(self.shadow, inter, meta, counts)
        found: list[TraceDivergence] = []
        tol = FLOAT32_TOLERANCE
        for k, (got, want) in enumerate(_live_pairs(self.runner.state, self.shadow, meta)):
            if not torch.allclose(got, want.to(got.dtype), atol=tol.atol, rtol=tol.rtol):
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
                break
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
    zero_on_alloc: bool = False,
    timer: PhaseTimer | None = None,
) -> TraceResult:
    """Replay ``trace`` through the graph runner with the float64 shadow; see the module.

    ``metadata_backend``: a :class:`~workbench.backends.MetadataBackend` subclass to run the steps with
    (yours, or an engine's through :func:`workbench.engines.subject.engine_backend`); ``zero_on_alloc``: see
    :class:`TraceReplayer`. The steps are timed by phase (``timer``, a new :class:`PhaseTimer` if not given)."""
    replayer = TraceReplayer(
        trace, backend=backend, seed=seed, metadata_backend=metadata_backend, zero_on_alloc=zero_on_alloc,
        timer=timer if timer is not None else PhaseTimer(),
    )  # fmt: skip
    return replayer.run(progress, stop_at_first)


def _tokens(batch: Batch) -> int:
    if batch.mode == "idle":
        return 0
    if batch.extend_lens is not None:
        return int(batch.extend_lens.sum())
    return batch.raw_batch_size * (batch.draft_tokens if batch.mode == "target_verify" else 1)


def _live_pairs(state: Any, shadow: Any, meta: Metadata) -> list[tuple[torch.Tensor, torch.Tensor]]:
    idx = meta.state_indices if meta.state_indices.dim() == 1 else meta.state_indices[:, 0]
    return [(state.ssm[int(s)], shadow.ssm[int(s)]) for s in idx.tolist()]


def _first_row_difference(want: torch.Tensor, got: torch.Tensor) -> tuple[int | None, Any, Any] | None:
    if want.shape != got.shape:
        return None, list(want.shape), list(got.shape)
    if torch.equal(want, got):
        return None
    bad = (want != got).reshape(want.shape[0], -1).any(dim=1) if want.dim() else torch.tensor([True])
    row = int(bad.nonzero()[0, 0])
    return row, want[row].tolist(), got[row].tolist()


def _slot_of(meta: Metadata, row: int | None) -> int | None:
    if row is None or row >= meta.state_indices.shape[0]:
        return None
    value = meta.state_indices[row]
    return int(value.flatten()[0])


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
