"""What the simulator, the scripted traces and the replay share: a trace step as the workbench's
:class:`~workbench.batch.Batch`, the pool a trace header rebuilds, and sglang's verify track step.

Below :mod:`~workbench.traces.simulate`, :mod:`~workbench.traces.script` and :mod:`~workbench.traces.replay`
(none of them imports another for these).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace

import torch

from workbench.batch import Batch
from workbench.errors import WorkbenchError
from workbench.limits import check_int
from workbench.metadata.tree import DraftTree
from workbench.pool import StatePool
from workbench.profiles import get_profile
from workbench.traces.model import Trace, TraceHeader, TraceStep, row_parents, tokens_kept


class SimulationError(WorkbenchError):
    """A simulation argument, or a trace step, that cannot be made or replayed: names the field and value."""


def verify_track_step(pre: int, accepted: int, interval: int) -> int:
    """The draft step a verify tracks at commit, or -1: sglang's ``fused_commit_track_indices`` for a chain
    (topk 1). A row that held ``pre`` tokens and kept ``accepted`` (1..D) crosses a multiple of ``interval``
    when ``pre // interval != (pre + accepted) // interval``; it tracks the last multiple reached, ``tp``,
    whose state is that of draft step ``tp - pre - 1`` (under draft trees: a depth on the accepted path,
    whose node is ``accept_index[b, tp - pre - 1] - b * D``, clamped to the path as sglang PR 35821 does).

    >>> verify_track_step(30, 3, 32), verify_track_step(31, 1, 32), verify_track_step(30, 1, 32)
    (1, 0, -1)
    """
    post = pre + accepted
    if pre // interval == post // interval:
        return -1
    return post // interval * interval - pre - 1


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


# -- a step as the workbench's Batch ---------------------------------------------------------------------
def split_step(step: TraceStep) -> tuple[TraceStep, ...]:
    """The batches a step runs as, each a step of its own (the same number, no metadata, rows in the recorded
    order): a mixed step with verify rows runs as its verify rows (a target_verify step) and then its other
    rows (a mixed step of decode and extend rows, run as an extend batch), as vLLM's GDN builder splits it
    (``spec_*`` / ``non_spec_*``); every other step as itself.

    >>> from workbench.traces.model import TraceRow
    >>> rows = (TraceRow(0, 1, 1, 8, 3, 5, 2, kind="verify"), TraceRow(1, 2, 4, 6, 2, 4, kind="extend"))
    >>> [(s.mode, [r.id for r in s.rows]) for s in split_step(TraceStep(3, "mixed", rows, metadata={"a": 1}))]
    [('target_verify', [0]), ('mixed', [1])]
    """
    if not step.splits:
        return (step,)
    kinds = step.kinds
    verify = tuple(r for r, k in zip(step.rows, kinds, strict=True) if k == "verify")
    others = tuple(r for r, k in zip(step.rows, kinds, strict=True) if k != "verify")
    parts = [replace(step, mode="target_verify", rows=verify, admit=(), finish=(), metadata=None)]
    if others:
        parts.append(replace(step, mode="mixed", rows=others, admit=(), finish=(), metadata=None))
    return tuple(parts)


def _check_rows(step: TraceStep, draft_tokens: int, accepted: str) -> None:
    for i, (r, kind) in enumerate(zip(step.rows, step.kinds, strict=True)):
        where = f"step {step.step} row {i} (request {r.id})"
        if r.new_tokens < 1 or r.cached_tokens < 0 or r.seq_len != r.cached_tokens + r.new_tokens:
            raise SimulationError(
                f"{where}: seq_len={r.seq_len}, cached_tokens={r.cached_tokens}, new_tokens={r.new_tokens}; "
                "need new_tokens >= 1, cached_tokens >= 0 and seq_len == cached_tokens + new_tokens"
            )
        if kind == "decode" and r.new_tokens != 1:
            raise SimulationError(f"{where}: new_tokens={r.new_tokens} in a decode row, must be 1")
        if kind == "verify":
            if r.new_tokens != draft_tokens:
                raise SimulationError(f"{where}: new_tokens={r.new_tokens} in a verify row, must be D={draft_tokens}")
            if r.accepted is not None and not 1 <= tokens_kept(r, accepted) <= draft_tokens:
                raise SimulationError(
                    f"{where}: accepted={r.accepted} ({accepted}), must keep 1..D={draft_tokens} tokens"
                )


def to_batch(
    step: TraceStep,
    profile: str,
    draft_tokens: int,
    *,
    num_accepted: Mapping[int, int] | None = None,
    accepted: str = "tokens",
    topk: int = 1,
    device: str | torch.device | None = None,
) -> Batch:
    """The workbench :class:`~workbench.batch.Batch` of one trace step, rows in the recorded order.

    decode -> ``Batch.decode``; target_verify -> ``Batch.target_verify`` (D = ``draft_tokens``); extend and
    mixed -> ``Batch.extend(req_pool_indices, new_tokens, cached_tokens)`` (a mixed step's decode rows are
    one-token extend rows, as sglang's MIXED batch has them); idle -> ``Batch.idle()``. A mixed step with
    verify rows is two batches: :func:`split_step` it first (:func:`to_batches`).

    ``num_accepted``: request id -> tokens kept at that request's previous verify, for profiles that
    carry ``num_accepted_tokens`` into the next verify (vLLM: it reads the state in slot ``accepted - 1``);
    a request not in it reads slot 0 (1: its last step was a prefill). :func:`iter_batches` keeps it.
    ``accepted``: the header's unit of a row's ``accepted`` (``"tokens"`` or ``"drafts"``). ``topk``: the
    header's; above 1 every verify batch carries its rows' draft trees (a :class:`DraftTree` of each row's
    ``tree``, a row without one the chain), as sglang's tree verify runs chains and trees alike.
    Raises :class:`SimulationError` naming the step and row when a row's counts do not add up.
    """
    prof = get_profile(profile)
    d = check_int("draft_tokens", draft_tokens, 1)
    if step.splits:
        raise SimulationError(
            f"step {step.step}: a mixed step with verify rows runs as two batches: split_step(step) gives them"
        )
    _check_rows(step, d, accepted)
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
        tree = DraftTree.from_parents([list(row_parents(r)) for r in step.rows]) if topk > 1 else None
        return Batch.target_verify(
            rpi, [r.seq_len for r in step.rows], d, num_accepted_tokens=acc, tree=tree, device=device
        )
    if step.mode in ("extend", "mixed"):
        return Batch.extend(rpi, [r.new_tokens for r in step.rows], [r.cached_tokens for r in step.rows], device=device)
    raise SimulationError(
        f"step {step.step}: mode {step.mode!r} is not one of decode, target_verify, extend, mixed, idle"
    )


def to_batches(
    step: TraceStep,
    profile: str,
    draft_tokens: int,
    *,
    num_accepted: Mapping[int, int] | None = None,
    accepted: str = "tokens",
    topk: int = 1,
    device: str | torch.device | None = None,
) -> tuple[tuple[TraceStep, Batch], ...]:
    """Each part of :func:`split_step` with its :func:`to_batch` (one for every step but a mixed step with
    verify rows, which is two: its verify rows, then the others)."""
    return tuple(
        (
            part,
            to_batch(
                part, profile, draft_tokens, num_accepted=num_accepted, accepted=accepted, topk=topk, device=device
            ),
        )
        for part in split_step(step)
    )


def iter_batches(trace: Trace, *, device: str | torch.device | None = None) -> Iterator[tuple[TraceStep, Batch]]:
    """Every step with its Batch (a mixed step with verify rows: each of its two parts, :func:`split_step`),
    keeping each request's last kept count (read through the header's ``accepted`` unit) for its next verify
    (vLLM); any step a request runs consumes it (the lab's rule), a finished request drops it."""
    h = trace.header
    last: dict[int, int] = {}
    for step in trace.steps:
        parts = to_batches(
            step, h.profile, h.draft_tokens, num_accepted=last, accepted=h.accepted, topk=h.topk, device=device
        )
        for r, kind in zip(step.rows, step.kinds, strict=True):
            last.pop(r.id, None)
            if kind == "verify" and r.accepted is not None:
                last[r.id] = tokens_kept(r, h)
        for rid in step.finish:
            last.pop(rid, None)
        yield from parts


__all__ = [
    "SimulationError",
    "iter_batches",
    "new_pool",
    "slots_per_request",
    "split_step",
    "to_batch",
    "to_batches",
    "verify_track_step",
]
