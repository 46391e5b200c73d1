"""A trace written by hand: a few scheduler steps named request by request (for a zoo case, a test, a lesson).

:func:`scripted` turns a list of steps such as::

    [
        {"mode": "extend", "rows": {0: 8}},               # request 0 admitted, feeds 8 prompt tokens
        {"mode": "extend", "rows": {0: 8, 1: 5}},         # its second chunk; request 1 admitted beside it
        {"mode": "decode", "rows": [0, 1], "finish": [0]},
        {"mode": "target_verify", "rows": {1: 2}},        # request 1 verifies D tokens, 2 accepted
        {"mode": "mixed", "rows": {1: ("verify", 1), 2: 6}},  # a verify row beside request 2's first chunk
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
from workbench.pool import StatePool
from workbench.traces.model import STEP_MODES, Trace, TraceHeader, TraceRow, TraceStep
from workbench.traces.steps import SimulationError, new_pool

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


_MODE_KIND = {"decode": "decode", "target_verify": "verify", "extend": "extend"}
_KINDS = ("decode", "verify", "extend")


def _mixed_row(where: str, rid: int, value: object, draft_tokens: int) -> tuple[int, int, int | None, str]:
    """A mixed step's row: ``n`` (a one-token decode when 1, else an extend chunk of ``n``), or ``(kind, n)``
    with kind ``"decode"`` (n 1), ``"extend"`` (n tokens) or ``"verify"`` (D tokens, n accepted)."""
    kind, given = value if isinstance(value, tuple) and len(value) == 2 else (None, value)
    n = given if isinstance(given, int) and not isinstance(given, bool) else 0
    if kind is None and n >= 1:
        kind = "decode" if n == 1 else "extend"
    if n < 1 or kind not in _KINDS or (kind == "decode" and n != 1) or (kind == "verify" and n > draft_tokens):
        raise SimulationError(
            f"{where}: rows[{rid}] = {value!r}: a mixed row is new_tokens, or (kind, n): ('decode', 1), "
            f"('extend', new_tokens) or ('verify', accepted in 1..D={draft_tokens})"
        )
    return (rid, draft_tokens, n, "verify") if kind == "verify" else (rid, n, None, str(kind))


def _rows_of(where: str, mode: str, value: object, draft_tokens: int) -> list[tuple[int, int, int | None, str]]:
    """``(id, new_tokens, accepted, kind)`` per row, in the given order."""
    if mode == "idle":
        if value:
            raise SimulationError(f"{where}: rows = {value!r}: an idle step has no rows")
        return []
    if mode == "decode":
        return [(rid, 1, None, "decode") for rid in _ints(where, "rows", value)]
    if not isinstance(value, Mapping) or not value:
        need = "accepted" if mode == "target_verify" else "new_tokens"
        raise SimulationError(f"{where}: rows = {value!r}: a {mode} step needs {{request id: {need}, ...}}")
    out: list[tuple[int, int, int | None, str]] = []
    for rid, n in value.items():
        if mode == "mixed" and isinstance(rid, int) and rid >= 0:
            out.append(_mixed_row(where, rid, n, draft_tokens))
            continue
        if not (isinstance(rid, int) and rid >= 0 and isinstance(n, int) and not isinstance(n, bool) and n >= 1):
            raise SimulationError(f"{where}: rows[{rid!r}] = {n!r}: need a request id >= 0 and an int >= 1")
        if mode == "target_verify":
            if n > draft_tokens:
                raise SimulationError(f"{where}: rows[{rid}] = {n}: accepted must be in 1..D={draft_tokens}")
            out.append((rid, draft_tokens, n, "verify"))
        else:
            out.append((rid, n, None, _MODE_KIND[mode]))
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

    Each step: ``mode`` (one of ``STEP_MODES``); ``rows``: decode ``[ids]``, extend ``{id: new_tokens}``,
    target_verify ``{id: accepted}``, mixed ``{id: new_tokens}`` (a one-token decode when 1, else an extend
    chunk) or ``{id: (kind, n)}`` (``("verify", accepted)`` for a verify row of D tokens, ``("extend", n)``,
    ``("decode", 1)``), in the engine's row order; idle none; ``finish``: ids freed after the step. Every
    row gets its ``kind``.
    A prefix cache's work goes in ``metadata`` (``docs/traces.md``, "Prefix caching"), and the pool follows
    it: a checkpoint on a free slot holds it, a finishing request whose slot was published donates it,
    ``evict`` releases; ``cached``: ``{id: L}`` for a request admitted at this step from a prefix hit of ``L``
    tokens (its first row continues from ``L``).

    ``tokens``: give every row its token ids: ``{id: [ids]}`` from the step's ``tokens`` where given, else
    :func:`generated_token` of (request, position).
    Raises :class:`~workbench.traces.steps.SimulationError` naming the step and the field.
    """
    if not isinstance(layer, str) or layer not in LAYERS:
        raise SimulationError(f"layer = {layer!r}: must be one of {tuple(LAYERS)}")
    header = TraceHeader(profile, layer, num_slots, {m: list(b) for m, b in buckets.items()}, draft_tokens, None)
    try:
        pool = new_pool(header)
    except (MetadataError, ValueError) as e:
        raise SimulationError(f"num_slots = {num_slots!r}: {e}") from e
    script = _Script(pool, num_slots, draft_tokens, tokens)
    return Trace(header, [script.step(t, spec) for t, spec in enumerate(steps)])


def _step_fields(
    where: str, spec: Mapping[str, Any]
) -> tuple[str, dict[str, Any], Mapping[Any, Any], Mapping[Any, Any]]:
    """A step's ``mode``, its ``metadata`` (a new dict), ``tokens`` and ``cached`` (empty when left out);
    an unknown key, mode or a value of the wrong kind is refused naming the step."""
    unknown = sorted(set(spec) - set(STEP_KEYS))
    mode = spec.get("mode")
    if unknown or mode not in STEP_MODES:
        bad = f"unknown key {unknown[0]!r}" if unknown else f"mode = {mode!r}"
        raise SimulationError(f"{where}: {bad}; a step has {STEP_KEYS}, mode one of {STEP_MODES}")
    metadata = spec.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise SimulationError(f"{where}: metadata = {metadata!r}: must be a mapping (or left out)")
    given = spec.get("tokens") or {}
    hits = spec.get("cached") or {}
    if not isinstance(given, Mapping) or not isinstance(hits, Mapping):
        raise SimulationError(f"{where}: tokens and cached must be mappings of request id -> value")
    return str(mode), dict(metadata or {}), given, hits


class _Script:
    """The pool and the requests of a script turned into steps one by one: each request's ``(row, slot)``
    (from its first step), the tokens in its state, and the requests finished."""

    def __init__(self, pool: StatePool, num_slots: int, draft_tokens: int, tokens: bool) -> None:
        self.pool, self.num_slots, self.draft_tokens, self.tokens = pool, num_slots, draft_tokens, tokens
        self.placed: dict[int, tuple[int, int]] = {}  # request id -> (row, slot)
        self.cached: dict[int, int] = {}  # request id -> tokens in its state
        self.done: set[int] = set()

    def step(self, t: int, spec: Mapping[str, Any]) -> TraceStep:
        """Step ``t`` of the script: the cache's evictions give their slots back first, then the rows (new
        requests placed), the checkpoints held, and the finishes (a published slot is donated, else freed)."""
        where = f"steps[{t}]"
        mode, md, given, hits = _step_fields(where, spec)
        for slot in md.get("evict", []):
            if slot in self.pool.held_slots:
                self.pool.release(slot)
        rows, admit = self._rows(where, mode, spec.get("rows"), given, hits)
        owned = {slot for row, slot in self.placed.values() if self.pool.is_allocated(row)}
        published = {c["slot"] for c in md.get("checkpoints", [])}
        for slot in published - owned - self.pool.held_slots:
            self.pool.hold(slot)
        finish = self._finish(where, spec.get("finish", []), published)
        return TraceStep(t, mode, tuple(rows), tuple(admit), tuple(finish), md or None)

    def _rows(
        self, where: str, mode: str, value: object, given: Mapping[Any, Any], hits: Mapping[Any, Any]
    ) -> tuple[list[TraceRow], list[int]]:
        """The step's rows (each request placed at its first step, a hit starting from ``hits``' tokens) and
        the requests admitted at it; each request's tokens move on by its row's."""
        rows: list[TraceRow] = []
        admit: list[int] = []
        for rid, new, accepted, kind in _rows_of(where, mode, value, self.draft_tokens):
            if rid in self.done:
                raise SimulationError(f"{where}: request {rid} finished at an earlier step")
            if rid not in self.placed:
                self._place(where, rid, hits)
                admit.append(rid)
            row, slot = self.placed[rid]
            before = self.cached[rid]
            ids = self._ids(where, rid, before, new, given) if self.tokens else None
            rows.append(TraceRow(rid, row, slot, before + new, new, before, accepted, ids, kind=kind))
            self.cached[rid] = before + (accepted if accepted is not None else new)
        return rows, admit

    def _place(self, where: str, rid: int, hits: Mapping[Any, Any]) -> None:
        """Request ``rid``'s row and slot, the lowest free (as the engines' pools hand them out), and its tokens
        cached: a prefix hit's (``hits``), else none."""
        if self.pool.num_free == 0:
            raise SimulationError(f"{where}: request {rid}: the pool of {self.num_slots} slots is full")
        row = int(self.pool.alloc(1)[0])
        self.placed[rid] = (row, int(self.pool.mapping[row, 0]))
        self.cached[rid] = int(hits.get(rid, 0))

    def _ids(self, where: str, rid: int, before: int, new: int, given: Mapping[Any, Any]) -> tuple[int, ...]:
        """The ``new`` ids a row of request ``rid`` feeds after ``before`` tokens: the step's, else generated."""
        ids = tuple(given[rid]) if rid in given else tuple(generated_token(rid, before + k) for k in range(new))
        if len(ids) != new:
            raise SimulationError(f"{where}: tokens[{rid}] has {len(ids)} ids, the row feeds {new}")
        return ids

    def _finish(self, where: str, value: object, published: set[int]) -> list[int]:
        """The requests ``value`` finishes after the step: a slot the step published is donated (it stays,
        held by the cache), any other freed."""
        finish = _ints(where, "finish", value)
        for rid in finish:
            if rid not in self.placed or rid in self.done:
                raise SimulationError(f"{where}: finish: request {rid} is not live")
            row, slot = self.placed[rid]
            if slot in published:
                self.pool.donate(row)  # its slot stays, held by the cache
            else:
                self.pool.free([row])
            self.done.add(rid)
        return finish


__all__ = ["STEP_KEYS", "TOKEN_IDS", "generated_token", "scripted"]
