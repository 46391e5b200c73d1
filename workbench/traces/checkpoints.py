"""Prefix-cache checks of a trace replay: every checkpoint is the state after exactly its prefix.

A recurrent state, unlike a KV cache, cannot be cut at any length: a prefix cache keeps whole states, each
the state after exactly some prefix of a request's tokens (a *checkpoint*), in slots of the same pool. A
trace says what the cache did at each step in its ``metadata`` (``workbench.traces.model.PREFIX_KEYS``;
``docs/traces.md``, "Prefix caching"); :class:`CheckpointBook` runs and checks it beside the replay, on the
:class:`~workbench.traces.context.StepContext` the replay hands it each step:

* ``evict`` (first, before the step's admissions, which may take the freed slots): each slot is a live
  checkpoint; it is dropped (its slot free again).
* ``hits``: the slot holds a live checkpoint of exactly the hit's length, the request was admitted at this
  step, and its first row continues from there (``cached_tokens`` equal to the length). The shadow of the
  request's own slot becomes the float64 state of that prefix, recomputed: a hit whose copy-on-write is
  missing (or wrong) leaves the runner on other bytes, and the step's state check shows it.
* ``moves`` (after ``copies_before``): a request's running state moves to another slot, as vLLM's align
  mode moves it into the block of its position (the pre-copy is a ``copies_before`` into it); the old
  slot is freed, or kept by a checkpoint: one published on it earlier (while the request ran on it) stays
  live, one the step publishes on it takes it. Hits and ``copies_before`` all read before the forward, so a
  hit on a checkpoint in the very step its owner moves off it (or copies out of it) is legal.
* copies (``copies_before`` the forward, ``copies_after`` it): whole-slot copies of the conv window and the
  recurrent state, made in the runner's pool and in the float64 shadow alike; never from or to the dummy
  slot, never onto their own source, never from a slot that holds neither a live request's state nor a
  live checkpoint (a freed or evicted one), never onto a slot another live request owns or a live
  checkpoint.
* sglang's track fields (first after the forward): :mod:`workbench.traces.tracking`.
* ``checkpoints``: published after the step; the slot is compared, conv window and recurrent state, with the
  float64 state recomputed from zeros over the request's first ``tokens`` token ids (cached per prefix), and
  ``tokens`` may not exceed what the request's state holds after the step (nothing is published before the
  step that writes it has run). A running request's own slot may be published as it finishes (it is then
  donated to the cache), or while it keeps running when the slot holds its state and that state holds
  exactly the checkpoint's tokens (vLLM hashes the block a chunk fills at schedule time): the slot is then a
  live checkpoint the request still runs on, and a forward of the request that writes it before it moves
  off is a divergence (:meth:`CheckpointBook.written`, field ``checkpoints``).

Token ids come from the rows' ``tokens``: the replay's inputs are a fixed embedding of them
(:func:`~workbench.traces.cache_record.embed_tokens`), so requests sharing a prefix compute the same state
over it. What the checks learn across steps is kept in a :class:`~workbench.traces.cache_record.CacheRecord`.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.errors import MetadataError
from workbench.profiles import Profile
from workbench.traces.cache_record import EMBED_VOCAB, CacheRecord, Checkpoint, embed_tokens, embedding_table
from workbench.traces.context import StepContext
from workbench.traces.divergence import TraceDivergence, prefix_divergence
from workbench.traces.model import PREFIX_KEYS, TRACK_FIELDS, TraceRow, TraceStep, accepted_paths
from workbench.traces.tracking import TrackChecks


class CheckpointBook:
    """The live checkpoints of a replay, and the checks of each step's prefix-cache work (see the module).

    ``layer``: the runner's layer; ``reference``: its float64 twin; ``profile``: the pool's. Each check takes
    the step's :class:`~workbench.traces.context.StepContext`; ``record`` is what they know across steps,
    ``tracks`` the track checks, which share it.
    """

    def __init__(self, layer: Any, reference: Any, profile: str | Profile) -> None:
        self.record = CacheRecord(layer, reference, profile)
        self.tracks = TrackChecks(self.record)
        self.hits = self.published = self.verified = 0

    @property
    def live(self) -> dict[int, Checkpoint]:
        """Slot -> the live checkpoint it holds."""
        return self.record.live

    @property
    def history(self) -> dict[int, list[int] | None]:
        """Request id -> the token ids in its state (None: unknown)."""
        return self.record.history

    @property
    def table(self) -> torch.Tensor:
        """The fixed input embedding the replay feeds token ids through."""
        return self.record.table

    def prefix_state(self, prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The float64 conv window and recurrent state after exactly ``prefix`` from zeros (cached)."""
        return self.record.prefix_state(prefix)

    def is_live(self, slot: int) -> Checkpoint | None:
        return self.record.live.get(slot)

    # -- the step's prefix-cache work -------------------------------------------------------------------
    @staticmethod
    def work(step: TraceStep) -> dict[str, Any]:
        """The step's prefix-cache keys (empty when it has none)."""
        md = step.metadata or {}
        return {k: md[k] for k in PREFIX_KEYS if md.get(k)}

    def evict(self, ctx: StepContext) -> list[TraceDivergence]:
        """The step's evictions, before anything else of it (its admissions may take the slots they free)."""
        out: list[TraceDivergence] = []
        for i, slot in enumerate(self.work(ctx.step).get("evict", [])):
            if slot not in self.record.live:
                detail = f"evict[{i}]: slot {slot} holds no live checkpoint"
                out.append(prefix_divergence(ctx.step, "evict", detail, slot=slot))
                continue
            self.record.live.pop(slot)
            self.record.label(slot, None)
            if slot in ctx.pool.held_slots:
                ctx.pool.release(slot)
        return out

    def before(self, ctx: StepContext) -> list[TraceDivergence]:
        """Hits and copies before the forward (after the step's admissions); admitted requests start their
        token history."""
        step, rec = ctx.step, self.record
        work = self.work(step)
        first = {r.id: r for r in step.rows}
        for rid in step.admit:
            rec.history[rid] = []
            rec.from_zeros[rid] = rid in first and first[rid].cached_tokens == 0  # else: a hit, below
        out: list[TraceDivergence] = []
        for i, hit in enumerate(work.get("hits", [])):
            out += self._hit(ctx, i, hit, first.get(hit["request"]))
        out += self._copies(ctx, work.get("copies_before", []), "copies_before")
        out += self._moves(ctx, work.get("moves", []))
        return out

    def _hit(self, ctx: StepContext, i: int, hit: dict[str, Any], row: TraceRow | None) -> list[TraceDivergence]:
        """One hit: checked, then the request's history and shadow are its prefix's."""
        rid, n, slot = hit["request"], hit["tokens"], hit["slot"]
        cp = self.record.live.get(slot)
        problem, expected, got = None, None, None
        if rid not in ctx.step.admit:
            problem = "the request was not admitted at this step"
        elif cp is None:
            problem = "no live checkpoint there (freed, evicted or never published)"
        elif len(cp.tokens) != n:
            problem = f"the checkpoint holds {len(cp.tokens)} tokens, the hit claims {n}"
            expected, got = len(cp.tokens), n
        elif row is not None and row.cached_tokens != n:
            problem = f"the request's row continues from {row.cached_tokens} tokens, not the hit's {n}"
            expected, got = n, row.cached_tokens
        if problem is not None or cp is None:
            detail = f"hits[{i}] ({n} tokens): {problem}"
            return [prefix_divergence(ctx.step, "hit", detail, rid, slot, expected=expected, got=got)]
        self.hits += 1
        self.record.history[rid] = list(cp.tokens)
        self.record.from_zeros[rid] = True  # from a prefix state computed from zeros
        for own in ctx.slots_of(rid):  # the truth: the prefix's own state
            self.record.set_shadow(ctx.shadow, own, cp.tokens)
            self.record.label(own, cp.tokens)
        return []

    def _moves(self, ctx: StepContext, moves: list[dict[str, Any]]) -> list[TraceDivergence]:
        """Running states moved to other slots (vLLM align: the block of the request's new position): the
        request is live and in the step, its row names the new (first) slot, and the new slots are free or
        its own. One slot per request (``slot``): the old slot is freed (a checkpoint the step publishes on it
        keeps it, held by the cache). A window of D blocks under speculation (``slots``): the blocks it
        leaves are freed, or held for a later post-copy (``keep``) until a checkpoint takes them or the
        request finishes; the request's accepted count resets to 1 (vLLM's pre-copy), so its next verify
        reads the new first block."""
        rows = {r.id: r for r in ctx.step.rows}
        out: list[TraceDivergence] = []
        for i, mv in enumerate(moves):
            rid, window = mv["request"], mv.get("slots")
            new = [mv["slot"]] if window is None else list(window)
            row = rows.get(rid)
            own = set(ctx.slots_of(rid)) if rid in ctx.live else set()
            taken = next((s for s in new if s in self.record.live and s not in own), None)
            problem = None
            if rid not in ctx.live or row is None:
                problem = "the request is not live in this step"
            elif row.slot != new[0]:
                problem = f"the request's row names slot {row.slot}"
            elif taken is not None:
                cp = self.record.live[taken]
                problem = (
                    f"slot {taken} holds the live checkpoint of request {cp.request}'s first {len(cp.tokens)} tokens"
                )
            if problem is None:
                problem = self._move(ctx, rid, new, window is not None, list(mv.get("keep", [])))
            if problem is not None:
                detail = f"moves[{i}] to slot {new[0]}: {problem}"
                out.append(prefix_divergence(ctx.step, "move", detail, rid, new[0]))
        return out

    def _move(self, ctx: StepContext, rid: int, new: list[int], windowed: bool, keep: list[int]) -> str | None:
        """Move ``rid``'s running state to ``new`` (its slots, in column order), or say why not."""
        pool, rec = ctx.pool, self.record
        row = ctx.live[rid]
        have = pool.slots_of(row)
        running = have[ctx.accepted.get(rid, 1) - 1] if windowed else have[0]  # where its state is now
        try:
            dropped = pool.remap(row, new) if windowed else [pool.move(row, new[0])]
        except MetadataError as e:
            return str(e)
        # the truth moves with the request: a move without its pre-copy leaves the runner behind
        for t in ctx.shadow.tensors().values():
            t[new[0]] = t[running]
        if windowed:
            ctx.reset_accepted(rid)
            rec.label(new[0], rec.labels.get(running))
        else:
            have_ids = rec.known_ids(rid)
            if have_ids is not None:  # the block's checkpoint, without a recompute
                rec.cache_slot(tuple(have_ids), ctx.shadow, running)
        for slot in dropped:  # a checkpoint published while the request ran on it stays, held by the cache
            if slot in rec.live:
                pool.hold(slot)
        for j, slot in enumerate(keep):
            if slot not in dropped:
                return f"keep[{j}]: slot {slot} is not a slot the request leaves (it leaves {dropped})"
            if slot not in pool.held_slots:
                pool.hold(slot)
            rec.pending.setdefault(rid, set()).add(slot)
        return None

    def after(self, ctx: StepContext) -> list[TraceDivergence]:
        """Copies after the forward, then the checkpoints the step publishes, each verified; sglang's own track
        fields, where the trace records them, against those copies."""
        step = ctx.step
        work = self.work(step)
        for r in step.rows:  # the forward wrote these slots: what a copy once put there is gone
            slots = ctx.pool.slots_of(r.req_pool_index) if r.id in ctx.live else [r.slot]
            read = self.record.labels.get(slots[min(ctx.read_columns.get(r.id, 0), len(slots) - 1)])
            for slot in slots:
                self.record.label(slot, None)
            if len(slots) > 1:
                self._label_window(ctx, r, slots, read)
        out = self.tracks.check(ctx, work.get("copies_after", []))
        out += self._copies(ctx, work.get("copies_after", []), "copies_after")
        for i, c in enumerate(work.get("checkpoints", [])):
            out += self._publish(ctx, i, c["request"], c["tokens"], c["slot"])
        return out

    def _publish(self, ctx: StepContext, i: int, rid: int, n: int, slot: int) -> list[TraceDivergence]:
        """Checkpoint ``i`` of the step: ``slot`` holds ``rid``'s state after its first ``n`` tokens. Checked
        against what may be published, then against the float64 state of exactly that prefix; it is live
        from now on (also when off: the cache holds it)."""
        step, rec = ctx.step, self.record
        have, owner = rec.history.get(rid), ctx.owner(slot)
        problem, expected, got = None, None, None
        if have is None:
            problem = (
                "the request's token ids are not all in the trace (rows without tokens), so its prefix cannot be "
                "recomputed"
            )
        elif n > len(have):
            problem = f"published before it is written: the request's state holds {len(have)} tokens after this step"
            expected, got = len(have), n
        elif owner is not None and owner != rid:
            runs_on = ", which keeps running" if owner not in step.finish else ""
            problem = f"the slot is the running slot of request {owner}{runs_on}"
        elif owner == rid and rid not in step.finish:
            problem = self._running_problem(ctx, rid, n, slot, len(have))
            expected, got = (len(have), n) if problem and n != len(have) else (None, None)
        elif slot == ctx.dummy_slot:
            problem = "the dummy slot"
        if problem is not None or have is None:
            detail = f"checkpoints[{i}] ({n} tokens): {problem}"
            return [prefix_divergence(step, "checkpoint", detail, rid, slot, expected=expected, got=got)]
        self.published += 1
        prefix = tuple(have[:n])
        if not rec.has_prefix(prefix) and rec.labels.get(slot) == prefix:  # a copy put exactly it there
            rec.cache_slot(prefix, ctx.shadow, slot)
        elif n == len(have) and rec.from_zeros.get(rid) and not rec.has_prefix(prefix):
            rec.remember_shadow(ctx, rid, prefix)
        bad = rec.compare(ctx.state, slot, prefix)
        out: list[TraceDivergence] = []
        if bad is not None:
            name, err = bad
            detail = f"checkpoints[{i}] ({n} tokens): {name} off the float64 state after exactly its first {n} tokens"
            out.append(prefix_divergence(step, "checkpoint", detail, rid, slot, got=err))
        else:
            self.verified += 1
        if owner is None and slot not in ctx.pool.held_slots:
            ctx.pool.hold(slot)
        rec.live[slot] = Checkpoint(rid, prefix, slot, step.step)
        rec.pending.get(rid, set()).discard(slot)
        rec.set_shadow(ctx.shadow, slot, prefix)
        return out

    @staticmethod
    def _running_problem(ctx: StepContext, rid: int, n: int, slot: int, held: int) -> str | None:
        """Why ``slot``, a slot of running request ``rid``, may not be published as its first ``n`` tokens
        (None: it may): it must be the slot that holds the request's state after the step (a window's column
        of its accepted count), and that state must hold exactly ``n`` tokens (``held`` it holds)."""
        slots = ctx.slots_of(rid)
        state_slot = slots[ctx.accepted.get(rid, 1) - 1] if len(slots) > 1 else slots[0]
        if slot != state_slot:
            return (
                f"slot {slot} is a slot of request {rid}'s window that does not hold its state (slot {state_slot} does)"
            )
        if n != held:
            return (
                f"the slot is the running slot of request {rid}, which keeps running: its state holds {held} tokens, "
                f"not exactly the checkpoint's {n}"
            )
        return None

    def written(self, ctx: StepContext) -> list[TraceDivergence]:
        """Before the forward (after the step's moves): a row whose forward writes a live checkpoint, which its
        request published while it ran on the slot and has not moved off (its running slot; a verify in a
        window of D blocks writes all of them): the request wrote its published checkpoint."""
        out: list[TraceDivergence] = []
        for row, kind in zip(ctx.step.rows, ctx.step.kinds, strict=True):
            if row.id not in ctx.live:
                continue
            slots = ctx.slots_of(row.id)
            for slot in slots if kind == "verify" else slots[:1]:
                cp = self.record.live.get(slot)
                if cp is None:
                    continue
                detail = (
                    f"request {row.id}'s forward writes slot {slot}, the live checkpoint of request {cp.request}'s "
                    f"first {len(cp.tokens)} tokens (published at step {cp.step}): the request wrote its published "
                    "checkpoint"
                )
                out.append(prefix_divergence(ctx.step, "checkpoints", detail, row.id, slot))
        return out

    def finish(self, ctx: StepContext, rid: int, row: int) -> None:
        """Free a finishing request's row: its slot stays held when it was published (donated), else freed."""
        pool, rec = ctx.pool, self.record
        slots = pool.slots_of(row)
        if len(slots) == 1 and slots[0] in rec.live:
            pool.donate(row)
        else:
            pool.free([row])
            for slot in slots:  # a window's blocks published while it ran on them stay, held by the cache
                if slot in rec.live:
                    pool.hold(slot)
        for slot in rec.pending.pop(rid, set()):  # blocks left for a post-copy that never came
            pool.release(slot)
        rec.history.pop(rid, None)
        rec.from_zeros.pop(rid, None)

    def remember(self, step: TraceStep, accepted: str = "tokens") -> None:
        """Extend each row's token history by what the step put into its state (a verify row keeps the tokens
        of its accepted path: the first its ``accepted`` says, read in the header's unit ``accepted``, or
        under draft trees the nodes of the step's ``accept_index``)."""
        paths = accepted_paths(step, accepted)
        for r in step.rows:
            have = self.record.history.get(r.id)
            if have is None or r.tokens is None:
                self.record.history[r.id] = None
                continue
            if step.kind_of(r) == "verify":
                have.extend(r.tokens[n] for n in paths[r.id])
            else:
                have.extend(r.tokens[: r.new_tokens])

    # -- pieces -----------------------------------------------------------------------------------------
    def _label_window(self, ctx: StepContext, row: TraceRow, slots: list[int], read: tuple[int, ...] | None) -> None:
        """What the forward left in a window of D slots (vLLM align with speculation): a verify's column ``t``
        the float64 state after the request's first ``cached + t + 1`` ids (for the accepted ``t``), an
        extend's column 0 after all of them; known only when the column the step read held exactly the ids
        before it (``read``; none for a state from zeros). A checkpoint published from a slot whose label
        is its prefix is compared with the shadow's slot instead of a recompute."""
        have = self.record.known_ids(row.id)
        if have is None:
            return
        if row.cached_tokens and read != tuple(have[: row.cached_tokens]):
            return
        if ctx.step.kind_of(row) == "verify":
            for t in range(min(ctx.kept(row), len(slots))):
                self.record.label(slots[t], tuple(have[: row.cached_tokens + t + 1]))
        else:
            self.record.label(slots[0], tuple(have))

    def _copies(self, ctx: StepContext, pairs: list[list[int]], key: str) -> list[TraceDivergence]:
        """The step's copies before (``key`` ``copies_before``) or after the forward: each checked, then made in
        the runner's pool and the shadow alike, and its destination labelled with what the source held."""
        out: list[TraceDivergence] = []
        writable: set[int] | None = None  # before the forward: the slots a copy may go into
        if key == "copies_before":
            moves = self.work(ctx.step).get("moves", [])
            writable = {s for rid in ctx.step.admit for s in ctx.slots_of(rid)}  # of admitted requests
            writable |= {mv["slot"] if "slot" in mv else mv["slots"][0] for mv in moves}  # where a state moves
        for i, (src, dst) in enumerate(pairs):
            own = key == "copies_after" and self._own_post_copy(ctx, src, dst)
            problem = self._copy_problem(ctx, src, dst, own, writable)
            if problem is not None:
                out.append(prefix_divergence(ctx.step, "copy", f"{key}[{i}] {src} -> {dst}: {problem}", slot=dst))
                continue
            for pool in (ctx.state, ctx.shadow):
                for t in pool.tensors().values():
                    t[dst] = t[src]
            src_owner = ctx.owner(src)
            if own and src_owner is not None:  # vLLM's post-copy within its own block: the next verify reads it
                ctx.reset_accepted(src_owner)
            self.record.label(dst, self._copied_label(ctx, src, src_owner))
        return out

    def _copy_problem(self, ctx: StepContext, src: int, dst: int, own: bool, writable: set[int] | None) -> str | None:
        """Why the copy ``src -> dst`` may not be made (None: it may); ``own``: vLLM's post-copy within the
        request's own window; ``writable``: before the forward, the slots a copy may go into (None: after)."""
        if src == dst:
            return "source and destination are one slot (the copy overlaps itself)"
        if not (ctx.in_pool(src) and ctx.in_pool(dst)):
            return "reads or writes the dummy (null) slot or a slot past the pool"
        if ctx.owner(src) is None and src not in self.record.live:
            return f"reads slot {src}, which holds neither a live request's state nor a checkpoint (freed or evicted)"
        kept = self.record.kept_slot(ctx, dst, after=writable is None and not own)
        if kept is not None:
            return kept
        if writable is not None and dst not in writable:
            dst_owner = ctx.owner(dst)
            whose = f"request {dst_owner}'s slot" if dst_owner is not None else "a slot no admitted request owns"
            return (
                f"writes {whose}: a copy before the forward goes into a request admitted at this step, or into the "
                "slot a request moves to"
            )
        return None

    def _copied_label(self, ctx: StepContext, src: int, src_owner: int | None) -> tuple[int, ...] | None:
        """The token ids whose float64 state a copy from ``src`` put into the shadow, or None (unknown; a window
        of D blocks holds a state per draft step, not only the request's)."""
        checkpoint = self.record.live.get(src)
        of_checkpoint = checkpoint.tokens if checkpoint is not None else None
        if ctx.pool.slots_per_request > 1:  # the tokens the source slot's state is of, when known
            label = self.record.labels.get(src) if src_owner is not None else None
            return label if label is not None else of_checkpoint
        have = self.record.known_ids(src_owner) if src_owner is not None else None
        return tuple(have) if have is not None else of_checkpoint

    @staticmethod
    def _own_post_copy(ctx: StepContext, src: int, dst: int) -> bool:
        """vLLM align with speculation: a copy after the forward from the block holding a request's state now
        (the window column of its accepted count) into the first block of its own window (the post-copy whose
        source and destination block are one); the request's state moves, nothing of it is replaced."""
        owner = ctx.owner(dst)
        if ctx.pool.slots_per_request == 1 or owner is None or owner != ctx.owner(src):
            return False
        window = ctx.slots_of(owner)
        return dst == window[0] and src == window[ctx.accepted.get(owner, 1) - 1]


__all__ = [
    "EMBED_VOCAB",
    "TRACK_FIELDS",
    "Checkpoint",
    "CheckpointBook",
    "embed_tokens",
    "embedding_table",
]
