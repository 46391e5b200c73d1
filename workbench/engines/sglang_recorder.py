"""How sglang 0.5.23's scheduler state becomes trace steps: :class:`Recorder`, attached to one ``Scheduler``
instance, writes down step by step what one GDN layer saw (``docs/traces.md``) into a
:class:`~workbench.engines.scheduler_base.SchedulerTrace`. The CPU driver
(:mod:`workbench.engines.sglang_scheduler`) records with it, and so does the live dumper
(:mod:`workbench.engines.sglang_dump`); this module imports no sglang code (the names it uses come in as
``sg``).

How sglang's state maps to the trace:

- **slots** are ``MambaPool`` slots as sglang hands them out (``num_slots`` = the pool's size + 1: slot 0 is
  sglang's dummy slot, the profile's); a row's ``slot`` is its request's ``mamba_pool_idx``. Its
  ``req_pool_index`` is sglang's own ``req_pool_idx`` (row 0 reserved there too, stable for the request's
  life). The ping-pong track slots of ``extra_buffer`` are no row's: the trace names them where a track or
  a checkpoint does.
- **rows** in sglang's order (``batch.reqs``), each with its ``kind``: a prefill chunk ``extend``; a verify
  (EAGLE, chain, topk 1) ``verify``, feeding the pending bonus token and the ``D - 1`` drafts on top of
  ``seq_lens``; a one-token ``decode``: a decode step's row without speculation, or a running request a
  ``MIXED`` step appends after the prefill rows (sglang keeps mixed chunk on for EAGLE: the running requests
  then feed their bonus token as one-token extend rows, never tracked). ``accepted`` is sglang's
  ``num_correct_drafts_per_req_cpu`` (drafts, no bonus; header ``"accepted": "drafts"``).
- **prefix keys**: ``hits`` (a request admitted with a matched prefix: its length and the copy-on-write
  source), ``copies_before`` (the copy-on-write pairs, ``mamba_cow_src_indices`` -> ``mamba_cow_dst_indices``),
  ``copies_after`` (what the forward copies into track slots, then ``MambaPool.copy_from`` of a
  ``no_buffer`` insert), ``checkpoints`` (every insert that gives the tree a new mamba value: the request,
  the inserted key's length, the slot), ``evict`` (a published slot the cache gives back to the allocator).
  The cache's work after a forward (result processing, and the next scheduling round, where the chunked
  request's insert and the evictions for new admissions happen; no forward runs in between) is the step's;
  an eviction whose slot no later write of that work reuses is written at the next step, before its
  admissions, as the format orders them.
- **track fields** (``extra_buffer``): an extend or mixed step's ``mamba_track_mask``,
  ``mamba_track_indices``, ``mamba_track_seqlens`` as the batch hands them to the forward (the running tails
  of a mixed step at -1), with ``mamba_chunk_size`` and the final-state copies (``track_ssm_final_src`` /
  ``_dst``, and the same pairs in ``copies_after``); a verify step's ``mamba_track_indices`` as
  ``prepare_mamba_track_for_verify`` rebuilds them inside the forward and ``mamba_steps_to_track`` from
  ``_verify_commit_step_indices`` (a verify batch reaches the forward still carrying the track fields of the
  extend step it was merged from: the forward clears them, so the trace records what it uses, and
  ``stats["verify_stale_track_fields"]`` counts them); without speculation a decode step's mask and indices,
  and ``mamba_track_seqlens`` (sglang keeps none for a decode: each tracked row's ``seq_len``, -1 elsewhere).
- ``zero_on_alloc``: sglang clears a fresh running slot before its first forward (``mamba_needs_clear``).

The trace is written by :class:`Recorder`, attached to the ``Scheduler`` instance through hooks (its
``get_next_batch_to_run``, ``run_batch``, ``process_batch_result``, the model worker's ``verify``, the target's
linear-attention backend's ``init_forward_metadata``, the tree cache's and the pool's methods); the CPU driver
supplies the requests, the fake forward and the toy model, so the same recorder serves a live scheduler
(:mod:`workbench.engines.sglang_dump`). Each step's ``metadata`` also carries the GDN backend's
``state_indices`` (``mamba_cache_indices``) and ``query_start_loc`` as it built them for the target forward,
which ``workbench trace check`` compares with the profile's.
"""

from __future__ import annotations

import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workbench.engines.instance_hooks import Hooked, patch
from workbench.engines.scheduler_base import SchedulerTrace, TraceIds, step_mode, trace_header
from workbench.engines.versions import EngineError
from workbench.layer_names import GDN


# -- observing the cache ------------------------------------------------------------------------------
@dataclass
class _Event:
    """One thing the cache did to a mamba slot: ``copy`` (``src`` -> ``slot``), ``publish`` (``slot`` holds
    ``request``'s state after its first ``tokens`` ids, the key's ``ids``) or ``free`` (``slot`` back to the
    allocator)."""

    kind: str
    slot: int
    src: int = -1
    request: int | None = None  # the trace's id of the request being cached
    tokens: int = 0
    ids: tuple[int, ...] = ()
    finished: bool = False
    forward: bool = False  # during the fake forward (copy-on-write), not the cache's own work


class _CacheEvents:
    """Wraps the tree cache's and the pool's methods on their instances
    (:data:`~workbench.engines.sglang_scheduler.DRIVER_STANDINS`) and lists, in order, what they did to mamba
    slots; :meth:`restore` puts the methods back."""

    def __init__(self, tree_cache: Any, req_pool: Any, ids: TraceIds, on_publish: Callable[[_Event], None]) -> None:
        self.events: list[_Event] = []
        self.forward = False
        self.ids = ids  # sglang's request ids -> the trace's, as they are when the event happens
        self.on_publish = on_publish  # called as the tree takes the slot (the state is the one published)
        self._caching: list[Any] = []  # the requests being cached (checkpoint_into_tree), innermost last
        cache, pool = tree_cache, req_pool
        checkpoint, insert = cache.checkpoint_into_tree, cache.insert
        copy_from, free = pool.mamba_pool.copy_from, pool.mamba_allocator.free

        def checkpoint_into_tree(req: Any, *, up_to: int, **kwargs: Any) -> Any:
            self._caching.append(req)
            try:
                return checkpoint(req, up_to=up_to, **kwargs)
            finally:
                self._caching.pop()

        def insert_(params: Any) -> Any:
            result = insert(params)
            value = getattr(params, "mamba_value", None)
            if value is not None and not result.mamba_exist:
                self._publish(params, int(value.view(-1)[0]))
            return result

        def copy_from_(src: Any, dst: Any) -> Any:
            req = self._caching[-1] if self._caching else None
            for a, b in zip(src.view(-1).tolist(), dst.view(-1).tolist(), strict=True):
                self.events.append(
                    _Event(
                        "copy",
                        int(b),
                        src=int(a),
                        request=None if req is None else self.ids[req.rid],
                        forward=self.forward,
                    )
                )
            return copy_from(src, dst)

        def free_(index: Any) -> Any:
            for slot in index.view(-1).tolist():
                self.events.append(_Event("free", int(slot), forward=self.forward))
            return free(index)

        self._restore = [
            patch(cache, "checkpoint_into_tree", checkpoint_into_tree),
            patch(cache, "insert", insert_),
            patch(pool.mamba_pool, "copy_from", copy_from_),
            patch(pool.mamba_allocator, "free", free_),
        ]

    def restore(self) -> None:
        """Put the wrapped methods back (in reverse order)."""
        for restore in reversed(self._restore):
            restore()
        self._restore = []

    def _publish(self, params: Any, slot: int) -> None:
        if not self._caching:
            raise EngineError(f"sglang gave mamba slot {slot} to the tree outside a request's caching: not modelled")
        req = self._caching[-1]
        n = len(params.key)  # an EAGLE key is of bigrams: the state is of its first len(key) token ids
        ids = tuple(int(t) for t in params.key.token_ids[:n])
        event = _Event("publish", slot, request=self.ids[req.rid], tokens=n, ids=ids, finished=req.finished())
        self.on_publish(event)
        self.events.append(event)

    def take(self) -> list[_Event]:
        out, self.events = self.events, []
        return out


# -- one step in sglang's terms ---------------------------------------------------------------------------
@dataclass
class _Row:
    """One request of a batch, in sglang's order."""

    req: Any
    tid: int  # the trace's id of the request (-1 until the recorder knows it)
    kind: str
    pool_row: int
    slot: int
    cached: int
    new: int
    tokens: list[int]  # a verify row's: empty until its draft tokens are seen
    accepted: int | None = None  # a verify's num_correct_drafts


@dataclass
class _Step:
    """What one engine step did: its rows, and the requests (by their trace ids) it admitted, hit, finished."""

    number: int
    rows: list[_Row]
    admitted: list[int]
    hits: list[tuple[int, int, int]]  # (request, tokens, slot)
    cow: list[tuple[int, int]]  # (source, destination)
    track: dict[str, Any]  # the track fields the forward used
    track_copies: list[tuple[int, int]]  # (running slot, track slot): the forward's copies after it
    finished: list[int] = field(default_factory=list)
    retracted: list[int] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)  # the backend's: state_indices, query_start_loc


def _ids(req: Any) -> list[int]:
    return [*req.origin_input_ids, *req.output_ids]


def batch_rows(batch: Any, req_pool: Any, draft_tokens: int) -> list[_Row]:
    """A ``ScheduleBatch``'s rows in sglang's order: kind, request-pool row, slot, cached and new tokens, the
    tokens (a verify row's are left empty: its drafts exist only inside the forward). Each slot is checked
    against what the pool maps the row to (``get_mamba_indices``, what the backend reads)."""
    mode, spec = batch.forward_mode, not batch.spec_algorithm.is_none()
    tails = {id(r) for r in (batch.decoding_reqs or [])} if mode.is_mixed() else set()
    pool_rows, seq_lens = batch.req_pool_indices.tolist(), batch.seq_lens.tolist()
    mapped = req_pool.get_mamba_indices(batch.req_pool_indices).tolist()
    out = []
    for i, req in enumerate(batch.reqs):
        ids = _ids(req)
        if mode.is_extend():
            kind = "decode" if id(req) in tails else "extend"
            cached, new = int(batch.prefix_lens[i]), int(batch.extend_lens[i])
        elif spec:
            kind, cached, new = "verify", int(seq_lens[i]), draft_tokens
        else:
            kind, cached, new = "decode", int(seq_lens[i]) - 1, 1
        tokens = [] if kind == "verify" else ids[cached : cached + new]
        if len(tokens) != new if kind != "verify" else len(ids) <= cached:
            raise EngineError(f"request {req.rid}: {new} tokens from {cached}, but it has {len(ids)}")
        slot, row = int(req.kv.mamba_pool_idx), int(pool_rows[i])
        if slot != int(mapped[i]):
            raise EngineError(
                f"request {req.rid}: slot {slot} on pool row {row}, but the pool maps the row to {mapped[i]}"
            )
        out.append(_Row(req, -1, kind, row, slot, cached, new, tokens))
    return out


def cow_pairs(batch: Any) -> list[tuple[int, int]]:
    """The batch's copy-on-write pairs (``mamba_cow_src_indices`` -> ``mamba_cow_dst_indices``)."""
    if batch.mamba_cow_src_indices is None:
        return []
    return list(zip(batch.mamba_cow_src_indices.tolist(), batch.mamba_cow_dst_indices.tolist(), strict=True))


def track_fields(batch: Any, rows: list[_Row], chunk: int) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """An extend, mixed or (non-speculative) decode batch's track fields, as the forward reads them, and the
    copies after the forward they make (final states into track slots); a verify's are rebuilt inside its
    forward (empty here). ``chunk``: ``mamba_cache_chunk_size``."""
    verify = batch.forward_mode.is_decode() and not batch.spec_algorithm.is_none()
    if verify or batch.mamba_track_mask is None or batch.mamba_track_indices is None:
        return {}, []
    mask = [bool(x) for x in batch.mamba_track_mask.tolist()]
    indices = [int(x) for x in batch.mamba_track_indices.tolist()]
    if batch.forward_mode.is_extend():
        seqlens = [int(x) for x in batch.mamba_track_seqlens.tolist()]
        final = [(r.slot, indices[i]) for i, r in enumerate(rows) if mask[i] and (seqlens[i] - r.cached) % chunk == 0]
        fields: dict[str, Any] = {
            "mamba_track_mask": mask,
            "mamba_track_indices": indices,
            "mamba_track_seqlens": seqlens,
            "mamba_chunk_size": chunk,
            "track_ssm_final_src": [a for a, _ in final],
            "track_ssm_final_dst": [b for _, b in final],
        }
        return fields, list(final)
    seqlens = [r.cached + r.new if m else -1 for r, m in zip(rows, mask, strict=True)]
    copies = [(r.slot, indices[i]) for i, r in enumerate(rows) if mask[i]]
    return {"mamba_track_mask": mask, "mamba_track_indices": indices, "mamba_track_seqlens": seqlens}, copies


def linear_backend(sched: Any) -> Any:
    """The target model's linear-attention backend of a ``Scheduler`` (``tp_worker.model_runner.attn_backend``'s
    ``linear_attn_backend``, the hybrid backend's GDN part), or None."""
    runner = getattr(getattr(sched, "tp_worker", None), "model_runner", None)
    return getattr(getattr(runner, "attn_backend", None), "linear_attn_backend", None)


# -- the recorder -------------------------------------------------------------------------------------
class Recorder(Hooked):
    """Attached to one sglang ``Scheduler`` instance, writes down what it does as a trace (the module docstring:
    the mapping). The CPU driver records with it, and so does ``workbench.engines.sglang_dump`` in a live
    scheduler process.

    :meth:`attach` wraps, on their instances: the scheduler's ``get_next_batch_to_run`` (the round's number,
    retractions), ``run_batch`` (before the forward: rows, admissions, hits, copy-on-write, track fields) and
    ``process_batch_result`` (accepted drafts ``num_correct_drafts_per_req_cpu``, finished requests); the model
    worker's ``verify(batch, ...)`` under EAGLE (the verify input's ``draft_token``, ``[bs * D]``, before it
    runs; the track indices ``prepare_mamba_track_for_verify`` rebuilt and the commit's tracked step after it);
    the target model's linear-attention backend's ``init_forward_metadata(forward_batch)`` and
    ``init_forward_metadata_out_graph(forward_batch, in_capture)`` (its ``forward_metadata``:
    ``mamba_cache_indices`` as ``state_indices``, ``query_start_loc``; a graph replay's ``bucket``); and the tree
    cache's and the pool's methods (:class:`_CacheEvents`). :meth:`detach` puts them back.

    A step goes to ``trace.steps`` at the next ``run_batch`` (the cache's work until then is its), or at
    :meth:`finish`; then :meth:`written` is called, and every step in ``trace.steps`` is final.

    ``sg``: the sglang names it uses (``version``, ``commit``, ``runtime_context``,
    ``verify_commit_step_indices``: :class:`~workbench.engines.sglang_scheduler.Sglang` or
    ``sglang_dump.sglang_names()``). ``backend``: the linear-attention backend to read (None:
    :func:`linear_backend`; no metadata is recorded without one).
    ``on_publish``: called with each published checkpoint as the tree takes it. Errors: :meth:`failed` (here:
    raised). Raises :class:`EngineError` for a deployment it cannot follow (named).
    """

    def __init__(
        self,
        sg: Any,
        sched: Any,
        *,
        seed: int | None = None,
        backend: Any = None,
        on_publish: Callable[[_Event], None] | None = None,
    ) -> None:
        rc = sg.runtime_context
        self.sg, self.sched = sg, sched
        _check_followable(rc, sched)
        spec = rc.get_spec()
        self.draft_tokens = 0 if sched.spec_algorithm.is_none() else int(spec.speculative_num_draft_tokens)
        self.pool, self.tree_cache = sched.req_to_token_pool, sched.tree_cache
        self.chunk = int(rc.mamba_cache_chunk_size())
        self.backend = backend if backend is not None else linear_backend(sched)
        self.trace = SchedulerTrace(
            _header(sg, sched.max_running_requests, self.draft_tokens, self.pool.mamba_pool.size + 1, seed, GDN)
        )
        self.stats = self.trace.stats
        self.writer = _TraceWriter(self.trace)
        self.ids = TraceIds()
        self.on_publish = on_publish
        self.live: dict[str, Any] = {}  # requests that hold a row and a slot
        self.pool_rows: dict[str, int] = {}  # each live request's request-pool row (stable while it lives)
        self.round = -1  # get_next_batch_to_run calls so far, less one: the step's number
        self.current: _Step | None = None  # between run_batch and the end of process_batch_result
        self.pending: _Step | None = None  # processed, waiting for the next run_batch (the cache's work)
        self.events: _CacheEvents | None = None
        self.active = False
        self._restore: list[Callable[[], None]] = []

    # -- hooks -----------------------------------------------------------------------------------------
    def _guarded(self, hook: Callable[..., None], *args: Any) -> None:
        if self.active:
            try:
                hook(*args)
            except Exception as e:  # noqa: BLE001 -- failed() decides
                self.failed(e)

    def attach(self) -> None:
        """Wrap the methods (class docstring) on their instances (once)."""
        if self._restore:
            raise EngineError("this recorder is attached already")
        sched = self.sched
        next_batch, run_batch, process = sched.get_next_batch_to_run, sched.run_batch, sched.process_batch_result

        def get_next_batch_to_run(*args: Any, **kwargs: Any) -> Any:
            plan = next_batch(*args, **kwargs)
            self._guarded(self.scheduled, plan)
            return plan

        def run_batch_(batch: Any, *args: Any, **kwargs: Any) -> Any:
            self._guarded(self.before_forward, batch)
            forward = self.active and self.events is not None
            if forward:
                assert self.events is not None
                self.events.forward = True
            try:
                result = run_batch(batch, *args, **kwargs)
            finally:
                if forward and self.events is not None:
                    self.events.forward = False
            self._guarded(self.after_forward, batch)
            return result

        def process_batch_result_(batch: Any, result: Any, *args: Any, **kwargs: Any) -> Any:
            out = process(batch, result, *args, **kwargs)
            self._guarded(self.processed, batch, result)
            return out

        self.events = _CacheEvents(self.tree_cache, self.pool, self.ids, self._published)
        self._restore = [
            self.events.restore,
            patch(sched, "get_next_batch_to_run", get_next_batch_to_run),
            patch(sched, "run_batch", run_batch_),
            patch(sched, "process_batch_result", process_batch_result_),
            *self._attach_worker(),
            *self._attach_backend(),
        ]
        self.active = True

    def _attach_worker(self) -> list[Callable[[], None]]:
        if not self.draft_tokens:
            return []
        worker = self.sched.model_worker
        verify = worker.verify

        def verify_(batch: Any, *args: Any, **kwargs: Any) -> Any:
            self._guarded(self.drafts, batch)
            result = verify(batch, *args, **kwargs)
            self._guarded(self.verified, batch, result)
            return result

        return [patch(worker, "verify", verify_)]

    def _attach_backend(self) -> list[Callable[[], None]]:
        backend = self.backend
        if backend is None:
            return []
        eager, graph = backend.init_forward_metadata, backend.init_forward_metadata_out_graph

        def init_forward_metadata(forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
            out = eager(forward_batch, *args, **kwargs)
            self._guarded(self.forward_metadata, None)
            return out

        def init_forward_metadata_out_graph(forward_batch: Any, in_capture: bool = False, **kwargs: Any) -> Any:
            out = graph(forward_batch, in_capture=in_capture, **kwargs)
            if not in_capture:
                self._guarded(self.forward_metadata, int(forward_batch.batch_size))
            return out

        return [
            patch(backend, "init_forward_metadata", init_forward_metadata),
            patch(backend, "init_forward_metadata_out_graph", init_forward_metadata_out_graph),
        ]

    def _published(self, e: _Event) -> None:
        if self.on_publish is not None:
            self.on_publish(e)

    # -- the hooks' work -----------------------------------------------------------------------------
    def scheduled(self, plan: Any) -> None:
        """After ``get_next_batch_to_run``: the round's number; the live requests it retracted (they finish at
        the last step written, and start over under a new id when readmitted)."""
        self.round += 1
        out = [rid for rid in sorted(self.live) if getattr(self.live[rid], "is_retracted", False)]
        for rid in out:
            del self.live[rid]
            self.pool_rows.pop(rid, None)
        tids = [self.ids[rid] for rid in out]
        if self.pending is not None and tids:
            self.pending.retracted.extend(tids)
        elif tids:
            self.writer.retract(tids)
        batch = plan.batch_to_run
        if batch is None or batch.is_empty():
            self.stats["empty_steps"] += 1

    def before_forward(self, batch: Any) -> None:
        """``run_batch`` is called: the step before goes to the trace; this one's rows, admissions, hits,
        copy-on-write and track fields."""
        if self.current is not None:
            raise EngineError(f"sglang ran a batch before step {self.current.number}'s result was processed")
        self._flush()
        rows = batch_rows(batch, self.pool, self.draft_tokens)
        for r in rows:
            row = self.pool_rows.get(r.req.rid, r.pool_row)
            if row != r.pool_row:
                raise EngineError(f"request {r.req.rid}: pool row {r.pool_row}, but the request had row {row}")
            if r.req.rid in self.live:
                r.tid = self.ids[r.req.rid]
        admitted, hits, cow = self._admissions(rows, batch)
        track, track_copies = track_fields(batch, rows, self.chunk)
        if track:
            self.stats["extend_track_rows" if batch.forward_mode.is_extend() else "decode_track_rows"] += sum(
                track["mamba_track_mask"]
            )
        if self.draft_tokens and batch.forward_mode.is_decode():
            self.stats["verify_stale_track_fields"] += int(batch.mamba_track_mask is not None)
        self.current = _Step(self.round, rows, admitted, hits, cow, track, track_copies)

    def _admissions(
        self, rows: list[_Row], batch: Any
    ) -> tuple[list[int], list[tuple[int, int, int]], list[tuple[int, int]]]:
        """The requests admitted at this step (given their trace ids: a request sglang readmits after a
        retraction starts over under a new one), their hits (request, tokens, copy-on-write source) and the
        copy-on-write pairs of the batch."""
        cow = cow_pairs(batch)
        source = {dst: src for src, dst in cow}
        admitted, hits = [], []
        for r in rows:
            rid = r.req.rid
            if rid in self.live:
                continue
            if r.kind != "extend":
                raise EngineError(f"request {rid} first runs as a {r.kind} row")
            r.tid = self.ids.readmit(rid) if rid in self.ids else self.ids.admit(rid)
            admitted.append(r.tid)
            self.live[rid] = r.req
            self.pool_rows[rid] = r.pool_row
            if r.cached:
                if r.slot not in source:
                    raise EngineError(f"request {rid} starts from {r.cached} cached tokens with no copy-on-write")
                hits.append((r.tid, r.cached, source[r.slot]))
        return admitted, hits, cow

    def drafts(self, batch: Any) -> None:
        """The verify's input (``batch.spec_info.draft_token``: per row the pending token, then its drafts)."""
        step = self._step("a verify")
        d = self.draft_tokens
        flat = [int(t) for t in batch.spec_info.draft_token.view(-1).tolist()]
        if len(flat) != d * len(step.rows):
            raise EngineError(
                f"step {step.number}: the verify input holds {len(flat)} draft tokens for {len(step.rows)} rows of "
                f"D = {d} (a tree, topk > 1, is not followed)"
            )
        for b, r in enumerate(step.rows):
            tokens = flat[b * d : (b + 1) * d]
            want = _ids(r.req)[r.cached]
            if r.kind != "verify" or tokens[0] != want:
                raise EngineError(
                    f"step {step.number}: request {r.req.rid}'s verify row starts with token {tokens[0]}, its pending "
                    f"token is {want} ({r.kind} row)"
                )
            r.tokens = tokens

    def verified(self, batch: Any, result: Any) -> None:
        """After the verify: the track indices it used and the step each row tracks at commit."""
        import torch

        step = self._step("a verify")
        if batch.mamba_track_indices is None:
            return
        host = types.SimpleNamespace(
            seq_lens=batch.seq_lens.cpu(),
            mamba_track_indices=batch.mamba_track_indices.cpu(),
            tree_cache=batch.tree_cache,
        )
        _, to_track = self.sg.verify_commit_step_indices(
            batch=host,
            accept_index=result.accept_index.cpu(),
            accept_lens=result.accept_lens.cpu().to(torch.int32),
            draft_token_num=self.draft_tokens,
        )
        if to_track is None:
            return
        steps = [int(x) for x in to_track.tolist()]
        step.track = {
            "mamba_track_indices": [int(x) for x in host.mamba_track_indices.tolist()],
            "mamba_steps_to_track": steps,
        }
        self.stats["verify_track_rows"] += sum(s >= 0 for s in steps)

    def forward_metadata(self, bucket: int | None) -> None:
        """The target backend built its metadata for the step's forward (``bucket``: a graph replay's size)."""
        step = self.current
        if step is None:
            return  # a forward outside a step (a warm-up, a capture)
        if step.metadata:
            self.stats["metadata_extra_calls"] += 1
            return
        m = self.backend.forward_metadata
        if bucket is not None:
            step.metadata["bucket"] = bucket
        step.metadata["state_indices"] = [int(x) for x in m.mamba_cache_indices.tolist()]
        step.metadata["query_start_loc"] = [int(x) for x in m.query_start_loc.tolist()]

    def after_forward(self, batch: Any) -> None:
        step = self._step("a forward")
        for r in step.rows:
            if r.kind == "verify" and not r.tokens:
                raise EngineError(
                    f"step {step.number}: request {r.req.rid}'s draft tokens never reached the recorder (the model "
                    "worker's verify was not called)"
                )

    def processed(self, batch: Any, result: Any) -> None:
        """After ``process_batch_result``: acceptance read back from sglang, finished requests."""
        step = self._step("a result")
        self.current = None
        drafts = result.num_correct_drafts_per_req_cpu
        for i, r in enumerate(step.rows):
            if r.kind == "verify":
                if drafts is None:
                    raise EngineError(f"step {step.number}: sglang's result of a verify has no accepted drafts")
                r.accepted = int(drafts[i])
            if r.req.finished() and r.req.rid in self.live:
                del self.live[r.req.rid]
                self.pool_rows.pop(r.req.rid, None)
                step.finished.append(r.tid)
        self.pending = step

    def _step(self, what: str) -> _Step:
        if self.current is None:
            raise EngineError(f"sglang reached {what} outside a run_batch the recorder saw")
        return self.current

    def _flush(self) -> None:
        """The pending step, with the cache's work since its forward, to ``trace.steps``."""
        step, self.pending = self.pending, None
        if step is None:
            return
        assert self.events is not None
        self.writer.add(step, self.events.take())
        if step.retracted:
            self.writer.retract(step.retracted)
        self.written()

    def finish(self) -> None:
        """The last step to the trace (no later scheduling round will add to it)."""
        self._flush()
        self.stats["evict_after_last_step"] += len(self.writer.carry)  # no step left to write them at
        self.writer.carry = []


def _check_followable(rc: Any, sched: Any) -> None:
    """The deployment is one the recorder follows, or an :class:`EngineError` naming the setting and value."""
    overlap = bool(getattr(sched, "enable_overlap", False)) or not rc.get_schedule().disable_overlap_schedule
    if overlap:
        raise EngineError(
            "disable_overlap_schedule = False: the sglang recorder needs --disable-overlap-schedule (a step's "
            "result must be processed before the next step runs)"
        )
    mamba = rc.get_exec().mamba
    if mamba.enable_mamba_extra_buffer_lazy:
        raise EngineError("mamba_radix_cache_strategy = 'extra_buffer_lazy': the trace format does not model it")
    if not sched.spec_algorithm.is_none():
        spec = rc.get_spec()
        if not sched.spec_algorithm.is_eagle() or (spec.speculative_eagle_topk or 1) != 1:
            raise EngineError(
                f"speculative_algorithm = {spec.speculative_algorithm!r}, speculative_eagle_topk = "
                f"{spec.speculative_eagle_topk!r}: the recorder follows EAGLE chains (topk 1) only"
            )
    if not hasattr(sched.req_to_token_pool, "mamba_pool"):
        raise EngineError(
            f"req_to_token_pool = {type(sched.req_to_token_pool).__name__}: not a hybrid pool (no mamba state)"
        )


# -- the trace ----------------------------------------------------------------------------------------
class _TraceWriter:
    """Turns each :class:`_Step` and the cache's work after its forward into the file's step object (module
    docstring: the mapping), keeping what the trace says across steps: ids and live checkpoints."""

    def __init__(self, trace: SchedulerTrace) -> None:
        self.trace, self.stats = trace, trace.stats
        self.live: dict[int, tuple[int, int]] = {}  # slot -> (trace id, tokens) of a live checkpoint
        self.carry: list[int] = []  # evictions for the next step's start

    def add(self, s: _Step, work: list[_Event]) -> None:
        """Step ``s`` with the cache's work after its forward (``work``, in order)."""
        evict = self._start(s)
        meta: dict[str, Any] = {
            "evict": evict,
            "hits": [{"request": tid, "tokens": n, "slot": slot} for tid, n, slot in s.hits],
            "copies_before": [[a, b] for a, b in s.cow],
            "copies_after": [[a, b] for a, b in s.track_copies],
            "checkpoints": [],
        }
        meta["evict"] += self._work(s, work, meta)
        rows = [self._row(r) for r in s.rows]
        metadata = {k: v for k, v in meta.items() if v}
        metadata.update(s.track)
        metadata.update(s.metadata)  # the backend's: state_indices, query_start_loc (a replay's bucket first)
        self.trace.steps.append({
            "step": s.number,
            "mode": step_mode([r.kind for r in s.rows]),
            "rows": rows,
            "admit": list(s.admitted),
            "finish": list(s.finished),
            "metadata": metadata or None,
        })  # fmt: skip
        self._count(s, metadata)

    def retract(self, tids: list[int]) -> None:
        """Requests sglang retracted after the last step written: they finish there."""
        if not tids:
            return
        if not self.trace.steps:
            raise EngineError(f"sglang retracted requests {tids} before any step ran")
        self.trace.steps[-1]["finish"].extend(tids)
        self.stats["retracted"] += len(tids)

    def _start(self, s: _Step) -> list[int]:
        """The evictions carried to this step's start (checked against its hits; :meth:`_work` took them out of
        ``live`` when sglang freed them)."""
        evict, self.carry = self.carry, []
        self.stats["evict_next_step"] += len(evict)
        hit = {slot for _, _, slot in s.hits}
        for slot in evict:
            if slot in hit:
                raise EngineError(f"step {s.number}: sglang evicted slot {slot} after a request hit it in this step")
        return evict

    def _work(self, s: _Step, work: list[_Event], meta: dict[str, Any]) -> list[int]:
        """The cache's work after the step's forward: copies and checkpoints into ``meta``; the evictions
        that must come at this step's start (returned: a later write of the same work reuses the slot),
        the others carried to the next step."""
        start = set(self.live)
        hit = {slot for _, _, slot in s.hits}
        own: list[int] = []
        for i, e in enumerate(work):
            if e.kind == "copy" and e.forward:  # the copy-on-write before the forward
                if (e.src, e.slot) not in s.cow:
                    raise EngineError(
                        f"step {s.number}: a copy {e.src} -> {e.slot} in the forward, not a copy-on-write"
                    )
            elif e.kind == "copy":
                if e.request is None:
                    raise EngineError(f"step {s.number}: sglang copied slot {e.src} -> {e.slot} outside caching")
                meta["copies_after"].append([e.src, e.slot])
            elif e.kind == "publish":
                self._publish(s, e, meta)
            elif e.slot in self.live:
                del self.live[e.slot]
                reused = any(x.slot == e.slot and x.kind in ("copy", "publish") for x in work[i + 1 :])
                if not reused:
                    self.carry.append(e.slot)
                elif e.slot in start and e.slot not in hit:
                    own.append(e.slot)
                    self.stats["evict_this_step"] += 1
                else:
                    raise EngineError(
                        f"step {s.number}: sglang evicted slot {e.slot} and wrote it again after the forward, but "
                        "the trace cannot evict it before the step (published or hit in it)"
                    )
        return own

    def _publish(self, s: _Step, e: _Event, meta: dict[str, Any]) -> None:
        if e.slot in self.live:
            raise EngineError(f"step {s.number}: sglang published slot {e.slot}, which holds a live checkpoint")
        assert e.request is not None
        self.live[e.slot] = (e.request, e.tokens)
        meta["checkpoints"].append({"request": e.request, "tokens": e.tokens, "slot": e.slot})
        self.stats["published_finished" if e.finished else "published_running"] += 1

    @staticmethod
    def _row(r: _Row) -> dict[str, Any]:
        return {
            "id": r.tid,
            "slot": r.slot,
            "req_pool_index": r.pool_row,
            "seq_len": r.cached + r.new,
            "new_tokens": r.new,
            "cached_tokens": r.cached,
            "accepted": r.accepted,
            "tokens": r.tokens,
            "kind": r.kind,
        }

    def _count(self, s: _Step, metadata: dict[str, Any]) -> None:
        """What a step did, added to the stats."""
        stats = self.stats
        kinds = Counter(r.kind for r in s.rows)
        stats["steps"] += 1
        stats[f"steps_{step_mode(list(kinds))}"] += 1
        for kind, n in kinds.items():
            stats[f"rows_{kind}"] += n
        stats["admitted"] += len(s.admitted)
        stats["hits"] += len(s.hits)
        stats["finished"] += len(s.finished)
        for key in ("evict", "copies_before", "copies_after", "checkpoints"):
            stats[key] += len(metadata.get(key, ()))


def _header(
    sg: Any, max_running: int, draft_tokens: int, num_slots: int, seed: int | None, layer: str
) -> dict[str, Any]:
    return trace_header(
        "sglang", version=sg.version, commit=sg.commit, max_running=max_running, draft_tokens=draft_tokens,
        num_slots=num_slots, seed=seed, layer=layer, accepted="drafts", zero_on_alloc=True,
    )  # fmt: skip


__all__ = [
    "Recorder",
    "batch_rows",
    "cow_pairs",
    "linear_backend",
    "track_fields",
]
