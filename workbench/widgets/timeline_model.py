"""The model behind ``ServingTimeline``: simulate a serving trace, replay it step by step, and record who
owns every state slot at every step.

Plain Python (no ipywidgets, no plotly). :meth:`TimelineModel.build` simulates a trace
(:func:`workbench.traces.simulate.simulate`, buckets 1, 2, 4, 8, at most 10 running requests: a few
hundredths of a second a step on the CPU) and replays it with :class:`~workbench.traces.replay.TraceReplayer`,
one step at a time, recording after each:

- ``owners[i][s]``: the request id that held slot ``s`` during step ``i`` (the requests live before it, those it
  admitted, those it finished), or None (free; the dummy slot is never owned);
- ``foreign``: ``(step, slot)`` pairs the replay found written although no row of the step owns them
  (divergences of kind ``"foreign"``);
- ``checkpoints``: ``(step, slot)`` -> the prefix-cache checkpoint the slot holds after that step (request,
  prefix length, verified or off), and ``copies``: the step's slot-to-slot copies (a hit's copy-on-write, an
  insert), when the trace has a prefix cache;
- ``padding[i]``: the bucket the step ran in (from the runner's metadata of that step), its live rows and
  its padded rows, or that it ran eagerly.

Every user-facing failure comes back as one line (``error``) with the control it belongs beside
(``error_control``, one of ``CONTROLS``), never as an exception into the view; a failed build drops every
earlier result (nothing on show outlives the settings it came from). A value of a kind no control holds
(``KINDS``: None, a list, a float or a bool for an int, an int for a checkbox) or a name that is no input
refuses the whole build and takes none of it: the inputs stay as they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.buckets import above_largest
from workbench.errors import WorkbenchError
from workbench.layer_names import DEFAULT_LAYER, LAYER_NAMES
from workbench.limits import check_int
from workbench.profiles import PROFILES
from workbench.traces.model import Trace, TraceStep
from workbench.traces.replay import GRAPH_STEP_MODES, PhaseTimer, TraceReplayer, TraceResult
from workbench.traces.simulate import simulate
from workbench.viz.timeline import Checkpointed, Copy
from workbench.widgets.explorer_model import kind_error, shown

MAX_STEPS = 400
"""Most steps a build replays (each is a real replay on the CPU, with a float64 shadow beside it)."""
BUCKETS = [1, 2, 4, 8]
MAX_RUNNING = 10
LAYERS = LAYER_NAMES  # the keys of workbench.layers.LAYERS
INPUTS = ("profile", "layer", "steps", "seed", "spec", "mixed", "dp_dummies", "prefix_cache")
PREFIX_CACHES = ("none", "no_buffer", "extra_buffer", "align")
"""The prefix-cache choices of a simulated trace (sglang's mamba radix cache strategies; vLLM's align)."""
CONTROLS = (*INPUTS, "step", "general")
# the kind of value each input holds (``build`` takes no other) and what a text input holds, in words
KINDS = {"profile": "text", "layer": "text", "steps": "int", "seed": "int", "spec": "int"}
KINDS |= {"mixed": "bool", "dp_dummies": "bool", "prefix_cache": "text"}
TEXTS = {
    "profile": "a profile's name",
    "layer": f"one of {list(LAYERS)}",
    "prefix_cache": f"one of {list(PREFIX_CACHES)}",
}
ROW_COLUMNS = ("id", "req_pool_index", "slot", "seq_len", "new_tokens", "cached_tokens", "accepted")

__all__ = [
    "BUCKETS",
    "CONTROLS",
    "INPUTS",
    "LAYERS",
    "MAX_STEPS",
    "PREFIX_CACHES",
    "ROW_COLUMNS",
    "Padding",
    "TimelineModel",
]


@dataclass(frozen=True)
class Padding:
    """How one step ran: ``bucket`` (the captured batch size it was padded to; None: eager), ``live_rows``
    (requests in the step), ``padded_rows`` (``bucket - live_rows``; 0 when eager), ``how`` (in words)."""

    mode: str
    bucket: int | None
    live_rows: int
    padded_rows: int
    how: str

    def __str__(self) -> str:
        def rows(n: int, what: str) -> str:
            return f"{n} {what} row{'' if n == 1 else 's'}"

        return f"{self.mode}: {rows(self.live_rows, 'live')}, {rows(self.padded_rows, 'padded')}; {self.how}"


class TimelineModel:
    """Simulate, replay and record a trace's slot ownership (see the module).

    Args: ``profile`` (a name of ``workbench.profiles.PROFILES``), ``layer`` (one of ``LAYERS``), ``steps``
    (1..``MAX_STEPS``), ``seed``, ``spec`` (D of speculative verify steps; 0: plain decode), ``mixed``
    (prefill chunks and decode rows in one step), ``dp_dummies`` (some steps are a DP rank's idle steps),
    ``prefix_cache`` (one of ``PREFIX_CACHES``; "no_buffer", "extra_buffer" (sglang), "align" (vLLM):
    requests share system prompts and a prefix cache keeps checkpoints, each verified against the float64
    state of its prefix).
    """

    def __init__(
        self,
        profile: str = "sglang",
        layer: str = DEFAULT_LAYER,
        steps: int = 60,
        seed: int = 0,
        spec: int = 0,
        mixed: bool = False,
        dp_dummies: bool = False,
        prefix_cache: str = "none",
    ) -> None:
        self.profile, self.layer, self.steps, self.seed = profile, layer, steps, seed
        self.spec, self.mixed, self.dp_dummies = spec, mixed, dp_dummies
        self.prefix_cache = prefix_cache
        self.error: str | None = None
        self.error_control = "general"
        self.selected = 0
        self._clear()

    # -- settings --------------------------------------------------------------------------------------
    def _fail(self, control: str, message: str) -> None:
        self.error, self.error_control = message, control if control in CONTROLS else "general"

    def _clear(self) -> None:
        self.trace: Trace | None = None
        self.result: TraceResult | None = None
        self.slots: list[int] = []
        self.dummy: int | None = None
        self.step_numbers: list[int] = []
        self.owners: list[list[int | None]] = []
        self.foreign: set[tuple[int, int]] = set()
        self.padding: list[Padding] = []
        self.checkpoints: dict[tuple[int, int], Checkpointed] = {}
        self.copies: list[Copy] = []
        self.selected = 0

    def check(self) -> bool:
        """Check the settings without simulating; False with ``error`` beside its control when refused."""
        self.error, self.error_control = None, "general"
        if not isinstance(self.profile, str) or self.profile not in PROFILES:
            self._fail("profile", f"profile: {shown(self.profile)} is not one of {tuple(PROFILES)}")
            return False
        if self.layer not in LAYERS:
            self._fail("layer", f"layer: {shown(self.layer)} is not one of {LAYERS}")
            return False
        for name, lo, hi in (("steps", 1, MAX_STEPS), ("seed", 0, 2**31 - 1), ("spec", 0, 8)):
            value = getattr(self, name)
            try:
                check_int(name, value, lo, hi)
            except WorkbenchError as e:
                why = (
                    f" (each step is a real replay with a float64 shadow; at most {MAX_STEPS})"
                    if name == "steps"
                    else ""
                )
                self._fail(name, f"{e}{why}")
                return False
        for name in ("mixed", "dp_dummies"):
            if not isinstance(getattr(self, name), bool):
                self._fail(name, f"{name} = {shown(getattr(self, name))}: must be True or False")
                return False
        if self.prefix_cache not in PREFIX_CACHES:
            self._fail("prefix_cache", f"prefix_cache = {shown(self.prefix_cache)}: choose one of {PREFIX_CACHES}")
            return False
        return True

    # -- build -----------------------------------------------------------------------------------------
    def build(self, **changes: Any) -> bool:
        """Apply ``changes`` (``INPUTS``), simulate the trace and replay it step by step, recording the slot
        owners, foreign writes and padding of each step. False (``error`` set, every result dropped) when a
        setting is refused or the trace cannot be replayed."""
        unknown = sorted(set(changes) - set(INPUTS))
        self._clear()
        if unknown:
            self._fail("general", f"build: {unknown} are not timeline inputs; inputs are {list(INPUTS)}")
            return False
        for k, v in changes.items():
            why = kind_error(k, KINDS[k], v, TEXTS.get(k, ""))
            if why is not None:
                self._fail(k, f"{why}; not taken, still {shown(getattr(self, k))}")
                return False
        for k, v in changes.items():
            setattr(self, k, v)
        if not self.check():
            return False
        try:
            trace = simulate(
                self.profile,
                self.layer,
                steps=self.steps,
                seed=self.seed,
                spec=self.spec,
                mixed=self.mixed,
                dp_dummies=self.dp_dummies,
                buckets=BUCKETS,
                max_running=MAX_RUNNING,
                prefix_cache=None if self.prefix_cache == "none" else self.prefix_cache,
            )
        except (WorkbenchError, ValueError) as e:
            self._fail(_control_of(str(e)), str(e))
            return False
        return self._replay(trace)

    def show(self, trace: Trace) -> bool:
        """Replay a given trace (a file read with ``read_trace``, a ``scripted`` one, a zoo case's) instead of
        a simulated one, recording the same; False (``error`` set) when it cannot be replayed."""
        self._clear()
        self.error = None
        if not isinstance(trace, Trace):
            self._fail("general", f"trace: expected a workbench.traces.Trace, got {type(trace).__name__}")
            return False
        if len(trace.steps) > MAX_STEPS:
            self._fail("general", f"trace: {len(trace.steps)} steps; the timeline replays at most {MAX_STEPS}")
            return False
        return self._replay(trace)

    def _replay(self, trace: Trace) -> bool:
        try:
            replayer = TraceReplayer(trace, timer=PhaseTimer())
        except (WorkbenchError, ValueError) as e:
            self._fail(_control_of(str(e)), str(e))
            return False
        pool = replayer.pool
        slots = list(range(pool.num_slots))
        owners: list[list[int | None]] = []
        padding: list[Padding] = []
        foreign: set[tuple[int, int]] = set()
        bad: set[tuple[int | None, int]] = set()  # (slot, step that published it off its prefix)
        checkpoints: dict[tuple[int, int], Checkpointed] = {}
        copies: list[Copy] = []
        for step in trace.steps:
            held = {rid: tuple(pool.slots_of(row)) for rid, row in replayer.live.items()}
            graphs_before = replayer.result.graph_steps + replayer.result.idle_steps
            try:
                found = replayer.step(step)
            except (WorkbenchError, ValueError, RuntimeError) as e:
                self._fail("general", f"step {step.step}: the trace cannot be replayed: {e}")
                return False
            for rid, row in replayer.live.items():  # admitted at this step
                held.setdefault(rid, tuple(pool.slots_of(row)))
            for r in step.rows:  # admitted and finished at this step: its pool row is already freed
                held.setdefault(r.id, (r.slot,))
            line: list[int | None] = [None] * len(slots)
            for rid, owned in held.items():
                for s in owned:
                    line[s] = rid
            owners.append(line)
            foreign |= {(step.step, d.slot) for d in found if d.kind == "foreign" and d.slot is not None}
            bad |= {(d.slot, step.step) for d in found if d.kind == "prefix" and d.field == "checkpoint"}
            for slot, cp in replayer.book.live.items():  # bad from the step that published it off its prefix
                checkpoints[(step.step, slot)] = Checkpointed(cp.request, len(cp.tokens), (slot, cp.step) not in bad)
            md = step.metadata or {}
            for key, before in (("copies_before", True), ("copies_after", False)):
                copies += [Copy(step.step, int(p[0]), int(p[1]), before) for p in md.get(key, [])]
            # the runner's metadata of a step it replayed (its graph buffers: overwritten by the next replay)
            replayed = replayer.result.graph_steps + replayer.result.idle_steps > graphs_before
            padding.append(_padding(step, replayer.runner.last_metadata if replayed else None, trace))
        self.trace, self.result = trace, replayer.result
        self.slots, self.dummy = slots, pool.profile.dummy_slot
        self.step_numbers = [s.step for s in trace.steps]
        self.owners, self.foreign, self.padding = owners, foreign, padding
        self.checkpoints, self.copies = checkpoints, copies
        return True

    @property
    def built(self) -> bool:
        return self.trace is not None

    # -- a step ----------------------------------------------------------------------------------------
    def select(self, i: int) -> bool:
        """Select step index ``i`` (0..steps-1); False (``error`` beside ``step``) when out of range."""
        if not self.built:
            self._fail("general", "press Build first: no trace is replayed")
            return False
        try:
            check_int("step", i, 0, len(self.step_numbers) - 1)
        except WorkbenchError as e:
            self._fail("step", str(e))
            return False
        self.error = None
        self.selected = i
        return True

    def _index(self, i: int | None) -> int:
        return self.selected if i is None else i

    def trace_step(self, i: int | None = None) -> TraceStep:
        assert self.trace is not None, "press Build first"
        return self.trace.steps[self._index(i)]

    def step_table(self, i: int | None = None) -> list[dict[str, Any]]:
        """The rows of step ``i`` (default: the selected one), one dict per request (``ROW_COLUMNS``)."""
        if not self.built:
            return []
        return [{c: getattr(r, c) for c in ROW_COLUMNS} for r in self.trace_step(i).rows]

    def step_padding(self, i: int | None = None) -> Padding | None:
        """How step ``i`` (default: the selected one) ran: bucket, live rows, padded rows."""
        return self.padding[self._index(i)] if self.built else None

    def step_text(self, i: int | None = None) -> str:
        """One line about step ``i``: its number, mode, admissions, finishes and padding."""
        if not self.built:
            return ""
        st, pad = self.trace_step(i), self.padding[self._index(i)]
        admit = f", admits {list(st.admit)}" if st.admit else ""
        finish = f", finishes {list(st.finish)}" if st.finish else ""
        return f"step {st.step}{admit}{finish}: {pad}{_prefix_words(st)}"

    def reused_slots(self) -> dict[int, list[int]]:
        """Slot -> the request ids that held it over the trace, in order, for slots held by two or more."""
        out: dict[int, list[int]] = {}
        for line in self.owners:
            for s, rid in enumerate(line):
                if rid is not None and rid not in out.setdefault(s, []):
                    out[s].append(rid)
        return {s: ids for s, ids in out.items() if len(ids) > 1}

    def summary(self) -> str:
        """The replay's verdict (OK, or the first divergence named) and the slot reuse seen."""
        if self.result is None:
            return ""
        reused = self.reused_slots()
        return f"{self.result.summary()}; {len(reused)} of {len(self.slots)} slots reused by later requests"

    def figure_data(self) -> dict[str, Any]:
        """Keywords for :func:`workbench.viz.timeline.slot_timeline`."""
        first = self.result.first if self.result is not None else None
        divergence = (first.step, first.slot, first.kind) if first is not None else None
        return dict(
            owners=self.owners,
            steps=self.step_numbers,
            slots=self.slots,
            dummy=self.dummy if self.dummy is not None else 0,
            foreign=self.foreign,
            selected=self.step_numbers[self.selected] if self.step_numbers else None,
            divergence=divergence,
            checkpoints=self.checkpoints,
            copies=self.copies,
        )


def _prefix_words(step: TraceStep) -> str:
    """The step's prefix-cache work in words (empty without any)."""
    md = step.metadata or {}
    said = [f"evicts slots {md['evict']}"] if md.get("evict") else []
    said += [f"request {h['request']} hits {h['tokens']} tokens in slot {h['slot']}" for h in md.get("hits", [])]
    said += [f"copies {a} -> {b} before" for a, b, *_ in md.get("copies_before", [])]
    said += [f"copies {a} -> {b} after" for a, b, *_ in md.get("copies_after", [])]
    said += [
        f"publishes request {c['request']}'s first {c['tokens']} tokens in slot {c['slot']}"
        for c in md.get("checkpoints", [])
    ]
    return f"; prefix cache: {', '.join(said)}" if said else ""


def _control_of(message: str) -> str:
    """The control a simulator message names first (``"spec = 3: ..."`` -> ``"spec"``), else "general"."""
    head = message.split(":", 1)[0].split("=", 1)[0].strip()
    return head if head in INPUTS else "general"


def _padding(step: TraceStep, meta: Any, trace: Trace) -> Padding:
    live = len(step.rows)
    bucket = getattr(meta, "bucket", None) if meta is not None else None
    if bucket is not None:
        return Padding(step.mode, bucket, live, bucket - live, f"replayed in the graph of bucket {bucket}")
    graph_mode = "decode" if step.mode == "idle" else step.mode
    buckets = trace.header.buckets.get(graph_mode)
    if step.mode in GRAPH_STEP_MODES and buckets and live > buckets[-1]:
        how = f"eager: {above_largest(live, buckets)}"
    elif step.mode in ("extend", "mixed"):
        how = "eager: extend and mixed steps are not captured"
    else:
        how = "eager"
    return Padding(step.mode, None, live, 0, how)
