"""What a simulated trace is made from: :class:`SimConfig`, one frozen object that validates itself.

Every parameter of :func:`~workbench.traces.simulate.simulate` is a field, with its default; building one
checks every field (a bad value raises :class:`~workbench.traces.steps.SimulationError` naming the field and
the value) and resolves the defaults that depend on others (the pool, the buckets, the prefix cache's
settings) into :attr:`SimConfig.plan`, a :class:`SimPlan`. So a config that exists is one the simulator runs,
and one config is one trace: ``simulate(config)`` twice gives the same steps.

    >>> c = SimConfig("vllm", steps=50, seed=1, mixed=True)
    >>> c
    SimConfig(profile='vllm', layer='gdn', steps=50, seed=1, mixed=True)
    >>> c.summary()
    'vllm gdn: 50 steps, seed 1, no speculation, mixed steps; pool of 61 slots, at most 30 running'
    >>> dataclasses.replace(c, spec=3).summary()
    'vllm gdn: 50 steps, seed 1, spec 3, mixed steps; pool of 91 slots, at most 30 running'
    >>> dataclasses.replace(c, profile="sglang", spec=2).summary()  # sglang's running requests decode in them
    'sglang gdn: 50 steps, seed 1, spec 2, mixed steps (1-token decode tails); pool of 31 slots, at most 30 running'

(torch.utils.benchmark's ``TaskSpec`` is the model: a small frozen spec with a readable repr and summary.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from functools import cached_property

from workbench.buckets import check_buckets
from workbench.errors import MetadataError
from workbench.layer_names import DEFAULT_LAYER
from workbench.layers import LAYERS, LayerError, LayerSpec, get_layer_spec
from workbench.limits import INT32_MAX, INT64_MAX, check_int
from workbench.metadata.record import GRAPH_MODES
from workbench.profiles import PROFILES, Profile, get_profile
from workbench.traces.steps import SimulationError
from workbench.traces.strategies import PREFIX_CACHES, PREFIX_CACHES_NOT_BUILT, STRATEGIES, CacheSettings, NoBuffer

DEFAULT_DRAFT_TOKENS = 2
"""D of the header when the trace has no verify step (``spec=0``), as ``TraceHeader``'s default."""

DEFAULT_MAX_BS = 24
"""Largest captured batch size of the default bucket lists (the profile's own lists, clipped)."""

DEFAULT_BLOCK_SIZE = 16
"""``block_size`` of ``align`` (vLLM's mamba block size, hundreds to thousands of tokens there)."""

DEFAULT_CACHE_CHUNK = 16
"""``cache_chunk`` of ``extra_buffer`` (sglang's ``mamba_cache_chunk_size``, 64 there: small here so that
short simulated prompts track)."""

DEFAULT_TRACK_INTERVAL = 32
"""``track_interval`` of ``extra_buffer`` (sglang's ``mamba_track_interval``, 256 there)."""

MIXED_VERIFY_ENGINES = ("vllm",)
"""Engines whose mixed steps carry verify rows (``mixed=True`` with ``spec=D``): vLLM 0.33.0 batches verify rows
of D tokens with prefill chunks (56% of the steps of a real scheduler run, ``tests/fixtures``). The other engine,
sglang, keeps mixed chunked prefill under chain EAGLE / MTP, but its mixed steps hold no verify row: the running
requests join a step that prefills as 1-token decode rows (``SGLANG_MIXED_SPEC``)."""

SGLANG_MIXED_SPEC = (
    "sglang 0.5.23, python/sglang/srt/arg_groups/speculative_hook.py:1103-1117 and "
    "python/sglang/srt/speculative/spec_info.py:147-158"
)
"""Where sglang keeps ``enable_mixed_chunk`` under speculation: it turns it off only when the algorithm's
``supports_mixed_chunk()`` is false (ngram); EAGLE, EAGLE3, DFLASH and DSPARK keep it, and "mixed steps degrade
running requests to a plain 1-token decode"."""


@dataclass(frozen=True, repr=False)
class SimConfig:
    """Every parameter of a simulated trace (see :mod:`workbench.traces.simulate` for the scheduler they
    drive); building one validates it (``SimulationError`` naming the field and value) and resolves its
    defaults into :attr:`plan`. ``dataclasses.replace`` makes a variant, validated again.

    Attributes:
        profile: engine conventions, a name of ``workbench.profiles.PROFILES``: pool, row order of mixed
            steps, the prefix caches it has (``Profile.prefix_caches``).
        layer: a key of ``workbench.layers.LAYERS`` (Gated DeltaNet, Mamba2: both decode, verify and extend).
        steps: scheduler steps to record (idle ones included).
        seed: of the one ``random.Random`` every draw comes from.
        spec: D, draft tokens per verify step (0: no speculation, plain decode steps).
        topk: 1, each verify row's drafts are a chain; above 1 (sglang's ``speculative_eagle_topk``, needs
            ``spec`` and a profile with ``tree_verify``: vLLM removed tree drafts), each verify row's D tokens
            are the nodes of a random draft tree (``DraftTree.random``, each node at most ``topk`` children)
            and it accepts a random root-to-node path (``accept_rate``).
        mixed: let a step carry prefill chunks and decode-phase rows together (``mode="mixed"``): one-token
            decode rows, or with ``spec`` under vLLM (``MIXED_VERIFY_ENGINES``) verify rows of D tokens; under
            sglang with ``spec``, a step that prefills runs its decode-phase requests as one-token decode rows
            (the pending token) and a step that does not verifies (``SGLANG_MIXED_SPEC``).
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
        prefix_cache: None (no prefix cache, rows without ``tokens``) or a key of
            :data:`~workbench.traces.strategies.STRATEGIES` the profile has (``Profile.prefix_caches``):
            ``"no_buffer"`` or ``"extra_buffer"`` (sglang's mamba radix cache; sglang profiles), ``"align"``
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

    Sequences (``buckets``, the ``(low, high)`` pairs) are kept as tuples, so equal configs compare and hash
    equal however they were given.
    """

    profile: str = "sglang"
    layer: str = DEFAULT_LAYER
    _: KW_ONLY
    steps: int = 200
    seed: int = 0
    spec: int = 0
    topk: int = 1
    mixed: bool = False
    dp_dummies: bool = False
    num_slots: int | None = None
    buckets: Sequence[int] | None = None
    chunk_size: int = 32
    token_budget: int = 64
    max_running: int | None = None
    max_waiting: int | None = None
    arrival_rate: float = 0.5
    prompt_lens: tuple[int, int] = (4, 96)
    output_lens: tuple[int, int] = (2, 40)
    accept_rate: float = 0.7
    dp_dummy_rate: float = 0.1
    prefill: bool | None = None
    prefix_cache: str | None = None
    shared_prefixes: int = 4
    prefix_len: tuple[int, int] = (16, 64)
    vocab: int = 512
    followup_rate: float = 0.2
    max_cached: int | None = None
    cache_chunk: int | None = None
    track_interval: int | None = None
    block_size: int | None = None

    def __post_init__(self) -> None:
        plan = self.plan  # validates every field, in the order simulate() always checked them
        given = {"prompt_lens": plan.prompt_lens, "output_lens": plan.output_lens}
        if plan.cache is not None:
            given["prefix_len"] = plan.cache.prefix_len
        for name, value in given.items():
            object.__setattr__(self, name, value)
        if self.buckets is not None:
            object.__setattr__(self, "buckets", tuple(int(b) for b in self.buckets))

    @cached_property
    def plan(self) -> SimPlan:
        """What the fields resolve to (defaults filled in), for the simulator."""
        return _resolve(self)

    def __repr__(self) -> str:
        """The profile, the layer and every field that differs from its default."""
        shown = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.name in ("profile", "layer") or getattr(self, f.name) != f.default
        ]
        return f"SimConfig({', '.join(shown)})"

    @property
    def mixed_tails(self) -> bool:
        """Whether the mixed steps run the decode-phase requests as one-token decode rows although ``spec`` is
        set (sglang's: ``SGLANG_MIXED_SPEC``); vLLM's hold verify rows of D tokens (``MIXED_VERIFY_ENGINES``)."""
        return self.mixed and self.spec > 0 and self.plan.profile.engine not in MIXED_VERIFY_ENGINES

    def summary(self) -> str:
        """One line: the engine and layer, the run, the step kinds, the prefix cache and the pool."""
        p = self.plan
        parts = [f"{self.steps} steps", f"seed {self.seed}", f"spec {self.spec}" if self.spec else "no speculation"]
        if self.topk > 1:
            parts[-1] += f" (draft trees, topk {self.topk})"
        if self.mixed:
            parts.append("mixed steps (1-token decode tails)" if self.mixed_tails else "mixed steps")
        if self.dp_dummies:
            parts.append(f"DP dummy steps ({p.dp_dummy_rate:g})")
        if not p.prefill:
            parts.append("a decode instance (no prefill)")
        if p.cache is not None:
            parts.append(f"prefix cache {self.prefix_cache} (at most {p.cache.max_cached} checkpoints)")
        pool = f"pool of {p.num_slots} slots, at most {p.max_running} running"
        return f"{p.profile.name} {p.layer.name}: {', '.join(parts)}; {pool}"


@dataclass(frozen=True)
class SimPlan:
    """What a :class:`SimConfig` resolves to: the profile and layer looked up, ``prefill`` and the pool's
    sizes with their defaults, the rates as floats, the header's buckets, and the prefix cache's strategy
    class and settings (None without one)."""

    profile: Profile
    layer: LayerSpec
    prefill: bool
    arrival_rate: float
    accept_rate: float
    dp_dummy_rate: float
    prompt_lens: tuple[int, int]
    output_lens: tuple[int, int]
    strategy: type[NoBuffer] | None
    cache: CacheSettings | None
    buckets: dict[str, list[int]]  # graph mode -> captured batch sizes (the trace header's)
    draft_tokens: int  # the header's D: spec, or DEFAULT_DRAFT_TOKENS without speculation
    slots_per_request: int  # slots a request owns in the pool (D under vLLM with a verify graph)
    num_slots: int
    max_running: int
    max_waiting: int


# -- checks: each names the field and the value --------------------------------------------------------------
def _int(name: str, value: object, lo: int, hi: int = INT64_MAX) -> int:
    """``check_int``'s check and message, as a SimulationError."""
    try:
        return check_int(name, value, lo, hi)
    except MetadataError as e:
        raise SimulationError(str(e)) from None


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


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise SimulationError(f"{name} = {value!r}: must be True or False")
    return value


# -- resolution, in the order the fields are checked -------------------------------------------------------
def _resolve(c: SimConfig) -> SimPlan:
    try:
        prof = get_profile(c.profile)
    except MetadataError as e:
        raise SimulationError(str(e)) from None
    try:
        layer = get_layer_spec(c.layer)
    except LayerError:
        raise SimulationError(f"layer = {c.layer!r}: choose one of {sorted(LAYERS)}") from None
    _int("steps", c.steps, 0)
    _int("seed", c.seed, -(2**63), 2**63 - 1)
    spec = _int("spec", c.spec, 0, 1024)
    _check_topk(c, prof, spec)
    prefill = _check_steps(c, layer)
    _int("chunk_size", c.chunk_size, 1)
    _int("token_budget", c.token_budget, max(2, spec))
    arrival_rate = _check_range("arrival_rate", c.arrival_rate, 0.0, 64.0)
    accept_rate = _check_range("accept_rate", c.accept_rate, 0.0, 1.0)
    dp_dummy_rate = _check_range("dp_dummy_rate", c.dp_dummy_rate, 0.0, 1.0)
    prompt_lens = _check_lens("prompt_lens", c.prompt_lens, 2)
    output_lens = _check_lens("output_lens", c.output_lens, 1)
    strategy = _check_prefix_cache(c.prefix_cache, prof, layer, prefill)
    shared = _int_arg("shared_prefixes", c.shared_prefixes, 1, 1 << 16)
    prefix_len = _check_lens("prefix_len", c.prefix_len, 1)
    vocab = _int_arg("vocab", c.vocab, 1, INT32_MAX + 1)
    followup_rate = _check_range("followup_rate", c.followup_rate, 0.0, 1.0)
    block_size = _check_block_size(c, strategy)
    cache_chunk, track_interval = _check_track_grid(c, strategy)
    graph_modes = [m for m in GRAPH_MODES if m in layer.supported_modes and _captures(strategy, m, spec)]
    buckets = _header_buckets(prof, graph_modes, c.buckets, spec)
    d = spec or DEFAULT_DRAFT_TOKENS
    spr = prof.slots_per_request(d) if "target_verify" in buckets else 1
    num_slots, max_running = _pool_size(c, prof, strategy, spr, max(b[-1] for b in buckets.values()))
    max_waiting = _int("max_waiting", 2 * max_running if c.max_waiting is None else c.max_waiting, 0)
    cache = None
    if strategy is not None:
        cache = CacheSettings(
            max_cached=_max_cached(c, num_slots),
            shared_prefixes=shared,
            prefix_len=prefix_len,
            vocab=vocab,
            followup_rate=followup_rate,
            longest_prompt=prompt_lens[1],
            spec=spec,
            slots_per_request=spr,
            block_size=block_size,
            cache_chunk=cache_chunk,
            track_interval=track_interval,
            batch_grid=layer.chunk_grid == "batch",
        )
    elif c.max_cached is not None:
        raise SimulationError(f"max_cached = {c.max_cached!r}: needs a prefix cache (prefix_cache='no_buffer')")
    return SimPlan(
        profile=prof,
        layer=layer,
        prefill=prefill,
        arrival_rate=arrival_rate,
        accept_rate=accept_rate,
        dp_dummy_rate=dp_dummy_rate,
        prompt_lens=prompt_lens,
        output_lens=output_lens,
        strategy=strategy,
        cache=cache,
        buckets=buckets,
        draft_tokens=d,
        slots_per_request=spr,
        num_slots=num_slots,
        max_running=max_running,
        max_waiting=max_waiting,
    )


def _check_topk(c: SimConfig, prof: Profile, spec: int) -> int:
    """``topk``: an int >= 1; above 1 (draft trees) it needs ``spec`` and an engine that verifies trees."""
    topk = _int_arg("topk", c.topk, 1, 1024)
    if topk == 1:
        return topk
    if not prof.tree_verify:
        why = " (vLLM removed tree drafts)" if prof.engine == "vllm" else ""
        trees = " or ".join(repr(p.name) for p in PROFILES.values() if p.tree_verify)
        raise SimulationError(
            f"topk = {topk}: profile {prof.name!r} verifies chains only{why}; draft trees need profile {trees}"
        )
    if not spec:
        raise SimulationError(f"topk = {topk}: draft trees are verify rows; give spec (D, the tree's nodes) too")
    return topk


def _check_steps(c: SimConfig, layer: LayerSpec) -> bool:
    """The step kinds the config asks for, against the layer's modes and each other; ``prefill`` resolved."""
    modes = layer.supported_modes
    _flag("mixed", c.mixed)
    _flag("dp_dummies", c.dp_dummies)
    if c.prefill is not None and not isinstance(c.prefill, bool):
        raise SimulationError(f"prefill = {c.prefill!r}: must be True, False or None")
    prefill = "extend" in modes if c.prefill is None else c.prefill
    cls_name = layer.layer_class.__name__
    if c.spec and "target_verify" not in modes:
        raise SimulationError(
            f"spec = {c.spec}: layer {c.layer!r} has no target_verify step ({cls_name}.supported_modes = {modes}); "
            "simulate it with spec=0"
        )
    if c.mixed and not prefill:
        why = (
            f"layer {c.layer!r} has no extend step ({cls_name}.supported_modes = {modes})"
            if "extend" not in modes
            else "prefill=False"
        )
        raise SimulationError(f"mixed = True: a mixed step carries prefill chunks, but {why}")
    return prefill


def _check_prefix_cache(value: object, prof: Profile, layer: LayerSpec, prefill: bool) -> type[NoBuffer] | None:
    """The prefix-cache strategy's class, or None; refused (naming the field and value) where it is not
    modelled: a name not in ``STRATEGIES``, another engine's (``Profile.prefix_caches``), a layer without
    extend steps, a decode instance."""
    if value is None:
        return None
    if value in PREFIX_CACHES_NOT_BUILT:
        raise SimulationError(f"prefix_cache = {value!r}: not built yet; the simulator models {PREFIX_CACHES}")
    if not isinstance(value, str) or value not in STRATEGIES:
        raise SimulationError(f"prefix_cache = {value!r}: choose one of {PREFIX_CACHES}, or None")
    if value not in prof.prefix_caches:
        owners = sorted(p.name for p in PROFILES.values() if value in p.prefix_caches)
        raise SimulationError(
            f"profile = {prof.name!r}: prefix_cache = {value!r} is not its engine's (profiles {owners} have it); "
            f"{prof.engine}'s mamba prefix cache is prefix_cache={' or '.join(map(repr, prof.prefix_caches))}"
        )
    if "extend" not in layer.supported_modes:
        raise SimulationError(
            f"layer = {layer.name!r}: prefix_cache = {value!r} checkpoints prefilled prompts, and it has no extend step"
        )
    if not prefill:
        raise SimulationError(f"prefill = False: prefix_cache = {value!r} checkpoints prefilled prompts")
    return STRATEGIES[value]


def _refuse_foreign(c: SimConfig, name: str, strategy: type[NoBuffer] | None) -> bool:
    """Whether ``strategy`` reads the option ``name``; refused when it is given and the strategy does not
    (naming the strategy that reads it)."""
    if strategy is not None and name in strategy.options:
        return True
    given = getattr(c, name)
    if given is not None:
        owner = next(cls for cls in STRATEGIES.values() if name in cls.options)
        raise SimulationError(f"{name} = {given!r}: needs prefix_cache={owner.name!r} ({owner.options[name]})")
    return False


def _check_block_size(c: SimConfig, strategy: type[NoBuffer] | None) -> int:
    """``block_size`` (align's): at most ``chunk_size`` and ``token_budget`` (a chunk ends on a block's end)
    and at least ``spec`` (a verify's window moves by one block at most)."""
    if not _refuse_foreign(c, "block_size", strategy):
        return DEFAULT_BLOCK_SIZE
    given = DEFAULT_BLOCK_SIZE if c.block_size is None else c.block_size
    bs = _int_arg("block_size", given, 1, min(c.chunk_size, c.token_budget))
    if c.spec and bs < c.spec:
        raise SimulationError(
            f"block_size = {bs}: must be at least spec = {c.spec} (a verify's window of blocks moves by one block "
            "at most, as vLLM's does)"
        )
    return bs


def _check_track_grid(c: SimConfig, strategy: type[NoBuffer] | None) -> tuple[int, int]:
    """``cache_chunk`` and ``track_interval`` (extra_buffer's; their defaults otherwise): the interval is a
    multiple of the chunk."""
    for name in ("cache_chunk", "track_interval"):
        _refuse_foreign(c, name, strategy)
    cc = _int_arg("cache_chunk", DEFAULT_CACHE_CHUNK if c.cache_chunk is None else c.cache_chunk, 1, 1 << 20)
    given = DEFAULT_TRACK_INTERVAL if c.track_interval is None else c.track_interval
    interval = _int_arg("track_interval", given, 1, 1 << 30)
    if interval % cc:
        raise SimulationError(
            f"track_interval = {interval}: must be a multiple of cache_chunk = {cc} (sglang tracks decode on the "
            "grid lcm(checkpoint grid, mamba_track_interval))"
        )
    return cc, interval


def _captures(strategy: type[NoBuffer] | None, mode: str, spec: int) -> bool:
    return strategy is None or strategy.captures(mode, spec)


def _header_buckets(
    prof: Profile, modes: Sequence[str], buckets: Sequence[int] | None, spec: int
) -> dict[str, list[int]]:
    if buckets is not None:
        try:
            given = check_buckets(buckets)
        except TypeError:
            raise SimulationError(f"buckets = {buckets!r}: must be a list of increasing positive ints") from None
        except MetadataError as e:
            raise SimulationError(str(e)) from None
        return {m: list(given) for m in modes}
    return {m: prof.buckets(DEFAULT_MAX_BS, m == "target_verify" or spec > 0) for m in modes}


def _pool_size(c: SimConfig, prof: Profile, strategy: type[NoBuffer] | None, spr: int, largest: int) -> tuple[int, int]:
    """``(num_slots, max_running)``: each as given, or the default from the other (a live request takes
    ``spr`` slots, or what the strategy holds beside them: ``live_slots``); ``largest``: the largest bucket."""
    per_request = spr if strategy is None else strategy.live_slots(spr)
    num_slots = None if c.num_slots is None else _int("num_slots", c.num_slots, 2)
    if strategy is not None and num_slots is not None and num_slots - 1 < strategy.need:
        raise SimulationError(
            f"num_slots = {num_slots}: prefix_cache={strategy.name!r} needs {strategy.need} slots per request "
            f"{strategy.need_why} beside the dummy slot"
        )
    max_running = c.max_running
    if max_running is None:
        max_running = largest + max(1, largest // 4)
        if num_slots is not None:
            max_running = min(max_running, max(1, (num_slots - 1) // per_request))
    max_running = _int("max_running", max_running, 1)
    if num_slots is None:
        return max_running * per_request + 1, max_running
    if (num_slots - 1) // spr < 1:
        raise SimulationError(
            f"num_slots = {num_slots}: leaves no room for one request of {spr} slots beside the reserved dummy "
            f"slot {prof.dummy_slot}"
        )
    return num_slots, max_running


def _max_cached(c: SimConfig, num_slots: int) -> int:
    """Checkpoints the tree may hold: as given, or half the slots; at most every slot but the dummy."""
    given = (num_slots - 1) // 2 if c.max_cached is None else c.max_cached
    return _int_arg("max_cached", given, 0, num_slots - 1)


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_CACHE_CHUNK",
    "DEFAULT_DRAFT_TOKENS",
    "DEFAULT_MAX_BS",
    "DEFAULT_TRACK_INTERVAL",
    "SimConfig",
    "SimPlan",
]
