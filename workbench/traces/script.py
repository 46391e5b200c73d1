"""A trace written by hand: a few scheduler steps named request by request (for a zoo case, a test, a lesson).

:func:`scripted` turns a list of steps such as::

    [
        {"mode": "extend", "rows": {0: 8}},               # request 0 admitted, feeds 8 prompt tokens
        {"mode": "extend", "rows": {0: 8, 1: 5}},         # its second chunk; request 1 admitted beside it
        {"mode": "decode", "rows": [0, 1], "finish": [0]},
        {"mode": "target_verify", "rows": {1: 2}},        # request 1 verifies D tokens, 2 accepted
        {"mode": "idle"},
    ]

into a :class:`~workbench.traces.model.Trace`: each request gets its request-pool row and slot from a real
pool at its first step (lowest first, as the simulator and the engines' pools hand them out), its tokens are
counted across steps (``cached_tokens`` before the step, ``seq_len`` after), and ``finish`` frees its row and
slot after the step, for a later request to reuse. The accounting is the simulator's
(:mod:`workbench.traces.simulate`): a verify of ``accepted`` tokens leaves ``cached + accepted`` in the state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workbench.errors import MetadataError
from workbench.layers import LAYERS
from workbench.traces.model import STEP_MODES, Trace, TraceHeader, TraceRow, TraceStep
from workbench.traces.simulate import SimulationError, new_pool

STEP_KEYS = ("mode", "rows", "finish", "tokens", "cached", "metadata")
TOKEN_IDS = 512
"""Generated token ids are in ``range(TOKEN_IDS)``, a fixed function of (request, position)."""


def generated_token(request: int, position: int) -> int:
    """The token id a scripted request feeds at ``position`` when the step does not give one."""
    return (request * 7_919 + position * 104_729 + 13) % TOKEN_IDS


def _ints(where: str, name: str, value: object) -> list[int]:
    items = list(value) if isinstance(value, list | tuple) else None
    if items is None or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in items):
        raise SimulationError(f"{where}: {name} = {value!r}: must be a list of request ids (ints >= 0)")
    return [int(v) for v in items]


def _rows_of(where: str, mode: str, value: object, draft_tokens: int) -> list[tuple[int, int, int | None]]:
    """``(id, new_tokens, accepted)`` per row, in the given order."""
    if mode == "idle":
        if value:
            raise SimulationError(f"{where}: rows = {value!r}: an idle step has no rows")
        return []
    if mode == "decode":
        return [(rid, 1, None) for rid in _ints(where, "rows", value)]
    if not isinstance(value, Mapping) or not value:
        need = "accepted" if mode == "target_verify" else "new_tokens"
        raise SimulationError(f"{where}: rows = {value!r}: a {mode} step needs {{request id: {need}, ...}}")
    out: list[tuple[int, int, int | None]] = []
    for rid, n in value.items():
        if not (isinstance(rid, int) and rid >= 0 and isinstance(n, int) and not isinstance(n, bool) and n >= 1):
            raise SimulationError(f"{where}: rows[{rid!r}] = {n!r}: need a request id >= 0 and an int >= 1")
        if mode == "target_verify":
            if n > draft_tokens:
                raise SimulationError(f"{where}: rows[{rid}] = {n}: accepted must be in 1..D={draft_tokens}")
            out.append((rid, draft_tokens, n))
        else:
            out.append((rid, n, None))
    return out


def scripted(
    profile: str,
    layer: str,
    steps: Sequence[Mapping[str, Any]],
    *,
    num_slots: int,
    buckets: Mapping[str, Sequence[int]],
    draft_tokens: int = 2,
    tokens: bool = False,
) -> Trace:
    """The trace of ``steps`` (see the module) on a pool of ``num_slots`` with ``buckets`` per graph mode.

    Each step: ``mode`` (one of ``STEP_MODES``); ``rows``: decode ``[ids]``, extend and mixed
    ``{id: new_tokens}``, target_verify ``{id: accepted}``, idle none; ``finish``: ids freed after the step.
    A prefix cache's work goes in ``metadata`` (``docs/traces.md``, "Prefix caching"), and the pool follows
    it: a checkpoint on a free slot holds it, a finishing request whose slot was published donates it,
    ``evict`` releases; ``cached``: ``{id: L}`` for a request admitted at this step from a prefix hit of ``L``
    tokens (its first row continues from ``L``).

    ``tokens``: give every row its token ids: ``{id: [ids]}`` from the step's ``tokens`` where given, else
    :func:`generated_token` of (request, position).
    Raises :class:`~workbench.traces.simulate.SimulationError` naming the step and the field.
    """
    if not isinstance(layer, str) or layer not in LAYERS:
        raise SimulationError(f"layer = {layer!r}: must be one of {tuple(LAYERS)}")
    header = TraceHeader(profile, layer, num_slots, {m: list(b) for m, b in buckets.items()}, draft_tokens, None)
    try:
        pool = new_pool(header)
    except (MetadataError, ValueError) as e:
        raise SimulationError(f"num_slots = {num_slots!r}: {e}") from e
    placed: dict[int, tuple[int, int]] = {}  # request id -> (row, slot)
    cached: dict[int, int] = {}
    done: set[int] = set()
    out: list[TraceStep] = []
    for t, spec in enumerate(steps):
        where = f"steps[{t}]"
        unknown = sorted(set(spec) - set(STEP_KEYS))
        mode = spec.get("mode")
        if unknown or mode not in STEP_MODES:
            bad = f"unknown key {unknown[0]!r}" if unknown else f"mode = {mode!r}"
            raise SimulationError(f"{where}: {bad}; a step has {STEP_KEYS}, mode one of {STEP_MODES}")
        metadata = spec.get("metadata")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise SimulationError(f"{where}: metadata = {metadata!r}: must be a mapping (or left out)")
        md = dict(metadata or {})
        given = spec.get("tokens") or {}
        hits = spec.get("cached") or {}
        if not isinstance(given, Mapping) or not isinstance(hits, Mapping):
            raise SimulationError(f"{where}: tokens and cached must be mappings of request id -> value")
        for slot in md.get("evict", []):
            if slot in pool.held_slots:
                pool.release(slot)
        rows, admit = [], []
        for rid, new, accepted in _rows_of(where, mode, spec.get("rows"), draft_tokens):
            if rid in done:
                raise SimulationError(f"{where}: request {rid} finished at an earlier step")
            if rid not in placed:
                if pool.num_free == 0:
                    raise SimulationError(f"{where}: request {rid}: the pool of {num_slots} slots is full")
                row = int(pool.alloc(1)[0])
                placed[rid] = (row, int(pool.mapping[row, 0]))
                cached[rid] = int(hits.get(rid, 0))
                admit.append(rid)
            row, slot = placed[rid]
            before = cached[rid]
            ids = None
            if tokens:
                ids = tuple(given[rid]) if rid in given else tuple(generated_token(rid, before + k) for k in range(new))
                if len(ids) != new:
                    raise SimulationError(f"{where}: tokens[{rid}] has {len(ids)} ids, the row feeds {new}")
            rows.append(TraceRow(rid, row, slot, before + new, new, before, accepted, ids))
            cached[rid] = before + (accepted if accepted is not None else new)
        owned = {slot for row, slot in placed.values() if pool.is_allocated(row)}
        published = {c["slot"] for c in md.get("checkpoints", [])}
        for slot in published - owned - pool.held_slots:
            pool.hold(slot)
        finish = _ints(where, "finish", spec.get("finish", []))
        for rid in finish:
            if rid not in placed or rid in done:
                raise SimulationError(f"{where}: finish: request {rid} is not live")
            row, slot = placed[rid]
            if slot in published:
                pool.donate(row)  # its slot stays, held by the cache
            else:
                pool.free([row])
            done.add(rid)
        out.append(TraceStep(t, mode, tuple(rows), tuple(admit), tuple(finish), md or None))
    return Trace(header, out)


__all__ = ["STEP_KEYS", "TOKEN_IDS", "generated_token", "scripted"]
