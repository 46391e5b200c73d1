"""The model behind ``MetadataExplorer``: all logic in plain Python (no ipywidgets), so tests drive it.

The user sets parameters (profile or all three, mode, raw batch size, seq lens typed or random, draft
tokens, bucket list typed or the engine's, pool size and fragmentation); :meth:`ExplorerModel.update`
rebuilds the metadata and returns an :class:`ExplorerState` with the metadata, their pools and, instead of
raising, the validator's errors in words keyed by the control that caused them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from workbench.batch import Batch
from workbench.errors import MetadataError, WorkbenchError
from workbench.metadata import Metadata, build_metadata, validate
from workbench.pool import StatePool

PROFILE_NAMES = ("sglang", "sglang-ascend", "vllm")
PROFILE_CHOICES = (*PROFILE_NAMES, "all")
MODES = ("decode", "target_verify", "extend", "idle")
# the controls an error can be shown beside; "general" for anything else
CONTROLS = ("profile", "mode", "raw_batch_size", "seq_lens", "draft_tokens", "buckets", "pool_size", "fragmentation")


@dataclass(frozen=True)
class ExplorerParams:
    """What the explorer's controls hold.

    Attributes:
        profile: one of ``PROFILE_CHOICES`` ("all": the three engines side by side).
        mode: decode | target_verify | extend | idle.
        raw_batch_size: live requests (ignored when ``seq_lens`` is typed: the list decides).
        seq_lens: typed comma-separated lengths (decode/verify: seq lens; extend: new tokens per request),
            or "" for random ones drawn from ``seed``.
        draft_tokens: D of target_verify.
        buckets: typed comma-separated captured batch sizes, or "" for the engine default.
        pool_size: state slots in the pool, the dummy slot included.
        fragmentation: 0..1, the share of earlier requests freed before the batch is allocated (holes).
        seed: of the random lengths and of which earlier requests are freed.
    """

    profile: str = "all"
    mode: str = "decode"
    raw_batch_size: int = 5
    seq_lens: str = ""
    draft_tokens: int = 3
    buckets: str = ""
    pool_size: int = 64
    fragmentation: float = 0.5
    seed: int = 0


@dataclass
class ExplorerState:
    """The result of one update: steps (one per profile shown), their pools, errors by control."""

    params: ExplorerParams
    metas: list[Metadata] = field(default_factory=list)
    pools: list[StatePool] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    raw_batch_size: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors


def parse_int_list(field_name: str, text: str) -> list[int]:
    """Parse "1, 2,3" into ints; raise ``WorkbenchError`` naming the field, the position and the text."""
    out = []
    for i, part in enumerate(p.strip() for p in str(text).replace(";", ",").split(",")):
        if not part:
            continue
        try:
            out.append(int(part))
        except ValueError:
            raise MetadataError(f"{field_name}: item {i} is {part!r}, not an integer") from None
    return out


def control_of(message: str) -> str:
    """Which control an error message is about (its leading field name), "general" when none matches."""
    head = message.split(":")[0].split("[")[0].split(" ")[0]
    table = {
        "seq_lens": "seq_lens",
        "extend_lens": "seq_lens",
        "prefix_lens": "seq_lens",
        "draft_tokens": "draft_tokens",
        "slots_per_request": "draft_tokens",
        "buckets": "buckets",
        "bucket": "buckets",
        "num_slots": "pool_size",
        "pool_size": "pool_size",
        "pool": "pool_size",
        "max_requests": "pool_size",
        "fragmentation": "fragmentation",
        "raw_batch_size": "raw_batch_size",
        "profile": "profile",
        "mode": "mode",
    }
    return table.get(head, "general")


class ExplorerModel:
    """Builds the metadata the explorer shows. ``update(**changes)`` never raises on bad input: the
    errors come back in ``ExplorerState.errors`` (control name -> message)."""

    def __init__(self, **params: Any) -> None:
        self.params = ExplorerParams(**params)
        self.state = self.update()

    def update(self, **changes: Any) -> ExplorerState:
        """Apply ``changes`` to the parameters and rebuild; returns (and keeps) the new state."""
        try:
            self.params = replace(self.params, **changes)
        except TypeError as e:  # an unknown parameter name is a programming error, not user input
            raise MetadataError(f"ExplorerModel.update: {e}") from None
        self.state = self._build(self.params)
        return self.state

    # -- building -------------------------------------------------------------------------------------
    def _build(self, p: ExplorerParams) -> ExplorerState:
        st = ExplorerState(params=p, raw_batch_size=p.raw_batch_size)
        errors = st.errors
        if p.profile not in PROFILE_CHOICES:
            errors["profile"] = f"profile: {p.profile!r} is not one of {list(PROFILE_CHOICES)}"
        if p.mode not in MODES:
            errors["mode"] = f"mode: {p.mode!r} is not one of {list(MODES)}"
        if not 0.0 <= p.fragmentation <= 1.0:
            errors["fragmentation"] = f"fragmentation: {p.fragmentation} is not in [0, 1]"
        if p.mode == "target_verify" and p.draft_tokens < 1:
            errors["draft_tokens"] = f"draft_tokens: {p.draft_tokens}, must be >= 1"
        lens: list[int] | None = None
        buckets: list[int] | None = None
        try:
            lens = parse_int_list("seq_lens", p.seq_lens) if p.seq_lens.strip() else None
        except WorkbenchError as e:
            errors["seq_lens"] = str(e)
        try:
            buckets = parse_int_list("buckets", p.buckets) if p.buckets.strip() else None
            if buckets is not None and not buckets:
                raise MetadataError("buckets: no batch size typed; clear the box for the engine default")
        except WorkbenchError as e:
            errors["buckets"] = str(e)
        if errors:
            return st
        r = 0 if p.mode == "idle" else (len(lens) if lens is not None else p.raw_batch_size)
        st.raw_batch_size = r
        if r < 0:
            errors["raw_batch_size"] = f"raw_batch_size: {r}, must be >= 0"
            return st
        if lens is None:
            rng = random.Random(p.seed)
            lens = [rng.randint(1, 64 if p.mode == "extend" else 512) for _ in range(r)]
        profiles = PROFILE_NAMES if p.profile == "all" else (p.profile,)
        for name in profiles:
            try:
                meta, pool = self._one(name, p, r, lens, buckets)
            except (WorkbenchError, ValueError, TypeError) as e:
                errors.setdefault(control_of(str(e)), f"{name}: {e}")
                continue
            st.metas.append(meta)
            st.pools.append(pool)
        return st

    @staticmethod
    def _one(
        name: str, p: ExplorerParams, r: int, lens: list[int], buckets: list[int] | None
    ) -> tuple[Metadata, StatePool]:
        d = p.draft_tokens if p.mode == "target_verify" else 1
        spr = d if (name == "vllm" and p.mode == "target_verify") else 1
        pool = StatePool(p.pool_size, name, slots_per_request=spr)
        if r > pool.capacity:
            raise MetadataError(
                f"pool_size: {p.pool_size} slots hold {pool.capacity} requests of {spr} slot(s) beside the dummy "
                f"slot, fewer than the {r} live requests"
            )
        # earlier requests, some freed again: the batch lands in the holes, as in a busy server
        earlier = min(pool.capacity - r, 2 * max(r, 1))
        rng = random.Random(p.seed * 7919 + 17)  # independent of the lengths drawn from seed
        scratch = pool.alloc(earlier).tolist()
        freed = rng.sample(scratch, round(p.fragmentation * earlier)) if earlier else []
        pool.free(freed)
        rows = pool.alloc(r)
        if p.mode == "decode":
            batch = Batch.decode(rows, lens)
        elif p.mode == "target_verify":
            batch = Batch.target_verify(rows, lens, draft_tokens=d)
        elif p.mode == "extend":
            # every other request continues from a cached prefix (has an initial state), the rest are new
            prefix = [0 if i % 2 else 16 * (i + 1) for i in range(r)]
            batch = Batch.extend(rows, lens, prefix)
        else:
            batch = Batch.idle()
        bucket: str | None = None if p.mode == "extend" else "auto"
        meta = build_metadata(batch, pool, bucket=bucket, buckets=buckets)
        validate(meta, pool)
        return meta, pool
