"""The simulator's prefix caches of recurrent states: one class per strategy, and :data:`STRATEGIES`.

A strategy is the engine's mamba prefix cache as :func:`~workbench.traces.simulate.simulate` models it
(``prefix_cache=...``; ``docs/traces.md``, "Prefix caching"): the tree of checkpoints
(:class:`~workbench.traces.radix.RadixCache`) in pool slots (``StatePool.hold``), at most ``max_cached`` of
them, the prompts' token ids, and what it did at the current step (the step's ``metadata``). The scheduler
(``simulate``'s ``_Scheduler``) calls it at fixed points of a step, in this order: ``admit`` (a row and
slots, a hit), ``chunk`` / ``can_start`` (how much of a prompt a row feeds), ``place`` (states that move
before the step's rows are laid out), ``track`` (after the forward), ``prefilled`` (a prompt's last chunk
ran), ``finish``, ``end_step`` (the metadata).

What every strategy shares (:class:`NoBuffer`'s): every row carries its ``tokens``. ``shared_prefixes``
system prompts (lengths uniform in ``prefix_len``, ids below ``vocab``) are drawn once per trace; a
request's prompt is the first ``prompt_len`` tokens of one of them, then its own random ids up to
``prompt_len`` (so prompts share prefixes, and a short one ends inside one). With probability
``followup_rate`` a request is instead the next turn of a finished one: its whole conversation (prompt,
every generated token) then new ids, up to ``prompt_lens``' high end. Generated tokens and drafts are
random ids; a verify row feeds the last sampled token then D - 1 drafts and keeps the first ``accepted``
(under draft trees: the ids of the nodes of its accepted path).
``metadata`` then holds only the prefix keys (``PREFIX_KEYS``, then ``TRACK_KEYS``) non-empty at the step,
or None.

The strategies: :class:`NoBuffer` and :class:`ExtraBuffer` (sglang's mamba radix cache; profiles sglang and
sglang-ascend), :class:`Align` and, with speculation, :class:`AlignSpec` (vLLM's ``mamba_cache_mode="align"``;
profile vllm); which profile has which is ``Profile.prefix_caches``. Adding one is a class here and an entry
in :data:`STRATEGIES` (and the profile's ``prefix_caches``; a new option, a field of
:class:`~workbench.traces.config.SimConfig` named in the class's ``options``).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from workbench.layer_names import DEFAULT_LAYER
from workbench.layers import LAYERS
from workbench.pool import StatePool
from workbench.traces.model import (
    CHUNK_TRACK_FIELDS,
    FINAL_TRACK_FIELDS,
    PREFIX_KEYS,
    RECOMPUTE_FIELDS,
    TRACK_FIELDS,
    VERIFY_TRACK_FIELDS,
)
from workbench.traces.radix import RadixCache
from workbench.traces.steps import SimulationError, verify_track_step

CONV_WINDOW = LAYERS[DEFAULT_LAYER].config("small").conv_kernel - 1
"""Input positions in a conv window of the replayed layers (``track_conv_indices`` gathers that many; every
layer's small config has ``conv_kernel`` 4: ``tests/test_layers_registry.py``)."""

EXTRA_BUFFER_SLOTS = 3
"""Pool slots an ``extra_buffer`` request holds while live: its running slot and 2 ping-pong track slots."""

TRACK_KEYS = (
    *TRACK_FIELDS, *(k for k in VERIFY_TRACK_FIELDS if k not in TRACK_FIELDS), *FINAL_TRACK_FIELDS,
    *CHUNK_TRACK_FIELDS,
)  # fmt: skip
"""sglang's per-step track fields an ``extra_buffer`` step records: an extend or decode step's
``TRACK_FIELDS`` (one entry per row, in row order), a verify's ``VERIFY_TRACK_FIELDS``, an extend step's
``FINAL_TRACK_FIELDS`` for the rows tracked at their chunk's end and ``CHUNK_TRACK_FIELDS`` for the
positions it tracks inside a chunk."""


@dataclass
class Request:
    """A simulated request: its lengths, its place in the pool, and what a strategy keeps of it."""

    id: int
    prompt_len: int
    output_len: int
    cached: int = 0  # tokens folded into the state
    sampled: int = 0  # output tokens sampled so far
    row: int = -1
    slot: int = -1
    prompt: tuple[int, ...] = ()  # its prompt's token ids (with a prefix cache; else empty)
    fed: list[int] = field(default_factory=list)  # with a prefix cache: the ids in its state (``cached``)
    pending: int = -1  # with a prefix cache: the last sampled id, fed by its next decode or verify
    pingpong: list[int] = field(default_factory=list)  # extra_buffer: its 2 track slots (held)
    next_track: int = 0  # extra_buffer: the ping-pong entry the next tracked step writes
    last_track: tuple[int, int] | None = None  # extra_buffer: (slot, tokens) of the last tracked state
    prev_track: tuple[int, int] | None = None  # extra_buffer: the tracked state before it
    last_published: bool = False  # extra_buffer: ``last_track`` went to the tree (its slot donated)
    path: tuple[int, ...] | None = None  # draft trees: the root-first path of nodes its last verify accepted

    @property
    def prefilling(self) -> bool:
        return self.cached < self.prompt_len

    @property
    def done(self) -> bool:
        """It sampled every output token it asked for (its prompt fed): it finishes after this step."""
        return not self.prefilling and self.sampled >= self.output_len


@dataclass(frozen=True)
class CacheSettings:
    """What a strategy is built from, resolved by :class:`~workbench.traces.config.SimConfig` (its fields,
    defaults filled in); each strategy reads the ones it needs."""

    max_cached: int  # most checkpoints the tree holds
    shared_prefixes: int  # system prompts drawn once per trace
    prefix_len: tuple[int, int]  # (low, high) of a system prompt's length
    vocab: int  # token ids are drawn below it
    followup_rate: float  # the chance that an arrival is the next turn of a finished request
    longest_prompt: int  # ``prompt_lens``' high end: a next turn fits it
    spec: int = 0  # D of the verify rows, 0 without speculation
    slots_per_request: int = 1  # pool slots a request owns (D under vLLM with speculation)
    block_size: int = 16  # align: tokens of one mamba block
    cache_chunk: int = 16  # extra_buffer: the shortest tracked prefill chunk, and its grid
    track_interval: int = 32  # extra_buffer: decode and verify steps track at its multiples
    batch_grid: bool = False  # extra_buffer: the layer's chunk states lie on one grid over the batch (Mamba2)


# -- sglang's mamba radix cache --------------------------------------------------------------------------
class NoBuffer:
    """sglang's mamba radix cache, strategy ``no_buffer`` (``prefix_cache="no_buffer"``; profiles sglang and
    sglang-ascend, layers gdn and mamba2): the tree, the slots it holds, the prompts' token ids (module
    docstring), and what it did at the current step (the metadata).

    - *admission*: the prompt is matched (``limit = prompt_len - 1``: a hit leaves a token to compute); a
      hit of ``L`` tokens in tree slot ``s`` gives the request its own slot all the same, ``copies_before
      [[s, own]]`` (copy-on-write), ``hits``, and ``cached_tokens = L`` on its first row; the node is
      touched (LRU) and locked for the step.
    - *after the last prefill chunk*, a request that runs on (not finishing at this step) copies its state
      into a newly held slot (``copies_after``, ``checkpoints`` with ``tokens = prompt_len``) unless the
      tree holds a state at exactly its prompt already.
    - *at finish*, a request whose exact state (prompt and every generated token fed: ``cached_tokens``
      after its last step) is not in the tree *donates* its own slot (``StatePool.donate``,
      ``checkpoints``, no copy); otherwise it frees it. A request finishing at its last prefill chunk
      donates (no copy).
    - *eviction* (LRU, ``evict``, before the step): when an admission finds no free slot (the tree holds
      them), and when a new checkpoint would pass ``max_cached`` or finds no free slot. A checkpoint used
      or published at the step is locked and never evicted at it; a checkpoint that cannot get room is
      skipped.
    """

    name: ClassVar[str] = "no_buffer"
    need: ClassVar[int] = 1
    """Free pool slots an admission takes (its running slot)."""
    need_why: ClassVar[str] = "(its running slot)"
    options: ClassVar[Mapping[str, str]] = {}
    """The ``SimConfig`` fields only this strategy reads, each with what it is for (a config that gives one
    without the strategy is refused naming it)."""
    names_slots: ClassVar[bool] = False
    """Rows name every slot their request owns (``TraceRow.slots``)."""

    def __init__(self, pool: StatePool, rng: random.Random, settings: CacheSettings) -> None:
        self.pool, self.rng, self.max_cached = pool, rng, settings.max_cached
        self.vocab, self.followup_rate = settings.vocab, settings.followup_rate
        self.longest_prompt = settings.longest_prompt
        lo, hi = settings.prefix_len
        # drawn first, once per trace: the system prompts the requests' prompts start from
        self.prefixes = [
            [rng.randrange(self.vocab) for _ in range(rng.randint(lo, hi))] for _ in range(settings.shared_prefixes)
        ]
        self.tree = RadixCache()
        self.history: deque[tuple[int, ...]] = deque(maxlen=64)  # finished conversations a next turn extends
        self.meta: dict[str, list[Any]] = {}
        self.locked: list[int] = []  # tree slots used or published at this step

    @classmethod
    def create(cls, pool: StatePool, rng: random.Random, settings: CacheSettings) -> NoBuffer:
        """The strategy for ``settings`` (a subclass may pick a variant: :class:`Align` with speculation)."""
        return cls(pool, rng, settings)

    @classmethod
    def live_slots(cls, slots_per_request: int) -> int:
        """Pool slots a live request takes (the default pool has room for ``max_running`` of them)."""
        return slots_per_request

    @classmethod
    def captures(cls, mode: str, spec: int) -> bool:
        """Whether the runner captures the graph of ``mode`` (the header lists its buckets)."""
        return True

    # -- tokens ---------------------------------------------------------------------------------------
    def token(self) -> int:
        return self.rng.randrange(self.vocab)

    def prompt(self, prompt_len: int) -> tuple[int, ...]:
        """A new request's prompt: the next turn of a finished conversation (``followup_rate``), or the first
        ``prompt_len`` ids of a shared system prompt followed by its own."""
        if self.history and self.rng.random() < self.followup_rate:
            base = self.history[self.rng.randrange(len(self.history))]
            n = self.rng.randint(len(base) + 1, self.longest_prompt)
            return base + tuple(self.token() for _ in range(n - len(base)))
        head = self.prefixes[self.rng.randrange(len(self.prefixes))][:prompt_len]
        return (*head, *(self.token() for _ in range(prompt_len - len(head))))

    # -- one step -------------------------------------------------------------------------------------
    def _record(self, key: str, value: Any) -> None:
        self.meta.setdefault(key, []).append(value)

    def _evict(self) -> bool:
        """Evict the LRU unlocked checkpoint and give its slot back (listed under ``evict``, before the
        step); False when every checkpoint is locked or there is none."""
        slot = self.tree.evict_one()
        if slot is None:
            return False
        self.pool.release(slot)
        self._record("evict", slot)
        return True

    def _publish(self, req: Request, slot: int, n: int | None = None) -> None:
        """``slot`` holds ``req``'s state now (a copy or its own slot): a checkpoint of exactly its ids, or of
        its first ``n``."""
        length = len(req.fed) if n is None else n
        took = self.tree.insert(req.fed[:length], slot)  # the caller checked state_at: the node had no state
        assert took and (n is not None or length == req.cached)
        self.tree.lock(slot)  # published at this step: not evicted at it (the replay sees it after)
        self.locked.append(slot)
        self._record("checkpoints", {"request": req.id, "tokens": length, "slot": slot})

    def can_place(self) -> bool:
        """Whether an admission can get its slots (``need``): free ones, or unlocked checkpoints to evict."""
        return self.pool.num_free + self.tree.evictable() >= self.need

    def chunk(self, req: Request, n: int) -> int:
        """The prefill chunk ``req`` feeds, given ``n`` (what the chunk size and the budget allow): ``n`` here
        (0: none at this step)."""
        return n

    def can_start(self, req: Request, left: int) -> bool:
        """Whether an admission with ``left`` tokens of budget gets a first chunk: always here."""
        return True

    def place(self, reqs: list[tuple[Request, int]], admitted: list[int]) -> None:
        """Before the step's rows are laid out (admissions done; ``reqs``: each row's request and the tokens it
        feeds): move running states (align); none here."""

    def track(self, mode: str, rows: list[tuple[Request, int | None, int]]) -> None:
        """The step's state tracking, after its forward (``rows``: each row's request, its prefill chunk
        (None for a decode or verify row) and the tokens its state kept, in row order): none here."""

    def admit(self, req: Request) -> bool:
        """Give ``req`` a row and its own slot (evicting a checkpoint if the tree holds the last free ones)
        and start it from the deepest checkpoint of its prompt (copy-on-write); False: no slot to be had."""
        hit = self._match(req)
        if hit is not None:
            self.tree.lock(hit[1])  # first, so that making room for its own slot cannot evict it
        while self.pool.num_free < self.need:
            if self._evict():
                continue
            if hit is None:
                return False
            self.tree.unlock(hit[1])  # the only checkpoint left to evict is its own source: start cold
            hit = None
        req.row = int(self.pool.alloc(1)[0])
        req.slot = self.pool.slots_of(req.row)[0]
        self._admitted(req)
        if hit is not None:
            length, src = hit
            self.tree.touch(src)
            self.locked.append(src)
            req.cached, req.fed = length, list(req.prompt[:length])
            self._record("hits", {"request": req.id, "tokens": length, "slot": src})
            self._record("copies_before", [src, req.slot])
        return True

    def _match(self, req: Request) -> tuple[int, int] | None:
        """The checkpoint an admission starts from: the deepest on its prompt, leaving a token to compute."""
        return self.tree.match(req.prompt, req.prompt_len - 1)

    def _room(self, *, need_slot: bool) -> bool:
        """Room for one more checkpoint: under ``max_cached`` (and a free slot, for a copy), evicting LRU
        checkpoints for it."""
        if len(self.tree) >= self.max_cached and not self._evict():
            return False
        return not need_slot or self.pool.num_free > 0 or self._evict()

    def prefilled(self, req: Request) -> None:
        """``req``'s last prefill chunk ran and it runs on: copy its state into a held slot, unless the tree
        has that prompt's state already (or no room for it)."""
        if self.tree.state_at(req.prompt) is not None or not self._room(need_slot=True):
            return
        slot = self.pool.hold()
        self._record("copies_after", [req.slot, slot])
        self._publish(req, slot)

    def _remember(self, req: Request) -> None:
        """Keep ``req``'s conversation for a next turn, when one more id at least fits the longest prompt."""
        conversation = (*req.fed, req.pending)  # the last sampled id was never fed, but is the reply's
        if len(conversation) < self.longest_prompt:
            self.history.append(conversation)

    def finish(self, req: Request) -> None:
        """``req`` finished: donate its slot to the tree when its exact state is new there, else free it."""
        self._remember(req)
        if self.tree.state_at(req.fed) is None and self._room(need_slot=False):
            self.pool.donate(req.row)
            self._publish(req, req.slot)
        else:
            self.pool.free([req.row])

    def _admitted(self, req: Request) -> None:
        """``req`` got its row and running slot: nothing more here."""

    def end_step(self) -> dict[str, Any] | None:
        """The step's prefix-cache metadata (only the keys with entries, in ``PREFIX_KEYS`` then
        ``TRACK_KEYS`` order), or None; unlocks what the step locked."""
        for slot in self.locked:
            self.tree.unlock(slot)
        self.locked = []
        meta = {k: self.meta[k] for k in (*PREFIX_KEYS, *TRACK_KEYS) if self.meta.get(k)}
        self.meta = {}
        return meta or None


@dataclass
class _TrackLists:
    """sglang's track fields of one ``extra_buffer`` step, built row by row (:meth:`ExtraBuffer.track`)."""

    mask: list[bool] = field(default_factory=list)  # per row: tracked
    indices: list[int] = field(default_factory=list)  # per row: pingpong[next_track] before the flip
    seqlens: list[int] = field(default_factory=list)  # per row: the chunk's end (floored by the backend), or -1
    steps: list[int] = field(default_factory=list)  # per verify row: the draft step tracked, or -1
    h_src: list[int] = field(default_factory=list)  # chunk states h tracked inside a chunk: their index in h
    h_dst: list[int] = field(default_factory=list)  # and the track slot each goes to
    # Mamba2 off the batch's grid, recomputed: (row, tracked position in the batch, track slot)
    recompute: tuple[list[int], list[int], list[int]] = field(default_factory=lambda: ([], [], []))
    # extend rows tracked at their chunk's end: (running slot, track slot)
    final: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))
    conv: list[list[int]] = field(default_factory=list)  # per tracked prefill row: its W - 1 conv inputs


class ExtraBuffer(NoBuffer):
    """sglang's mamba radix cache, strategy ``extra_buffer`` (``prefix_cache="extra_buffer"``; the profiles,
    layers, prompts, tree, hits and evictions of :class:`NoBuffer`), with a 2-entry ping-pong track buffer
    per request whose tracked states are donated to the tree instead of copied.

    - *slots*: an admitted request holds its running slot and a 2-entry ping-pong track buffer, two slots
      taken with ``StatePool.hold`` at admission (``EXTRA_BUFFER_SLOTS`` = 3 free slots needed, LRU
      checkpoints evicted for them; the default pool is ``3 * max_running + 1`` slots). The 2-entry buffer
      is the overlap scheduler's (sglang keeps 1 entry, no flip, without it); the trace is otherwise
      non-overlapped (each step's result is processed before the next step).
    - *extend tracking* (sglang's ``_init_track_ssm_indices`` / ``_init_track_conv_indices``, non-DCP): a
      prefill row that feeds ``new >= cache_chunk`` tokens tracks its last chunk boundary, ``cached +
      floor(new / cache_chunk) * cache_chunk``, and records its chunk's end as ``mamba_track_seqlens`` (the
      backend floors it). At the chunk's end (``new`` a multiple) the final state is copied after the step
      (``copies_after``); inside the chunk the state comes from the kernel's chunk states ``h``, one grid
      per sequence for GDN (row ``b``'s chunk ``j`` is ``h[offset_b + j]``, ``offset_b`` the
      ``ceil(new / cache_chunk)`` chunks of the rows before it): ``mamba_chunk_size``, ``track_ssm_h_src``,
      ``track_ssm_h_dst``, and ``track_conv_indices`` (the ``W - 1`` input positions before the tracked
      one, for every tracked row). Prompts are fed in chunks that are multiples of ``cache_chunk`` where
      they can be (``min(remaining, chunk_size, budget left)`` rounded down to one when it is at least
      ``cache_chunk`` and does not end the prompt), so the next chunk starts on the grid; a prompt's last
      chunk is fed whole. ``cache_chunk`` stands for sglang's ``mamba_cache_chunk_size`` and the model's
      state chunk (with page size 1 both 64 there; its checkpoint grid too).
    - *decode tracking*: after a decode step whose row leaves ``seq_len`` tokens in the state, a multiple
      of ``track_interval``.
    - *verify tracking* (at commit, sglang's ``fused_commit_track_indices`` for a chain, topk 1): a verify
      row with ``pre = cached_tokens`` and ``post = pre + accepted`` that crosses a multiple
      (``pre // interval != post // interval``) tracks the state after ``tp = post // interval * interval``
      tokens, the intermediate state of its draft step ``tp - pre - 1`` (under draft trees, topk > 1: of the
      accepted path's node at that depth, ``accept_index[b, tp - pre - 1] - b * D``), into
      ``pingpong[next_track]``
      (``mamba_track_indices``, ``mamba_steps_to_track``, -1 for rows that cross none; no copy, no mask or
      seqlens: sglang clears them for a verify). The one-token decode rows of a mixed step are never
      tracked (sglang's MIXED batch feeds them as extend rows of 1 token), under speculation too (its mixed
      steps decode the running requests' pending tokens; a real scheduler run tracks none of them).
    - *a tracked row* copies its running slot into ``pingpong[next_track]`` after the step
      (``copies_after``; sglang's ``track_mamba_states_if_needed`` / the extend final-state copy),
      remembers ``last_track`` (that slot, the tokens in the state), keeps the one before as
      ``prev_track``, and flips ``next_track`` (sglang flips at schedule time for extend and at result
      processing for decode; the trace sees one step either way). The step records sglang's
      ``mamba_track_mask``, ``mamba_track_indices`` (``pingpong[next_track]`` before the flip, for
      untracked rows too) and ``mamba_track_seqlens`` (the tokens tracked, -1 when untracked) for its rows
      in row order, on steps where some row is tracked (``TRACK_KEYS``, after the prefix keys).
    - *insertion* (a donation of the track slot, no copy): after a request's last prefill chunk (when it
      runs on) and at finish, the last tracked state not yet published goes into the tree (``checkpoints``
      with ``tokens`` the tracked length, ``last_track``'s slot) unless the tree has a state at exactly
      those tokens, or no room (``max_cached``, eviction as ``no_buffer``); a request that runs on holds a
      replacement ping-pong slot (``StatePool.hold``) in place of the donated one. sglang inserts at
      ``mamba_last_track_seqlen`` after a prefill (``cache_unfinished_req``), so the last chunk need not be
      the tracked one. Its overshoot fallback (a last tracked length past the kept tokens falls back to
      ``prev_track``) never fires here: a tracked length is always a prefix of the request's kept ids.
    - *finish*: the running slot is freed (never donated), the ping-pong slots not donated are released.
    """

    name: ClassVar[str] = "extra_buffer"
    need: ClassVar[int] = EXTRA_BUFFER_SLOTS
    need_why: ClassVar[str] = "(running + 2 ping-pong)"
    options: ClassVar[Mapping[str, str]] = {"cache_chunk": "the track buffers", "track_interval": "the track buffers"}

    def __init__(self, pool: StatePool, rng: random.Random, settings: CacheSettings) -> None:
        super().__init__(pool, rng, settings)
        self.cache_chunk, self.track_interval = settings.cache_chunk, settings.track_interval
        self.batch_grid = settings.batch_grid  # Mamba2: the kernel's chunk states lie on one grid over the batch

    @classmethod
    def live_slots(cls, slots_per_request: int) -> int:
        return EXTRA_BUFFER_SLOTS

    def _admitted(self, req: Request) -> None:
        """The request's ping-pong track buffer: two held slots (``admit`` made room for them)."""
        req.pingpong = [self.pool.hold(), self.pool.hold()]
        req.next_track, req.last_track, req.prev_track, req.last_published = 0, None, None, False

    def chunk(self, req: Request, n: int) -> int:
        """``n`` rounded down to a multiple of ``cache_chunk`` when it is at least one and does not end the
        prompt (so that the next chunk starts on the grid, as sglang's chunked prefill does); a prompt's last
        chunk, and a shorter ``n``, as they are."""
        c = self.cache_chunk
        return n // c * c if n >= c and req.cached + n < req.prompt_len else n

    def track(self, mode: str, rows: list[tuple[Request, int | None, int]]) -> None:
        """Track each row that reaches a tracked position (``(request, chunk tokens or None, tokens kept)``,
        after the step): an extend or decode row copies its running slot into ``pingpong[next_track]``
        (``copies_after``), a verify row has its draft step's state put there at commit; the slot becomes
        ``last_track`` and the ping-pong flips. Records sglang's track fields when some row is tracked."""
        verify = mode == "target_verify"
        cc = self.cache_chunk
        out = _TrackLists()
        offset = start = 0  # the row's first chunk state in h (one grid per sequence), its first input token
        for req, n, kept in rows:
            tracked, at, step = self._tracked(mode, req, n, kept)
            if tracked and n is not None:
                self._track_in_chunk(out, req, n, offset, start)
            new = n if n is not None else kept if verify else 1
            offset, start = offset + (new - 1) // cc + 1, start + new
            dst = req.pingpong[req.next_track]
            out.mask.append(tracked)
            out.indices.append(dst)
            # sglang records the chunk's end; its backend floors it to the last chunk boundary
            out.seqlens.append((req.cached if n is not None else at) if tracked else -1)
            out.steps.append(step)
            if tracked:
                self._take_track(out, req, n, at, dst, verify)
        if any(out.mask):
            self._record_track(out, verify)

    def _tracked(self, mode: str, req: Request, n: int | None, kept: int) -> tuple[bool, int, int]:
        """Whether a row (``n``: its prefill chunk, None for a decode or verify row; ``kept``: the tokens its
        state kept) is tracked at this step, the tokens in the tracked state, and a verify's draft step (-1)."""
        cc, interval = self.cache_chunk, self.track_interval
        if n is not None:  # a prefill chunk: its last chunk boundary is the tracked position
            return n >= cc, req.cached - n + n // cc * cc, -1
        if mode == "target_verify":  # the last multiple the accepted tokens reach, if they cross one
            step = verify_track_step(req.cached - kept, kept, interval)
            # under draft trees the tracked step is a node: the accepted path's node at that depth
            node = step if req.path is None or step < 0 else req.path[step]
            return step >= 0, req.cached - kept + step + 1, node
        if mode == "decode":
            return req.cached % interval == 0, req.cached, -1
        return False, req.cached, -1  # a mixed step's decode tail: a one-token extend row to sglang, untracked

    def _track_in_chunk(self, out: _TrackLists, req: Request, n: int, offset: int, start: int) -> None:
        """A tracked prefill row of ``n`` tokens whose first input token is ``start`` in the flattened batch
        and whose first chunk state is ``h[offset]`` (one grid per sequence): a position inside the chunk
        comes from the kernel's chunk states, or (Mamba2 off the batch's grid) is recomputed; the row's conv
        window (``CONV_WINDOW`` input positions before the tracked one, clamped to the row) either way."""
        cc, dst = self.cache_chunk, req.pingpong[req.next_track]
        end = start + n // cc * cc  # the tracked position in the flattened batch
        if n % cc and (not self.batch_grid or end % cc == 0):
            out.h_src.append(end // cc if self.batch_grid else offset + n // cc)
            out.h_dst.append(dst)
        elif n % cc:  # Mamba2, off the batch's grid: sglang recomputes the state
            for lst, v in zip(out.recompute, (len(out.mask), end, dst), strict=True):
                lst.append(v)
        out.conv.append([min(max(end - CONV_WINDOW + j, 0), start + n - 1) for j in range(CONV_WINDOW)])

    def _take_track(self, out: _TrackLists, req: Request, n: int | None, at: int, dst: int, verify: bool) -> None:
        """A tracked row's state goes to ``dst`` (a copy of its running slot when it is the final state; a
        verify's is put there at commit) and becomes its ``last_track``; the ping-pong flips."""
        if not verify and at == req.cached:  # the final state: a copy after the step
            self._record("copies_after", [req.slot, dst])
            if n is not None:  # an extend row: sglang's final-state lists name the copy
                out.final[0].append(req.slot)
                out.final[1].append(dst)
        req.prev_track, req.last_track, req.last_published = req.last_track, (dst, at), False
        req.next_track ^= 1

    def _record_track(self, out: _TrackLists, verify: bool) -> None:
        """The step's track fields (some row was tracked): a verify's indices and steps; an extend or decode
        step's mask, indices, lengths, final-state copies, and the chunk-state fields when a row needs them."""
        if verify:
            self.meta["mamba_track_indices"], self.meta["mamba_steps_to_track"] = out.indices, out.steps
            return
        self.meta["mamba_track_mask"], self.meta["mamba_track_indices"] = out.mask, out.indices
        self.meta["mamba_track_seqlens"] = out.seqlens
        self.meta.update(zip(FINAL_TRACK_FIELDS, out.final, strict=True))
        if out.h_src or out.recompute[0]:
            self.meta["mamba_chunk_size"] = self.cache_chunk  # type: ignore[assignment]  # an int among the lists
            self.meta["track_ssm_h_src"], self.meta["track_ssm_h_dst"] = out.h_src, out.h_dst
            if self.batch_grid:
                self.meta.update(zip(RECOMPUTE_FIELDS, out.recompute, strict=True))
            self.meta["track_conv_indices"] = out.conv

    def _unpublished(self, req: Request) -> tuple[int, int] | None:
        """``req``'s last tracked state when it is not in the tree yet (nor a state at exactly its tokens)."""
        if req.last_track is None or req.last_published:
            return None
        slot, n = req.last_track
        return None if self.tree.state_at(req.fed[:n]) is not None else (slot, n)

    def _donate_track(self, req: Request, slot: int, n: int) -> None:
        """Publish the track slot ``slot`` (``req``'s state after its first ``n`` ids) into the tree, no copy."""
        self._publish(req, slot, n)
        req.last_published = True

    def prefilled(self, req: Request) -> None:
        """``req``'s last prefill chunk ran and it runs on: donate its last tracked state to the tree and
        hold a replacement ping-pong slot (when the tree lacks that state and has room)."""
        got = self._unpublished(req)
        if got is None or not self._room(need_slot=True):
            return
        slot, n = got
        self._donate_track(req, slot, n)
        req.pingpong[req.pingpong.index(slot)] = self.pool.hold()

    def finish(self, req: Request) -> None:
        """``req`` finished: donate its last tracked state (when new to the tree), free its running slot,
        release the ping-pong slots it did not donate."""
        self._remember(req)
        got = self._unpublished(req)
        if got is not None and self._room(need_slot=False):
            slot, n = got
            self._donate_track(req, slot, n)
            req.pingpong.remove(slot)
        self.pool.free([req.row])
        for slot in req.pingpong:
            self.pool.release(slot)
        req.pingpong = []


# -- vLLM's block-aligned mamba cache --------------------------------------------------------------------
class Align(NoBuffer):
    """vLLM's block-aligned mamba prefix cache (``prefix_cache="align"``: vLLM 0.33.0's
    ``mamba_cache_mode="align"``, the only mode beside none; profile vllm, either layer, ``docs/traces.md``
    "Prefix caching"): chunks end on block boundaries, the block a step fills is published in that step
    while it is still the request's running block, and a state entering a new block is pre-copied and moved
    there. Same prompts and tree as :class:`NoBuffer`; the rules, checked against a run of vLLM's own
    scheduler (``tests/fixtures/vllm_0_33_0_scheduler_shape.json``), and the simplifications:

    - *blocks*: ``block_size`` (default 16; vLLM's mamba block size is large and model-dependent, e.g. 528
      or 1600, small here so that short prompts fill blocks). A request's running slot stands for the block
      of column ``max((computed - 1) // block_size, 0)``; one pool slot per block, no block table.
    - *chunks* (``Scheduler._mamba_block_aligned_split``): a prefill chunk ends at a multiple of
      ``block_size`` (``min(remaining, chunk_size, budget left)`` rounded down to one; a chunk may span
      several blocks, whose inner states are not kept, as vLLM's are not), and stops at the prompt's last
      cacheable position, ``(prompt_len - 1) // block_size * block_size``, when it lies inside the chunk (so
      the state there is a checkpoint a request sharing the prompt hits); the prompt's tail after it is the
      last chunk. ``block_size`` is at most ``chunk_size`` and ``token_budget``. vLLM's other stops
      (shared-prefix junctions and partial hash tails, both off with one hash block per mamba block) are not
      modelled.
    - *publish* (``MambaManager.cache_blocks``, at schedule time): a row whose state after the step holds
      exactly a whole number of blocks (a chunk ending on a block's end, a decode filling one) publishes its
      running slot in that step (``checkpoints``, the slot still its own: vLLM hashes the block the step
      fills), unless the tree has a state there or no room (``max_cached``). The checkpoint is locked while
      the request runs on it and stays live when the request moves on; a request that finishes on it
      donates it.
    - *moves*: a step whose first token of a row starts a new block (``computed % block_size == 0`` and
      ``computed > 0`` before the step; not at the admission step of a hit, whose fresh slot is its block
      already) pre-copies the running slot into the lowest free slot (``copies_before``) and moves the request
      there (``moves``, ``StatePool.move``; its rows name the new slot from then on); the block it leaves
      stays a checkpoint when it was published, else it is freed after the step. Mixed steps apply the rule
      to every row. A first chunk from zero spanning several blocks stays in its admission slot (vLLM writes
      it straight into its last block, no initial state read: a relabelling). A move that finds no free slot
      and no unlocked checkpoint to evict is skipped (the request keeps its slot, that boundary is not cached;
      vLLM would not have scheduled, or would have preempted, it); a request whose block is a checkpoint
      cannot skip its move (it would write the checkpoint): then the pool is too small (refused).
    - *hits*: the deepest checkpoint on the prompt (``limit = prompt_len - 1``) whose length is a multiple
      of ``block_size`` (vLLM hits whole blocks; every checkpoint here is one); the request gets its own row
      and slot, ``hits``, the pre-copy ``copies_before [[s, own]]``, ``cached_tokens = L``.
    - *finish*: the running slot is donated when it is a checkpoint, else freed (its partial block is not
      cached). No ``copies_after``.
    - *eviction*: LRU as ``no_buffer``, for an admission's slot, a move's target and ``max_cached``; a
      checkpoint hit or published at the step, or still a request's running block, is never evicted. The
      default pool is ``2 * max_running + 1`` slots (room for moves and checkpoints).
    - padded rows use vLLM's null block 0 (the profile's dummy slot), as without a prefix cache.
    - without speculation the trace has no verify graph (one slot per request: a move moves one); with it,
      :class:`AlignSpec` (``create`` picks it).
    """

    name: ClassVar[str] = "align"
    options: ClassVar[Mapping[str, str]] = {"block_size": "vLLM's mamba blocks"}

    def __init__(self, pool: StatePool, rng: random.Random, settings: CacheSettings) -> None:
        super().__init__(pool, rng, settings)
        self.block_size = settings.block_size
        self.releasing: list[int] = []  # old slots of this step's moves that the tree does not keep
        self.running: dict[int, int] = {}  # request -> its running slot, published (locked while it runs on it)

    @classmethod
    def create(cls, pool: StatePool, rng: random.Random, settings: CacheSettings) -> NoBuffer:
        return AlignSpec(pool, rng, settings) if settings.spec else Align(pool, rng, settings)

    @classmethod
    def live_slots(cls, slots_per_request: int) -> int:
        """Its own slots and a block it left (a checkpoint or, with speculation, one held for its post-copy)."""
        return slots_per_request + 1

    @classmethod
    def captures(cls, mode: str, spec: int) -> bool:
        """No verify graph without speculation: one slot per request (a move moves one)."""
        return mode != "target_verify" or spec > 0

    def chunk(self, req: Request, n: int) -> int:
        """``n``, or less: the chunk stops at the prompt's last cacheable position when that lies inside it,
        and else ends on a multiple of ``block_size`` unless it ends the prompt (vLLM's
        ``_mamba_block_aligned_split``); 0 when no block end is in reach."""
        end, bs = req.cached + n, self.block_size
        last = (req.prompt_len - 1) // bs * bs  # vLLM's last_cache_position (no EAGLE block drop)
        if req.cached < last < end:
            return last - req.cached
        if end >= req.prompt_len:
            return n
        return max(end // bs * bs - req.cached, 0)

    def can_start(self, req: Request, left: int) -> bool:
        """A first chunk fits ``left``: a whole block (chunks start on block boundaries), or the prompt."""
        return left >= self.block_size or req.prompt_len <= left

    def _match(self, req: Request) -> tuple[int, int] | None:
        """The deepest checkpoint of whole blocks on the prompt, leaving a token to compute."""
        limit = req.prompt_len - 1
        while True:
            hit = self.tree.match(req.prompt, limit)
            if hit is None or hit[0] % self.block_size == 0:
                return hit
            limit = hit[0] - 1

    def _publish_running(self, req: Request, slot: int) -> None:
        """``req``'s state fills its running block ``slot`` exactly (``cached`` a multiple of ``block_size``):
        published now, while it still runs on it (vLLM hashes the block at schedule time), unless the tree has
        that state or no room. Locked until the request leaves the block (no eviction of a running block)."""
        if self.tree.state_at(req.fed) is not None or not self._room(need_slot=False):
            return
        self._publish(req, slot, req.cached)
        self.tree.lock(slot)
        self.running[req.id] = slot

    def _leave(self, req: Request, old: int) -> None:
        """``req`` left its block ``old`` at this step (held by the caller): a checkpoint stays one (locked for
        the step, as the owner's pre-copy reads it), anything else is freed after the step."""
        if self.running.get(req.id) == old:
            del self.running[req.id]
            self.locked.append(old)  # the running lock becomes the step's: end_step unlocks it
        else:
            self.releasing.append(old)

    def place(self, reqs: list[tuple[Request, int]], admitted: list[int]) -> None:
        """Each request whose step starts a new block (not a hit admitted now: its fresh slot is that block)
        is pre-copied into the lowest free slot and moved there; the block it leaves stays a checkpoint if it
        was published, or is freed after the step."""
        fresh = set(admitted)
        for req, _ in reqs:
            if req.id in fresh or req.cached == 0 or req.cached % self.block_size:
                continue
            while not self.pool.free_slots() and self._evict():
                pass
            if not self.pool.free_slots():
                if req.id in self.running:
                    raise SimulationError(
                        f"num_slots = {self.pool.num_slots}: no free slot for request {req.id}'s next block, and "
                        "its block is a published checkpoint (prefix_cache='align'); give more slots"
                    )
                continue  # no room for the new block: the state stays, the boundary is not cached
            new = self.pool.hold()  # the lowest free slot
            self.pool.release(new)
            old = self.pool.move(req.row, new)
            self.pool.hold(old)  # kept until the step ends: no later move or admission of this step takes it
            req.slot = new
            self._record("copies_before", [old, new])
            self._record("moves", {"request": req.id, "slot": new})
            self._leave(req, old)

    def track(self, mode: str, rows: list[tuple[Request, int | None, int]]) -> None:
        """After the forward: each row whose state now holds exactly a whole number of blocks publishes its
        running slot (a chunk ending on a block's end, a decode filling its block)."""
        for req, _, _ in rows:
            if req.cached % self.block_size == 0:
                self._publish_running(req, req.slot)

    def prefilled(self, req: Request) -> None:
        """Nothing at a prompt's end: its full blocks were published as the steps filled them."""

    def finish(self, req: Request) -> None:
        """``req`` finished: its slot is donated when it is a published checkpoint (its block filled at the
        last step), else freed (a partial block)."""
        self._remember(req)
        slot = self.running.pop(req.id, None)
        if slot is None:
            self.pool.free([req.row])
            return
        # published at this step, as the step filled it (a window of D blocks never gets here: AlignSpec does not
        # publish for a finishing request, and a later step of its request slides off the block first)
        self.locked.append(slot)  # the running lock, unlocked at the step's end
        self.pool.donate(req.row)

    def end_step(self) -> dict[str, Any] | None:
        for slot in self.releasing:
            self.pool.release(slot)
        self.releasing = []
        return super().end_step()


@dataclass
class Window:
    """A request's window of blocks under vLLM's align mode with speculation: ``curr`` is the block of its
    last scheduled token, its D slots the blocks ``curr .. curr + D - 1``."""

    curr: int = -1
    accepted: int = 1  # vLLM's num_accepted_tokens for the next step: its state is in column accepted - 1
    boundary: bool = False  # column 0 holds the state after exactly (curr + 1) * block_size tokens
    pending: int | None = None  # the slot of block curr - 1, held until a post-copy gives it its boundary state
    spent: list[int] = field(default_factory=list)  # post-copied blocks the tree did not take: held till finish


class AlignSpec(Align):
    """vLLM's align mode with speculation (``prefix_cache="align"``, ``spec=D``, ``block_size >= D``, mixed
    steps or not; ``docs/traces.md``): each request owns a window of D blocks (its pool slots; its rows name
    them), which slides with the block of its last scheduled token (pre-copy from column ``num_accepted -
    1``, count reset to 1). Its first block holds the boundary state when a prefill chunk ended on the block's
    end or a verify kept every token up to it (the post-copy within the block): the block is then published
    in that step, still the running block, unless the request finishes at the step (vLLM caches it after
    the step's output, which a finished request no longer gets); the block the window leaves stays a
    checkpoint, or is freed, or, without its boundary state, is held for the post-copy of a later verify
    whose accepted tokens reach its end (vLLM's ``postprocess_mamba``), which then publishes it."""

    names_slots: ClassVar[bool] = True

    def __init__(self, pool: StatePool, rng: random.Random, settings: CacheSettings) -> None:
        super().__init__(pool, rng, settings)
        self.d = settings.slots_per_request
        self.windows: dict[int, Window] = {}

    def _admitted(self, req: Request) -> None:
        self.windows[req.id] = Window()

    def _free_slot(self, taken: list[int]) -> int:
        """A free slot not in ``taken`` (the lowest), evicting LRU checkpoints for one."""
        while True:
            free = [x for x in self.pool.free_slots() if x not in taken]
            if free:
                return free[0]
            if not self._evict():
                raise SimulationError(
                    f"num_slots = {self.pool.num_slots}: no free slot for a window of {self.d} blocks "
                    "(prefix_cache='align' with speculation); give more slots"
                )

    def place(self, reqs: list[tuple[Request, int]], admitted: list[int]) -> None:
        """Slide each request's window to the block of its last scheduled token (``preprocess_mamba``): the
        blocks both windows share keep their slots, new blocks take free ones, the state in column
        ``accepted - 1`` is copied into the new first block (``copies_before``, unless it is that slot) and
        the accepted count resets to 1. The first block it leaves stays a checkpoint when it was published,
        is freed when it held its boundary state unpublished, else is held for the post-copy (``keep``)."""
        fresh, bs = set(admitted), self.block_size
        for req, n in reqs:
            w = self.windows[req.id]
            curr = (req.cached + n - 1) // bs
            if req.id in fresh or w.curr < 0:
                w.curr = curr
            elif curr != w.curr:
                self._slide(req, w, curr)

    def _slide(self, req: Request, w: Window, curr: int) -> None:
        """Move ``req``'s window from block ``w.curr`` to ``curr`` (see :meth:`place`)."""
        d = self.d
        old = self.pool.slots_of(req.row)
        new: list[int] = []
        for j in range(curr, curr + d):
            new.append(old[j - w.curr] if j < w.curr + d else self._free_slot(old + new))
        src = old[w.accepted - 1]
        if src != new[0]:
            self._record("copies_before", [src, new[0]])
        left = old[0]
        self.pool.remap(req.row, new)
        move: dict[str, Any] = {"request": req.id, "slots": new}
        self.pool.hold(left)
        if w.boundary:  # the block's own state: a checkpoint since the step that filled it, or freed
            self._leave(req, left)
        else:
            if w.pending is not None:  # never (its post-copy came before this slide): kept till finish
                w.spent.append(w.pending)  # as the replay keeps a kept block
            w.pending = left
            move["keep"] = [left]
        self._record("moves", move)
        w.curr, w.accepted, w.boundary = curr, 1, False
        req.slot = new[0]

    def track(self, mode: str, rows: list[tuple[Request, int | None, int]]) -> None:
        """After the forward (``postprocess_mamba``): a prefill chunk that ends on its block's end leaves the
        boundary state in column 0 (published now); a verify (every decode-phase row, in verify and mixed
        steps alike) whose accepted tokens reach a block's end, ``aligned``, copies the state of column
        ``aligned - running`` (``running`` = the tokens before the step + 1) into that block: its own first
        block (published now; the next verify reads it there), or the block its window left, held for it,
        which becomes the checkpoint of exactly ``aligned`` tokens."""
        bs = self.block_size
        for req, n, kept in rows:
            w = self.windows[req.id]
            window = self.pool.slots_of(req.row)
            if n is not None:
                w.boundary = req.cached % bs == 0
                if w.boundary and not req.done:
                    self._publish_running(req, window[0])
                continue
            before = req.cached - kept
            running, aligned = before + 1, req.cached // bs * bs
            w.accepted = kept
            if aligned < running:
                continue
            src, dest = window[aligned - running], aligned // bs - 1
            if dest == w.curr:  # within its own block (all D accepted, the block's end reached exactly)
                self._record("copies_after", [src, window[0]])
                w.accepted, w.boundary = 1, True
                if not req.done:
                    self._publish_running(req, window[0])
            elif dest == w.curr - 1 and w.pending is not None:
                self._post_copy(req, w, src, aligned)

    def _post_copy(self, req: Request, w: Window, src: int, aligned: int) -> None:
        """The post-copy into the block ``req``'s window left, held for it: it holds the state after exactly
        ``aligned`` tokens and becomes that checkpoint (or stays the request's till it finishes)."""
        assert w.pending is not None
        slot, w.pending = w.pending, None
        self._record("copies_after", [src, slot])
        if self.tree.state_at(req.fed[:aligned]) is None and self._room(need_slot=False):
            self._publish(req, slot, aligned)
        else:  # the request's block until it finishes (the replay frees a kept block only then)
            w.spent.append(slot)

    def finish(self, req: Request) -> None:
        """``req`` finished: its window is freed, with the blocks it left that the tree did not take."""
        w = self.windows.pop(req.id)
        for slot in [*w.spent, *([] if w.pending is None else [w.pending])]:
            self.pool.release(slot)
        super().finish(req)


STRATEGIES: dict[str, type[NoBuffer]] = {cls.name: cls for cls in (NoBuffer, ExtraBuffer, Align)}
"""Prefix-cache strategy name (``prefix_cache=...``, ``Profile.prefix_caches``) -> its class; ``align``'s
``create`` picks :class:`AlignSpec` with speculation."""

PREFIX_CACHES = tuple(STRATEGIES)
"""Prefix-cache strategies the simulator models: sglang's mamba radix cache without extra buffers, and with
its 2-entry ping-pong track buffer; vLLM's block-aligned mamba cache."""

PREFIX_CACHES_NOT_BUILT = ("extra_buffer_lazy",)
"""Strategies the engines have and the simulator does not (yet): sglang's lazily allocated track buffer."""


__all__ = [
    "CONV_WINDOW",
    "EXTRA_BUFFER_SLOTS",
    "PREFIX_CACHES",
    "PREFIX_CACHES_NOT_BUILT",
    "STRATEGIES",
    "TRACK_KEYS",
    "Align",
    "AlignSpec",
    "CacheSettings",
    "ExtraBuffer",
    "NoBuffer",
    "Request",
    "Window",
]
