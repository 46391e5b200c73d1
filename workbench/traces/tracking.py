"""sglang's track fields of a trace replay: each tracked row's state copied into its track slot, checked.

sglang tracks a request's state into a slot of its own (which the prefix cache then publishes); a trace
records how (``workbench.traces.model.TRACK_FIELDS`` and the keys beside them; ``docs/traces.md``,
"Prefix caching"). :class:`TrackChecks` runs and checks it after each step's forward, on the
:class:`~workbench.traces.context.StepContext` the replay hands it, and labels what it copies in the
:class:`~workbench.traces.cache_record.CacheRecord` it shares with the checkpoint checks:

* ``mamba_track_mask``, ``mamba_track_indices``, ``mamba_track_seqlens``: each tracked row has its copy
  from its running slot into that slot, and holds exactly that many tokens; an untracked row's length is -1.
  In an extend step that records ``mamba_chunk_size`` ``C``, a length ``L`` with ``L - cached`` not a
  multiple of ``C`` is tracked from the kernel's chunk states ``h`` instead (its grid: :class:`_ChunkGrid`),
  with ``track_ssm_h_src`` / ``track_ssm_h_dst``, Mamba2's recomputes off its grid (``RECOMPUTE_FIELDS``),
  ``track_conv_indices`` and the final copies (``FINAL_TRACK_FIELDS``) checked against the rows.
* a verify step's ``mamba_track_indices`` and ``mamba_steps_to_track`` (sglang tracks at commit): a row with
  step ``s >= 0`` has the intermediate state of its draft step ``s`` (the state after ``cached + s + 1``
  tokens) copied into its track slot, in the runner and the float64 shadow alike, the slot checked as a
  copy's destination after the forward; ``s`` must be one of the row's accepted steps. Under draft trees
  (the header's ``topk > 1``) ``s`` is a node: it must be on the row's accepted path (``accept_index[b, tp -
  pre - 1] - b * D``, the depth clamped to the path as sglang PR 35821 does); the slot gets the state of the
  path to ``s``, labelled with those nodes' token ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernels.mamba2.chunk_grid import grid_index, grid_owner, grid_size
from kernels.snapshots import Snapshots
from workbench.traces.cache_record import CacheRecord
from workbench.traces.context import StepContext
from workbench.traces.divergence import TraceDivergence, prefix_divergence
from workbench.traces.model import (
    FINAL_TRACK_FIELDS,
    RECOMPUTE_FIELDS,
    TRACK_FIELDS,
    VERIFY_TRACK_FIELDS,
    TraceStep,
)

EXTEND_MODES = ("extend", "mixed")


def _track(
    step: TraceStep, detail: str, request: int | None = None, slot: int | None = None, **values: Any
) -> TraceDivergence:
    return prefix_divergence(step, "track", detail, request, slot, **values)


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


def chunk_positions(step: TraceStep) -> dict[int, int]:
    """The states :meth:`TrackChecks.fields` will track from the kernel's chunk states in ``step``: each such
    row's running slot -> its tokens in the step up to its tracked position (``(L - cached) // C * C``), for
    the replay to ask the references for (:mod:`kernels.snapshots`); empty when the step tracks none, or its
    fields are not the lists the checks take (they say so)."""
    md = step.metadata or {}
    chunk = md.get("mamba_chunk_size") if step.mode in EXTEND_MODES else None
    fields = [md.get(k) for k in TRACK_FIELDS]
    n = len(step.rows)
    if not isinstance(chunk, int) or chunk <= 0 or not all(isinstance(f, list) and len(f) == n for f in fields):
        return {}
    mask, lengths = (list(f or ()) for f in (fields[0], fields[2]))
    out: dict[int, int] = {}
    for i, row in enumerate(step.rows):
        length = lengths[i] - row.cached_tokens if isinstance(lengths[i], int) else 0
        if mask[i] and length % chunk:
            out[row.slot] = length // chunk * chunk
    return out


class TrackChecks:
    """The track checks of a replay's steps (see the module); what they copy is labelled in ``record``."""

    def __init__(self, record: CacheRecord) -> None:
        self.record = record

    def check(self, ctx: StepContext, copies_after: list[list[int]]) -> list[TraceDivergence]:
        """The step's track fields, where the trace records them: at a verify's commit
        (``mamba_steps_to_track``), else against the step's copies after the forward (``copies_after``)."""
        if "mamba_steps_to_track" in (ctx.step.metadata or {}):
            return self.verified(ctx)
        return self.fields(ctx, copies_after)

    # -- a verify's tracking at commit -----------------------------------------------------------------
    def verified(self, ctx: StepContext) -> list[TraceDivergence]:
        """sglang's tracking at the commit of a verify (``scatter_mamba_states_after_mtp_verify``): each row with
        ``mamba_steps_to_track[i] = s >= 0`` gets its draft step ``s``'s intermediate state (conv window and
        recurrent state) copied into ``mamba_track_indices[i]``; -1 skips the row."""
        step = ctx.step
        md = step.metadata or {}
        fields = [md.get(k) for k in VERIFY_TRACK_FIELDS]
        n = len(step.rows)
        if step.mode != "target_verify":
            return [
                _track(step, f"mamba_steps_to_track on a {step.mode} step: only a target_verify step tracks at commit")
            ]
        if not all(isinstance(f, list) and len(f) == n for f in fields):
            got = [len(f) if isinstance(f, list) else f for f in fields]
            detail = f"{', '.join(VERIFY_TRACK_FIELDS)} must each be a list of one entry per row ({n}); got {got}"
            return [_track(step, detail)]
        slots, steps = (list(f or ()) for f in fields)
        out: list[TraceDivergence] = []
        for i in range(n):
            s, dst = int(steps[i]), int(slots[i])
            if s >= 0:
                out += self._verified_row(ctx, i, s, dst)
            elif s < -1:  # under draft trees: a node read past the path, from its -1 padding
                out += self._past_path(ctx, i, s, dst)
        return out

    @staticmethod
    def _past_path(ctx: StepContext, i: int, s: int, dst: int) -> list[TraceDivergence]:
        """A tracked node below -1: ``accept_index`` read past the row's accepted path (its -1 padding, minus
        ``b * D``); nothing is copied."""
        row = ctx.step.rows[i]
        detail = (
            f"row {i}: mamba_steps_to_track[{i}] = {s} into slot {dst}: not a node (-1 past its accepted path "
            f"{list(ctx.path(row))}, minus b * D): the track depth was read past the path (sglang PR 35821 clamps "
            "it by accept_lens - 1)"
        )
        return [_track(ctx.step, detail, row.id, dst, got=s)]

    def _verified_row(self, ctx: StepContext, i: int, s: int, dst: int) -> list[TraceDivergence]:
        step, row, verified, d = ctx.step, ctx.step.rows[i], ctx.verified, ctx.draft_tokens
        where = f"row {i}: mamba_steps_to_track[{i}] = {s} into slot {dst}"
        problem = self.record.kept_slot(ctx, dst, after=True)
        if not ctx.in_pool(dst):
            problem = "writes the dummy (null) slot or a slot past the pool"
        elif s >= d:
            problem = f"past the verify's {d} draft steps"
        elif verified is None or row.req_pool_index not in verified.rows:
            problem = "the step left no intermediate state for the row (it did not run as a verify)"
        if problem is not None:
            return [_track(step, f"{where}: {problem}", row.id, dst)]
        assert verified is not None
        k = verified.rows.index(row.req_pool_index)
        for pool, inter in ((ctx.state, verified.runner), (ctx.shadow, verified.reference)):
            pool.conv[dst] = inter.conv[k, s].to(pool.conv.dtype)
            pool.ssm[dst] = inter.ssm[k, s].to(pool.ssm.dtype)
        # node s holds the state of the tokens on the path to it (a chain's first s + 1)
        have, kept, to_s = self.record.known_ids(row.id), ctx.kept(row), ctx.node_path(row, s)
        ids = (
            None if have is None or row.tokens is None else (*have[: row.cached_tokens], *(row.tokens[t] for t in to_s))
        )
        self.record.label(dst, ids)
        if ctx.topk > 1:  # a node of a draft tree: on the accepted path, or the slot holds another branch
            path = ctx.path(row)
            if s in path:
                return []
            detail = (
                f"{where}: node {s} is not on the accepted path {list(path)} (its own path is {list(to_s)}): the "
                f"track node is accept_index[b, tp - pre - 1] - b * D, the path's node at the track depth (sglang "
                "PR 35821 clamps the depth by accept_lens - 1)"
            )
            return [_track(step, detail, row.id, dst, expected=f"a node of {list(path)}", got=s)]
        if s < kept:
            return []
        detail = (
            f"{where}: draft step {s} was not accepted ({kept} accepted): the slot gets the state of tokens the "
            "request did not keep"
        )
        return [_track(step, detail, row.id, dst, expected=f"< {kept}", got=s)]

    # -- the track fields of a step --------------------------------------------------------------------
    def fields(self, ctx: StepContext, copies: list[list[int]]) -> list[TraceDivergence]:
        """sglang's ``mamba_track_mask`` / ``mamba_track_indices`` / ``mamba_track_seqlens`` (one entry per row,
        in row order) say which rows the step tracks, into which slot, at which length; an untracked row's
        length is -1. A tracked row takes its final state (its copy, running slot -> that slot, after the
        step; it holds exactly that many tokens), or, in an extend step that records ``mamba_chunk_size``
        ``C`` and a length ``L`` with ``L - cached`` not a multiple of ``C``, the kernel's chunk state ``h``
        after ``cached + (L - cached) // C * C`` tokens (sglang's ``_init_track_ssm_indices``; the +1 its
        scheduler adds to force this path cancels under the floor): :meth:`_chunk`."""
        step = ctx.step
        md = step.metadata or {}
        fields = [md.get(k) for k in TRACK_FIELDS]
        if all(f is None for f in fields):
            return []
        n = len(step.rows)
        if not all(isinstance(f, list) and len(f) == n for f in fields):
            got = [len(f) if isinstance(f, list) else f for f in fields]
            return [
                _track(step, f"{', '.join(TRACK_FIELDS)} must each be a list of one entry per row ({n}); got {got}")
            ]
        mask, slots, lengths = (list(f or ()) for f in fields)  # lists of one entry per row (checked above)
        made = {(int(a), int(b)) for a, b, *_ in copies}
        chunk = md.get("mamba_chunk_size") if step.mode in EXTEND_MODES else None
        out: list[TraceDivergence] = []
        h_rows: list[int] = []  # rows tracked from the chunk states, in row order
        for i, row in enumerate(step.rows):
            held = ctx.held_after(row)
            if not mask[i]:
                if lengths[i] != -1:
                    detail = f"row {i}: untracked, but mamba_track_seqlens[{i}] = {lengths[i]} (want -1)"
                    out.append(_track(step, detail, row.id, expected=-1, got=lengths[i]))
            elif chunk and (lengths[i] - row.cached_tokens) % chunk:
                h_rows.append(i)
            elif (row.slot, int(slots[i])) not in made:
                detail = f"row {i}: tracked into slot {slots[i]}, but no copy {row.slot} -> {slots[i]} after the step"
                out.append(_track(step, detail, row.id, int(slots[i])))
            elif lengths[i] != held:
                detail = f"row {i}: mamba_track_seqlens[{i}] = {lengths[i]}, but the state holds {held} tokens"
                out.append(_track(step, detail, row.id, int(slots[i]), expected=held, got=lengths[i]))
        if h_rows and chunk:
            out += self._chunk(ctx, h_rows, [int(slots[i]) for i in h_rows], [lengths[i] for i in h_rows])
        if step.mode in EXTEND_MODES and any(k in md for k in FINAL_TRACK_FIELDS):
            finals = [(row.slot, int(slots[i])) for i, row in enumerate(step.rows) if mask[i] and i not in h_rows]
            out += self._finals(step, finals)
        return out

    @staticmethod
    def _finals(step: TraceStep, want: list[tuple[int, int]]) -> list[TraceDivergence]:
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
            return [_track(step, detail)]
        named = [[int(a), int(b)] for a, b in zip(src, dst, strict=True)]
        wanted = [list(p) for p in want]
        if named == wanted:
            return []
        detail = (
            f"{', '.join(FINAL_TRACK_FIELDS)} name the copies {named}, but the rows tracked at their chunk's end "
            f"copy {wanted} (running slot -> track slot, row order)"
        )
        return [_track(step, detail, expected=wanted, got=named)]

    # -- rows tracked from the chunk states ------------------------------------------------------------
    def _chunk(self, ctx: StepContext, rows: list[int], dsts: list[int], lengths: list[int]) -> list[TraceDivergence]:
        """The rows tracked from the kernel's chunk states: row ``rows[k]``'s state after ``p = cached + (L -
        cached) // C * C`` tokens goes to ``dsts[k]`` (conv window and recurrent state; :meth:`chunk_state`,
        the replay's stand-in for the kernel's ``h``). Where ``h`` holds it depends on the layer
        (:class:`_ChunkGrid`); a Mamba2 position off its grid is recomputed instead (``RECOMPUTE_FIELDS``).
        Recorded entries are matched to the rows by their track slot, and the state each copies is the one it
        names (so an index read on the wrong grid, sglang issue 31833, is named at its step and the
        checkpoint published from it is off); ``track_conv_indices`` (one window of ``W - 1`` flattened
        input positions per tracked row) against the positions before ``p``."""
        step = ctx.step
        md = step.metadata or {}
        if ctx.inputs is None or ctx.before is None:
            return [_track(step, "the step ran no forward: there is no chunk state to track from")]
        grid = _ChunkGrid.of(step, int(md["mamba_chunk_size"]), ctx.layer)
        want = {
            dst: _Tracked(i, length - step.rows[i].cached_tokens, grid)
            for i, dst, length in zip(rows, dsts, lengths, strict=True)
        }
        entries = self._chunk_entries(step, want)
        if isinstance(entries, str):
            return [_track(step, entries)]
        out: list[TraceDivergence] = []
        for key, j, source, slot in entries:
            out += self._chunk_entry(ctx, grid, want, key, j, source, slot, dsts)
        for slot, tracked in want.items():
            if not tracked.written and not any(d.slot == slot for d in out):
                detail = (
                    f"row {tracked.row}: tracked from h into slot {slot} ({tracked.source}), but no entry of "
                    f"track_ssm_h_dst or track_ssm_recompute_dst is {slot}"
                )
                out.append(_track(step, detail, step.rows[tracked.row].id, slot))
        conv_idx = md.get("track_conv_indices")
        if conv_idx is not None:
            out += self._conv(ctx, conv_idx, grid.chunk, grid.qsl)
        return out

    def _chunk_entry(
        self,
        ctx: StepContext,
        grid: _ChunkGrid,
        want: dict[int, _Tracked],
        key: str,
        j: int,
        source: Any,
        slot: int,
        dsts: list[int],
    ) -> list[TraceDivergence]:
        """One recorded chunk-state copy: the state it names into its track slot, checked against the row that
        tracks into that slot."""
        step = ctx.step
        tracked = want.get(slot)
        if tracked is None:
            return [
                _track(
                    step,
                    f"{key}[{j}] = {slot}, but no row tracked from h goes to slot {slot} (they go to {dsts})",
                    slot=slot,
                )
            ]
        row = step.rows[tracked.row]
        got, wrong = grid.read(key, j, source, tracked)
        problem = self.record.kept_slot(ctx, slot, after=True)
        if not ctx.in_pool(slot):
            problem = "writes the dummy (null) slot or a slot past the pool"
        where = f"row {tracked.row}: tracked from h into slot {slot}"
        out: list[TraceDivergence] = []
        if wrong is not None:  # the entry names another state (or none): which one, against the row's own
            out.append(_track(step, f"{where}: {wrong}", row.id, slot, expected=tracked.index, got=source))
        if problem is not None:  # the track slot itself may not be written
            out.append(_track(step, f"{where}: {problem}", row.id, slot))
        if got is not None and problem is None:  # a wrong entry still copies the state it names
            self._copy_chunk_state(ctx, *got, slot)
            tracked.written = True
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

    def _copy_chunk_state(self, ctx: StepContext, b: int, tokens: int, slot: int) -> None:
        """Row ``b``'s state after ``tokens`` tokens of the step's chunk into ``slot``, runner and shadow alike."""
        for pool, (conv, ssm) in zip((ctx.state, ctx.shadow), self.chunk_state(ctx, b, tokens), strict=True):
            pool.conv[slot], pool.ssm[slot] = conv.to(pool.conv.dtype), ssm.to(pool.ssm.dtype)
        rb = ctx.step.rows[b]
        have = self.record.known_ids(rb.id)
        ids = None if have is None or rb.tokens is None else (*have[: rb.cached_tokens], *rb.tokens[:tokens])
        self.record.label(slot, ids)

    def chunk_state(self, ctx: StepContext, b: int, tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row ``b``'s conv window and recurrent state after the first ``tokens`` tokens of the step's chunk,
        in the runner's layer (its dtype) and in the float64 reference: the replay's stand-in for the
        kernel's chunk state ``h``. What the layer's references handed out as the step's forward passed it
        (``ctx.taken``, asked for by :func:`chunk_positions`), else the same layer run on those tokens from
        the row's state before the step (``ctx.inputs`` and ``ctx.before``): a kernel that hands out none
        (the Triton kernels), or a state no tracked row asked for (an entry naming another)."""
        assert ctx.inputs is not None and ctx.before is not None  # the forward ran (checked by the caller)
        step, x = ctx.step, ctx.inputs
        row = step.rows[b]
        at = sum(r.new_tokens for r in step.rows[:b])
        taken = ctx.taken or (None, None)
        return [
            _taken(snaps, row.slot, tokens) or self.record.run_scratch(
                layer, dtype, x[at : at + tokens], row.cached_tokens,
                (init.conv[row.slot], init.ssm[row.slot]) if row.cached_tokens else None,
            )
            for (layer, dtype, init), snaps in zip(
                (
                    (ctx.layer, ctx.layer.dtype, ctx.before[0]),
                    (ctx.reference, torch.float64, ctx.before[1]),
                ),
                taken, strict=True,
            )
        ]  # fmt: skip

    @staticmethod
    def _conv(ctx: StepContext, recorded: Any, chunk: int, qsl: list[int]) -> list[TraceDivergence]:
        """``track_conv_indices``: for each tracked row (row order), the ``W - 1`` flattened input positions
        before its tracked position, ``qsl[b] + (L - cached) // C * C - (W - 1) + j`` (clamped into the step's
        tokens), as sglang's ``_init_track_conv_indices`` gathers them."""
        step = ctx.step
        md = step.metadata or {}
        width = int(ctx.shadow.conv.shape[-1])
        tracked = [i for i, m in enumerate(md["mamba_track_mask"]) if m]
        if not isinstance(recorded, list) or len(recorded) != len(tracked):
            return [_track(step, f"track_conv_indices must hold one window per tracked row ({len(tracked)})")]
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
                out.append(_track(step, detail, row.id, expected=want, got=recorded[k]))
        return out


def _taken(snaps: Snapshots | None, slot: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Slot ``slot``'s conv window and recurrent state after ``tokens`` tokens of its row, when the references
    handed both out (``snaps``); else None."""
    if snaps is None or snaps.wanted.get(slot) != tokens or slot not in snaps.conv or slot not in snaps.ssm:
        return None
    return snaps.conv[slot], snaps.ssm[slot]


__all__ = ["TrackChecks", "chunk_positions"]
