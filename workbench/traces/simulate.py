"""A seeded scheduler simulator: a :class:`~workbench.traces.model.Trace` of one layer's serving steps.

Requests arrive at random (a prompt length and an output length each), wait, are admitted under a token
budget and a cap on running requests, get a request-pool row and a state slot from a real
:class:`~workbench.pool.StatePool`, are prefilled in chunks, decode (or, with ``spec=D``, run speculative
target-verify steps with a random number of accepted tokens), finish and free their row and slot, which a
later request then reuses: fragmentation (live rows that are not contiguous) and slot reuse happen by
themselves. Same arguments, same trace: every draw comes from one ``random.Random(seed)``.

The modelling choices, each as the engines make it or as the workbench can replay it:

* **Token accounting.** A request's ``cached_tokens`` are the tokens already folded into its state; a row
  feeds ``new_tokens`` and its ``seq_len`` is ``cached_tokens + new_tokens`` in every mode (a decode's
  ``seq_len`` counts its new token; a verify's counts all D fed tokens). The last prefill chunk samples the
  first output token; a decode samples one more; a verify of ``accepted`` tokens samples ``accepted``
  (``accepted - 1`` drafts kept plus the bonus token), and its state then holds ``cached_tokens +
  accepted`` tokens. A request finishes once it sampled ``output_len`` tokens (a verify may overshoot by
  up to D - 1, as an engine's does before it trims); its row and slots are freed after that step.
* **Verify and accept.** ``accepted`` of a verify row is in 1..D: the first fed token (the last sampled
  one) is always kept, each draft after it is kept with probability ``accept_rate`` until the first
  rejection. That is what ``GraphRunner.accept`` takes (sglang: scatter the intermediate state of token
  ``accepted - 1`` back to the slot, after the step) and what vLLM carries into the request's *next*
  verify as ``num_accepted_tokens`` (its state sits in slot ``accepted - 1`` of the request's D slots):
  :func:`to_batch` takes those counts as ``num_accepted``; :func:`iter_batches` tracks them over a trace.
* **Draft trees** (``topk > 1``, sglang's ``speculative_eagle_topk``): each verify row's D tokens are the
  nodes of a tree drawn by ``DraftTree.random(1, D, topk, seed=...)`` (its seed from the simulation's rng),
  written as the row's ``tree``; the row accepts a root-to-node path (from the root, while the node has
  children and a draw is below ``accept_rate``, step to a child chosen at random), ``accepted`` is the
  path's length, and the step's ``metadata`` records sglang's ``accept_index`` (global ids ``b * D + node``,
  -1 after each path; width the step's deepest tree + 1). The row feeds the last sampled id then D - 1 draft
  ids in node order and keeps the ids of its path's nodes; ``extra_buffer`` tracks the path's node at the
  track depth. With ``topk == 1`` no draw changes: a seed's chain trace is what it always was.
  With ``spec > 0`` every decode-phase request verifies (there are no plain decode rows), so a vLLM
  request's state never has to be read from slot 0 after a verify; sglang's mixed steps are the exception
  ("Step choice").
* **Chunked prefill.** A prompt is fed ``min(remaining, chunk_size, budget left)`` tokens per extend row;
  the first chunk has ``cached_tokens`` 0 (no initial state), later ones the tokens before. A one-token
  piece is never split off a longer remainder (vLLM would class a one-token row as a decode), so a
  one-token extend row is always the tail of a prompt (``cached_tokens > 0``).
* **Step choice.** Without ``mixed``, a step is either ``extend`` (prefill chunks only: continuing prompts
  first, then new admissions, first come first served) or ``decode`` / ``target_verify`` (decode-phase
  requests, oldest first). Prefill goes first, as sglang's scheduler does, but never twice in a row while
  requests wait to decode (so a long prompt's chunks interleave with decode steps). With ``mixed``, every
  step takes the decode-phase rows first (they come first in the budget in both engines) and fills the
  rest of the budget with prefill chunks; a step that has both is ``mixed``. With ``mixed`` and ``spec``,
  under vLLM (``MIXED_VERIFY_ENGINES``: vLLM 0.33.0 batches verify rows with prefill chunks, in 56% of the
  steps of a run of its real scheduler) the decode-phase rows are verify rows of D tokens. sglang keeps
  mixed chunked prefill under chain EAGLE / MTP (``SGLANG_MIXED_SPEC``) but never verifies beside a
  prefill: a step with prefill work takes the decode-phase rows as one-token decode rows (a plain decode
  of the pending token: the state and ``sampled`` advance by one, no draft, never tracked) and fills the
  rest of the budget with prefill chunks; a step without prefill work (or whose chunks do not fit) is a
  ``target_verify`` step of D tokens per row, as without ``mixed``. So a sglang trace with ``mixed`` and
  ``spec`` holds verify rows and decode rows, never in one step (a run of sglang 0.5.23's real scheduler
  under EAGLE with mixed chunk has its MIXED steps so).
* **Row kinds.** Every row says its ``kind``: ``"extend"`` for a prompt chunk (a one-token prompt tail
  too), ``"verify"`` for a decode-phase row under speculation (but in sglang's mixed steps), else
  ``"decode"``; a step that is not mixed holds rows of its mode's kind only.
* **Row order.** Decode and verify rows: oldest request first. A mixed step keeps each engine's order:
  sglang (and sglang-ascend) extend rows first and the one-token decode rows last (``ForwardMode.MIXED``:
  decodes are the tail, ``num_decodes = bs - num_prefills``); vLLM one-token rows first, then the longer
  ones (``torch.split([num_decodes, num_prefills])``; a one-token prompt tail is a decode to vLLM too, so
  it sits with them, in extend steps as well: V1's reorder). A vLLM trace with mixed steps and speculation
  follows the V2 model runner's batch order (``sort_batch_req_ids``) in every step, as the real scheduler
  run does: verify rows first (oldest first), then the other rows by ``(new_tokens != D, new_tokens)``;
  the other vLLM traces keep V1's order, as they did before V2 was measured.
* **Admission.** A waiting request is admitted (``pool.alloc(1)``; listed in the step's ``admit``) at the
  step where it first runs, when the budget has room for it, fewer than ``max_running`` requests are live
  and the pool has a free row. Arrivals beyond ``max_waiting`` queued requests are turned away (the
  client backs off), so a long run keeps a bounded queue.
* **Zeroing and rows.** A sglang trace's header says ``zero_on_alloc`` (``Profile.zero_on_alloc``: sglang
  clears a slot it hands to a request, ``mamba_needs_clear``; vLLM 0.33.0 zeroes no mamba block) and the
  replay follows it. A request keeps its request-pool row for its life, as both real schedulers' traces
  record it (sglang's ``req_pool_idx``; vLLM's drivers give each request a stable row of their own, since
  ``condense()`` moves V1's batch indices), so the simulator moves no row either.
* **Idle and DP dummies.** A step with nothing to run is ``idle`` (the step count is the trace's clock).
  With ``dp_dummies``, this engine is one data-parallel rank: with probability ``dp_dummy_rate`` a step
  carries none of its rows while its requests hold their slots (the other ranks run; this one runs a dummy
  batch), the case of vLLM PR #37728 / #49757 (dummy runs writing through stale rows).
* **Disaggregated decode.** With ``prefill=False`` a trace models a decode instance, where a request arrives
  with its prompt prefilled elsewhere (``cached_tokens = prompt_len``, first token sampled) and decodes from
  its first step; ``mixed`` and a prefix cache are refused with it. Both layers prefill by default (Mamba2's
  extend is the chunk scan, ``kernels.mamba2.chunk_scan``) and verify with ``spec`` (Mamba2's through the
  selective state update's per-step states); a layer without a verify step would refuse ``spec``.
* **Prefix caching** (``prefix_cache=...``, ``docs/traces.md`` "Prefix caching"): a strategy of
  :mod:`workbench.traces.strategies` (sglang's ``no_buffer`` and ``extra_buffer``, vLLM's ``align``; the
  ones a profile has are ``Profile.prefix_caches``) gives every row its ``tokens`` and every step the cache's
  work in ``metadata``. The scheduler calls it at admission, when it sizes a prefill chunk, before a step's
  rows are laid out (states that move), after the forward (tracking), at a prompt's last chunk and at a
  finish; what each strategy does then is its class's docstring.

The parameters are the fields of :class:`~workbench.traces.config.SimConfig`, which checks them:
``simulate(config)`` runs one, ``simulate(profile, layer, steps=..., ...)`` builds it from the arguments.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, overload

from workbench.metadata.tree import DraftTree
from workbench.pool import StatePool
from workbench.traces.config import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CACHE_CHUNK,
    DEFAULT_DRAFT_TOKENS,
    DEFAULT_MAX_BS,
    DEFAULT_TRACK_INTERVAL,
    SimConfig,
    SimPlan,
)
from workbench.traces.model import Trace, TraceHeader, TraceRow, TraceStep
from workbench.traces.steps import (
    SimulationError,
    iter_batches,
    new_pool,
    slots_per_request,
    to_batch,
    verify_track_step,
)
from workbench.traces.strategies import (
    CONV_WINDOW,
    EXTRA_BUFFER_SLOTS,
    PREFIX_CACHES,
    PREFIX_CACHES_NOT_BUILT,
    STRATEGIES,
    TRACK_KEYS,
    NoBuffer,
    Request,
)


# -- the simulation ---------------------------------------------------------------------------------------
@overload
def simulate(config: SimConfig, /, **overrides: Any) -> Trace: ...
@overload
def simulate(profile: str = ..., layer: str = ..., /, **fields: Any) -> Trace: ...
def simulate(*args: Any, **kw: Any) -> Trace:
    """Simulate ``steps`` scheduler steps of one layer under one engine profile (see the module docstring).

    ``simulate(config)`` runs a :class:`~workbench.traces.config.SimConfig` (its fields are the parameters,
    documented there); ``simulate(config, seed=3)`` runs ``dataclasses.replace(config, seed=3)`` (keywords
    override fields, validated again); ``simulate(profile, layer, steps=..., ...)`` and
    ``simulate(profile=..., ...)`` build the config from the arguments, the fields' defaults for the rest. A
    bad value raises :class:`SimulationError` naming the field and the value.

    Returns:
        a :class:`Trace` whose header names the profile, layer, ``num_slots``, buckets (the graph modes the
        layer captures), ``draft_tokens`` (``spec``, or 2 without speculation) and ``seed``.

    >>> t = simulate("vllm", steps=50, seed=1, mixed=True)
    >>> t.header.profile, len(t), sorted(t.header.buckets)
    ('vllm', 50, ['decode', 'target_verify'])
    >>> simulate(SimConfig("vllm", steps=50, seed=1, mixed=True)) == t
    True
    """
    config = _config_of(args, kw)
    plan = config.plan
    pool = StatePool(plan.num_slots, plan.profile, slots_per_request=plan.slots_per_request)
    header = TraceHeader(
        plan.profile.name, config.layer, pool.num_slots, plan.buckets, draft_tokens=plan.draft_tokens,
        seed=config.seed, zero_on_alloc=plan.profile.zero_on_alloc, topk=config.topk,
    )  # fmt: skip
    rng = random.Random(config.seed)  # every draw, in one order: the prefixes first, then step by step
    sched = _Scheduler(pool, rng, _new_cache(plan, pool, rng), config)
    out: list[TraceStep] = []
    for t in range(config.steps):
        sched.arrive()
        if config.dp_dummies and sched.running and rng.random() < plan.dp_dummy_rate:
            out.append(TraceStep(t, "idle"))  # the DP group's step carries none of this rank's rows
            sched.last_mode = "idle"
            continue
        out.append(sched.step(t))
    return Trace(header, out)


def _config_of(args: tuple[Any, ...], kw: dict[str, Any]) -> SimConfig:
    """The config ``simulate(*args, **kw)`` runs: a SimConfig given first (keywords replace its fields), or
    one built from the arguments."""
    if args and isinstance(args[0], SimConfig):
        if len(args) > 1:
            raise TypeError(
                f"simulate(config, ...): {len(args) - 1} more positional argument(s); give fields as keywords "
                "(they replace the config's)"
            )
        return dataclasses.replace(args[0], **kw) if kw else args[0]
    return SimConfig(*args, **kw)


def _new_cache(plan: SimPlan, pool: StatePool, rng: random.Random) -> NoBuffer | None:
    """The prefix cache's strategy on ``pool`` (it draws the shared prefixes from ``rng`` first), or None."""
    if plan.strategy is None or plan.cache is None:
        return None
    return plan.strategy.create(pool, rng, plan.cache)


def _poisson(rng: random.Random, rate: float) -> int:
    if rate <= 0.0:
        return 0
    limit, k, p = math.exp(-rate), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


@dataclass
class _Work:
    """One step's work before its rows are laid out: prefill chunks ``(request, tokens)`` (continuing prompts
    first, then admissions), decode-phase requests (oldest first), the ids admitted at the step; then, drawn,
    each decoder's accepted count (1 without speculation) and the ids each chunk and each decoder feeds
    (None without a prefix cache), index for index; under draft trees each verify row's tree (parents) and the
    root-first path it accepted (None for chains). ``tails``: the decoders are sglang's one-token decode rows
    of a mixed step under speculation (not verify rows)."""

    chunks: list[tuple[Request, int]] = field(default_factory=list)
    decoders: list[Request] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    fed_chunks: list[tuple[int, ...] | None] = field(default_factory=list)
    fed_decoders: list[tuple[int, ...] | None] = field(default_factory=list)
    trees: list[tuple[int, ...] | None] = field(default_factory=list)
    paths: list[tuple[int, ...] | None] = field(default_factory=list)
    tails: bool = False


class _Scheduler:
    """The running and waiting requests, and one step's choice (see the module docstring)."""

    def __init__(self, pool: StatePool, rng: random.Random, cache: NoBuffer | None, config: SimConfig) -> None:
        plan = config.plan
        self.pool, self.rng, self.cache = pool, rng, cache
        self.spec, self.mixed, self.prefill = config.spec, config.mixed, plan.prefill
        self.topk = config.topk
        self.decodes_first = plan.profile.decodes_first
        self.chunk_size, self.token_budget = config.chunk_size, config.token_budget
        self.max_running, self.max_waiting = plan.max_running, plan.max_waiting
        self.tokens_per_decode, self.accept_rate = config.spec or 1, plan.accept_rate
        self.mixed_tails = config.mixed_tails  # sglang: a step that prefills decodes its running requests
        self.arrival_rate, self.prompt_lens, self.output_lens = plan.arrival_rate, plan.prompt_lens, plan.output_lens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order
        self.last_mode = "idle"
        self.next_id = 0

    # -- requests in and out --------------------------------------------------------------------------
    def arrive(self) -> None:
        """This step's arrivals (Poisson, ``arrival_rate``), queued while fewer than ``max_waiting`` wait and
        turned away beyond (each takes a request id either way)."""
        for _ in range(_poisson(self.rng, self.arrival_rate)):
            if len(self.waiting) < self.max_waiting:
                req = Request(self.next_id, self.rng.randint(*self.prompt_lens), self.rng.randint(*self.output_lens))
                if self.cache is not None:
                    req.prompt = self.cache.prompt(req.prompt_len)
                    req.prompt_len = len(req.prompt)
                self.waiting.append(req)
            self.next_id += 1

    def can_admit(self) -> bool:
        if not self.waiting or len(self.running) >= self.max_running:
            return False
        return self.pool.num_free > 0 if self.cache is None else self.cache.can_place()

    def admit(self) -> Request | None:
        req = self.waiting[0]
        if self.cache is not None:
            if not self.cache.admit(req):
                return None
        else:
            req.row = int(self.pool.alloc(1)[0])
            req.slot = self.pool.slots_of(req.row)[0]
        self.waiting.popleft()
        self.running.append(req)
        return req

    # -- one step -------------------------------------------------------------------------------------
    def step(self, t: int) -> TraceStep:
        """Step ``t``: choose its work, let the cache move states, draw what the rows feed, lay the rows out,
        fold the tokens into the requests, and retire the requests that are done."""
        work = self._choose()
        if not work.chunks and not work.decoders:
            self.last_mode = "idle"
            # nothing was admitted (an admission always brings a chunk), so the cache did nothing either
            return TraceStep(t, "idle", metadata=None if self.cache is None else self.cache.end_step())
        if self.cache is not None:  # align: states entering a new block move there (their rows name the new slot)
            self.cache.place(work.chunks + [(r, self._fed(work)) for r in work.decoders], work.admitted)
        self._draw(work)
        mode = _mode_of(work, self.spec)
        rows = self._rows(work, mode)
        self._advance(work)
        done = [r for r in self.running if r.done]
        metadata = self._retire(work, mode, rows, done)
        if any(p is not None for p in work.paths):  # sglang's verify outcome under draft trees
            metadata = {**(metadata or {}), "accept_index": _accept_index(work)}
        self.last_mode = mode
        return TraceStep(t, mode, tuple(rows), tuple(work.admitted), tuple(r.id for r in done), metadata)

    def _fed(self, work: _Work) -> int:
        """The tokens each decoder of ``work`` feeds: D for a verify row, 1 for a decode row."""
        return 1 if work.tails else self.tokens_per_decode

    def _choose(self) -> _Work:
        """The step's work ("Step choice"): with ``mixed``, the decode-phase rows first and prefill chunks in
        the budget left (sglang under speculation: :meth:`_choose_tails`); else prefill chunks (not twice in a
        row while requests wait to decode) or the decode-phase rows, which a decode instance (no prefill) fills
        with requests arriving prefilled."""
        work, left = _Work(), self.token_budget
        decode_phase = [r for r in self.running if not r.prefilling]
        prefill_work = self.prefill and (len(decode_phase) < len(self.running) or self.can_admit())
        if self.mixed_tails:
            return self._choose_tails(decode_phase, prefill_work)
        if self.mixed:
            left = self._take_decoders(decode_phase, work.decoders, left)
            self._take_chunks(work, left)
        elif prefill_work and (not decode_phase or self.last_mode != "extend"):
            self._take_chunks(work, left)
        elif decode_phase or (not self.prefill and self.can_admit()):
            left = self._take_decoders(decode_phase, work.decoders, left)
            self._admit_prefilled(work, left)
        return work

    def _choose_tails(self, decode_phase: list[Request], prefill_work: bool) -> _Work:
        """sglang's step under speculation with mixed chunks: with prefill work, the decode-phase rows as
        one-token decode rows first in the budget (sglang's ``mixed_with_decode_tokens``) and prefill chunks in
        the rest; a step without prefill work, or whose chunks do not fit, verifies the decode-phase rows."""
        work = _Work()
        if prefill_work:
            left = self._take_decoders(decode_phase, work.decoders, self.token_budget, 1)
            self._take_chunks(work, left)
            if work.chunks:  # no chunk means no admission either: the step is a verify step
                work.tails = bool(work.decoders)
                return work
            work.decoders.clear()
        self._take_decoders(decode_phase, work.decoders, self.token_budget)
        return work

    def _take_decoders(
        self, decode_phase: list[Request], decoders: list[Request], left: int, tokens: int | None = None
    ) -> int:
        """The oldest decode-phase requests whose rows (``tokens`` each, D or 1 by default) fit ``left``; the
        budget left."""
        per_row = self.tokens_per_decode if tokens is None else tokens
        n = min(len(decode_phase), left // per_row)
        decoders.extend(decode_phase[:n])
        return left - n * per_row

    def _chunk(self, r: Request, left: int) -> int:
        """The prefill chunk ``r`` feeds with ``left`` tokens of budget (the cache may round it)."""
        n = min(r.prompt_len - r.cached, self.chunk_size, left)
        return n if self.cache is None else self.cache.chunk(r, n)

    def _take_chunks(self, work: _Work, left: int) -> int:
        """Prefill chunks in ``left`` tokens of budget: the running prompts' next chunks, then admissions (first
        come, first served) while the budget, the running cap, the pool and the cache allow."""
        for r in self.running:
            if not r.prefilling or left <= 0:
                continue
            n = self._chunk(r, left)
            if n <= 0 or (n == 1 and r.prompt_len - r.cached > 1):
                continue  # never split a one-token piece off a longer remainder (none: no block end fits)
            work.chunks.append((r, n))
            left -= n
        while left >= 2 and self.can_admit() and (self.cache is None or self.cache.can_start(self.waiting[0], left)):
            req = self.admit()
            if req is None:
                break
            work.admitted.append(req.id)
            n = self._chunk(req, left)  # a hit starts past its cached tokens
            assert n > 0  # can_start saw to it
            work.chunks.append((req, n))
            left -= n
        return left

    def _admit_prefilled(self, work: _Work, left: int) -> None:
        """A decode instance's admissions: requests prefilled elsewhere (their first token sampled) join the
        decode rows while the budget has room for their tokens."""
        while not self.prefill and left >= self.tokens_per_decode and self.can_admit():
            req = self.admit()
            assert req is not None  # no prefix cache without prefill: the pool had a free slot
            req.cached, req.sampled = req.prompt_len, 1
            work.admitted.append(req.id)
            work.decoders.append(req)
            left -= self.tokens_per_decode

    def _draw(self, work: _Work) -> None:
        """Each decoder's accepted count (``spec``; under draft trees its tree and accepted path), then, with a
        prefix cache, the ids each row feeds: a prompt piece; the last sampled id then D - 1 drafts. In that
        order: one rng draws both."""
        verify = self.spec and not work.tails
        work.trees = [None] * len(work.decoders)
        work.paths = [None] * len(work.decoders)
        if verify and self.topk > 1:
            for i in range(len(work.decoders)):
                work.trees[i], work.paths[i] = self._draw_tree()
            work.accepted = [len(p or ()) for p in work.paths]
        else:
            work.accepted = [self._draw_accepted() for _ in work.decoders] if verify else [1] * len(work.decoders)
        cache = self.cache
        if cache is None:
            work.fed_chunks, work.fed_decoders = [None] * len(work.chunks), [None] * len(work.decoders)
            return
        work.fed_chunks = [r.prompt[r.cached : r.cached + n] for r, n in work.chunks]
        drafts = self._fed(work) - 1
        work.fed_decoders = [(r.pending, *(cache.token() for _ in range(drafts))) for r in work.decoders]

    def _draw_accepted(self) -> int:
        a = 1
        while a < self.spec and self.rng.random() < self.accept_rate:
            a += 1
        return a

    def _draw_tree(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """A verify row's draft tree (parents; ``DraftTree.random`` seeded from the rng) and the root-first path
        it accepts: from the root, while the node has children and a draw is below ``accept_rate``, a child
        chosen at random."""
        seed = self.rng.randrange(2**62)
        parents = tuple(DraftTree.random(1, self.spec, self.topk, seed=seed).parents[0].tolist())
        children: dict[int, list[int]] = {}
        for t, p in enumerate(parents):
            children.setdefault(p, []).append(t)
        path = [0]
        while children.get(path[-1]) and self.rng.random() < self.accept_rate:
            path.append(self.rng.choice(children[path[-1]]))
        return parents, tuple(path)

    def _rows(self, work: _Work, mode: str) -> list[TraceRow]:
        """The step's rows, each with its ``kind``, in the engine's order ("Row order"): decode and verify rows
        oldest first; under vLLM with verify rows in mixed steps, V2's batch order (verify rows, then the
        others by length); else a mixed or extend step's one-token rows first under vLLM (``decodes_first``,
        stable), extend rows first under sglang."""
        windows = self.cache is not None and self.cache.names_slots  # align with speculation: rows name them
        rows_ext = [
            TraceRow(r.id, r.row, r.slot, r.cached + n, n, r.cached, None, ids, self._slots(r, windows), "extend")
            for (r, n), ids in zip(work.chunks, work.fed_chunks, strict=True)
        ]
        d, spec = self._fed(work), self.spec and not work.tails
        kind = "verify" if spec else "decode"  # a decode-phase row (a one-token prompt tail is an extend row)
        rows_dec = [
            TraceRow(
                r.id, r.row, r.slot, r.cached + d, d, r.cached, a if spec else None, ids, self._slots(r, windows), kind,
                tree,
            )
            for r, a, ids, tree in zip(work.decoders, work.accepted, work.fed_decoders, work.trees, strict=True)
        ]  # fmt: skip
        if mode == "decode" or mode == "target_verify":
            return rows_dec
        if self.decodes_first and self.mixed and spec:  # vLLM V2's sort_batch_req_ids
            return rows_dec + sorted(rows_ext, key=lambda r: (r.new_tokens != d, r.new_tokens))
        if self.decodes_first:  # vLLM: every one-token row is a decode, laid first (stable)
            both = rows_dec + rows_ext
            return [r for r in both if r.new_tokens == 1] + [r for r in both if r.new_tokens != 1]
        return rows_ext + rows_dec

    def _slots(self, req: Request, windows: bool) -> tuple[int, ...] | None:
        return tuple(self.pool.slots_of(req.row)) if windows else None

    def _advance(self, work: _Work) -> None:
        """Fold each row's tokens into its request ("Token accounting"): a chunk's (the prompt's last samples
        the first output token), a decoder's accepted ones (sampled too); with a prefix cache, the ids fed and
        the next sampled id (drawn)."""
        cache = self.cache
        for (r, n), ids in zip(work.chunks, work.fed_chunks, strict=True):
            r.cached += n
            if cache is not None:
                r.fed.extend(ids or ())
            if not r.prefilling:
                r.sampled += 1  # the last chunk samples the first output token
                if cache is not None:
                    r.pending = cache.token()
        for r, a, ids, path in zip(work.decoders, work.accepted, work.fed_decoders, work.paths, strict=True):
            r.cached += a
            r.sampled += a
            r.path = path
            if cache is not None:  # the ids of the `a` accepted nodes are kept; the step samples the next (the bonus)
                fed = ids or ()
                r.fed.extend(fed[:a] if path is None else tuple(fed[n] for n in path))
                r.pending = cache.token()

    def _retire(self, work: _Work, mode: str, rows: list[TraceRow], done: list[Request]) -> dict[str, Any] | None:
        """After the step: the cache tracks, checkpoints and finishes (its metadata returned), or the pool
        frees the rows of the requests ``done``; they leave the running list."""
        gone = {r.id for r in done}
        metadata = None
        if self.cache is not None:
            metadata = _cache_after(self.cache, work, mode, rows, done, gone)
        elif done:
            self.pool.free([r.row for r in done])
        if done:
            self.running = [r for r in self.running if r.id not in gone]
        return metadata


def _accept_index(work: _Work) -> list[list[int]]:
    """sglang's ``accept_index`` of a verify step under draft trees: per verify row ``b`` (row order) its
    accepted path as global ids ``b * D + node``, then -1, as wide as the step's deepest tree + 1."""
    trees = DraftTree.from_parents([list(t or ()) for t in work.trees])
    return trees.accept_index([list(p or ()) for p in work.paths]).tolist()


def _mode_of(work: _Work, spec: int) -> str:
    if work.chunks and work.decoders:
        return "mixed"
    if work.chunks:
        return "extend"
    return "target_verify" if spec else "decode"


def _cache_after(
    cache: NoBuffer, work: _Work, mode: str, rows: list[TraceRow], done: list[Request], gone: set[int]
) -> dict[str, Any] | None:
    """The cache's work after the forward, in order: tracking (rows in row order), a prompt's end for the
    requests that run on (one finishing now donates instead: no copy for a finished request), the finishes;
    then the step's metadata."""
    reqs: dict[int, tuple[Request, int | None, int]] = {r.id: (r, n, n) for r, n in work.chunks}
    reqs.update({r.id: (r, None, a) for r, a in zip(work.decoders, work.accepted, strict=True)})
    cache.track(mode, [reqs[row.id] for row in rows])
    for r, _ in work.chunks:
        if not r.prefilling and r.id not in gone:
            cache.prefilled(r)
    for r in done:
        cache.finish(r)
    return cache.end_step()


__all__ = [
    "CONV_WINDOW",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_CACHE_CHUNK",
    "DEFAULT_DRAFT_TOKENS",
    "DEFAULT_MAX_BS",
    "DEFAULT_TRACK_INTERVAL",
    "EXTRA_BUFFER_SLOTS",
    "PREFIX_CACHES",
    "PREFIX_CACHES_NOT_BUILT",
    "STRATEGIES",
    "TRACK_KEYS",
    "SimConfig",
    "SimulationError",
    "iter_batches",
    "new_pool",
    "simulate",
    "slots_per_request",
    "to_batch",
    "verify_track_step",
]
