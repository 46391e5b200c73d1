"""Prefix-cache checks of a trace replay: every checkpoint is the state after exactly its prefix.

A recurrent state, unlike a KV cache, cannot be cut at any length: a prefix cache keeps whole states, each
the state after exactly some prefix of a request's tokens (a *checkpoint*), in slots of the same pool. A
trace says what the cache did at each step in its ``metadata`` (``workbench.traces.model.PREFIX_KEYS``;
``docs/traces.md``, "Prefix caching"); :class:`CheckpointBook` runs and checks it beside the replay:

* ``evict`` (first, before the step's admissions, which may take the freed slots): each slot is a live
  checkpoint; it is dropped (its slot free again).
* ``hits``: the slot holds a live checkpoint of exactly the hit's length, the request was admitted at this
  step, and its first row continues from there (``cached_tokens`` equal to the length). The shadow of the
  request's own slot becomes the float64 state of that prefix, recomputed: a hit whose copy-on-write is
  missing (or wrong) leaves the runner on other bytes, and the step's state check shows it.
* ``moves`` (after ``copies_before``): a request's running state moves to another slot, as vLLM's align
  mode moves it into the block of its position (the pre-copy is a ``copies_before`` into it); the old
  slot is freed, or kept by a checkpoint the step publishes on it.
* copies (``copies_before`` the forward, ``copies_after`` it): whole-slot copies of the conv window and the
  recurrent state, made in the runner's pool and in the float64 shadow alike; never from or to the dummy
  slot, never onto their own source, never from a slot that holds neither a live request's state nor a
  live checkpoint (a freed or evicted one), never onto a slot another live request owns or a live
  checkpoint.
* sglang's ``mamba_track_mask``, ``mamba_track_indices``, ``mamba_track_seqlens`` (when a trace records
  them): each tracked row has its copy from its running slot into that slot, and holds exactly that many
  tokens; an untracked row's length is -1.
* a verify step's ``mamba_track_indices`` and ``mamba_steps_to_track`` (sglang tracks at commit, first after
  the forward): a row with step ``s >= 0`` has the intermediate state of its draft step ``s`` (the state after
  ``cached + s + 1`` tokens) copied into its track slot, in the runner and the float64 shadow alike, the slot
  checked as a copy's destination after the forward; ``s`` must be one of the row's accepted steps.
* ``checkpoints``: published after the step; the slot is compared, conv window and recurrent state, with the
  float64 state recomputed from zeros over the request's first ``tokens`` token ids (cached per prefix), and
  ``tokens`` may not exceed what the request's state holds after the step (nothing is published before the
  step that writes it has run). A running request's own slot may be published only as it finishes (it is
  then donated to the cache).

Token ids come from the rows' ``tokens``: the replay's inputs are a fixed embedding of them
(:func:`embed_tokens`), so requests sharing a prefix compute the same state over it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kernels.mamba2.chunk_grid import grid_index, grid_owner, grid_size
from workbench.batch import Batch
from workbench.errors import MetadataError
from workbench.layers import LayerState
from workbench.metadata import build_metadata
from workbench.pool import StatePool
from workbench.traces.model import (
    FINAL_TRACK_FIELDS,
    PREFIX_KEYS,
    RECOMPUTE_FIELDS,
    TRACK_FIELDS,
    VERIFY_TRACK_FIELDS,
    TraceStep,
)

if TYPE_CHECKING:
    from workbench.traces.replay import TraceDivergence, TraceReplayer

EMBED_VOCAB = 4096
"""Rows of the fixed input embedding: a token id ``t`` feeds row ``t % EMBED_VOCAB``."""
EMBED_SEED = 20_26
ATOL, RTOL = 1e-4, 1e-3
"""A float32 state against its float64 recomputation (the tolerances of the replay's accept check)."""
PREFIX_CACHE_SIZE = 128


def embed_tokens(table: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """The inputs ``[len(ids), hidden]`` of token ``ids``: rows of ``table`` (``[EMBED_VOCAB, hidden]``)."""
    return table[torch.tensor(ids, dtype=torch.long) % table.shape[0]]


def embedding_table(hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """The fixed, seeded input embedding the replay feeds token ids through (never zeros)."""
    g = torch.Generator().manual_seed(EMBED_SEED)
    return torch.randn(EMBED_VOCAB, hidden, generator=g).to(dtype)


@dataclass(frozen=True)
class _ChunkGrid:
    """Where an extend step's chunk states ``h`` hold which row's state (``chunk_grid`` of the layer): GDN's one
    grid per sequence (row ``b``'s chunk ``j`` is ``h[offset_b + j]``, ``offset_b`` the ``ceil(new / C)``
    chunks of the rows before it), or Mamba2's one grid over the flattened batch
    (:mod:`kernels.mamba2.chunk_grid`)."""

    chunk: int
    batch: bool
    qsl: list[int]
    offsets: list[int]

    @classmethod
    def of(cls, step: TraceStep, chunk: int, layer: Any) -> _ChunkGrid:
        offsets, qsl = [0], [0]
        for r in step.rows:
            offsets.append(offsets[-1] + (r.new_tokens - 1) // chunk + 1)
            qsl.append(qsl[-1] + r.new_tokens)
        return cls(chunk, getattr(layer, "chunk_grid", "sequence") == "batch", qsl, offsets)

    @property
    def size(self) -> int:
        return grid_size(self.qsl[-1], self.chunk) if self.batch else self.offsets[-1]

    def index(self, row: int, tokens: int) -> int | None:
        """The entry holding ``row``'s state after ``tokens`` tokens of the step (None: off the grid)."""
        if self.batch:
            return grid_index(self.qsl, row, tokens, self.chunk)
        return self.offsets[row] + tokens // self.chunk

    def owner(self, src: int) -> tuple[int, int] | None:
        """The row and its tokens whose state entry ``src`` holds; None past the grid."""
        if not 0 <= src < self.size:
            return None
        if self.batch:
            return grid_owner(self.qsl, src, self.chunk)
        b = next(j for j in range(len(self.offsets) - 1) if self.offsets[j] <= src < self.offsets[j + 1])
        return b, (src - self.offsets[b]) * self.chunk

    def read(self, key: str, j: int, source: Any, want: _Tracked) -> tuple[tuple[int, int] | None, str | None]:
        """What entry ``j`` of ``key`` copies (a row and its tokens; None when it names nothing), and why that is
        not ``want`` (None when it is)."""
        if key == "track_ssm_h_dst":
            got = self.owner(source)
            if got is None:
                return None, f"h[{source}] is past the step's {self.size} chunk states"
            if source == want.index:
                return got, None
            names = f"h[{source}] is row {got[0]}'s state after {got[1]} tokens"
            if want.index is None:
                return got, (
                    f"track_ssm_h_src[{j}] = {source}, but {names}; row {want.row}'s state after {want.aligned} "
                    f"tokens is on no entry of the grid over the flattened batch (position {want.end} is not a "
                    f"multiple of C = {self.chunk}): it is recomputed ({', '.join(RECOMPUTE_FIELDS)})"
                )
            where = (
                f"one grid over the flattened batch, row {want.row} starts at token {self.qsl[want.row]}"
                if self.batch
                else f"row {want.row}'s chunks start at h[{self.offsets[want.row]}]"
            )
            return got, (
                f"track_ssm_h_src[{j}] = {source}, but its state after {want.length} tokens floored to C = "
                f"{self.chunk} is h[{want.index}] ({where}; {names})"
            )
        b, e = source
        if not (0 <= b < len(self.qsl) - 1 and self.qsl[b] <= e <= self.qsl[b + 1]):
            return None, f"track_ssm_seq_idx[{j}] = {b}, track_ssm_end_locs[{j}] = {e} name no position of its rows"
        got = (b, e - self.qsl[b])
        if got == (want.row, want.aligned):
            return got, None
        return got, (
            f"track_ssm_seq_idx[{j}] = {b}, track_ssm_end_locs[{j}] = {e} recompute row {b}'s state after {got[1]} "
            f"tokens, but row {want.row}'s tracked state is after {want.aligned} (position {want.end})"
        )


@dataclass
class _Tracked:
    """A row tracked from the chunk states: its tracked length past its cached tokens (``length``), that floored
    to the grid's chunk (``aligned``), the entry holding it (``index``; None off a Mamba2 grid), its flattened
    end position."""

    row: int
    length: int
    grid: _ChunkGrid
    written: bool = False

    @property
    def aligned(self) -> int:
        return self.length // self.grid.chunk * self.grid.chunk

    @property
    def index(self) -> int | None:
        return self.grid.index(self.row, self.aligned)

    @property
    def end(self) -> int:
        return self.grid.qsl[self.row] + self.aligned

    @property
    def source(self) -> str:
        return f"h[{self.index}]" if self.index is not None else "a recompute: it is off the grid"


@dataclass(frozen=True)
class Checkpoint:
    """A published checkpoint: ``slot`` holds ``request``'s state after exactly ``tokens`` (its first ids)."""

    request: int
    tokens: tuple[int, ...]
    slot: int
    step: int


class CheckpointBook:
    """The live checkpoints of a replay, and the checks of each step's prefix-cache work (see the module)."""

    def __init__(self, replayer: TraceReplayer) -> None:
        self.rep = replayer
        self.live: dict[int, Checkpoint] = {}  # slot -> checkpoint
        self.history: dict[int, list[int] | None] = {}  # request id -> token ids in its state (None: unknown)
        # request id -> its shadow is the float64 recurrence from zeros over exactly ``history`` (admitted
        # with no cached tokens, or from a hit's prefix state), so a checkpoint of all of it can be read there
        self.from_zeros: dict[int, bool] = {}
        # slot -> the token ids whose float64 state a copy put into the shadow's slot (a track slot published
        # later reads its reference there instead of recomputing it)
        self._written: dict[int, tuple[int, ...]] = {}
        # request id -> blocks its window left that the cache holds for a later post-copy (vLLM align + spec)
        self.pending: dict[int, set[int]] = {}
        self.hits = self.published = self.verified = 0
        self._prefix: OrderedDict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        layer = replayer.runner.layer
        self.table = embedding_table(layer.config.hidden_size, layer.dtype)  # the runner's inputs
        self._scratch_pool = StatePool(2, replayer.pool.profile)
        self._scratch_row = int(self._scratch_pool.alloc(1)[0])

    # -- the step's prefix-cache work -------------------------------------------------------------------
    @staticmethod
    def work(step: TraceStep) -> dict[str, Any]:
        """The step's prefix-cache keys (empty when it has none)."""
        md = step.metadata or {}
        return {k: md[k] for k in PREFIX_KEYS if md.get(k)}

    def evict(self, step: TraceStep) -> list[TraceDivergence]:
        """The step's evictions, before anything else of it (its admissions may take the slots they free)."""
        out: list[TraceDivergence] = []
        for i, slot in enumerate(self.work(step).get("evict", [])):
            if slot not in self.live:
                out.append(self._div(step, "evict", f"evict[{i}]: slot {slot} holds no live checkpoint", slot=slot))
                continue
            self.live.pop(slot)
            self._written.pop(slot, None)
            if slot in self.rep.pool.held_slots:
                self.rep.pool.release(slot)
        return out

    def before(self, step: TraceStep) -> list[TraceDivergence]:
        """Hits and copies before the forward (after the step's admissions); admitted requests start their
        token history."""
        work = self.work(step)
        first = {r.id: r for r in step.rows}
        for rid in step.admit:
            self.history[rid] = []
            self.from_zeros[rid] = rid in first and first[rid].cached_tokens == 0  # else: a hit, below
        out: list[TraceDivergence] = []
        for i, hit in enumerate(work.get("hits", [])):
            rid, n, slot = hit["request"], hit["tokens"], hit["slot"]
            cp, row = self.live.get(slot), first.get(rid)
            problem, expected, got = None, None, None
            if rid not in step.admit:
                problem = "the request was not admitted at this step"
            elif cp is None:
                problem = "no live checkpoint there (freed, evicted or never published)"
            elif len(cp.tokens) != n:
                problem = f"the checkpoint holds {len(cp.tokens)} tokens, the hit claims {n}"
                expected, got = len(cp.tokens), n
            elif row is not None and row.cached_tokens != n:
                problem = f"the request's row continues from {row.cached_tokens} tokens, not the hit's {n}"
                expected, got = n, row.cached_tokens
            if problem is not None:
                detail = f"hits[{i}] ({n} tokens): {problem}"
                out.append(self._div(step, "hit", detail, rid, slot, expected=expected, got=got))
                continue
            assert cp is not None
            self.hits += 1
            self.history[rid] = list(cp.tokens)
            self.from_zeros[rid] = True  # from a prefix state computed from zeros
            for own in self.rep.pool.slots_of(self.rep.live[rid]):  # the truth: the prefix's own state
                self._set_shadow(own, cp.tokens)
                self._written[own] = cp.tokens
        out += self._copies(step, work.get("copies_before", []), "copies_before")
        out += self._moves(step, work.get("moves", []))
        return out

    def _moves(self, step: TraceStep, moves: list[dict[str, Any]]) -> list[TraceDivergence]:
        """Running states moved to other slots (vLLM align: the block of the request's new position): the
        request is live and in the step, its row names the new (first) slot, and the new slots are free or
        its own. One slot per request (``slot``): the old slot is freed (a checkpoint the step publishes on it
        keeps it, held by the cache). A window of D blocks under speculation (``slots``): the blocks it
        leaves are freed, or held for a later post-copy (``keep``) until a checkpoint takes them or the
        request finishes; the request's accepted count resets to 1 (vLLM's pre-copy), so its next verify
        reads the new first block."""
        rows = {r.id: r for r in step.rows}
        out: list[TraceDivergence] = []
        for i, mv in enumerate(moves):
            rid, window = mv["request"], mv.get("slots")
            new = [mv["slot"]] if window is None else list(window)
            row = rows.get(rid)
            taken = next((s for s in new if s in self.live), None)
            problem = None
            if rid not in self.rep.live or row is None:
                problem = "the request is not live in this step"
            elif row.slot != new[0]:
                problem = f"the request's row names slot {row.slot}"
            elif taken is not None:
                cp = self.live[taken]
                problem = (
                    f"slot {taken} holds the live checkpoint of request {cp.request}'s first {len(cp.tokens)} tokens"
                )
            if problem is None:
                problem = self._move(rid, new, window is not None, list(mv.get("keep", [])))
            if problem is not None:
                out.append(self._div(step, "move", f"moves[{i}] to slot {new[0]}: {problem}", rid, new[0]))
        return out

    def _move(self, rid: int, new: list[int], windowed: bool, keep: list[int]) -> str | None:
        """Move ``rid``'s running state to ``new`` (its slots, in column order), or say why not."""
        rep = self.rep
        row = rep.live[rid]
        have = rep.pool.slots_of(row)
        running = have[rep.accepted.get(rid, 1) - 1] if windowed else have[0]  # where its state is now
        try:
            dropped = rep.pool.remap(row, new) if windowed else [rep.pool.move(row, new[0])]
        except MetadataError as e:
            return str(e)
        # the truth moves with the request: a move without its pre-copy leaves the runner behind
        for t in rep.shadow.tensors().values():
            t[new[0]] = t[running]
        if windowed:
            rep.accepted[rid] = 1
            label = self._written.get(running)
            if label is None:
                self._written.pop(new[0], None)
            else:
                self._written[new[0]] = label
        else:
            have_ids = self.history.get(rid)
            if have_ids is not None and self.from_zeros.get(rid):  # the block's checkpoint, without a recompute
                self._cache(tuple(have_ids), (rep.shadow.conv[running].clone(), rep.shadow.ssm[running].clone()))
        for j, slot in enumerate(keep):
            if slot not in dropped:
                return f"keep[{j}]: slot {slot} is not a slot the request leaves (it leaves {dropped})"
            rep.pool.hold(slot)
            self.pending.setdefault(rid, set()).add(slot)
        return None

    def after(self, step: TraceStep) -> list[TraceDivergence]:
        """Copies after the forward, then the checkpoints the step publishes, each verified; sglang's own track
        fields, where the trace records them, against those copies."""
        work = self.work(step)
        for r in step.rows:  # the forward wrote these slots: what a copy once put there is gone
            slots = self.rep.pool.slots_of(r.req_pool_index) if r.id in self.rep.live else [r.slot]
            read = self._written.get(slots[min(self.rep.read_columns.get(r.id, 0), len(slots) - 1)])
            for slot in slots:
                self._written.pop(slot, None)
            if len(slots) > 1:
                self._label_window(step, r, slots, read)
        md = step.metadata or {}
        if "mamba_steps_to_track" in md:
            out = self._track_verified(step)
        else:
            out = self._track_fields(step, work.get("copies_after", []))
        out += self._copies(step, work.get("copies_after", []), "copies_after")
        finishing = set(step.finish)
        for i, c in enumerate(work.get("checkpoints", [])):
            rid, n, slot = c["request"], c["tokens"], c["slot"]
            have, owner = self.history.get(rid), self.rep.owner(slot)
            problem, expected, got = None, None, None
            if have is None:
                problem = (
                    "the request's token ids are not all in the trace (rows without tokens), so its prefix "
                    "cannot be recomputed"
                )
            elif n > len(have):
                problem = (
                    f"published before it is written: the request's state holds {len(have)} tokens after this step"
                )
                expected, got = len(have), n
            elif owner is not None and (owner != rid or rid not in finishing):
                runs_on = ", which keeps running" if owner not in finishing else ""
                problem = f"the slot is the running slot of request {owner}{runs_on}"
            elif slot == self.rep.pool.profile.dummy_slot:
                problem = "the dummy slot"
            if problem is not None or have is None:
                detail = f"checkpoints[{i}] ({n} tokens): {problem}"
                out.append(self._div(step, "checkpoint", detail, rid, slot, expected=expected, got=got))
                continue
            self.published += 1
            prefix = tuple(have[:n])
            if prefix not in self._prefix and self._written.get(slot) == prefix:  # a copy put exactly it there
                shadow = self.rep.shadow
                self._cache(prefix, (shadow.conv[slot].clone(), shadow.ssm[slot].clone()))
            elif n == len(have) and self.from_zeros.get(rid) and prefix not in self._prefix:
                self._remember_shadow(rid, prefix)
            bad = self._compare(slot, prefix)
            if bad is not None:
                name, err = bad
                detail = (
                    f"checkpoints[{i}] ({n} tokens): {name} off the float64 state after exactly its first {n} tokens"
                )
                out.append(self._div(step, "checkpoint", detail, rid, slot, got=err))
            else:
                self.verified += 1
            if owner is None and slot not in self.rep.pool.held_slots:
                self.rep.pool.hold(slot)
            self.live[slot] = Checkpoint(rid, prefix, slot, step.step)
            self.pending.get(rid, set()).discard(slot)
            self._set_shadow(slot, prefix)
        return out

    def finish(self, rid: int, row: int) -> None:
        """Free a finishing request's row: its slot stays held when it was published (donated), else freed."""
        slots = self.rep.pool.slots_of(row)
        if len(slots) == 1 and slots[0] in self.live:
            self.rep.pool.donate(row)
        else:
            self.rep.pool.free([row])
        for slot in self.pending.pop(rid, set()):  # blocks left for a post-copy that never came
            self.rep.pool.release(slot)
        self.history.pop(rid, None)
        self.from_zeros.pop(rid, None)

    def remember(self, step: TraceStep) -> None:
        """Extend each row's token history by what the step put into its state (a verify keeps ``accepted``)."""
        for r in step.rows:
            have = self.history.get(r.id)
            if have is None or r.tokens is None:
                self.history[r.id] = None
                continue
            kept = r.accepted if (step.mode == "target_verify" and r.accepted is not None) else r.new_tokens
            have.extend(r.tokens[:kept])

    def is_live(self, slot: int) -> Checkpoint | None:
        return self.live.get(slot)

    # -- pieces -----------------------------------------------------------------------------------------
    def _label_window(self, step: TraceStep, row: Any, slots: list[int], read: tuple[int, ...] | None) -> None:
        """What the forward left in a window of D slots (vLLM align with speculation): a verify's column ``t``
        the float64 state after the request's first ``cached + t + 1`` ids (for the accepted ``t``), an
        extend's column 0 after all of them; known only when the column the step read held exactly the ids
        before it (``read``; none for a state from zeros). A checkpoint published from a slot whose label
        is its prefix is compared with the shadow's slot instead of a recompute."""
        have = self.history.get(row.id)
        if have is None or not self.from_zeros.get(row.id):
            return
        if row.cached_tokens and read != tuple(have[: row.cached_tokens]):
            return
        if step.mode == "target_verify":
            for t in range(min(row.accepted or 1, len(slots))):
                self._written[slots[t]] = tuple(have[: row.cached_tokens + t + 1])
        else:
            self._written[slots[0]] = tuple(have)

    def _track_verified(self, step: TraceStep) -> list[TraceDivergence]:
        """sglang's tracking at the commit of a verify (``scatter_mamba_states_after_mtp_verify``): each row with
        ``mamba_steps_to_track[i] = s >= 0`` gets its draft step ``s``'s intermediate state (conv window and
        recurrent state) copied into ``mamba_track_indices[i]``; -1 skips the row."""
        md = step.metadata or {}
        fields = [md.get(k) for k in VERIFY_TRACK_FIELDS]
        n = len(step.rows)
        if step.mode != "target_verify":
            detail = f"mamba_steps_to_track on a {step.mode} step: only a target_verify step tracks at commit"
            return [self._div(step, "track", detail)]
        if not all(isinstance(f, list) and len(f) == n for f in fields):
            got = [len(f) if isinstance(f, list) else f for f in fields]
            detail = f"{', '.join(VERIFY_TRACK_FIELDS)} must each be a list of one entry per row ({n}); got {got}"
            return [self._div(step, "track", detail)]
        slots, steps = (list(f or ()) for f in fields)
        rep, out = self.rep, []
        verified = rep.verified_intermediates
        d = rep.trace.header.draft_tokens
        for i, row in enumerate(step.rows):
            s, dst = int(steps[i]), int(slots[i])
            if s < 0:
                continue
            where = f"row {i}: mamba_steps_to_track[{i}] = {s} into slot {dst}"
            problem = self._kept_slot(dst, after=True)
            if dst == rep.pool.profile.dummy_slot or not 0 <= dst < rep.pool.num_slots:
                problem = "writes the dummy (null) slot or a slot past the pool"
            elif s >= d:
                problem = f"past the verify's {d} draft steps"
            elif verified is None or row.req_pool_index not in verified[0]:
                problem = "the step left no intermediate state for the row (it did not run as a verify)"
            if problem is not None:
                out.append(self._div(step, "track", f"{where}: {problem}", row.id, dst))
                continue
            assert verified is not None
            k = verified[0].index(row.req_pool_index)
            for pool, inter in ((rep.runner.state, verified[1]), (rep.shadow, verified[2])):
                pool.conv[dst] = inter.conv[k, s].to(pool.conv.dtype)
                pool.ssm[dst] = inter.ssm[k, s].to(pool.ssm.dtype)
            have, kept = self.history.get(row.id), row.accepted or 1
            if have is not None and row.tokens is not None and self.from_zeros.get(row.id):
                self._written[dst] = (*have[: row.cached_tokens], *row.tokens[: s + 1])
            else:
                self._written.pop(dst, None)
            if s >= kept:
                detail = (
                    f"{where}: draft step {s} was not accepted ({kept} accepted): the slot gets the state of "
                    "tokens the request did not keep"
                )
                out.append(self._div(step, "track", detail, row.id, dst, expected=f"< {kept}", got=s))
        return out

    def _own_post_copy(self, src: int, dst: int) -> bool:
        """vLLM align with speculation: a copy after the forward from the block holding a request's state now
        (the window column of its accepted count) into the first block of its own window (the post-copy whose
        source and destination block are one); the request's state moves, nothing of it is replaced."""
        rep = self.rep
        owner = rep.owner(dst)
        if rep.pool.slots_per_request == 1 or owner is None or owner != rep.owner(src):
            return False
        window = rep.pool.slots_of(rep.live[owner])
        return dst == window[0] and src == window[rep.accepted.get(owner, 1) - 1]

    def _kept_slot(self, dst: int, after: bool) -> str | None:
        """Why a copy may not write ``dst`` because of what it holds: a live checkpoint, or (``after`` the
        forward) the running slot of a live request; None when it may."""
        if dst in self.live:
            cp = self.live[dst]
            return f"overwrites the live checkpoint in slot {dst} (request {cp.request}, {len(cp.tokens)} tokens)"
        owner = self.rep.owner(dst)
        if after and owner is not None:
            return f"writes the running slot of request {owner}, replacing the state its step computed"
        return None

    def _track_fields(self, step: TraceStep, copies: list[list[int]]) -> list[TraceDivergence]:
        """sglang's ``mamba_track_mask`` / ``mamba_track_indices`` / ``mamba_track_seqlens`` (one entry per row,
        in row order) say which rows the step tracks, into which slot, at which length; an untracked row's
        length is -1. A tracked row takes its final state (its copy, running slot -> that slot, after the
        step; it holds exactly that many tokens), or, in an extend step that records ``mamba_chunk_size``
        ``C`` and a length ``L`` with ``L - cached`` not a multiple of ``C``, the kernel's chunk state ``h``
        after ``cached + (L - cached) // C * C`` tokens (sglang's ``_init_track_ssm_indices``; the +1 its
        scheduler adds to force this path cancels under the floor): :meth:`_track_chunk`."""
        md = step.metadata or {}
        fields = [md.get(k) for k in TRACK_FIELDS]
        if all(f is None for f in fields):
            return []
        n = len(step.rows)
        if not all(isinstance(f, list) and len(f) == n for f in fields):
            got = [len(f) if isinstance(f, list) else f for f in fields]
            detail = f"{', '.join(TRACK_FIELDS)} must each be a list of one entry per row ({n}); got {got}"
            return [self._div(step, "track", detail)]
        mask, slots, lengths = (list(f or ()) for f in fields)  # lists of one entry per row (checked above)
        made = {(int(a), int(b)) for a, b, *_ in copies}
        chunk = md.get("mamba_chunk_size") if step.mode in ("extend", "mixed") else None
        out: list[TraceDivergence] = []
        h_rows: list[int] = []  # rows tracked from the chunk states, in row order
        for i, row in enumerate(step.rows):
            kept = row.accepted if (step.mode == "target_verify" and row.accepted is not None) else row.new_tokens
            held = row.cached_tokens + kept
            if not mask[i]:
                if lengths[i] != -1:
                    detail = f"row {i}: untracked, but mamba_track_seqlens[{i}] = {lengths[i]} (want -1)"
                    out.append(self._div(step, "track", detail, row.id, expected=-1, got=lengths[i]))
                continue
            if chunk and (lengths[i] - row.cached_tokens) % chunk:
                h_rows.append(i)
            elif (row.slot, int(slots[i])) not in made:
                detail = f"row {i}: tracked into slot {slots[i]}, but no copy {row.slot} -> {slots[i]} after the step"
                out.append(self._div(step, "track", detail, row.id, int(slots[i])))
            elif lengths[i] != held:
                detail = f"row {i}: mamba_track_seqlens[{i}] = {lengths[i]}, but the state holds {held} tokens"
                out.append(self._div(step, "track", detail, row.id, int(slots[i]), expected=held, got=lengths[i]))
        if h_rows and chunk:
            out += self._track_chunk(step, h_rows, [int(slots[i]) for i in h_rows], [lengths[i] for i in h_rows])
        if step.mode in ("extend", "mixed") and any(k in md for k in FINAL_TRACK_FIELDS):
            finals = [(row.slot, int(slots[i])) for i, row in enumerate(step.rows) if mask[i] and i not in h_rows]
            out += self._track_finals(step, finals)
        return out

    def _track_finals(self, step: TraceStep, want: list[tuple[int, int]]) -> list[TraceDivergence]:
        """``track_ssm_final_src`` / ``track_ssm_final_dst``: one pair per extend row tracked at its chunk's end,
        in row order, its running slot and its track slot (the copy itself is checked with the copies)."""
        md = step.metadata or {}
        src, dst = (md.get(k, []) for k in FINAL_TRACK_FIELDS)
        if not (isinstance(src, list) and isinstance(dst, list) and len(src) == len(dst)):
            sizes = [len(v) if isinstance(v, list) else v for v in (src, dst)]
            detail = (
                f"{', '.join(FINAL_TRACK_FIELDS)}: lists of one entry each per row tracked at its chunk's end "
                f"({len(want)}); got {sizes}"
            )
            return [self._div(step, "track", detail)]
        named = [[int(a), int(b)] for a, b in zip(src, dst, strict=True)]
        wanted = [list(p) for p in want]
        if named == wanted:
            return []
        detail = (
            f"{', '.join(FINAL_TRACK_FIELDS)} name the copies {named}, but the rows tracked at their chunk's end "
            f"copy {wanted} (running slot -> track slot, row order)"
        )
        return [self._div(step, "track", detail, expected=wanted, got=named)]

    def _track_chunk(
        self, step: TraceStep, rows: list[int], dsts: list[int], lengths: list[int]
    ) -> list[TraceDivergence]:
        """The rows tracked from the kernel's chunk states: row ``rows[k]``'s state after ``p = cached + (L -
        cached) // C * C`` tokens goes to ``dsts[k]`` (conv window and recurrent state; :meth:`chunk_state`,
        the replay's stand-in for the kernel's ``h``). Where ``h`` holds it depends on the layer
        (:class:`_ChunkGrid`); a Mamba2 position off its grid is recomputed instead (``RECOMPUTE_FIELDS``).
        Recorded entries are matched to the rows by their track slot, and the state each copies is the one it
        names (so an index read on the wrong grid, sglang issue 31833, is named at its step and the
        checkpoint published from it is off); ``track_conv_indices`` (one window of ``W - 1`` flattened
        input positions per tracked row) against the positions before ``p``."""
        md = step.metadata or {}
        grid = _ChunkGrid.of(step, int(md["mamba_chunk_size"]), self.rep.runner.layer)
        want = {
            dst: _Tracked(i, length - step.rows[i].cached_tokens, grid)
            for i, dst, length in zip(rows, dsts, lengths, strict=True)
        }
        entries = self._chunk_entries(step, want)
        if isinstance(entries, str):
            return [self._div(step, "track", entries)]
        out: list[TraceDivergence] = []
        for key, j, source, slot in entries:
            tracked = want.get(slot)
            if tracked is None:
                detail = f"{key}[{j}] = {slot}, but no row tracked from h goes to slot {slot} (they go to {dsts})"
                out.append(self._div(step, "track", detail, slot=slot))
                continue
            row = step.rows[tracked.row]
            got, wrong = grid.read(key, j, source, tracked)
            problem = self._kept_slot(slot, after=True)
            if slot == self.rep.pool.profile.dummy_slot or not 0 <= slot < self.rep.pool.num_slots:
                problem = "writes the dummy (null) slot or a slot past the pool"
            where = f"row {tracked.row}: tracked from h into slot {slot}"
            if wrong is not None:  # the entry names another state (or none): which one, against the row's own
                out.append(
                    self._div(step, "track", f"{where}: {wrong}", row.id, slot, expected=tracked.index, got=source)
                )
            if problem is not None:  # the track slot itself may not be written
                out.append(self._div(step, "track", f"{where}: {problem}", row.id, slot))
            if got is not None and problem is None:  # a wrong entry still copies the state it names
                self._copy_chunk_state(step, *got, slot)
                tracked.written = True
        for slot, tracked in want.items():
            if not tracked.written and not any(d.slot == slot for d in out):
                detail = (
                    f"row {tracked.row}: tracked from h into slot {slot} ({tracked.source}), but no entry of "
                    f"track_ssm_h_dst or track_ssm_recompute_dst is {slot}"
                )
                out.append(self._div(step, "track", detail, step.rows[tracked.row].id, slot))
        conv_idx = md.get("track_conv_indices")
        if conv_idx is not None:
            out += self._track_conv(step, conv_idx, grid.chunk, grid.qsl)
        return out

    @staticmethod
    def _chunk_entries(step: TraceStep, want: dict[int, _Tracked]) -> list[tuple[str, int, Any, int]] | str:
        """The step's recorded chunk-state copies as ``(list, position, source, track slot)``: ``source`` an
        index of ``h`` (``track_ssm_h_dst``) or a ``(row, end position)`` recompute (``track_ssm_recompute_dst``).
        When none is recorded they stand for what the rows want; either kind alone means none of the other; a
        malformed list is a message."""
        md = step.metadata or {}
        on = {dst: t for dst, t in want.items() if t.index is not None}
        off = {dst: t for dst, t in want.items() if t.index is None}
        src, dst = md.get("track_ssm_h_src"), md.get("track_ssm_h_dst")
        recompute = [md.get(k) for k in RECOMPUTE_FIELDS]
        if src is None and dst is None and all(v is None for v in recompute):  # none recorded: the rows' own
            src, dst = [t.index for t in on.values()], list(on)
            recompute = [[t.row for t in off.values()], [t.end for t in off.values()], list(off)]
        elif all(v is None for v in recompute):  # h lists alone (GDN, or Mamba2 before sglang's fix)
            recompute = [[], [], []]
        elif src is None and dst is None:  # recomputes alone (a trace leaves out empty lists)
            src, dst = [], []

        def lengths(*lists: Any) -> list[Any]:
            return [len(v) if isinstance(v, list) else v for v in lists]

        if not (isinstance(src, list) and isinstance(dst, list) and len(src) == len(dst)):
            got = lengths(src, dst)
            return f"track_ssm_h_src, track_ssm_h_dst: lists of one entry each per row tracked from h; got {got}"
        seq, end, rdst = recompute
        if not (isinstance(seq, list) and isinstance(end, list) and isinstance(rdst, list)) or not (
            len(seq) == len(end) == len(rdst)
        ):
            return (
                f"{', '.join(RECOMPUTE_FIELDS)}: lists of one entry each per recomputed row; got {lengths(*recompute)}"
            )
        return [("track_ssm_h_dst", j, int(a), int(b)) for j, (a, b) in enumerate(zip(src, dst, strict=True))] + [
            ("track_ssm_recompute_dst", j, (int(a), int(e)), int(b))
            for j, (a, e, b) in enumerate(zip(seq, end, rdst, strict=True))
        ]

    def _copy_chunk_state(self, step: TraceStep, b: int, tokens: int, slot: int) -> None:
        """Row ``b``'s state after ``tokens`` tokens of the step's chunk into ``slot``, runner and shadow alike."""
        rep = self.rep
        for pool, (conv, ssm) in zip((rep.runner.state, rep.shadow), self.chunk_state(b, tokens), strict=True):
            pool.conv[slot], pool.ssm[slot] = conv.to(pool.conv.dtype), ssm.to(pool.ssm.dtype)
        rb = step.rows[b]
        have = self.history.get(rb.id)
        if have is not None and rb.tokens is not None and self.from_zeros.get(rb.id):
            self._written[slot] = (*have[: rb.cached_tokens], *rb.tokens[:tokens])
        else:
            self._written.pop(slot, None)

    def chunk_state(self, b: int, tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row ``b``'s conv window and recurrent state after the first ``tokens`` tokens of the step's chunk,
        in the runner's layer (its dtype) and in the float64 reference: the replay's stand-in for the
        kernel's chunk state ``h`` (the same layer run on those tokens from the row's state before the step,
        ``rep.step_inputs``)."""
        rep = self.rep
        assert rep.step_inputs is not None  # set by the replay before every forward
        step, x, before = rep.step_inputs
        row = step.rows[b]
        at = sum(r.new_tokens for r in step.rows[:b])
        return [
            self._run_scratch(
                layer, dtype, x[at : at + tokens], row.cached_tokens,
                (init.conv[row.slot], init.ssm[row.slot]) if row.cached_tokens else None,
            )
            for layer, dtype, init in (
                (rep.runner.layer, rep.runner.layer.dtype, before[0]),
                (rep.ref, torch.float64, before[1]),
            )
        ]  # fmt: skip

    def _track_conv(self, step: TraceStep, recorded: Any, chunk: int, qsl: list[int]) -> list[TraceDivergence]:
        """``track_conv_indices``: for each tracked row (row order), the ``W - 1`` flattened input positions
        before its tracked position, ``qsl[b] + (L - cached) // C * C - (W - 1) + j`` (clamped into the step's
        tokens), as sglang's ``_init_track_conv_indices`` gathers them."""
        md = step.metadata or {}
        width = int(self.rep.shadow.conv.shape[-1])
        tracked = [i for i, m in enumerate(md["mamba_track_mask"]) if m]
        if not isinstance(recorded, list) or len(recorded) != len(tracked):
            return [
                self._div(step, "track", f"track_conv_indices must hold one window per tracked row ({len(tracked)})")
            ]
        out: list[TraceDivergence] = []
        for k, i in enumerate(tracked):
            row = step.rows[i]
            aligned = (md["mamba_track_seqlens"][i] - row.cached_tokens) // chunk * chunk
            want = [min(max(qsl[i] + aligned - width + j, 0), qsl[-1] - 1) for j in range(width)]
            if list(recorded[k]) != want:
                detail = (
                    f"row {i}: track_conv_indices[{k}] = {recorded[k]}, but its window before the tracked position "
                    f"is {want}"
                )
                out.append(self._div(step, "track", detail, row.id, expected=want, got=recorded[k]))
        return out

    def _copies(self, step: TraceStep, pairs: list[list[int]], key: str) -> list[TraceDivergence]:
        rep, out = self.rep, []
        dummy = rep.pool.profile.dummy_slot
        admitted_slots = {s for rid in step.admit for s in rep.pool.slots_of(rep.live[rid])}
        moves = self.work(step).get("moves", []) if key == "copies_before" else []
        moving = {mv["slot"] if "slot" in mv else mv["slots"][0] for mv in moves}  # where a moved state goes
        for i, (src, dst) in enumerate(pairs):
            where = f"{key}[{i}] {src} -> {dst}"
            src_owner, dst_owner = rep.owner(src), rep.owner(dst)
            problem = None
            if src == dst:
                problem = "source and destination are one slot (the copy overlaps itself)"
            elif dummy in (src, dst) or min(src, dst) < 0 or max(src, dst) >= rep.pool.num_slots:
                problem = "reads or writes the dummy (null) slot or a slot past the pool"
            elif src_owner is None and src not in self.live:
                problem = (
                    f"reads slot {src}, which holds neither a live request's state nor a checkpoint (freed or evicted)"
                )
            elif (
                not (own := key == "copies_after" and self._own_post_copy(src, dst))
                and (kept := self._kept_slot(dst, after=key == "copies_after")) is not None
            ):
                problem = kept
            elif key == "copies_before" and dst not in admitted_slots | moving:
                whose = f"request {dst_owner}'s slot" if dst_owner is not None else "a slot no admitted request owns"
                problem = (
                    f"writes {whose}: a copy before the forward goes into a request admitted at this step, or "
                    "into the slot a request moves to"
                )
            if problem is not None:
                out.append(self._div(step, "copy", f"{where}: {problem}", slot=dst))
                continue
            for pool in (rep.runner.state, rep.shadow):
                for t in pool.tensors().values():
                    t[dst] = t[src]
            if own and src_owner is not None:  # vLLM's post-copy within its own block: the next verify reads it
                rep.accepted[src_owner] = 1
            # what the shadow now holds in dst: the float64 state after exactly these tokens (or unknown; a
            # window of D blocks holds a state per draft step, not only the request's)
            have = self.history.get(src_owner) if src_owner is not None else None
            if rep.pool.slots_per_request > 1:  # the tokens the source slot's state is of, when known
                label = self._written.get(src) if src_owner is not None else None
                if label is None and src in self.live:
                    label = self.live[src].tokens
                if label is None:
                    self._written.pop(dst, None)
                else:
                    self._written[dst] = label
            elif src_owner is not None and have is not None and self.from_zeros.get(src_owner):
                self._written[dst] = tuple(have)
            elif src in self.live:
                self._written[dst] = self.live[src].tokens
            else:
                self._written.pop(dst, None)
        return out

    def prefix_state(self, prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The float64 conv window and recurrent state after exactly ``prefix`` from zeros (cached)."""
        hit = self._prefix.get(prefix)
        if hit is not None:
            self._prefix.move_to_end(prefix)
            return hit
        got = self._run_scratch(self.rep.ref, torch.float64, embed_tokens(self.table, list(prefix)), 0, None)
        self._cache(prefix, got)
        return got

    def _run_scratch(
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

    def _remember_shadow(self, rid: int, prefix: tuple[int, ...]) -> None:
        """The state after exactly ``prefix`` is ``rid``'s shadow now: keep it instead of recomputing it (the
        shadow is the float64 recurrence over the same ids from zeros, chunk by chunk; a one-slot layout)."""
        row = self.rep.live.get(rid)
        if row is None or self.rep.pool.slots_per_request != 1:
            return
        (slot,) = self.rep.pool.slots_of(row)
        self._cache(prefix, (self.rep.shadow.conv[slot].clone(), self.rep.shadow.ssm[slot].clone()))

    def _cache(self, prefix: tuple[int, ...], value: tuple[torch.Tensor, torch.Tensor]) -> None:
        self._prefix[prefix] = value
        if len(self._prefix) > PREFIX_CACHE_SIZE:
            self._prefix.popitem(last=False)

    def _compare(self, slot: int, prefix: tuple[int, ...]) -> tuple[str, float] | None:
        conv, ssm = self.prefix_state(prefix)
        state = self.rep.runner.state
        for name, got, want in (("conv window", state.conv[slot], conv), ("recurrent state", state.ssm[slot], ssm)):
            got64 = got.double()
            if not torch.allclose(got64, want, atol=ATOL, rtol=RTOL):
                return name, float((got64 - want).abs().max()) if torch.isfinite(got64).all() else float("inf")
        return None

    def _set_shadow(self, slot: int, prefix: tuple[int, ...]) -> None:
        conv, ssm = self.prefix_state(prefix)
        self.rep.shadow.conv[slot] = conv
        self.rep.shadow.ssm[slot] = ssm

    def _div(
        self,
        step: TraceStep,
        field: str,
        detail: str,
        request: int | None = None,
        slot: int | None = None,
        expected: Any = None,
        got: Any = None,
    ) -> TraceDivergence:
        from workbench.traces.replay import TraceDivergence

        return TraceDivergence(
            step.step, "prefix", field, detail, request=request, slot=slot, expected=expected, got=got
        )


__all__ = [
    "ATOL",
    "EMBED_VOCAB",
    "RTOL",
    "TRACK_FIELDS",
    "Checkpoint",
    "CheckpointBook",
    "embed_tokens",
    "embedding_table",
]
