"""How vLLM 0.33.0's scheduler state becomes trace steps: :class:`Recorder`, attached to one v1 ``Scheduler``
instance, writes down step by step what one GDN layer saw (``docs/traces.md``) into a
:class:`~workbench.engines.scheduler_base.SchedulerTrace`. The CPU driver
(:mod:`workbench.engines.vllm_scheduler`) records with it, and so does the live dumper
(:mod:`workbench.engines.dump`); this module imports no vLLM code (the names it uses come in as ``v``).
What is recorded is what the scheduler and its block pool do; the worker's side (its request states, the
align-mode pre-copies of ``preprocess_mamba``, the post-copies, the GDN builder's metadata, Model Runner V2's
row order) is recomputed on the host from the scheduler's outputs.

How vLLM's state maps to the trace:

- **slots are block ids**: a pool slot is the GDN group's block of that id (``num_slots = num_blocks``; the
  null block 0 is the profile's dummy slot 0), so the builder's indices are the trace's slots as they are.
- **a request's slots** are its window: the ``1 + num_speculative_tokens`` blocks of its mamba block-table
  row from its running column (``(computed + scheduled - 1) // block_size``), what the builder reads; every
  row names them (``slots``; ``slot`` is the first). A window that changes is a ``moves`` entry; the worker's
  pre-copy (from column ``num_accepted - 1`` of the old window into the new first block) is the
  ``copies_before`` entry, left out when it is a self-copy (the source block is the destination). A block
  the window leaves stays live when it was published; it is kept (``keep``) when a later post-copy fills it
  and the cache publishes it; otherwise the trace frees it at the move (vLLM frees it a step or two later;
  nothing reads it, and a post-copy into it is a copy into a free slot).
- **rows**: Model Runner V2's order, each with its ``kind`` (``verify``: its drafts were scheduled;
  ``extend``: a prompt chunk; ``decode``: one token), its stable ``req_pool_index`` (:class:`RowAllocator`,
  lowest free from 1) and the ``tokens`` it feeds (a verify: the last sampled token, then the drafts).
  ``accepted`` counts the tokens kept, bonus included (vLLM's ``num_accepted_tokens``; header ``accepted``
  ``"tokens"``).
- **prefix keys**: ``hits`` (a request admitted with computed tokens: the cached block its row holds at the
  hit's last column), ``copies_before`` (pre-copies), ``moves`` (with ``keep``: a block the window left that a
  later post-copy fills and the cache then publishes), ``copies_after`` (post-copies, the decisions of
  ``postprocess_mamba_fused_kernel`` recomputed on the host), ``checkpoints`` (every block the block pool
  inserts a GDN-group hash for, at schedule time or in ``update_from_output``: the request, the tokens the
  hash covers, the block), ``evict`` (a block whose GDN-group hash the pool drops, at an allocation).
- **metadata**: the builder's ``GDNAttentionMetadata`` under vLLM's names (``model.SPLIT_KEYS``:
  ``spec_state_indices_tensor``, ``non_spec_state_indices_tensor``, ``spec_query_start_loc``,
  ``non_spec_query_start_loc``, ``num_spec_decodes``, ``num_decodes``, ``num_prefills``,
  ``num_accepted_tokens``; null where the builder made none) and ``has_initial_state`` where it made one, built
  unpadded as a CPU run builds them (no graph is replayed: no ``bucket``), and the runner's
  ``query_start_loc`` over all rows.
- a preempted request finishes at its last step; when vLLM readmits it, it starts over under a new id.

What a trace cannot say yet (``docs/traces.md``): a verify row whose drafts the token budget cut short (vLLM
schedules ``1 + k`` tokens, ``k < D - 1``) is refused with :class:`EngineError`; a one-token row without
drafts in a deployment with speculation (the budget cut every draft) is written as a ``decode`` row, while
vLLM's builder runs it on the speculative path (it reads column ``num_accepted - 1``; its index is in
``spec_state_indices_tensor``). Both are rare (none in 16 runs of 300 steps of the default deployment).
"""

from __future__ import annotations

import contextlib
import types
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from workbench.engines.instance_hooks import Hooked, patch
from workbench.engines.scheduler_base import RowAllocator, SchedulerTrace, TraceIds, step_mode, trace_header
from workbench.engines.versions import EngineError
from workbench.layer_names import GDN

TENSOR_KEYS = (
    "spec_state_indices_tensor", "non_spec_state_indices_tensor", "spec_query_start_loc", "non_spec_query_start_loc",
    "num_accepted_tokens",
)  # fmt: skip
"""The ``GDNAttentionMetadata`` tensors a step records under their names (null: the builder made none)."""
COUNT_KEYS = ("num_spec_decodes", "num_decodes", "num_prefills")
"""The ``GDNAttentionMetadata`` row counts a step records."""


def _commit(version_module: Any) -> str | None:
    """vLLM's ``__commit_id__`` (``g<hash>``, as its version tool writes it) as the bare hash, or None."""
    commit = getattr(version_module, "__commit_id__", None)
    if not commit:
        return None
    commit = str(commit)
    if commit.startswith("g") and all(c in "0123456789abcdef" for c in commit[1:]):
        commit = commit[1:]
    return commit


@dataclass(frozen=True)
class Deployment:
    """The vLLM deployment a run drives: speculation (``num_speculative_tokens``), block size, pool, batch
    limits."""

    num_spec: int
    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int


# -- observing the block pool -------------------------------------------------------------------------
@dataclass
class _PoolEvents:
    """What the block pool did to the GDN group's prefix cache: publishes ``(request id, block, tokens)`` and
    evictions (blocks), in order."""

    group: int
    get_group_id: Any
    publishes: list[tuple[str, int, int]] = field(default_factory=list)
    evictions: list[int] = field(default_factory=list)
    request: str | None = None

    def take(self) -> tuple[list[tuple[str, int, int]], list[int]]:
        out = (self.publishes, self.evictions)
        self.publishes, self.evictions = [], []
        return out


def _observe(pool: Any, events: _PoolEvents) -> list[Any]:
    """Wrap ``pool``'s methods on the instance (``BlockPool`` in
    :data:`~workbench.engines.vllm_scheduler.DRIVER_STANDINS`) to record into ``events``; returns the functions
    that put each back."""
    cache_full, cache_partial = pool.cache_full_blocks, pool.cache_partial_block
    insert, remove = pool._insert_block_hash, pool._remove_cached_block_hashes

    def with_request(original: Any) -> Any:
        def wrapped(request: Any, *args: Any, **kwargs: Any) -> Any:
            events.request = request.request_id
            try:
                return original(request, *args, **kwargs)
            finally:
                events.request = None

        return wrapped

    def insert_block_hash(key: Any, block: Any, num_tokens: int | None) -> None:
        new = block.block_hash != key and not pool.cached_block_hash_to_block.contain(key, block.block_id)
        insert(key, block, num_tokens)
        if new and events.get_group_id(key) == events.group:
            if events.request is None or num_tokens is None:
                raise EngineError(
                    f"vllm published block {block.block_id} of the GDN group outside a request's caching "
                    f"(request {events.request}, {num_tokens} tokens): not modelled by this driver"
                )
            events.publishes.append((events.request, int(block.block_id), int(num_tokens)))

    def remove_cached_block_hashes(block: Any) -> Any:
        removed = remove(block)
        if any(events.get_group_id(k) == events.group for k in removed):
            events.evictions.append(int(block.block_id))
        return removed

    return [
        patch(pool, "cache_full_blocks", with_request(cache_full)),
        patch(pool, "cache_partial_block", with_request(cache_partial)),
        patch(pool, "_insert_block_hash", insert_block_hash),
        patch(pool, "_remove_cached_block_hashes", remove_cached_block_hashes),
    ]


@contextlib.contextmanager
def _recording_precopies(mamba_utils: Any, into: list[tuple[str, int, int, int]]) -> Iterator[None]:
    """While open, ``preprocess_mamba``'s calls of ``collect_mamba_copy_meta`` append ``(request id, source
    column, destination column, accepted-token bias)`` to ``into`` and copy nothing."""

    def collect(copy_bufs: Any, kv_cache_config: Any, funcs: Any, group_ids: Any, src: int, dst: int,
                bias: int, req_state: Any, forward_context: Any) -> None:  # fmt: skip
        into.append((req_state.req_id, int(src), int(dst), int(bias)))

    original = mamba_utils.collect_mamba_copy_meta
    mamba_utils.collect_mamba_copy_meta = collect
    try:
        yield
    finally:
        mamba_utils.collect_mamba_copy_meta = original


PostCopy = tuple[int, int]
"""A post-copy: (the window column of its source, the destination's block column)."""


def post_copy(
    state_col: int, scheduled: int, computed: int, drafts: int, kept: int, block_size: int
) -> tuple[PostCopy | None, int]:
    """The align-mode post-copy after a row's forward, as ``postprocess_mamba_fused_kernel`` decides it:
    ``((bias, destination column) or None, accepted count for the next step)``.

    The row ran from ``computed`` tokens with ``scheduled`` tokens (``drafts`` of them drafts) and kept
    ``kept``; its state after its first real token is in window column 0 (block ``state_col``). When the
    tokens kept reach a block boundary ``aligned`` at or past that token, the state of column ``aligned -
    running`` (``running = computed + scheduled - drafts``) goes to block ``aligned // block_size - 1``; into
    the row's own block the count restarts at 1.

    >>> post_copy(15, 3, 239, 2, 1, 16)  # 240 tokens: block 14's boundary, from column 0
    ((0, 14), 1)
    >>> post_copy(15, 3, 240, 2, 2, 16)  # 242 tokens: no boundary reached
    (None, 2)
    >>> post_copy(14, 3, 237, 2, 3, 16)  # 240 tokens, all kept: into its own block, from column 2
    ((2, 14), 1)
    """
    running = computed + scheduled - drafts
    aligned = (running + kept - 1) // block_size * block_size
    if aligned < running:
        return None, kept
    dest = aligned // block_size - 1
    bias = aligned - running
    if dest == state_col:
        return (None if bias == 0 else (bias, dest)), 1
    return (bias, dest), kept


# -- the worker's view --------------------------------------------------------------------------------
class _RequestState:
    """The runner's per-request state, reduced to what ``preprocess_mamba`` reads (``req_id``,
    ``num_computed_tokens``, ``block_ids``), and the prompt length."""

    def __init__(self, req_id: str, prompt_len: int, block_ids: Any, num_computed_tokens: int) -> None:
        self.req_id = req_id
        self.prompt_len = prompt_len
        self.block_ids = [list(b) for b in block_ids]
        self.num_computed_tokens = num_computed_tokens


@dataclass
class _Row:
    """One scheduled request in the runner's order, as the trace needs it."""

    req: str
    kind: str
    computed: int
    scheduled: int
    drafts: list[int]
    tokens: list[int]
    window: list[int]
    state_col: int
    prefilling: bool
    block_row: list[int]
    num_accepted: int  # what the builder reads (after the pre-copy's reset)
    kept: int = 0  # tokens the forward kept (0: a prompt chunk that does not end the prompt)


@dataclass
class _Step:
    """What one engine step did, in engine terms (request ids, block ids)."""

    number: int
    rows: list[_Row]
    admitted: list[str]
    readmitted: set[str]
    preempted: list[str]
    hits: list[tuple[str, int, int]]  # (request, tokens, block)
    precopies: list[tuple[str, int, int]]  # (request, source block, destination block)
    postcopies: list[tuple[str, int, int]]
    publishes: list[tuple[str, int, int]]  # (request, block, tokens): at schedule time, then at update
    evictions: list[int]
    finished: list[str]
    metadata: dict[str, Any]
    aborted: list[str] = field(default_factory=list)  # finished outside update_from_output (an abort)


# -- the trace ----------------------------------------------------------------------------------------
class _TraceWriter:
    """Turns each :class:`_Step` into the file's step object (module docstring: the mapping), keeping what the
    trace says across steps: ids, rows, windows, live checkpoints, and the blocks each window left."""

    def __init__(self, trace: SchedulerTrace, spec: int) -> None:
        self.trace, self.spec, self.stats = trace, spec, trace.stats  # spec: num_speculative_tokens
        self.ids, self.rows = TraceIds(), RowAllocator()
        self.windows: dict[str, list[int]] = {}
        self.live: dict[int, tuple[int, int]] = {}  # block -> (trace id, tokens) of a live checkpoint
        self.left: dict[int, tuple[str, dict[str, Any]]] = {}  # block a window left -> (request, its move)

    def _close(self, req: str) -> int:
        tid = self.ids[req]
        self.rows.remove(req)
        self.windows.pop(req, None)
        for block in [b for b, (owner, _) in self.left.items() if owner == req]:
            del self.left[block]
        return tid

    def _take(self, blocks: list[int]) -> None:
        """``blocks`` are a window's now: no longer blocks some window left."""
        for b in blocks:
            self.left.pop(b, None)
            if b in self.live:
                raise EngineError(f"block {b} joins a window while the trace holds a live checkpoint in it")

    def add(self, s: _Step) -> None:
        self.preempt(s)
        meta: dict[str, list[Any]] = {k: [] for k in ("evict", "hits", "copies_before", "moves")}
        for b in s.evictions:
            if self.live.pop(b, None) is None:
                self.stats["evictions_not_live"] += 1
                continue
            meta["evict"].append(b)
        admit = self._admit(s)
        for req, tokens, block in s.hits:
            meta["hits"].append({"request": self.ids[req], "tokens": tokens, "slot": block})
        meta["copies_before"] = [[src, dst] for _, src, dst in s.precopies if src != dst]
        self.stats["precopies_self"] += sum(src == dst for _, src, dst in s.precopies)
        fresh = set(s.admitted)
        for r in s.rows:
            if r.req not in fresh and r.window != self.windows[r.req]:
                meta["moves"].append(self._move(r))
        after: dict[str, list[Any]] = {"copies_after": [[src, dst] for _, src, dst in s.postcopies]}
        after["checkpoints"] = [self._publish(req, block, tokens) for req, block, tokens in s.publishes]
        rows = [self._row(r) for r in s.rows]
        finish = [self._close(req) for req in s.finished]
        metadata = {k: v for k, v in {**meta, **after}.items() if v}
        metadata.update(s.metadata)
        self.trace.steps.append({
            "step": s.number,
            "mode": step_mode([r.kind for r in s.rows]),
            "rows": rows,
            "admit": admit,
            "finish": finish,
            "metadata": metadata or None,
        })  # fmt: skip

    def preempt(self, s: _Step) -> None:
        """vLLM preempted requests at this step's schedule (or aborted them since the last step): they finish
        after the last step written."""
        if s.aborted and self.trace.steps:
            last = self.trace.steps[-1]
            for req in s.aborted:
                if req in self.ids and req in self.rows.rows:
                    last["finish"].append(self._close(req))
                    self.stats["aborted"] += 1
        if not s.preempted:
            return
        if not self.trace.steps:
            raise EngineError(f"step {s.number}: vllm preempted {s.preempted} before any step ran")
        last = self.trace.steps[-1]
        for req in s.preempted:
            if req in self.ids and req in self.rows.rows:
                last["finish"].append(self._close(req))
                self.stats["preempted"] += 1

    def _admit(self, s: _Step) -> list[int]:
        admit = []
        rows = {r.req: r for r in s.rows}
        for req in s.admitted:
            tid = self.ids.readmit(req) if req in s.readmitted else self.ids.admit(req)
            self.rows.add(req)
            self._take(rows[req].window)
            self.windows[req] = list(rows[req].window)
            admit.append(tid)
        return admit

    def _move(self, r: _Row) -> dict[str, Any]:
        old, new = self.windows[r.req], r.window
        self._take([b for b in new if b not in old])
        move: dict[str, Any] = {"request": self.ids[r.req]}
        if self.spec:
            move["slots"], move["keep"] = list(new), []
        else:
            move["slot"] = new[0]
        for b in old:
            if b not in new and b not in self.live:
                self.left[b] = (r.req, move)
        self.windows[r.req] = list(new)
        return move

    def _publish(self, req: str, block: int, tokens: int) -> dict[str, Any]:
        tid = self.ids[req]
        left = self.left.pop(block, None)
        if left is not None and self.spec:  # the window left it; the trace keeps it until now
            owner, move = left
            if owner != req:
                raise EngineError(f"request {req} publishes block {block}, which request {owner}'s window left")
            move["keep"].append(block)
        self.live[block] = (tid, tokens)
        return {"request": tid, "tokens": tokens, "slot": block}

    def _row(self, r: _Row) -> dict[str, Any]:
        row: dict[str, Any] = {
            "id": self.ids[r.req],
            "slot": r.window[0],
            "req_pool_index": self.rows[r.req],
            "seq_len": r.computed + r.scheduled,
            "new_tokens": r.scheduled,
            "cached_tokens": r.computed,
            "accepted": r.kept if r.kind == "verify" else None,
            "tokens": r.tokens,
            "kind": r.kind,
        }
        if self.spec:
            row["slots"] = list(r.window)
        return row


# -- the recorder: one scheduler, observed --------------------------------------------------------------
def _mamba_group(v: Any, kvc: Any) -> int:
    """The first KV-cache group of GDN mamba layers: the group whose blocks are the trace's slots."""
    for i, g in enumerate(kvc.kv_cache_groups):
        if isinstance(g.kv_cache_spec, v.MambaSpec):
            return i
    raise EngineError("vllm's KV-cache config has no mamba group: a trace records a GDN layer's state slots")


def _finished(engine_out: Any) -> list[str]:
    """The request ids ``update_from_output``'s outputs finish, in order."""
    return [o.request_id for outs in engine_out.values() for o in outs.outputs if o.finish_reason is not None]


class Recorder(Hooked):
    """Attached to one vLLM ``Scheduler`` instance, writes down what it does as a trace (the module docstring:
    the mapping). The driver records with it, and so does ``workbench.engines.dump`` in a live process.

    :meth:`attach` wraps, on the instance, ``schedule`` and ``update_from_output`` and the block pool's
    ``cache_full_blocks`` / ``cache_partial_block`` / ``_insert_block_hash`` / ``_remove_cached_block_hashes``
    (:func:`_observe`); :meth:`detach` puts them back. Per engine step, after ``schedule`` it takes the
    worker's view (the runner's request states, ``preprocess_mamba``'s pre-copies, the rows in Model Runner
    V2's order, the hits, the GDN builder's metadata); after ``update_from_output`` the post-copies (from the
    tokens each row kept: ``len(sampled_token_ids[row])``, read before ``update_from_output`` runs), the
    publishes and the finished requests; then the
    step goes to ``trace.steps`` and :meth:`written` is called. A step a later preemption finishes in is the
    last one in ``trace.steps``: every step before it is final.

    ``v``: the vLLM names it uses (:class:`~workbench.engines.vllm_scheduler.Vllm`, or any object with
    ``version``, ``commit``, ``MambaSpec``, ``CommonAttentionMetadata``, ``GDNAttentionMetadataBuilder``,
    ``kv_cache_utils``, ``mamba_utils``, ``sort_batch_req_ids``). ``spec``: D as
    :func:`~workbench.engines.vllm_scheduler.run_vllm_scheduler` counts it, checked against the scheduler's
    speculative config (None: taken from it). ``group``: the KV-cache group whose
    blocks are the slots (None: the first mamba group). Steps are numbered by ``schedule`` calls from 0.
    Errors: :meth:`failed` (here: raised).
    """

    def __init__(
        self, v: Any, sched: Any, *, spec: int | None = None, seed: int | None = None, group: int | None = None
    ) -> None:
        import torch

        self.v, self.sched = v, sched
        self.vc, self.kvc = sched.vllm_config, sched.kv_cache_config
        if self.vc.cache_config.mamba_cache_mode != "align":
            raise EngineError(
                f"mamba_cache_mode = {self.vc.cache_config.mamba_cache_mode!r}: the recorder follows 'align' only"
            )
        sc = self.vc.speculative_config
        num_spec = int(sc.num_speculative_tokens) if sc is not None else 0
        if spec is not None and spec != (num_spec + 1 if num_spec else 0):
            raise EngineError(f"spec = {spec}: the scheduler runs {num_spec} speculative tokens (D = {num_spec + 1})")
        self.group = _mamba_group(v, self.kvc) if group is None else group
        gspec = self.kvc.kv_cache_groups[self.group].kv_cache_spec
        layer_name = self.kvc.kv_cache_groups[self.group].layer_names[0]
        sched_cfg = self.vc.scheduler_config
        self.d = Deployment(
            num_spec, int(gspec.block_size), int(self.kvc.num_blocks), int(sched_cfg.max_num_seqs),
            int(sched_cfg.max_num_batched_tokens), int(self.vc.model_config.max_model_len),
        )  # fmt: skip
        self.trace = SchedulerTrace(_header(v, self.d, seed, GDN))
        self.stats = self.trace.stats
        self.events = _PoolEvents(self.group, v.kv_cache_utils.get_group_id)
        self.builder = v.GDNAttentionMetadataBuilder(gspec, [layer_name], self.vc, torch.device("cpu"))
        self.copy_bufs = types.SimpleNamespace(mamba_group_ids=[self.group], mamba_spec=gspec, offset=0)
        self.writer = _TraceWriter(self.trace, num_spec)
        # the worker's state
        self.states: dict[str, _RequestState] = {}
        self.state_idx: dict[str, int] = {}  # the runner's mamba_state_idx
        self.num_accepted: dict[str, int] = {}
        self.seen: set[str] = set()
        self.number = 0  # schedule calls so far
        self.pending: tuple[Any, _Step] | None = None  # the step scheduled, before its update_from_output
        self.active = False
        self._restore: list[Any] = []

    # -- hooks -----------------------------------------------------------------------------------------
    def attach(self) -> None:
        """Wrap the scheduler's and the block pool's methods on their instances (once)."""
        if self._restore:
            raise EngineError("this recorder is attached already")
        sched = self.sched
        schedule, update = sched.schedule, sched.update_from_output

        def scheduled(*args: Any, **kwargs: Any) -> Any:
            so = schedule(*args, **kwargs)
            if self.active:
                try:
                    self.scheduled(so)
                except Exception as e:  # noqa: BLE001 -- failed() decides
                    self.failed(e)
            return so

        def updated(so: Any, output: Any, *args: Any, **kwargs: Any) -> Any:
            kept: dict[str, int] | None = None
            if self.active:
                try:  # what each row kept, read before vLLM trims a finishing request's tokens in place
                    kept = {r: len(output.sampled_token_ids[i]) for r, i in output.req_id_to_index.items()}
                except Exception as e:  # noqa: BLE001 -- failed() decides
                    self.failed(e)
            engine_out = update(so, output, *args, **kwargs)
            if self.active and kept is not None:
                try:
                    self.updated(so, kept, engine_out)
                except Exception as e:  # noqa: BLE001 -- failed() decides
                    self.failed(e)
            return engine_out

        self._restore = [
            patch(sched, "schedule", scheduled),
            patch(sched, "update_from_output", updated),
            *_observe(sched.kv_cache_manager.block_pool, self.events),
        ]
        self.active = True

    # -- after schedule --------------------------------------------------------------------------------
    def scheduled(self, so: Any) -> None:
        number = self.number
        self.number += 1
        if self.pending is not None:
            raise EngineError(
                f"step {number}: vllm scheduled again before step {self.pending[1].number}'s output came back "
                "(async scheduling or a batch queue): not modelled by the recorder"
            )
        sched_pubs, evictions = self.events.take()
        aborted = [r for r in sorted(so.finished_req_ids) if r in self.writer.rows.rows]
        if so.total_num_scheduled_tokens == 0:
            if sched_pubs or evictions:
                raise EngineError(f"step {number}: vllm scheduled nothing but changed its prefix cache")
            if not so.preempted_req_ids and not aborted:
                self.stats["empty_steps"] += 1
                return
        admitted, readmitted, preempted = self.update_states(so)
        s = _Step(number, [], admitted, readmitted, preempted, [], [], [], sched_pubs, evictions, [], {}, aborted)
        if so.total_num_scheduled_tokens == 0:  # a request preempted itself: nothing ran
            self.stats["empty_steps"] += 1
            self.writer.preempt(s)
            self.written()
            return
        order = list(
            self.v.sort_batch_req_ids(so.num_scheduled_tokens, so.scheduled_spec_decode_tokens, 1 + self.d.num_spec)
        )
        s.precopies = self.precopy(so, order)
        s.rows = self.rows(so, order)
        for rid in admitted:
            st = self.states[rid]
            if st.num_computed_tokens:
                block = st.block_ids[self.group][(st.num_computed_tokens - 1) // self.d.block_size]
                s.hits.append((rid, st.num_computed_tokens, block))
        s.metadata = self.metadata(s.rows)
        self.pending = (so, s)

    def update_states(self, so: Any) -> tuple[list[str], set[str], list[str]]:
        """The runner's ``_update_states``: drop finished and preempted requests, add new (and readmitted)
        ones, append new blocks. Returns (admitted, readmitted, preempted)."""
        preempted = sorted(so.preempted_req_ids or ())
        for rid in sorted(set(so.finished_req_ids) | set(preempted)):
            self.states.pop(rid, None)
            self.num_accepted.pop(rid, None)
        admitted, readmitted = [], set()
        for nr in so.scheduled_new_reqs:
            if nr.req_id in self.seen:
                readmitted.add(nr.req_id)
            self.seen.add(nr.req_id)
            prompt = len(nr.prompt_token_ids or ())
            self.states[nr.req_id] = _RequestState(nr.req_id, prompt, nr.block_ids, nr.num_computed_tokens)
            self.num_accepted[nr.req_id] = 1
            admitted.append(nr.req_id)
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            st = self.states[rid]
            st.num_computed_tokens = cached.num_computed_tokens[i]
            new = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids:
                raise EngineError(f"vllm resumed {rid} as a cached request (Model Runner V1 only): not modelled")
            if new is not None:
                for blocks, more in zip(st.block_ids, new, strict=True):
                    blocks.extend(more)
        return admitted, readmitted, preempted

    def precopy(self, so: Any, order: list[str]) -> list[tuple[str, int, int]]:
        """The real ``preprocess_mamba`` (host path): the pre-copies as (request, temporal source block,
        destination block); the accepted counts it resets."""
        import numpy as np

        batch = types.SimpleNamespace(
            req_ids=order, num_accepted_tokens_cpu=np.array([self.num_accepted[r] for r in order], dtype=np.int32)
        )
        calls: list[tuple[str, int, int, int]] = []
        with _recording_precopies(self.v.mamba_utils, calls):
            self.v.mamba_utils.preprocess_mamba(
                so, self.kvc, self.vc.cache_config, self.state_idx, batch, self.states, {}, {}, self.copy_bufs,
                align_ctx=None,
            )  # fmt: skip
        for i, r in enumerate(order):
            self.num_accepted[r] = int(batch.num_accepted_tokens_cpu[i])
        out = []
        for rid, src, dst, bias in calls:
            blocks = self.states[rid].block_ids[self.group]
            out.append((rid, blocks[src + bias], blocks[dst]))
        return out

    def rows(self, so: Any, order: list[str]) -> list[_Row]:
        spec_tokens = so.scheduled_spec_decode_tokens
        out = []
        for rid in order:
            st = self.states[rid]
            scheduled = so.num_scheduled_tokens[rid]
            drafts = list(spec_tokens.get(rid, ()))
            prefilling = st.num_computed_tokens < st.prompt_len
            if drafts:
                if len(drafts) != self.d.num_spec:
                    raise EngineError(
                        f"vllm scheduled {len(drafts)} of {self.d.num_spec} drafts for {rid}: a verify row of "
                        "fewer than D tokens has no place in a trace"
                    )
                kind = "verify"
            else:
                kind = "extend" if prefilling or scheduled > 1 else "decode"
            col = self.state_idx[rid]
            blocks = st.block_ids[self.group]
            window = blocks[col : col + 1 + self.d.num_spec]
            all_ids = self.sched.requests[rid].all_token_ids
            c = st.num_computed_tokens
            tokens = [int(all_ids[c]), *drafts] if drafts else [int(t) for t in all_ids[c : c + scheduled]]
            out.append(
                _Row(rid, kind, c, scheduled, drafts, tokens, list(window), col, prefilling, list(blocks),
                     self.num_accepted[rid])
            )  # fmt: skip
        self._check_windows(out)
        return out

    def _check_windows(self, rows: list[_Row]) -> None:
        """Each window is ``1 + spec`` distinct real blocks, and the scheduler's row holds the same there."""
        mgr = self.sched.kv_cache_manager.coordinator.single_type_managers[self.group]
        for r in rows:
            held = [b.block_id for b in mgr.req_to_blocks[r.req]][r.state_col : r.state_col + 1 + self.d.num_spec]
            if len(r.window) != 1 + self.d.num_spec or 0 in r.window or len(set(r.window)) != len(r.window):
                raise EngineError(f"request {r.req}: window {r.window} at column {r.state_col} is not whole")
            if held != r.window:
                raise EngineError(f"request {r.req}: the worker's window {r.window}, the scheduler's {held}")

    def metadata(self, rows: list[_Row]) -> dict[str, Any]:
        """``GDNAttentionMetadataBuilder.build`` on the step's CAM (unpadded, as a CPU run builds it), under
        vLLM's names."""
        import torch

        n = len(rows)
        lens = torch.tensor([r.scheduled for r in rows], dtype=torch.int32)
        qsl = torch.zeros(n + 1, dtype=torch.int32)
        torch.cumsum(lens, 0, out=qsl[1:])
        seq = torch.tensor([r.computed + r.scheduled for r in rows], dtype=torch.int32)
        width = max(len(r.block_row) for r in rows) + 1 + self.d.num_spec
        table = torch.zeros((n, width), dtype=torch.int32)
        for i, r in enumerate(rows):
            table[i, : len(r.block_row)] = torch.tensor(r.block_row, dtype=torch.int32)
        tokens = int(qsl[-1])
        cam = self.v.CommonAttentionMetadata(
            query_start_loc=qsl,
            query_start_loc_cpu=qsl.clone(),
            seq_lens=seq,
            num_reqs=n,
            num_actual_tokens=tokens,
            max_query_len=int(lens.max()),
            max_seq_len=int(seq.max()),
            block_table_tensor=table,
            slot_mapping=torch.full((tokens,), -1, dtype=torch.int64),
            causal=True,
            is_prefilling=torch.tensor([r.prefilling for r in rows], dtype=torch.bool),
            seq_lens_cpu_upper_bound=seq.clone(),
        )
        decode_like = [len(r.drafts) if (not r.prefilling and r.scheduled <= 1 + self.d.num_spec) else -1 for r in rows]
        md = self.builder.build(
            0,
            cam,
            num_accepted_tokens=torch.tensor([r.num_accepted for r in rows], dtype=torch.int32),
            num_decode_draft_tokens_cpu=torch.tensor(decode_like, dtype=torch.int32),
        )
        out: dict[str, Any] = {"query_start_loc": qsl.tolist()}
        for name in TENSOR_KEYS:
            value = getattr(md, name)
            out[name] = None if value is None else value.tolist()
        for name in COUNT_KEYS:
            out[name] = int(getattr(md, name))
        if md.has_initial_state is not None:
            out["has_initial_state"] = md.has_initial_state.tolist()
        return out

    # -- after update_from_output ----------------------------------------------------------------------
    def updated(self, so: Any, kept: dict[str, int], engine_out: Any) -> None:
        """The step's second half: ``kept`` is the tokens each row's output held (``sampled_token_ids``,
        before ``update_from_output``), ``engine_out`` what ``update_from_output`` returned."""
        pending, self.pending = self.pending, None
        update_pubs, more_evictions = self.events.take()
        if pending is None or pending[0] is not so:
            if pending is not None or update_pubs or more_evictions:
                raise EngineError("vllm's update_from_output came back for a step the recorder did not schedule")
            return  # an empty step
        s = pending[1]
        if more_evictions:
            raise EngineError(f"step {s.number}: vllm evicted blocks {more_evictions} after the forward")
        for r in s.rows:
            r.kept = kept[r.req]
            copy, self.num_accepted[r.req] = post_copy(
                r.state_col, r.scheduled, r.computed, len(r.drafts), max(r.kept, 1), self.d.block_size
            )
            if copy is not None:
                bias, dest = copy
                blocks = self.states[r.req].block_ids[self.group]
                s.postcopies.append((r.req, r.window[bias], blocks[dest]))
        s.publishes = s.publishes + update_pubs
        s.finished = _finished(engine_out)
        _count(self.stats, s)
        self.writer.add(s)
        self.written()


def _header(v: Any, d: Deployment, seed: int | None, layer: str) -> dict[str, Any]:
    return trace_header(
        "vllm", version=v.version, commit=v.commit, max_running=d.max_num_seqs,
        draft_tokens=d.num_spec + 1 if d.num_spec else 0, num_slots=d.num_blocks, seed=seed, layer=layer,
        accepted="tokens",
    )  # fmt: skip


def _count(stats: Counter[str], s: _Step) -> None:
    """What a step did, added to ``stats``."""
    kinds = Counter(r.kind for r in s.rows)
    stats["steps"] += 1
    stats[f"steps_{step_mode(list(kinds))}"] += 1
    if kinds["verify"] and (kinds["extend"] or kinds["decode"]):
        stats["steps_verify_with_others"] += 1
    for kind, n in kinds.items():
        stats[f"rows_{kind}"] += n
    stats["admitted"] += len(s.admitted)
    stats["hits"] += len(s.hits)
    stats["precopies"] += len(s.precopies)
    stats["postcopies"] += len(s.postcopies)
    stats["published"] += len(s.publishes)
    windows = {b: r.req for r in s.rows for b in r.window[:1]}
    stats["published_running"] += sum(windows.get(block) == req for req, block, _ in s.publishes)
    stats["evicted"] += len(s.evictions)
    stats["finished"] += len(s.finished)


__all__ = ["COUNT_KEYS", "TENSOR_KEYS", "Deployment", "PostCopy", "Recorder", "post_copy"]
