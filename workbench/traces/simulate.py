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
  With ``spec > 0`` every decode-phase request verifies (there are no plain decode steps), so a vLLM
  request's state never has to be read from slot 0 after a verify.
* **Chunked prefill.** A prompt is fed ``min(remaining, chunk_size, budget left)`` tokens per extend row;
  the first chunk has ``cached_tokens`` 0 (no initial state), later ones the tokens before. A one-token
  piece is never split off a longer remainder (vLLM would class a one-token row as a decode), so a
  one-token extend row is always the tail of a prompt (``cached_tokens > 0``).
* **Step choice.** Without ``mixed``, a step is either ``extend`` (prefill chunks only: continuing prompts
  first, then new admissions, first come first served) or ``decode`` / ``target_verify`` (decode-phase
  requests, oldest first). Prefill goes first, as sglang's scheduler does, but never twice in a row while
  requests wait to decode (so a long prompt's chunks interleave with decode steps). With ``mixed``, every
  step takes the decode-phase rows first (they come first in the budget in both engines) and fills the
  rest of the budget with prefill chunks; a step that has both is ``mixed``.
* **Row order.** Decode and verify rows: oldest request first. A mixed step keeps each engine's order:
  sglang (and sglang-ascend) extend rows first and the one-token decode rows last (``ForwardMode.MIXED``:
  decodes are the tail, ``num_decodes = bs - num_prefills``); vLLM one-token rows first, then the longer
  ones (``torch.split([num_decodes, num_prefills])``; a one-token prompt tail is a decode to vLLM too, so
  it sits with them, in extend steps as well).
* **Admission.** A waiting request is admitted (``pool.alloc(1)``; listed in the step's ``admit``) at the
  step where it first runs, when the budget has room for it, fewer than ``max_running`` requests are live
  and the pool has a free row. Arrivals beyond ``max_waiting`` queued requests are turned away (the
  client backs off), so a long run keeps a bounded queue.
* **Idle and DP dummies.** A step with nothing to run is ``idle`` (the step count is the trace's clock).
  With ``dp_dummies``, this engine is one data-parallel rank: with probability ``dp_dummy_rate`` a step
  carries none of its rows while its requests hold their slots (the other ranks run; this one runs a dummy
  batch), the case of vLLM PR #37728 / #49757 (dummy runs writing through stale rows).
* **Disaggregated decode.** With ``prefill=False`` a trace models a decode instance, where a request arrives
  with its prompt prefilled elsewhere (``cached_tokens = prompt_len``, first token sampled) and decodes from
  its first step; ``mixed`` and a prefix cache are refused with it. Both layers prefill by default (Mamba2's
  extend is the chunk scan, ``kernels.mamba2.chunk_scan``) and verify with ``spec`` (Mamba2's through the
  selective state update's per-step states); a layer without a verify step would refuse ``spec``.
* **Prefix caching** (``prefix_cache="no_buffer"``: sglang's mamba radix cache, strategy ``no_buffer``,
  ``docs/traces.md`` "Prefix caching"; profiles sglang and sglang-ascend, layers gdn and mamba2). Every row carries its
  ``tokens``. ``shared_prefixes`` system prompts (lengths uniform in ``prefix_len``, ids below ``vocab``)
  are drawn once per trace; a request's prompt is the first ``prompt_len`` tokens of one of them, then its
  own random ids up to ``prompt_len`` (so prompts share prefixes, and a short one ends inside one). With
  probability ``followup_rate`` a request is instead the next turn of a finished one: its whole
  conversation (prompt, every generated token) then new ids, up to ``prompt_lens``' high end. Generated
  tokens and drafts are random ids; a verify row feeds the last sampled token then D - 1 drafts and keeps
  the first ``accepted``. The tree (:class:`~workbench.traces.radix.RadixCache`) holds checkpoints in
  pool slots (``StatePool.hold``), at most ``max_cached`` of them:

  - *admission*: the prompt is matched (``limit = prompt_len - 1``: a hit leaves a token to compute); a
    hit of ``L`` tokens in tree slot ``s`` gives the request its own slot all the same, ``copies_before
    [[s, own]]`` (copy-on-write), ``hits``, and ``cached_tokens = L`` on its first row; the node is
    touched (LRU) and locked for the step.
  - *after the last prefill chunk*, a request that runs on (not finishing at this step) copies its state
    into a newly held slot (``copies_after``, ``checkpoints`` with ``tokens = prompt_len``) unless the
    tree holds a state at exactly its prompt already.
  - *at finish*, a request whose exact state (prompt and every generated token fed: ``cached_tokens`` after
    its last step) is not in the tree *donates* its own slot (``StatePool.donate``, ``checkpoints``, no
    copy); otherwise it frees it. A request finishing at its last prefill chunk donates (no copy).
  - *eviction* (LRU, ``evict``, before the step): when an admission finds no free slot (the tree holds
    them), and when a new checkpoint would pass ``max_cached`` or finds no free slot. A checkpoint used
    or published at the step is locked and never evicted at it; a checkpoint that cannot get room is
    skipped.

  ``metadata`` then holds only the prefix keys (``PREFIX_KEYS``) non-empty at the step, or None.
* **Prefix caching with track buffers** (``prefix_cache="extra_buffer"``: sglang's mamba radix cache,
  strategy ``extra_buffer``; same profiles, layer, prompts, tree, hits and evictions as ``no_buffer``):

  - *slots*: an admitted request holds its running slot and a 2-entry ping-pong track buffer, two slots
    taken with ``StatePool.hold`` at admission (``EXTRA_BUFFER_SLOTS`` = 3 free slots needed, LRU
    checkpoints evicted for them; the default pool is ``3 * max_running + 1`` slots). The 2-entry buffer
    is the overlap scheduler's (sglang keeps 1 entry, no flip, without it); the trace is otherwise
    non-overlapped (each step's result is processed before the next step).
  - *extend tracking* (sglang's ``_init_track_ssm_indices`` / ``_init_track_conv_indices``, non-DCP): a
    prefill row that feeds ``new >= cache_chunk`` tokens tracks its last chunk boundary, ``cached +
    floor(new / cache_chunk) * cache_chunk``, and records its chunk's end as ``mamba_track_seqlens`` (the
    backend floors it). At the chunk's end (``new`` a multiple) the final state is copied after the step
    (``copies_after``); inside the chunk the state comes from the kernel's chunk states ``h``, one grid per
    sequence for GDN (row ``b``'s chunk ``j`` is ``h[offset_b + j]``, ``offset_b`` the
    ``ceil(new / cache_chunk)`` chunks of the rows before it): ``mamba_chunk_size``, ``track_ssm_h_src``,
    ``track_ssm_h_dst``, and ``track_conv_indices`` (the ``W - 1`` input positions before the tracked one,
    for every tracked row). Prompts are fed in chunks that are multiples of ``cache_chunk`` where they can
    be (``min(remaining, chunk_size, budget left)`` rounded down to one when it is at least ``cache_chunk``
    and does not end the prompt), so the next chunk starts on the grid; a prompt's last chunk is fed
    whole. ``cache_chunk`` stands for sglang's ``mamba_cache_chunk_size`` and the model's state chunk
    (with page size 1 both 64 there; its checkpoint grid too).
  - *decode tracking*: after a decode step whose row leaves ``seq_len`` tokens in the state, a multiple
    of ``track_interval``.
  - *verify tracking* (at commit, sglang's ``fused_commit_track_indices`` for a chain, topk 1): a verify
    row with ``pre = cached_tokens`` and ``post = pre + accepted`` that crosses a multiple
    (``pre // interval != post // interval``) tracks the state after ``tp = post // interval * interval``
    tokens, the intermediate state of its draft step ``tp - pre - 1``, into ``pingpong[next_track]``
    (``mamba_track_indices``, ``mamba_steps_to_track``, -1 for rows that cross none; no copy, no mask or
    seqlens: sglang clears them for a verify). The one-token decode rows of a
    mixed step are never tracked (sglang's MIXED batch feeds them as extend rows of 1 token).
  - *a tracked row* copies its running slot into ``pingpong[next_track]`` after the step
    (``copies_after``; sglang's ``track_mamba_states_if_needed`` / the extend final-state copy), remembers
    ``last_track`` (that slot, the tokens in the state), keeps the one before as ``prev_track``, and flips
    ``next_track`` (sglang flips at schedule time for extend and at result processing for decode; the
    trace sees one step either way). The step records sglang's ``mamba_track_mask``,
    ``mamba_track_indices`` (``pingpong[next_track]`` before the flip, for untracked rows too) and
    ``mamba_track_seqlens`` (the tokens tracked, -1 when untracked) for its rows in row order, on steps
    where some row is tracked (``TRACK_KEYS``, after the prefix keys).
  - *insertion* (a donation of the track slot, no copy): after a request's last prefill chunk (when it
    runs on) and at finish, the last tracked state not yet published goes into the tree (``checkpoints``
    with ``tokens`` the tracked length, ``last_track``'s slot) unless the tree has a state at exactly
    those tokens, or no room (``max_cached``, eviction as ``no_buffer``); a request that runs on holds a
    replacement ping-pong slot (``StatePool.hold``) in place of the donated one. sglang inserts at
    ``mamba_last_track_seqlen`` after a prefill (``cache_unfinished_req``), so the last chunk need not be
    the tracked one. Its overshoot fallback (a last tracked length past the kept tokens falls back to
    ``prev_track``) never fires here: a tracked length is always a prefix of the request's kept ids.
  - *finish*: the running slot is freed (never donated), the ping-pong slots not donated are released.
* **Block-aligned prefix caching** (``prefix_cache="align"``: vLLM 0.33.0's ``mamba_cache_mode="align"``,
  the only mode beside none; profile vllm, either layer, ``docs/traces.md`` "Prefix caching").
  Same prompts and tree (:class:`~workbench.traces.radix.RadixCache`) as ``no_buffer``; the simplifications:

  - *blocks*: ``block_size`` (default 16; vLLM's mamba block size is large and model-dependent, e.g. 528 or
    1600, small here so that short prompts fill blocks). A request's running slot stands for the block of
    column ``max((computed - 1) // block_size, 0)``; one pool slot per block, no block table.
  - *chunks* (``Scheduler._mamba_block_aligned_split``): a prefill chunk ends at the prompt's end or at a
    multiple of ``block_size`` (``min(remaining, chunk_size, budget left)`` rounded down to one; a chunk
    may span several blocks, whose inner states are not kept, as vLLM's are not). ``block_size`` is at most
    ``chunk_size`` and ``token_budget``. vLLM's other mandatory stops (shared-prefix junctions, hash tails)
    are not modelled.
  - *moves*: a step whose first token of a row starts a new block (``computed % block_size == 0`` and
    ``computed > 0`` before the step; not at the admission step of a hit, whose fresh slot is its block
    already) pre-copies the running slot into the lowest free slot (``copies_before``), moves the request
    there (``moves``, ``StatePool.move``; its rows name the new slot from then on), and publishes the old
    slot, now the state after exactly ``computed`` tokens (a full block), as a checkpoint in the same step
    (``checkpoints``, held), keyed by those ids, unless the tree has a state there or no room
    (``max_cached``): then the old slot is freed after the step. Decode steps cross blocks the same way;
    mixed steps apply the rule to every row. A first chunk from zero spanning several blocks stays in its
    admission slot (vLLM writes it straight into its last block, no initial state read: a relabelling).
    A move that finds no free slot and no unlocked checkpoint to evict is skipped (the request keeps its
    slot, that boundary is not cached; vLLM would not have scheduled, or would have preempted, it).
  - *hits*: the deepest checkpoint on the prompt (``limit = prompt_len - 1``) whose length is a multiple of
    ``block_size`` (vLLM hits whole blocks; every checkpoint here is one); the request gets its own row
    and slot, ``hits``, the pre-copy ``copies_before [[s, own]]``, ``cached_tokens = L``.
  - *finish*: the running slot is freed (its partial block is not cached; full blocks were published as
    the request left them). No ``copies_after``, no donation.
  - *eviction*: LRU as ``no_buffer``, for an admission's slot, a move's target and ``max_cached``; a
    checkpoint hit or published at the step is never evicted at it. The default pool is
    ``2 * max_running + 1`` slots (room for moves and checkpoints).
  - padded rows use vLLM's null block 0 (the profile's dummy slot), as without a prefix cache.
  - *with speculation* (``spec=D``; not with ``mixed``; ``block_size >= D``): each request owns a window of
    D blocks (:class:`_AlignSpec`; ``docs/traces.md``): it slides with the block of its last scheduled token
    (pre-copy from column ``num_accepted - 1``, count reset to 1), the block it leaves is published when it
    holds its boundary state or held for the post-copy, and a verify whose accepted tokens reach a block's
    end copies the state of exactly that position into the block (vLLM's ``postprocess_mamba``).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.batch import Batch
from workbench.buckets import check_buckets
from workbench.errors import WorkbenchError
from workbench.layer_names import DEFAULT_LAYER
from workbench.layers import LAYERS, LayerError, get_layer_spec
from workbench.limits import INT32_MAX, check_int
from workbench.metadata.record import GRAPH_MODES
from workbench.pool import StatePool
from workbench.profiles import Profile, get_profile
from workbench.traces.model import (
    CHUNK_TRACK_FIELDS,
    FINAL_TRACK_FIELDS,
    PREFIX_KEYS,
    RECOMPUTE_FIELDS,
    TRACK_FIELDS,
    VERIFY_TRACK_FIELDS,
    Trace,
    TraceHeader,
    TraceRow,
    TraceStep,
)
from workbench.traces.radix import RadixCache

DEFAULT_DRAFT_TOKENS = 2
"""D of the header when the trace has no verify step (``spec=0``), as ``TraceHeader``'s default."""

DEFAULT_MAX_BS = 24
"""Largest captured batch size of the default bucket lists (the profile's own lists, clipped)."""

DECODES_FIRST = {"sglang": False, "sglang-ascend": False, "vllm": True}
"""Row order of a mixed step: vLLM lays one-token (decode) rows first, sglang last."""


PREFIX_CACHES = ("no_buffer", "extra_buffer", "align")
"""Prefix-cache strategies the simulator models: sglang's mamba radix cache without extra buffers, and with
its 2-entry ping-pong track buffer; vLLM's block-aligned mamba cache."""

PREFIX_CACHES_NOT_BUILT = ("extra_buffer_lazy",)
"""Strategies the engines have and the simulator does not (yet): sglang's lazily allocated track buffer."""

PREFIX_PROFILES = ("sglang", "sglang-ascend")
"""Profiles whose engine has ``no_buffer`` and ``extra_buffer`` (vLLM's mamba prefix cache is ``align``)."""

ALIGN_PROFILES = ("vllm",)
"""Profiles whose engine has ``align`` (vLLM's ``mamba_cache_mode``)."""

DEFAULT_BLOCK_SIZE = 16
"""``block_size`` of ``align`` (vLLM's mamba block size, hundreds to thousands of tokens there)."""

DEFAULT_CACHE_CHUNK = 16
"""``cache_chunk`` of ``extra_buffer`` (sglang's ``mamba_cache_chunk_size``, 64 there: small here so that
short simulated prompts track)."""

DEFAULT_TRACK_INTERVAL = 32
"""``track_interval`` of ``extra_buffer`` (sglang's ``mamba_track_interval``, 256 there)."""

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


def verify_track_step(pre: int, accepted: int, interval: int) -> int:
    """The draft step a verify tracks at commit, or -1: sglang's ``fused_commit_track_indices`` for a chain
    (topk 1). A row that held ``pre`` tokens and kept ``accepted`` (1..D) crosses a multiple of ``interval``
    when ``pre // interval != (pre + accepted) // interval``; it tracks the last multiple reached, ``tp``,
    whose state is that of draft step ``tp - pre - 1``.

    >>> verify_track_step(30, 3, 32), verify_track_step(31, 1, 32), verify_track_step(30, 1, 32)
    (1, 0, -1)
    """
    post = pre + accepted
    if pre // interval == post // interval:
        return -1
    return post // interval * interval - pre - 1


class SimulationError(WorkbenchError):
    """A simulation argument, or a trace step, that cannot be made or replayed: names the field and value."""


# -- the header alone rebuilds the pool ------------------------------------------------------------------
def slots_per_request(header: TraceHeader) -> int:
    """Slots each request owns in the pool a trace runs on: D where the profile keeps one per draft position
    (vLLM) and the header lists target-verify buckets (the runner captures that graph), else 1."""
    prof = get_profile(header.profile)
    return prof.slots_per_request(header.draft_tokens) if "target_verify" in header.buckets else 1


def new_pool(header: TraceHeader, *, device: str | torch.device = "cpu") -> StatePool:
    """An empty pool like the one the trace was made on (``alloc(1)`` per admission, in step order, then
    ``free`` at each finish, gives back the recorded rows and slots: the pool hands out lowest first)."""
    return StatePool(header.num_slots, header.profile, slots_per_request=slots_per_request(header), device=device)


# -- the simulation ---------------------------------------------------------------------------------------
@dataclass
class _Request:
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

    @property
    def prefilling(self) -> bool:
        return self.cached < self.prompt_len


def _check_range(name: str, value: object, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise SimulationError(f"{name} = {value!r}: must be a number in [{lo}, {hi}]")
    return float(value)


def _check_lens(name: str, value: object, minimum: int) -> tuple[int, int]:
    pair = list(value) if isinstance(value, tuple | list) else []
    if not (
        len(pair) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
        and minimum <= pair[0] <= pair[1]
    ):
        raise SimulationError(f"{name} = {value!r}: must be (low, high) ints with {minimum} <= low <= high")
    return int(pair[0]), int(pair[1])


def _int_arg(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SimulationError(f"{name} = {value!r}: must be an int in [{lo}, {hi:,}]")
    return value


def _check_prefix_cache(value: object, profile: str, layer: str, prefill: bool) -> str | None:
    """The prefix-cache strategy, or None; refused (naming the field and value) where it is not modelled."""
    if value is None:
        return None
    if value in PREFIX_CACHES_NOT_BUILT:
        raise SimulationError(f"prefix_cache = {value!r}: not built yet; the simulator models {PREFIX_CACHES}")
    if value not in PREFIX_CACHES:
        raise SimulationError(f"prefix_cache = {value!r}: choose one of {PREFIX_CACHES}, or None")
    if value == "align" and profile not in ALIGN_PROFILES:
        raise SimulationError(
            f"profile = {profile!r}: prefix_cache = 'align' is vLLM's block-aligned mamba cache (profiles "
            f"{ALIGN_PROFILES}); sglang's are 'no_buffer' and 'extra_buffer'"
        )
    if value != "align" and profile not in PREFIX_PROFILES:
        raise SimulationError(
            f"profile = {profile!r}: prefix_cache = {value!r} is sglang's mamba radix cache "
            f"(profiles {PREFIX_PROFILES}); vLLM's mamba prefix cache is prefix_cache='align'"
        )
    if "extend" not in get_layer_spec(layer).supported_modes:
        raise SimulationError(
            f"layer = {layer!r}: prefix_cache = {value!r} checkpoints prefilled prompts, and it has no extend step"
        )
    if not prefill:
        raise SimulationError(f"prefill = False: prefix_cache = {value!r} checkpoints prefilled prompts")
    return str(value)


def _header_buckets(
    prof: Profile, modes: Sequence[str], buckets: Sequence[int] | None, spec: int
) -> dict[str, list[int]]:
    if buckets is not None:
        try:
            given = check_buckets(buckets)
        except TypeError:
            raise SimulationError(f"buckets = {buckets!r}: must be a list of increasing positive ints") from None
        return {m: list(given) for m in modes}
    return {m: prof.buckets(DEFAULT_MAX_BS, m == "target_verify" or spec > 0) for m in modes}


def _poisson(rng: random.Random, rate: float) -> int:
    if rate <= 0.0:
        return 0
    limit, k, p = math.exp(-rate), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def simulate(
    profile: str = "sglang",
    layer: str = DEFAULT_LAYER,
    *,
    steps: int = 200,
    seed: int = 0,
    spec: int = 0,
    mixed: bool = False,
    dp_dummies: bool = False,
    num_slots: int | None = None,
    buckets: Sequence[int] | None = None,
    chunk_size: int = 32,
    token_budget: int = 64,
    max_running: int | None = None,
    max_waiting: int | None = None,
    arrival_rate: float = 0.5,
    prompt_lens: tuple[int, int] = (4, 96),
    output_lens: tuple[int, int] = (2, 40),
    accept_rate: float = 0.7,
    dp_dummy_rate: float = 0.1,
    prefill: bool | None = None,
    prefix_cache: str | None = None,
    shared_prefixes: int = 4,
    prefix_len: tuple[int, int] = (16, 64),
    vocab: int = 512,
    followup_rate: float = 0.2,
    max_cached: int | None = None,
    cache_chunk: int | None = None,
    track_interval: int | None = None,
    block_size: int | None = None,
) -> Trace:
    """Simulate ``steps`` scheduler steps of one layer under one engine profile (see the module docstring).

    Args:
        profile: engine conventions, a name of ``workbench.profiles.PROFILES``: pool, row order of mixed steps.
        layer: a key of ``workbench.layers.LAYERS`` (Gated DeltaNet, Mamba2: both decode, verify and extend).
        steps: scheduler steps to record (idle ones included).
        seed: of the one ``random.Random`` every draw comes from.
        spec: D, draft tokens per verify step (0: no speculation, plain decode steps).
        mixed: let a step carry prefill chunks and one-token decode rows together (``mode="mixed"``).
        dp_dummies: this engine is one DP rank: some steps are dummy (idle) steps while its requests live.
        num_slots: state slots of the pool, the dummy slot included; default: ``max_running`` requests'
            worth plus the dummy slot.
        buckets: captured batch sizes of every graph mode the layer has; default: the profile's own lists
            clipped to ``DEFAULT_MAX_BS`` = 24 (``profile.buckets(24, speculative)``).
        chunk_size: most prompt tokens a request feeds in one step.
        token_budget: most tokens (sum of ``new_tokens``) in one step; at least ``max(2, spec)``.
        max_running: most live (admitted, unfinished) requests; default: the largest bucket plus a quarter,
            so the decode rows pass the largest bucket now and then (those steps run eagerly); the pool's
            capacity bounds it too.
        max_waiting: most queued requests; arrivals beyond are turned away (default ``2 * max_running``).
        arrival_rate: mean arrivals per step (Poisson).
        prompt_lens: (low, high) of a prompt's length, uniform, low >= 2.
        output_lens: (low, high) of a request's output tokens, uniform, low >= 1.
        accept_rate: chance that each draft token after the first is accepted (a verify keeps tokens up to
            the first rejection): ``accepted`` in 1..D.
        dp_dummy_rate: with ``dp_dummies``, the chance that a step with live requests is a dummy step.
        prefill: run extend steps; default: whether the layer supports extend (both do); False models a
            disaggregated decode instance (requests arrive prefilled).
        prefix_cache: None (no prefix cache, rows without ``tokens``), ``"no_buffer"`` or ``"extra_buffer"``:
            sglang's mamba radix cache (module docstring, "Prefix caching"; sglang profiles), or ``"align"``
            (vLLM's, profile vllm); either layer.
        shared_prefixes: with a prefix cache, how many shared system prompts the prompts start from.
        prefix_len: (low, high) of a shared prompt's length, uniform, low >= 1.
        vocab: token ids are drawn below it.
        followup_rate: the chance that an arrival is the next turn of a finished request (its whole
            conversation, then new tokens), when one short enough finished.
        max_cached: most checkpoints the tree holds (pool slots no request owns); default half the
            slots (``(num_slots - 1) // 2``), so admissions keep flowing.
        cache_chunk: with ``prefix_cache="extra_buffer"``, the shortest prefill chunk that is tracked and the
            grid its tracked positions lie on (sglang's ``mamba_cache_chunk_size``); default 16.
        track_interval: with ``prefix_cache="extra_buffer"``, decode and verify steps track the state when it
            holds a multiple of it (sglang's ``mamba_track_interval``); a multiple of ``cache_chunk``;
            default 32.
        block_size: with ``prefix_cache="align"``, the tokens of one mamba block (vLLM's mamba block size):
            chunks end on its multiples, states move to a new slot and checkpoint at each; at most
            ``chunk_size`` and ``token_budget``; default 16.

    Returns:
        a :class:`Trace` whose header names the profile, layer, ``num_slots``, buckets (the graph modes the
        layer captures), ``draft_tokens`` (``spec``, or 2 without speculation) and ``seed``.

    >>> t = simulate("vllm", steps=50, seed=1, mixed=True)
    >>> t.header.profile, len(t), sorted(t.header.buckets)
    ('vllm', 50, ['decode', 'target_verify'])
    """
    prof = get_profile(profile)
    try:
        layer_spec = get_layer_spec(layer)
    except LayerError:
        raise SimulationError(f"layer = {layer!r}: choose one of {sorted(LAYERS)}") from None
    modes = layer_spec.supported_modes
    steps = check_int("steps", steps, 0)
    seed = check_int("seed", seed, -(2**63), 2**63 - 1)
    spec = check_int("spec", spec, 0, 1024)
    for name, flag in (("mixed", mixed), ("dp_dummies", dp_dummies)):
        if not isinstance(flag, bool):
            raise SimulationError(f"{name} = {flag!r}: must be True or False")
    if prefill is None:
        prefill = "extend" in modes
    elif not isinstance(prefill, bool):
        raise SimulationError(f"prefill = {prefill!r}: must be True, False or None")
    cls_name = layer_spec.layer_class.__name__
    if spec and "target_verify" not in modes:
        raise SimulationError(
            f"spec = {spec}: layer {layer!r} has no target_verify step ({cls_name}.supported_modes = {modes}); "
            "simulate it with spec=0"
        )
    if mixed and not prefill:
        why = (
            f"layer {layer!r} has no extend step ({cls_name}.supported_modes = {modes})"
            if "extend" not in modes
            else "prefill=False"
        )
        raise SimulationError(f"mixed = True: a mixed step carries prefill chunks, but {why}")
    if mixed and spec:
        raise SimulationError(
            f"mixed = True with spec = {spec}: a mixed step's decode rows are one-token rows, and verify rows of "
            "D tokens have no mixed batch in the workbench (sglang turns mixed chunked prefill off under "
            "speculative decoding); choose one"
        )
    chunk_size = check_int("chunk_size", chunk_size, 1)
    token_budget = check_int("token_budget", token_budget, max(2, spec))
    arrival_rate = _check_range("arrival_rate", arrival_rate, 0.0, 64.0)
    accept_rate = _check_range("accept_rate", accept_rate, 0.0, 1.0)
    dp_dummy_rate = _check_range("dp_dummy_rate", dp_dummy_rate, 0.0, 1.0)
    p_lo, p_hi = _check_lens("prompt_lens", prompt_lens, 2)
    o_lo, o_hi = _check_lens("output_lens", output_lens, 1)

    strategy = _check_prefix_cache(prefix_cache, prof.name, layer, prefill)
    shared_prefixes = _int_arg("shared_prefixes", shared_prefixes, 1, 1 << 16)
    f_lo, f_hi = _check_lens("prefix_len", prefix_len, 1)
    vocab = _int_arg("vocab", vocab, 1, INT32_MAX + 1)
    followup_rate = _check_range("followup_rate", followup_rate, 0.0, 1.0)
    extra = strategy == "extra_buffer"
    align = strategy == "align"
    if align and spec and mixed:
        raise SimulationError(
            f"mixed = {mixed!r}: prefix_cache='align' with speculation is modelled without mixed steps (a verify "
            "row's window and post-copy inside an extend batch are not built); simulate it with mixed=False"
        )
    if not align and block_size is not None:
        raise SimulationError(f"block_size = {block_size!r}: needs prefix_cache='align' (vLLM's mamba blocks)")
    bs = DEFAULT_BLOCK_SIZE
    if align:
        bs = _int_arg(
            "block_size", DEFAULT_BLOCK_SIZE if block_size is None else block_size, 1, min(chunk_size, token_budget)
        )
        if spec and bs < spec:
            raise SimulationError(
                f"block_size = {bs}: must be at least spec = {spec} (a verify's window of blocks moves by one block "
                "at most, as vLLM's does)"
            )
    if not extra:
        for name, given in (("cache_chunk", cache_chunk), ("track_interval", track_interval)):
            if given is not None:
                raise SimulationError(f"{name} = {given!r}: needs prefix_cache='extra_buffer' (the track buffers)")
    cc = _int_arg("cache_chunk", DEFAULT_CACHE_CHUNK if cache_chunk is None else cache_chunk, 1, 1 << 20)
    interval = _int_arg(
        "track_interval", DEFAULT_TRACK_INTERVAL if track_interval is None else track_interval, 1, 1 << 30
    )
    if interval % cc:
        raise SimulationError(
            f"track_interval = {interval}: must be a multiple of cache_chunk = {cc} (sglang tracks decode on the "
            "grid lcm(checkpoint grid, mamba_track_interval))"
        )

    # align without speculation has no verify graph: one slot per request (a move moves one)
    graph_modes = [m for m in GRAPH_MODES if m in modes and not (align and not spec and m == "target_verify")]
    header_buckets = _header_buckets(prof, graph_modes, buckets, spec)
    d = spec or DEFAULT_DRAFT_TOKENS
    largest = max(b[-1] for b in header_buckets.values())
    spr = prof.slots_per_request(d) if "target_verify" in header_buckets else 1
    # pool slots a live request takes: align keeps a block it left (a checkpoint or, with speculation, a block
    # held for its post-copy) beside its own
    per_request = EXTRA_BUFFER_SLOTS if extra else spr + 1 if align else spr
    if extra and num_slots is not None and check_int("num_slots", num_slots, 2) - 1 < EXTRA_BUFFER_SLOTS:
        raise SimulationError(
            f"num_slots = {num_slots}: prefix_cache='extra_buffer' needs {EXTRA_BUFFER_SLOTS} slots per request "
            "(running + 2 ping-pong) beside the dummy slot"
        )
    if max_running is None:
        max_running = largest + max(1, largest // 4)
        if num_slots is not None:
            max_running = min(max_running, max(1, (check_int("num_slots", num_slots, 2) - 1) // per_request))
    max_running = check_int("max_running", max_running, 1)
    if num_slots is None:
        num_slots = max_running * per_request + 1
    max_waiting = check_int("max_waiting", 2 * max_running if max_waiting is None else max_waiting, 0)
    pool = StatePool(num_slots, prof, slots_per_request=spr)
    header = TraceHeader(prof.name, layer, pool.num_slots, header_buckets, draft_tokens=d, seed=seed)
    rng = random.Random(seed)
    cache: _NoBuffer | None = None
    if strategy is not None:
        cached_max = (pool.num_slots - 1) // 2 if max_cached is None else max_cached
        common: dict[str, Any] = dict(
            max_cached=_int_arg("max_cached", cached_max, 0, pool.num_slots - 1),
            prefixes=[[rng.randrange(vocab) for _ in range(rng.randint(f_lo, f_hi))] for _ in range(shared_prefixes)],
            vocab=vocab,
            followup_rate=followup_rate,
            longest_prompt=p_hi,
        )
        if align and spec:
            cache = _AlignSpec(pool, rng, block_size=bs, draft_tokens=spr, **common)
        elif align:
            cache = _Align(pool, rng, block_size=bs, **common)
        elif extra:
            batch_grid = layer_spec.chunk_grid == "batch"
            cache = _ExtraBuffer(pool, rng, cache_chunk=cc, track_interval=interval, batch_grid=batch_grid, **common)
        else:
            cache = _NoBuffer(pool, rng, **common)
    elif max_cached is not None:
        raise SimulationError(f"max_cached = {max_cached!r}: needs a prefix cache (prefix_cache='no_buffer')")

    sched = _Scheduler(
        pool,
        rng,
        cache,
        spec=spec,
        mixed=mixed,
        prefill=prefill,
        decodes_first=DECODES_FIRST[prof.name],
        chunk_size=chunk_size,
        token_budget=token_budget,
        max_running=max_running,
        accept_rate=accept_rate,
    )
    next_id = 0
    out: list[TraceStep] = []
    for t in range(steps):
        for _ in range(_poisson(rng, arrival_rate)):
            if len(sched.waiting) < max_waiting:
                req = _Request(next_id, rng.randint(p_lo, p_hi), rng.randint(o_lo, o_hi))
                if cache is not None:
                    req.prompt = cache.prompt(req.prompt_len)
                    req.prompt_len = len(req.prompt)
                sched.waiting.append(req)
            next_id += 1
        if dp_dummies and sched.running and rng.random() < dp_dummy_rate:
            out.append(TraceStep(t, "idle"))  # the DP group's step carries none of this rank's rows
            sched.last_mode = "idle"
            continue
        out.append(sched.step(t))
    return Trace(header, out)


class _NoBuffer:
    """sglang's ``no_buffer`` mamba radix cache over a pool (module docstring, "Prefix caching"): the tree,
    the slots it holds, the prompts' token ids, and what it did at the current step (the metadata)."""

    def __init__(
        self,
        pool: StatePool,
        rng: random.Random,
        *,
        max_cached: int,
        prefixes: list[list[int]],
        vocab: int,
        followup_rate: float,
        longest_prompt: int,
    ) -> None:
        self.pool, self.rng, self.max_cached, self.prefixes = pool, rng, max_cached, prefixes
        self.vocab, self.followup_rate, self.longest_prompt = vocab, followup_rate, longest_prompt
        self.tree = RadixCache()
        self.history: deque[tuple[int, ...]] = deque(maxlen=64)  # finished conversations a next turn extends
        self.meta: dict[str, list[Any]] = {}
        self.locked: list[int] = []  # tree slots used or published at this step

    need = 1
    """Free pool slots an admission takes (its running slot)."""

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

    def _publish(self, req: _Request, slot: int, n: int | None = None) -> None:
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

    def chunk(self, req: _Request, n: int) -> int:
        """The prefill chunk ``req`` feeds, given ``n`` (what the chunk size and the budget allow): ``n`` here
        (0: none at this step)."""
        return n

    def can_start(self, req: _Request, left: int) -> bool:
        """Whether an admission with ``left`` tokens of budget gets a first chunk: always here."""
        return True

    def place(self, reqs: list[tuple[_Request, int]], admitted: list[int]) -> None:
        """Before the step's rows are laid out (admissions done; ``reqs``: each row's request and the tokens it
        feeds): move running states (align); none here."""

    def track(self, mode: str, rows: list[tuple[_Request, int | None, int]]) -> None:
        """The step's state tracking, after its forward (``rows``: each row's request, its prefill chunk
        (None for a decode or verify row) and the tokens its state kept, in row order): none here."""

    def admit(self, req: _Request) -> bool:
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

    def _match(self, req: _Request) -> tuple[int, int] | None:
        """The checkpoint an admission starts from: the deepest on its prompt, leaving a token to compute."""
        return self.tree.match(req.prompt, req.prompt_len - 1)

    def _room(self, *, need_slot: bool) -> bool:
        """Room for one more checkpoint: under ``max_cached`` (and a free slot, for a copy), evicting LRU
        checkpoints for it."""
        if len(self.tree) >= self.max_cached and not self._evict():
            return False
        return not need_slot or self.pool.num_free > 0 or self._evict()

    def prefilled(self, req: _Request) -> None:
        """``req``'s last prefill chunk ran and it runs on: copy its state into a held slot, unless the tree
        has that prompt's state already (or no room for it)."""
        if self.tree.state_at(req.prompt) is not None or not self._room(need_slot=True):
            return
        slot = self.pool.hold()
        self._record("copies_after", [req.slot, slot])
        self._publish(req, slot)

    def finish(self, req: _Request) -> None:
        """``req`` finished: donate its slot to the tree when its exact state is new there, else free it."""
        conversation = (*req.fed, req.pending)  # the last sampled id was never fed, but is the reply's
        if len(conversation) < self.longest_prompt:  # a next turn (one more id at least) fits the longest prompt
            self.history.append(conversation)
        if self.tree.state_at(req.fed) is None and self._room(need_slot=False):
            self.pool.donate(req.row)
            self._publish(req, req.slot)
        else:
            self.pool.free([req.row])

    def _admitted(self, req: _Request) -> None:
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


class _ExtraBuffer(_NoBuffer):
    """sglang's ``extra_buffer`` mamba radix cache (module docstring, "Prefix caching with track buffers"):
    ``no_buffer``'s tree, prompts, hits and evictions, with a 2-entry ping-pong track buffer per request
    whose tracked states are donated to the tree instead of copied."""

    need = EXTRA_BUFFER_SLOTS

    def __init__(
        self,
        pool: StatePool,
        rng: random.Random,
        *,
        cache_chunk: int,
        track_interval: int,
        batch_grid: bool,
        **kw: Any,
    ) -> None:
        super().__init__(pool, rng, **kw)
        self.cache_chunk, self.track_interval = cache_chunk, track_interval
        self.batch_grid = batch_grid  # Mamba2: the kernel's chunk states lie on one grid over the batch

    def _admitted(self, req: _Request) -> None:
        """The request's ping-pong track buffer: two held slots (``admit`` made room for them)."""
        req.pingpong = [self.pool.hold(), self.pool.hold()]
        req.next_track, req.last_track, req.prev_track, req.last_published = 0, None, None, False

    def chunk(self, req: _Request, n: int) -> int:
        """``n`` rounded down to a multiple of ``cache_chunk`` when it is at least one and does not end the
        prompt (so that the next chunk starts on the grid, as sglang's chunked prefill does); a prompt's last
        chunk, and a shorter ``n``, as they are."""
        c = self.cache_chunk
        return n // c * c if n >= c and req.cached + n < req.prompt_len else n

    def track(self, mode: str, rows: list[tuple[_Request, int | None, int]]) -> None:
        """Track each row that reaches a tracked position (``(request, chunk tokens or None, tokens kept)``,
        after the step): an extend or decode row copies its running slot into ``pingpong[next_track]``
        (``copies_after``), a verify row has its draft step's state put there at commit; the slot becomes
        ``last_track`` and the ping-pong flips. Records sglang's track fields when some row is tracked."""
        verify = mode == "target_verify"
        mask: list[bool] = []
        indices: list[int] = []
        seqlens: list[int] = []
        steps: list[int] = []
        cc = self.cache_chunk
        h_src: list[int] = []
        h_dst: list[int] = []
        recompute: tuple[list[int], list[int], list[int]] = ([], [], [])  # Mamba2 off the grid: row, end, slot
        final: tuple[list[int], list[int]] = ([], [])  # extend rows tracked at their chunk's end: running, track
        conv: list[list[int]] = []
        offset = start = 0  # the row's first chunk state in h (one grid per sequence), its first input token
        for req, n, kept in rows:
            at, step = req.cached, -1
            if n is not None:  # a prefill chunk: its last chunk boundary is the tracked position
                tracked = n >= cc
                at = req.cached - n + n // cc * cc
                if tracked and n % cc:  # inside the chunk: from the kernel's chunk state h
                    end = start + n // cc * cc  # the tracked position in the flattened batch
                    if not self.batch_grid or end % cc == 0:
                        h_src.append(end // cc if self.batch_grid else offset + n // cc)
                        h_dst.append(req.pingpong[req.next_track])
                    else:  # Mamba2, off the batch's grid: sglang recomputes the state
                        for lst, v in zip(recompute, (len(mask), end, req.pingpong[req.next_track]), strict=True):
                            lst.append(v)
                if tracked:
                    conv.append(
                        [min(max(start + n // cc * cc - CONV_WINDOW + j, 0), start + n - 1) for j in range(CONV_WINDOW)]
                    )
            elif verify:  # the last multiple the accepted tokens reach, if they cross one
                step = verify_track_step(req.cached - kept, kept, self.track_interval)
                tracked = step >= 0
                at = req.cached - kept + step + 1
            elif mode == "decode":
                tracked = req.cached % self.track_interval == 0
            else:  # a mixed step's decode tail: a one-token extend row to sglang, never tracked
                tracked = False
            new = n if n is not None else kept if verify else 1
            offset, start = offset + (new - 1) // cc + 1, start + new
            dst = req.pingpong[req.next_track]
            mask.append(tracked)
            indices.append(dst)
            # sglang records the chunk's end; its backend floors it to the last chunk boundary
            seqlens.append((req.cached if n is not None else at) if tracked else -1)
            steps.append(step)
            if tracked:
                if not verify and at == req.cached:  # the final state: a copy after the step
                    self._record("copies_after", [req.slot, dst])
                    if n is not None:  # an extend row: sglang's final-state lists name the copy
                        final[0].append(req.slot)
                        final[1].append(dst)
                req.prev_track, req.last_track, req.last_published = req.last_track, (dst, at), False
                req.next_track ^= 1
        if not any(mask):
            return
        if verify:
            self.meta["mamba_track_indices"], self.meta["mamba_steps_to_track"] = indices, steps
            return
        self.meta["mamba_track_mask"], self.meta["mamba_track_indices"] = mask, indices
        self.meta["mamba_track_seqlens"] = seqlens
        self.meta.update(zip(FINAL_TRACK_FIELDS, final, strict=True))
        if h_src or recompute[0]:
            self.meta["mamba_chunk_size"] = cc  # type: ignore[assignment]  # an int among the lists
            self.meta["track_ssm_h_src"], self.meta["track_ssm_h_dst"] = h_src, h_dst
            if self.batch_grid:
                self.meta.update(zip(RECOMPUTE_FIELDS, recompute, strict=True))
            self.meta["track_conv_indices"] = conv

    def _unpublished(self, req: _Request) -> tuple[int, int] | None:
        """``req``'s last tracked state when it is not in the tree yet (nor a state at exactly its tokens)."""
        if req.last_track is None or req.last_published:
            return None
        slot, n = req.last_track
        return None if self.tree.state_at(req.fed[:n]) is not None else (slot, n)

    def _donate_track(self, req: _Request, slot: int, n: int) -> None:
        """Publish the track slot ``slot`` (``req``'s state after its first ``n`` ids) into the tree, no copy."""
        self._publish(req, slot, n)
        req.last_published = True

    def prefilled(self, req: _Request) -> None:
        """``req``'s last prefill chunk ran and it runs on: donate its last tracked state to the tree and
        hold a replacement ping-pong slot (when the tree lacks that state and has room)."""
        got = self._unpublished(req)
        if got is None or not self._room(need_slot=True):
            return
        slot, n = got
        self._donate_track(req, slot, n)
        req.pingpong[req.pingpong.index(slot)] = self.pool.hold()

    def finish(self, req: _Request) -> None:
        """``req`` finished: donate its last tracked state (when new to the tree), free its running slot,
        release the ping-pong slots it did not donate."""
        conversation = (*req.fed, req.pending)
        if len(conversation) < self.longest_prompt:
            self.history.append(conversation)
        got = self._unpublished(req)
        if got is not None and self._room(need_slot=False):
            slot, n = got
            self._donate_track(req, slot, n)
            req.pingpong.remove(slot)
        self.pool.free([req.row])
        for slot in req.pingpong:
            self.pool.release(slot)
        req.pingpong = []


class _Align(_NoBuffer):
    """vLLM's block-aligned mamba prefix cache (``mamba_cache_mode="align"``; module docstring,
    "Block-aligned prefix caching"): chunks end on block boundaries, a state entering a new block is
    pre-copied and moved there, and the block it leaves is published as a checkpoint."""

    def __init__(self, pool: StatePool, rng: random.Random, *, block_size: int, **kw: Any) -> None:
        super().__init__(pool, rng, **kw)
        self.block_size = block_size
        self.releasing: list[int] = []  # old slots of this step's moves that the tree does not keep

    def chunk(self, req: _Request, n: int) -> int:
        """``n``, or less so that the chunk ends on a multiple of ``block_size`` unless it ends the prompt
        (vLLM's ``_mamba_block_aligned_split``); 0 when no block end is in reach."""
        end = req.cached + n
        if end >= req.prompt_len:
            return n
        return max(end // self.block_size * self.block_size - req.cached, 0)

    def can_start(self, req: _Request, left: int) -> bool:
        """A first chunk fits ``left``: a whole block (chunks start on block boundaries), or the prompt."""
        return left >= self.block_size or req.prompt_len <= left

    def _match(self, req: _Request) -> tuple[int, int] | None:
        """The deepest checkpoint of whole blocks on the prompt, leaving a token to compute."""
        limit = req.prompt_len - 1
        while True:
            hit = self.tree.match(req.prompt, limit)
            if hit is None or hit[0] % self.block_size == 0:
                return hit
            limit = hit[0] - 1

    def place(self, reqs: list[tuple[_Request, int]], admitted: list[int]) -> None:
        """Each request whose step starts a new block (not a hit admitted now: its fresh slot is that block)
        is pre-copied into the lowest free slot and moved there; its old slot, the state after exactly its
        ``cached`` tokens, becomes a checkpoint (or is freed after the step)."""
        fresh = set(admitted)
        for req, _ in reqs:
            if req.id in fresh or req.cached == 0 or req.cached % self.block_size:
                continue
            while not self.pool.free_slots() and self._evict():
                pass
            if not self.pool.free_slots():
                continue  # no room for the new block: the state stays, the boundary is not cached
            new = self.pool.hold()  # the lowest free slot
            self.pool.release(new)
            old = self.pool.move(req.row, new)
            self.pool.hold(old)  # kept until the step ends: no later move or admission of this step takes it
            req.slot = new
            self._record("copies_before", [old, new])
            self._record("moves", {"request": req.id, "slot": new})
            if self.tree.state_at(req.fed) is None and self._room(need_slot=False):
                self._publish(req, old)
            else:
                self.releasing.append(old)

    def prefilled(self, req: _Request) -> None:
        """Nothing at a prompt's end: its full blocks are published as the request leaves them."""

    def finish(self, req: _Request) -> None:
        """``req`` finished: its slot (a partial block, or a full one not yet left) is freed."""
        conversation = (*req.fed, req.pending)
        if len(conversation) < self.longest_prompt:
            self.history.append(conversation)
        self.pool.free([req.row])

    def end_step(self) -> dict[str, Any] | None:
        for slot in self.releasing:
            self.pool.release(slot)
        self.releasing = []
        return super().end_step()


@dataclass
class _Window:
    """A request's window of blocks under vLLM's align mode with speculation: ``curr`` is the block of its
    last scheduled token, its D slots the blocks ``curr .. curr + D - 1``."""

    curr: int = -1
    accepted: int = 1  # vLLM's num_accepted_tokens for the next step: its state is in column accepted - 1
    boundary: bool = False  # column 0 holds the state after exactly (curr + 1) * block_size tokens
    pending: int | None = None  # the slot of block curr - 1, held until a post-copy gives it its boundary state
    spent: list[int] = field(default_factory=list)  # post-copied blocks the tree did not take: held till finish


class _AlignSpec(_Align):
    """vLLM's align mode with speculation (module docstring, "Block-aligned prefix caching"): each request
    owns a window of D blocks (its pool slots), which slides when the block of its last scheduled token
    changes (the pre-copy), and a verify whose accepted tokens reach a block's end copies the state of
    exactly that position into the block (the post-copy), which becomes the checkpoint."""

    def __init__(self, pool: StatePool, rng: random.Random, *, draft_tokens: int, **kw: Any) -> None:
        super().__init__(pool, rng, **kw)
        self.d = draft_tokens
        self.windows: dict[int, _Window] = {}

    def _admitted(self, req: _Request) -> None:
        self.windows[req.id] = _Window()

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

    def place(self, reqs: list[tuple[_Request, int]], admitted: list[int]) -> None:
        """Slide each request's window to the block of its last scheduled token (``preprocess_mamba``): the
        blocks both windows share keep their slots, new blocks take free ones, the state in column
        ``accepted - 1`` is copied into the new first block (``copies_before``, unless it is that slot) and
        the accepted count resets to 1. The first block it leaves is published when it holds its boundary
        state, else held for the post-copy that will write it (``keep``)."""
        fresh, bs, d = set(admitted), self.block_size, self.d
        for req, n in reqs:
            w = self.windows[req.id]
            curr = (req.cached + n - 1) // bs
            if req.id in fresh or w.curr < 0:
                w.curr = curr
                continue
            if curr == w.curr:
                continue
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
            boundary = (w.curr + 1) * bs
            if w.boundary:  # the block's own state: published now, or freed after the step
                self.pool.hold(left)
                if self.tree.state_at(req.fed[:boundary]) is None and self._room(need_slot=False):
                    self._publish(req, left, boundary)
                else:
                    self.releasing.append(left)
            else:
                if w.pending is not None:  # never (its post-copy came before this slide): kept till finish
                    w.spent.append(w.pending)  # as the replay keeps a kept block
                self.pool.hold(left)
                w.pending = left
                move["keep"] = [left]
            self._record("moves", move)
            w.curr, w.accepted, w.boundary = curr, 1, False
            req.slot = new[0]

    def track(self, mode: str, rows: list[tuple[_Request, int | None, int]]) -> None:
        """After the forward (``postprocess_mamba``): a prefill chunk that ends on its block's end leaves the
        boundary state in column 0; a verify whose accepted tokens reach a block's end, ``aligned``, copies
        the state of column ``aligned - running`` (``running`` = the tokens before the step + 1) into that
        block: its own first block (then the next verify reads it there), or the block its window left, held
        for it, which becomes the checkpoint of exactly ``aligned`` tokens."""
        bs = self.block_size
        for req, n, kept in rows:
            w = self.windows[req.id]
            if n is not None:
                w.boundary = req.cached % bs == 0
                continue
            if mode != "target_verify":
                continue
            before = req.cached - kept
            running, aligned = before + 1, req.cached // bs * bs
            w.accepted = kept
            if aligned < running:
                continue
            window = self.pool.slots_of(req.row)
            src, dest = window[aligned - running], aligned // bs - 1
            if dest == w.curr:  # within its own block (all D accepted, the block's end reached exactly)
                self._record("copies_after", [src, window[0]])
                w.accepted, w.boundary = 1, True
            elif dest == w.curr - 1 and w.pending is not None:
                slot, w.pending = w.pending, None
                self._record("copies_after", [src, slot])
                if self.tree.state_at(req.fed[:aligned]) is None and self._room(need_slot=False):
                    self._publish(req, slot, aligned)
                else:  # the request's block until it finishes (the replay frees a kept block only then)
                    w.spent.append(slot)

    def finish(self, req: _Request) -> None:
        """``req`` finished: its window is freed, with the blocks it left that the tree did not take."""
        w = self.windows.pop(req.id)
        for slot in [*w.spent, *([] if w.pending is None else [w.pending])]:
            self.pool.release(slot)
        super().finish(req)


class _Scheduler:
    """The running and waiting requests, and one step's choice (see the module docstring)."""

    def __init__(
        self,
        pool: StatePool,
        rng: random.Random,
        cache: _NoBuffer | None,
        *,
        spec: int,
        mixed: bool,
        prefill: bool,
        decodes_first: bool,
        chunk_size: int,
        token_budget: int,
        max_running: int,
        accept_rate: float,
    ) -> None:
        self.pool, self.rng, self.spec, self.mixed, self.prefill = pool, rng, spec, mixed, prefill
        self.cache = cache
        self.decodes_first, self.chunk_size, self.token_budget = decodes_first, chunk_size, token_budget
        self.max_running, self.tokens_per_decode, self.accept_rate = max_running, spec or 1, accept_rate
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []  # in admission order
        self.last_mode = "idle"

    def can_admit(self) -> bool:
        if not self.waiting or len(self.running) >= self.max_running:
            return False
        return self.pool.num_free > 0 if self.cache is None else self.cache.can_place()

    def admit(self) -> _Request | None:
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

    def step(self, t: int) -> TraceStep:
        left = self.token_budget
        admitted: list[int] = []
        chunks: list[tuple[_Request, int]] = []  # prefill rows: (request, tokens this step)
        decoders: list[_Request] = []
        decode_phase = [r for r in self.running if not r.prefilling]
        prefill_work = self.prefill and (len(decode_phase) < len(self.running) or self.can_admit())
        if self.mixed:
            left = self._take_decoders(decode_phase, decoders, left)
            left = self._take_chunks(chunks, admitted, left)
        elif prefill_work and (not decode_phase or self.last_mode != "extend"):
            left = self._take_chunks(chunks, admitted, left)
        elif decode_phase or (not self.prefill and self.can_admit()):
            left = self._take_decoders(decode_phase, decoders, left)
            while not self.prefill and left >= self.tokens_per_decode and self.can_admit():
                req = self.admit()  # prefilled elsewhere: its first token is sampled
                assert req is not None  # no prefix cache without prefill: the pool had a free slot
                req.cached, req.sampled = req.prompt_len, 1
                admitted.append(req.id)
                decoders.append(req)
                left -= self.tokens_per_decode
        if not chunks and not decoders:
            self.last_mode = "idle"
            # nothing was admitted (an admission always brings a chunk), so the cache did nothing either
            return TraceStep(t, "idle", metadata=None if self.cache is None else self.cache.end_step())

        spec, cache = self.spec, self.cache
        if cache is not None:  # align: states entering a new block move there (their rows name the new slot)
            cache.place(chunks + [(r, self.tokens_per_decode) for r in decoders], admitted)
        accepted = [self._draw_accepted() for _ in decoders] if spec else [1] * len(decoders)
        fed_ext: list[tuple[int, ...] | None] = [None] * len(chunks)
        fed_dec: list[tuple[int, ...] | None] = [None] * len(decoders)
        if cache is not None:  # the ids each row feeds: prompt pieces; the last sampled id (then drafts)
            fed_ext = [r.prompt[r.cached : r.cached + n] for r, n in chunks]
            fed_dec = [(r.pending, *(cache.token() for _ in range(self.tokens_per_decode - 1))) for r in decoders]
        # align with speculation: rows name their window of blocks (admissions are placed by it)
        windows = isinstance(cache, _AlignSpec)
        rows_ext = [
            TraceRow(r.id, r.row, r.slot, r.cached + n, n, r.cached, tokens=ids, slots=self._slots(r, windows))
            for (r, n), ids in zip(chunks, fed_ext, strict=True)
        ]
        rows_dec = [
            TraceRow(
                r.id,
                r.row,
                r.slot,
                r.cached + self.tokens_per_decode,
                self.tokens_per_decode,
                r.cached,
                a if spec else None,
                ids,
                self._slots(r, windows),
            )
            for r, a, ids in zip(decoders, accepted, fed_dec, strict=True)
        ]
        if chunks and decoders:
            mode = "mixed"
        elif chunks:
            mode = "extend"
        else:
            mode = "target_verify" if spec else "decode"
        if mode == "decode" or mode == "target_verify":
            rows = rows_dec
        elif self.decodes_first:  # vLLM: every one-token row is a decode, laid first (stable)
            both = rows_dec + rows_ext
            rows = [r for r in both if r.new_tokens == 1] + [r for r in both if r.new_tokens != 1]
        else:
            rows = rows_ext + rows_dec

        for (r, n), ids in zip(chunks, fed_ext, strict=True):
            r.cached += n
            if cache is not None:
                r.fed.extend(ids or ())
            if not r.prefilling:
                r.sampled += 1  # the last chunk samples the first output token
                if cache is not None:
                    r.pending = cache.token()
        for r, a, ids in zip(decoders, accepted, fed_dec, strict=True):
            r.cached += a
            r.sampled += a
            if cache is not None:  # the first `a` fed ids are kept; the step samples the next (the bonus)
                r.fed.extend((ids or ())[:a])
                r.pending = cache.token()
        done = [r for r in self.running if not r.prefilling and r.sampled >= r.output_len]
        gone = {r.id for r in done}
        metadata = None
        if cache is not None:
            reqs: dict[int, tuple[_Request, int | None, int]] = {r.id: (r, n, n) for r, n in chunks}
            reqs.update({r.id: (r, None, a) for r, a in zip(decoders, accepted, strict=True)})
            cache.track(mode, [reqs[row.id] for row in rows])
            for r, _ in chunks:  # a request finishing now donates instead (no copy for a finished request)
                if not r.prefilling and r.id not in gone:
                    cache.prefilled(r)
            for r in done:
                cache.finish(r)
            metadata = cache.end_step()
        elif done:
            self.pool.free([r.row for r in done])
        if done:
            self.running = [r for r in self.running if r.id not in gone]
        self.last_mode = mode
        return TraceStep(t, mode, tuple(rows), tuple(admitted), tuple(r.id for r in done), metadata)

    def _slots(self, req: _Request, windows: bool) -> tuple[int, ...] | None:
        return tuple(self.pool.slots_of(req.row)) if windows else None

    def _draw_accepted(self) -> int:
        a = 1
        while a < self.spec and self.rng.random() < self.accept_rate:
            a += 1
        return a

    def _take_decoders(self, decode_phase: list[_Request], decoders: list[_Request], left: int) -> int:
        n = min(len(decode_phase), left // self.tokens_per_decode)
        decoders.extend(decode_phase[:n])
        return left - n * self.tokens_per_decode

    def _chunk(self, r: _Request, left: int) -> int:
        """The prefill chunk ``r`` feeds with ``left`` tokens of budget (the cache may round it)."""
        n = min(r.prompt_len - r.cached, self.chunk_size, left)
        return n if self.cache is None else self.cache.chunk(r, n)

    def _take_chunks(self, chunks: list[tuple[_Request, int]], admitted: list[int], left: int) -> int:
        for r in self.running:
            if not r.prefilling or left <= 0:
                continue
            n = self._chunk(r, left)
            if n <= 0 or (n == 1 and r.prompt_len - r.cached > 1):
                continue  # never split a one-token piece off a longer remainder (none: no block end fits)
            chunks.append((r, n))
            left -= n
        while left >= 2 and self.can_admit() and (self.cache is None or self.cache.can_start(self.waiting[0], left)):
            req = self.admit()
            if req is None:
                break
            admitted.append(req.id)
            n = self._chunk(req, left)  # a hit starts past its cached tokens
            assert n > 0  # can_start saw to it
            chunks.append((req, n))
            left -= n
        return left


# -- a step as the workbench's Batch ---------------------------------------------------------------------
def _check_rows(step: TraceStep, draft_tokens: int) -> None:
    for i, r in enumerate(step.rows):
        where = f"step {step.step} row {i} (request {r.id})"
        if r.new_tokens < 1 or r.cached_tokens < 0 or r.seq_len != r.cached_tokens + r.new_tokens:
            raise SimulationError(
                f"{where}: seq_len={r.seq_len}, cached_tokens={r.cached_tokens}, new_tokens={r.new_tokens}; "
                "need new_tokens >= 1, cached_tokens >= 0 and seq_len == cached_tokens + new_tokens"
            )
        if step.mode == "decode" and r.new_tokens != 1:
            raise SimulationError(f"{where}: new_tokens={r.new_tokens} in a decode step, must be 1")
        if step.mode == "target_verify":
            if r.new_tokens != draft_tokens:
                raise SimulationError(f"{where}: new_tokens={r.new_tokens} in a verify step, must be D={draft_tokens}")
            if r.accepted is not None and not 1 <= r.accepted <= draft_tokens:
                raise SimulationError(f"{where}: accepted={r.accepted}, must be in 1..D={draft_tokens}")


def to_batch(
    step: TraceStep,
    profile: str,
    draft_tokens: int,
    *,
    num_accepted: Mapping[int, int] | None = None,
    device: str | torch.device | None = None,
) -> Batch:
    """The workbench :class:`~workbench.batch.Batch` of one trace step, rows in the recorded order.

    decode -> ``Batch.decode``; target_verify -> ``Batch.target_verify`` (D = ``draft_tokens``); extend and
    mixed -> ``Batch.extend(req_pool_indices, new_tokens, cached_tokens)`` (a mixed step's decode rows are
    one-token extend rows, as sglang's MIXED batch has them); idle -> ``Batch.idle()``.

    ``num_accepted``: request id -> tokens accepted at that request's previous verify, for profiles that
    carry ``num_accepted_tokens`` into the next verify (vLLM: it reads the state in slot ``accepted - 1``);
    a request not in it reads slot 0 (1: its last step was a prefill). :func:`iter_batches` keeps it.
    Raises :class:`SimulationError` naming the step and row when a row's counts do not add up.
    """
    prof = get_profile(profile)
    d = check_int("draft_tokens", draft_tokens, 1)
    _check_rows(step, d)
    rpi = [r.req_pool_index for r in step.rows]
    if step.mode == "idle":
        if step.rows:
            raise SimulationError(f"step {step.step}: an idle step has no rows, got {len(step.rows)}")
        return Batch.idle(device=device)
    if not step.rows:
        raise SimulationError(f"step {step.step}: a {step.mode} step needs at least one row")
    if step.mode == "decode":
        return Batch.decode(rpi, [r.seq_len for r in step.rows], device=device)
    if step.mode == "target_verify":
        acc = None
        if prof.num_accepted_fill is not None:
            known = num_accepted or {}
            acc = [known.get(r.id, 1) for r in step.rows]
        return Batch.target_verify(rpi, [r.seq_len for r in step.rows], d, num_accepted_tokens=acc, device=device)
    if step.mode in ("extend", "mixed"):
        return Batch.extend(rpi, [r.new_tokens for r in step.rows], [r.cached_tokens for r in step.rows], device=device)
    raise SimulationError(
        f"step {step.step}: mode {step.mode!r} is not one of decode, target_verify, extend, mixed, idle"
    )


def iter_batches(trace: Trace, *, device: str | torch.device | None = None) -> Iterator[tuple[TraceStep, Batch]]:
    """Every step with its Batch, keeping each request's last accepted count for the next verify (vLLM);
    any step a request runs consumes it (the lab's rule), a finished request drops it."""
    h = trace.header
    last: dict[int, int] = {}
    for step in trace.steps:
        batch = to_batch(step, h.profile, h.draft_tokens, num_accepted=last, device=device)
        for r in step.rows:
            last.pop(r.id, None)
            if step.mode == "target_verify" and r.accepted is not None:
                last[r.id] = r.accepted
        for rid in step.finish:
            last.pop(rid, None)
        yield step, batch


__all__ = [
    "DECODES_FIRST",
    "PREFIX_CACHES",
    "PREFIX_CACHES_NOT_BUILT",
    "PREFIX_PROFILES",
    "TRACK_KEYS",
    "SimulationError",
    "iter_batches",
    "new_pool",
    "simulate",
    "slots_per_request",
    "to_batch",
    "verify_track_step",
]
