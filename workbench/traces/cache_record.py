"""What a replay knows of the prefix cache across steps: :class:`CacheRecord`.

The live checkpoints (:class:`Checkpoint`), each request's token ids, which shadow slots hold the float64
state of known ids (a copy's or a track's *label*), and the float64 states of prefixes, recomputed from zeros
through a fixed embedding of the token ids (:func:`embed_tokens`) and cached. Below both checkers that keep
it up to date: the prefix-cache checks (:mod:`~workbench.traces.checkpoints`) and the track checks
(:mod:`~workbench.traces.tracking`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from workbench.batch import Batch
from workbench.layers import FLOAT32_TOLERANCE, LayerState
from workbench.metadata import build_metadata
from workbench.pool import StatePool
from workbench.profiles import Profile
from workbench.traces.context import StepContext

EMBED_VOCAB = 4096
"""Rows of the fixed input embedding: a token id ``t`` feeds row ``t % EMBED_VOCAB``."""
EMBED_SEED = 20_26
PREFIX_CACHE_SIZE = 128
"""Float64 prefix states kept (least recently used first out)."""


def embed_tokens(table: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """The inputs ``[len(ids), hidden]`` of token ``ids``: rows of ``table`` (``[EMBED_VOCAB, hidden]``)."""
    return table[torch.tensor(ids, dtype=torch.long) % table.shape[0]]


def embedding_table(hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """The fixed, seeded input embedding the replay feeds token ids through (never zeros)."""
    g = torch.Generator().manual_seed(EMBED_SEED)
    return torch.randn(EMBED_VOCAB, hidden, generator=g).to(dtype)


@dataclass(frozen=True)
class Checkpoint:
    """A published checkpoint: ``slot`` holds ``request``'s state after exactly ``tokens`` (its first ids)."""

    request: int
    tokens: tuple[int, ...]
    slot: int
    step: int


class CacheRecord:
    """The prefix cache as the replay has followed it so far (see the module).

    ``layer``: the runner's layer (its width and dtype make the embedding table); ``reference``: its float64
    twin, which recomputes prefix states; ``profile``: the pool's, for the scratch slot those run on.
    """

    def __init__(self, layer: Any, reference: Any, profile: str | Profile) -> None:
        self.live: dict[int, Checkpoint] = {}  # slot -> checkpoint
        self.history: dict[int, list[int] | None] = {}  # request id -> token ids in its state (None: unknown)
        # request id -> its shadow is the float64 recurrence from zeros over exactly ``history`` (admitted
        # with no cached tokens, or from a hit's prefix state), so a checkpoint of all of it can be read there
        self.from_zeros: dict[int, bool] = {}
        # slot -> the token ids whose float64 state a copy put into the shadow's slot (a track slot published
        # later reads its reference there instead of recomputing it)
        self.labels: dict[int, tuple[int, ...]] = {}
        # request id -> blocks its window left that the cache holds for a later post-copy (vLLM align + spec)
        self.pending: dict[int, set[int]] = {}
        self.reference = reference
        self.table = embedding_table(layer.config.hidden_size, layer.dtype)  # the runner's inputs
        self._prefix: OrderedDict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._scratch_pool = StatePool(2, profile)
        self._scratch_row = int(self._scratch_pool.alloc(1)[0])

    # -- what the record says --------------------------------------------------------------------------
    def known_ids(self, request: int) -> list[int] | None:
        """The token ids in ``request``'s state when its shadow is their float64 recurrence from zeros, else
        None (unknown ids, or a state that did not start from zeros)."""
        have = self.history.get(request)
        return have if have is not None and self.from_zeros.get(request) else None

    def label(self, slot: int, ids: tuple[int, ...] | None) -> None:
        """The shadow's ``slot`` now holds the float64 state after exactly ``ids`` (None: unknown)."""
        if ids is None:
            self.labels.pop(slot, None)
        else:
            self.labels[slot] = ids

    def kept_slot(self, ctx: StepContext, dst: int, after: bool) -> str | None:
        """Why a copy may not write ``dst`` because of what it holds: a live checkpoint, or (``after`` the
        forward) the running slot of a live request; None when it may."""
        if dst in self.live:
            cp = self.live[dst]
            return f"overwrites the live checkpoint in slot {dst} (request {cp.request}, {len(cp.tokens)} tokens)"
        owner = ctx.owner(dst)
        if after and owner is not None:
            return f"writes the running slot of request {owner}, replacing the state its step computed"
        return None

    # -- float64 prefix states -------------------------------------------------------------------------
    def prefix_state(self, prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The float64 conv window and recurrent state after exactly ``prefix`` from zeros (cached)."""
        hit = self._prefix.get(prefix)
        if hit is not None:
            self._prefix.move_to_end(prefix)
            return hit
        got = self.run_scratch(self.reference, torch.float64, embed_tokens(self.table, list(prefix)), 0, None)
        self.cache(prefix, got)
        return got

    def has_prefix(self, prefix: tuple[int, ...]) -> bool:
        return prefix in self._prefix

    def forget_prefixes(self) -> None:
        """Drop every cached prefix state (each is recomputed when next asked for)."""
        self._prefix.clear()

    def cache(self, prefix: tuple[int, ...], value: tuple[torch.Tensor, torch.Tensor]) -> None:
        self._prefix[prefix] = value
        if len(self._prefix) > PREFIX_CACHE_SIZE:
            self._prefix.popitem(last=False)

    def cache_slot(self, prefix: tuple[int, ...], shadow: LayerState, slot: int) -> None:
        """The shadow's ``slot`` is the float64 state after exactly ``prefix``: keep it instead of recomputing."""
        self.cache(prefix, (shadow.conv[slot].clone(), shadow.ssm[slot].clone()))

    def remember_shadow(self, ctx: StepContext, rid: int, prefix: tuple[int, ...]) -> None:
        """The state after exactly ``prefix`` is ``rid``'s shadow now: keep it instead of recomputing it (the
        shadow is the float64 recurrence over the same ids from zeros, chunk by chunk; a one-slot layout)."""
        if rid not in ctx.live or ctx.pool.slots_per_request != 1:
            return
        (slot,) = ctx.slots_of(rid)
        self.cache_slot(prefix, ctx.shadow, slot)

    def run_scratch(
        self,
        layer: Any,
        dtype: torch.dtype,
        x: torch.Tensor,
        cached: int,
        init: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The conv window and recurrent state ``layer`` leaves after the tokens ``x`` (``[n, hidden]``), from
        ``init`` (a state after ``cached`` tokens) or zeros, on a scratch slot of its own."""
        pool, row = self._scratch_pool, self._scratch_row
        slot = int(pool.mapping[row, 0])
        state: LayerState = layer.new_state(2, dtype=dtype)  # zeros
        if init is not None:
            state.conv[slot], state.ssm[slot] = init
        if x.shape[0]:
            meta = build_metadata(Batch.extend([row], [x.shape[0]], [cached]), pool, bucket=None)
            layer.forward(x.to(dtype), meta, state, None)
        return state.conv[slot].clone(), state.ssm[slot].clone()

    def compare(self, state: LayerState, slot: int, prefix: tuple[int, ...]) -> tuple[str, float] | None:
        """What of ``state``'s ``slot`` is off the float64 state after exactly ``prefix`` (its name and largest
        error; infinite when not finite), or None."""
        conv, ssm = self.prefix_state(prefix)
        tol = FLOAT32_TOLERANCE
        for name, got, want in (("conv window", state.conv[slot], conv), ("recurrent state", state.ssm[slot], ssm)):
            got64 = got.double()
            if not torch.allclose(got64, want, atol=tol.atol, rtol=tol.rtol):
                return name, float((got64 - want).abs().max()) if torch.isfinite(got64).all() else float("inf")
        return None

    def set_shadow(self, shadow: LayerState, slot: int, prefix: tuple[int, ...]) -> None:
        """The shadow's ``slot`` becomes the float64 state after exactly ``prefix``."""
        conv, ssm = self.prefix_state(prefix)
        shadow.conv[slot] = conv
        shadow.ssm[slot] = ssm


__all__ = ["EMBED_VOCAB", "PREFIX_CACHE_SIZE", "CacheRecord", "Checkpoint", "embed_tokens", "embedding_table"]
