"""What a driver of an engine's own scheduler takes from the workbench, engine-free: the requests it serves,
how many drafted tokens each verify keeps, the request-pool rows and ids a trace names, and the trace itself
as the file's JSON objects.

A driver (``workbench.engines.vllm_scheduler``, ``workbench.engines.sglang_scheduler``) runs the installed
engine's scheduling code on the CPU and writes down what it did, step by step, as ``docs/traces.md``
describes. The engine decides everything a scheduler decides (admission, chunking, the prefix cache,
preemption); the workbench supplies only what a model and its users would:

- :class:`Workload`: arrivals (a burst at the start, then about ``arrival_rate`` per step), each a prompt
  that starts with one of a few shared system prompts, or the next turn of a finished conversation
  (``followup_rate``: its whole text, prompt and reply, then a new user turn), and an output length.
- :class:`Acceptance`: per verify, the tokens it keeps (1..D, the bonus token included), each draft accepted
  with probability ``rate`` until the first rejection.
- :class:`RowAllocator`: the stable request-pool row a trace names for each request, lowest free first from
  1 (row 0 is every profile's reserved row), freed when the request finishes or is preempted.
- :class:`TraceIds`: the engine's string ids as the trace's ints; a request the engine readmits after a
  preemption starts over under a new id (its state was thrown away).
- :class:`SchedulerTrace`: the header and step objects of the file (plain JSON values, so the engines layer
  needs nothing of ``workbench.traces``); ``lines()`` is the file, which ``workbench.traces.format.read_trace``
  reads into a ``Trace``.

Each draw comes from its own seeded stream (``seed`` and the stream's name), so the workload of a seed is the
same whatever the acceptance draws, and the same for every engine's driver.

    >>> first = Workload(3).arrivals(0)
    >>> len(first), first == Workload(3).arrivals(0), first == Workload(4).arrivals(0)
    (6, True, False)
    >>> rows = RowAllocator()
    >>> rows.add("a"), rows.add("b"), rows.remove("a"), rows.add("c")
    (1, 2, None, 1)
"""

from __future__ import annotations

import json
import random
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.profiles import get_profile


@dataclass(frozen=True)
class WorkloadSettings:
    """The requests a driver serves. Lengths are ``(low, high)`` inclusive; token ids are below ``vocab``."""

    system_prompts: int = 3  # shared system prompts, drawn once per run
    system_len: tuple[int, int] = (40, 240)
    user_len: tuple[int, int] = (5, 90)  # a request's own tokens after its system prompt or conversation
    output_len: tuple[int, int] = (8, 48)  # tokens it generates (max_tokens; no end-of-sequence token)
    followup_rate: float = 0.3  # an arrival is the next turn of a finished conversation
    arrival_rate: float = 0.35  # arrivals per step after the first
    first_burst: int = 6  # arrivals at step 0
    vocab: int = 4096  # the replay embeds token t as row t % 4096
    max_prompt: int = 2048  # prompts are cut to it (a follow-up of a long conversation)
    history: int = 64  # finished conversations a follow-up may continue


@dataclass(frozen=True)
class Arrival:
    """One request: its prompt's token ids, the tokens it generates, whether it continues a conversation."""

    prompt: tuple[int, ...]
    max_tokens: int
    followup: bool = False


def _stream(seed: int, name: str) -> random.Random:
    return random.Random(f"{seed}:{name}")


class Workload:
    """Seeded arrivals (module docstring); :meth:`finished` hands back a finished conversation so that a later
    arrival may continue it."""

    def __init__(self, seed: int, settings: WorkloadSettings | None = None) -> None:
        self.settings = s = settings or WorkloadSettings()
        self.rng = _stream(seed, "workload")
        self.systems = [self._ids(self.rng.randint(*s.system_len)) for _ in range(s.system_prompts)]
        self.conversations: deque[tuple[int, ...]] = deque(maxlen=s.history)

    def _ids(self, n: int) -> list[int]:
        return [self.rng.randrange(1, self.settings.vocab) for _ in range(n)]

    def arrivals(self, step: int) -> list[Arrival]:
        """The requests arriving before ``step`` is scheduled."""
        s, rng = self.settings, self.rng
        n = s.first_burst if step == 0 else int(rng.random() < s.arrival_rate)
        return [self._one() for _ in range(n)]

    def _one(self) -> Arrival:
        s, rng = self.settings, self.rng
        followup = bool(self.conversations) and rng.random() < s.followup_rate
        base = list(rng.choice(self.conversations)) if followup else list(rng.choice(self.systems))
        prompt = (base + self._ids(rng.randint(*s.user_len)))[: s.max_prompt]
        return Arrival(tuple(prompt), rng.randint(*s.output_len), followup)

    def finished(self, conversation: Sequence[int]) -> None:
        """A request finished with ``conversation`` (its prompt and every generated token)."""
        if len(conversation) < self.settings.max_prompt:
            self.conversations.append(tuple(conversation))


class Acceptance:
    """Seeded verify outcomes: :meth:`kept` of a row with ``drafts`` draft tokens is the tokens it keeps,
    1 + the drafts accepted before the first rejection (each accepted with probability ``rate``).

    >>> a = Acceptance(0, rate=1.0)
    >>> a.kept(2), Acceptance(0, rate=0.0).kept(2)
    (3, 1)
    """

    def __init__(self, seed: int, rate: float = 0.6) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"acceptance rate = {rate!r}: must be in [0, 1]")
        self.rng, self.rate = _stream(seed, "acceptance"), rate

    def kept(self, drafts: int) -> int:
        n = 0
        while n < drafts and self.rng.random() < self.rate:
            n += 1
        return n + 1

    def token(self, vocab: int = 4096) -> int:
        """A sampled or drafted token id (the fake model's)."""
        return self.rng.randrange(1, vocab)


class RowAllocator:
    """Stable request-pool rows: each request gets the lowest free row from 1 for its whole life."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self._free: list[int] = []
        self._next = 1

    def add(self, key: str) -> int:
        if key in self.rows:
            raise ValueError(f"request {key!r} already has row {self.rows[key]}")
        if self._free:
            self._free.sort()
            row = self._free.pop(0)
        else:
            row, self._next = self._next, self._next + 1
        self.rows[key] = row
        return row

    def remove(self, key: str) -> None:
        row = self.rows.pop(key, None)
        if row is not None:
            self._free.append(row)

    def __getitem__(self, key: str) -> int:
        return self.rows[key]


class TraceIds:
    """Engine request ids -> the trace's ints, in order of first admission; :meth:`readmit` gives a request
    that starts over (after a preemption) a new one."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self._next = 0

    def admit(self, key: str) -> int:
        if key not in self.ids:
            self.ids[key], self._next = self._next, self._next + 1
        return self.ids[key]

    def readmit(self, key: str) -> int:
        self.ids.pop(key, None)
        return self.admit(key)

    def __getitem__(self, key: str) -> int:
        return self.ids[key]

    def __contains__(self, key: object) -> bool:
        return key in self.ids


def step_mode(kinds: Sequence[str]) -> str:
    """The trace mode of a step whose rows have ``kinds`` (``decode``, ``verify``, ``extend``): the one mode of
    a step of one kind, ``mixed`` otherwise, ``idle`` without rows.

    >>> step_mode(["verify", "verify"]), step_mode(["verify", "extend"]), step_mode([])
    ('target_verify', 'mixed', 'idle')
    """
    distinct = set(kinds)
    if not distinct:
        return "idle"
    if len(distinct) > 1:
        return "mixed"
    return {"decode": "decode", "verify": "target_verify", "extend": "extend"}[distinct.pop()]


@dataclass
class SchedulerTrace:
    """A trace a real scheduler produced, as the file's JSON objects: ``header`` (line 1) and ``steps`` (one
    object per step, ``docs/traces.md``), with ``stats`` (counts of what the run did), ``notes`` (what the
    driver stood in for, one line each) and ``findings`` (what the driver's own checks found the engine doing
    against what it claims, one line each; empty when nothing). ``workbench.traces.format.read_trace(t.lines())``
    reads it."""

    header: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)

    def lines(self) -> Iterator[str]:
        """The file's lines (no newlines): the header, then every step."""
        yield json.dumps(self.header, separators=(",", ":"))
        for step in self.steps:
            yield json.dumps(step, separators=(",", ":"))

    def write(self, path: str | Path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for line in self.lines():
                f.write(line + "\n")

    def __repr__(self) -> str:
        h = self.header
        engine = h.get("engine", {})
        return (
            f"<SchedulerTrace {engine.get('name', '?')} {engine.get('version', '?')} {h['profile']} {h['layer']}: "
            f"{len(self.steps)} steps, {h['num_slots']} slots, D={h['draft_tokens']}>"
        )


__all__ = [
    "Acceptance",
    "Arrival",
    "RowAllocator",
    "SchedulerTrace",
    "TraceIds",
    "Workload",
    "WorkloadSettings",
    "step_mode",
]


def trace_header(
    profile: str,
    *,
    version: str,
    commit: str | None,
    max_running: int,
    draft_tokens: int,
    num_slots: int,
    seed: int | None,
    layer: str,
    accepted: str,
    zero_on_alloc: bool = False,
) -> dict[str, Any]:
    """The header line a driver writes (``docs/traces.md``): the profile's default buckets up to
    ``max_running`` (verify buckets too with speculation), D = ``draft_tokens`` (0: none; the header then
    keeps its default 2), the engine's release, ``accepted``'s unit, ``zero_on_alloc`` only when true."""
    prof = get_profile(profile)
    buckets = {"decode": prof.buckets(max_running, draft_tokens > 0)}
    if draft_tokens:
        buckets["target_verify"] = prof.buckets(max_running, True)
    engine: dict[str, Any] = {"name": prof.engine, "version": version}
    if commit:
        engine["commit"] = commit
    header: dict[str, Any] = {
        "format": "linattn-trace",
        "version": 1,
        "profile": profile,
        "layer": layer,
        "num_slots": num_slots,
        "buckets": buckets,
        "draft_tokens": draft_tokens or 2,
        "seed": seed,
        "engine": engine,
        "accepted": accepted,
    }
    if zero_on_alloc:
        header["zero_on_alloc"] = True
    return header
