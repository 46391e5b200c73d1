"""chunk_initial_state: a later prefill chunk that runs alone in its step loses its initial state, and the
request continues from zeros instead of from its first chunk (vLLM PR 22034)."""

from __future__ import annotations

from workbench.backends import MetadataBackend
from workbench.batch import Batch
from workbench.layer_names import MAMBA2
from workbench.metadata import Metadata
from workbench.traces.model import Trace
from workbench.traces.replay import TraceDivergence, TraceReplayer
from workbench.traces.script import scripted
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence, TraceEvidence

EXPLANATION = (
    "With chunked prefill a long prompt is fed over several steps, and every chunk after the first must "
    "start from the state the chunks before it left: `has_initial_state` is true for a row with computed "
    "tokens. vLLM's Mamba2 chunk scan took a shortcut: when the initial-state tensor had one row, it was "
    "thought pointless and dropped, so a prefill batch holding one request lost its initial state. A "
    "request whose later chunk happens to be alone in its step continues from zeros: the chunks "
    "before it are forgotten, with no error and an output that is merely worse; the same prompt beside "
    "another request's chunk is right, so the bug comes and goes with the load. Here the same condition "
    "sits in a backend's metadata, run on the Mamba2 layer (its prefill is the chunk scan, "
    "`kernels.mamba2.chunk_scan`): request 0's 20-token prompt is fed in chunks of 8, 8 and 4, the second "
    "alone, the third beside "
    "request 1's first chunk. The replay's float64 shadow, which carries every request's state over all of "
    "its tokens, names the step and the chunk. PR 22034 removed the condition; related chunk-boundary bugs "
    "are vLLM PR 23279 (the decay of the initial state counted from the Mamba chunk, not the sequence) and "
    "vllm-ascend PR 11508 (the initial state counted twice on later chunks)."
)

PLAN = (
    {"mode": "extend", "rows": {0: 8}},
    {"mode": "extend", "rows": {0: 8}},
    {"mode": "extend", "rows": {0: 4, 1: 6}},
    {"mode": "decode", "rows": [0, 1]},
    {"mode": "decode", "rows": [0, 1], "finish": [0, 1]},
)


def scenario_trace(profile: str) -> Trace:
    """Request 0's 20 prompt tokens in chunks of 8 (alone), 8 (alone) and 4 (beside request 1's 6), then
    two decode steps of both (Mamba2, 4 slots, decode buckets 1, 2, 4)."""
    return scripted(profile, MAMBA2, PLAN, num_slots=4, buckets={"decode": [1, 2, 4]})


class DropsLoneInitialState(MetadataBackend):
    """A prefill step of one request reads no initial state (the shortcut PR 22034 removed)."""

    drops_lone_initial_state = True

    def init_forward_metadata(self, batch: Batch) -> Metadata:
        meta = super().init_forward_metadata(batch)
        lone = meta.forward_mode == "extend" and meta.raw_batch_size == 1
        if self.drops_lone_initial_state and lone and meta.has_initial_state is not None:
            meta.has_initial_state.fill_(False)
        return meta


class KeepsInitialState(DropsLoneInitialState):
    """The fix: every row with computed tokens reads its state, whatever the batch size."""

    drops_lone_initial_state = False


def variant(fixed: bool) -> type[MetadataBackend]:
    """The case's own backend: a lone prefill chunk's initial state dropped (unfixed) or kept (fixed)."""
    return KeepsInitialState if fixed else DropsLoneInitialState


def reading(rep: TraceReplayer, d: TraceDivergence) -> tuple[bool, str]:
    """This bug: a request's state or output is off at a prefill chunk that continues its prompt (tokens
    already in its state)."""
    step = rep.trace.steps[d.step]
    row = next((r for r in step.rows if r.id == d.request), None)
    if d.kind not in ("state", "output") or row is None or step.mode not in ("extend", "mixed"):
        return False, ""
    if row.cached_tokens == 0:
        return False, f"request {d.request}'s first chunk (no initial state to lose)"
    chunk = sum(1 for s in rep.trace.steps[: d.step + 1] for r in s.rows if r.id == d.request)
    company = "alone in its step" if len(step.rows) == 1 else f"beside {len(step.rows) - 1} other row(s)"
    return True, (
        f"chunk {chunk} of request {d.request} (tokens {row.cached_tokens}..{row.seq_len}, "
        f"{row.cached_tokens} already in its state) ran {company}"
    )


def scenario(cls: type[MetadataBackend], profile: str, backend: str) -> list[Evidence]:
    """Replay :func:`scenario_trace` with ``cls``. Evidence of the bug: a request's state or output off its
    float64 recurrence at a later chunk."""
    return [h.replay_trace(scenario_trace(profile), cls, backend, what="trace replay", reading=reading)]


CASE = ZooCase(
    name="chunk_initial_state",
    title="a later prefill chunk alone in its step loses its initial state",
    issue="vLLM PR 22034",
    profile="vllm",
    explanation=EXPLANATION,
    subject="metadata_backend",
    scenario=scenario,
    variant=variant,
    mechanism=(TraceEvidence,),
    steps="a scripted 5-step trace on a pool of 4 slots, Mamba2 layer (small, seed 0), decode buckets 1, 2, 4: "
    "request 0's 20-token prompt in chunks of 8 (alone), 8 (alone) and 4 (beside request 1's 6-token first "
    "chunk), then two decode steps of both; every step checked against the float64 shadow of every request",
)
