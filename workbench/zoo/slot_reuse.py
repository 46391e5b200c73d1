"""slot_reuse: a freed state slot is handed to the next request without being zeroed, and read before the
new tenant writes it, so the request starts from its previous tenant's state (vLLM PR 56524)."""

from __future__ import annotations

from workbench.backends import MetadataBackend
from workbench.batch import Batch
from workbench.layer_names import GDN
from workbench.metadata import Metadata
from workbench.traces.model import Trace
from workbench.traces.replay import TraceDivergence, TraceReplayer
from workbench.traces.script import scripted
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence, TraceEvidence

EXPLANATION = (
    "vLLM allocates its cache zeroed once, at start-up, and then hands state blocks from request to request "
    "through its block pool. It zeroes newly allocated blocks only for attention layers "
    "(`_record_new_block_ids` in `single_type_kv_cache_manager.py` is set for `AttentionSpec` alone in 0.33.0), "
    "although its own `needs_kv_cache_zeroing` says Mamba state 'is read before it is fully written'. Any "
    "read of a slot before its new tenant first writes it then returns the bytes of the request that held "
    "it before. Here that read is a backend that hands every prefill chunk its slot as initial state; over "
    "a trace in which request 0 prefills, decodes and finishes, and request 1 is admitted to the slot it "
    "freed, request 1's first chunk starts from request 0's final state: harmless on a fresh pool, wrong "
    "from the first reuse, and found only by evals. The replay's float64 shadow, which starts every new "
    "request from zeros, names the step, the request, the slot and its previous tenant. The fix (PR 56524) "
    "zeroes a state block whenever it is (re)allocated, so whatever reads it early reads zeros, which is "
    "what a fresh recurrence starts from."
)

PLAN = (
    {"mode": "extend", "rows": {0: 6}},
    {"mode": "decode", "rows": [0]},
    {"mode": "decode", "rows": [0], "finish": [0]},
    {"mode": "extend", "rows": {1: 5}},
    {"mode": "decode", "rows": [1]},
    {"mode": "decode", "rows": [1], "finish": [1]},
)


def scenario_trace(profile: str) -> Trace:
    """Request 0 prefills 6 tokens, decodes twice and finishes; request 1 is admitted to its freed slot,
    prefills 5 tokens and decodes twice (Gated DeltaNet, 4 slots, decode buckets 1, 2, 4)."""
    return scripted(profile, GDN, PLAN, num_slots=4, buckets={"decode": [1, 2, 4]})


class ReadsSlotFirst(MetadataBackend):
    """Hands every prefill chunk its slot as initial state (``has_initial_state`` True), so the kernels read
    the slot before the tenant's first write: what the slot holds decides the first chunk."""

    zeroes_slots_on_alloc = False

    def init_forward_metadata(self, batch: Batch) -> Metadata:
        meta = super().init_forward_metadata(batch)
        if meta.has_initial_state is not None:
            meta.has_initial_state.fill_(True)
        return meta


class ZeroedOnAlloc(ReadsSlotFirst):
    """The same early read, with the allocator of PR 56524, which zeroes a slot when a request gets it."""

    zeroes_slots_on_alloc = True


def variant(fixed: bool) -> type[MetadataBackend]:
    """The case's own backend: the early read with slots reused unzeroed (unfixed) or zeroed (fixed)."""
    return ZeroedOnAlloc if fixed else ReadsSlotFirst


def reading(rep: TraceReplayer, d: TraceDivergence) -> tuple[bool, str]:
    """This bug: a request's state or output is off at the step that admitted it, on a slot another
    request held before."""
    if d.slot is None or d.request is None or d.kind not in ("state", "output"):
        return False, ""
    before = rep.previous_tenant(d.slot, d.request)
    admitted_here = d.request in rep.trace.steps[d.step].admit
    if before is None:
        return False, f"slot {d.slot} had no earlier tenant"
    said = f"slot {d.slot} last held request {before}"
    if not admitted_here:
        return False, f"{said}; request {d.request} was admitted before step {d.step}"
    return True, f"{said}, whose final state request {d.request} started from"


def scenario(cls: type[MetadataBackend], profile: str, backend: str) -> list[Evidence]:
    """Replay :func:`scenario_trace` with ``cls``, on a pool zeroed at start-up whose slots are zeroed on
    reallocation only when ``cls.zeroes_slots_on_alloc`` says so (a user's backend runs with vLLM 0.33.0's
    allocator, which does not). Evidence of the bug: a new tenant's state off its float64 recurrence."""
    zero = bool(getattr(cls, "zeroes_slots_on_alloc", False))
    return [
        h.replay_trace(
            scenario_trace(profile), cls, backend, what="trace replay", reading=reading, zero_on_alloc=zero,
            boot_zeroed=True,
        )
    ]  # fmt: skip


CASE = ZooCase(
    name="slot_reuse",
    title="a reused slot is not zeroed: the new request starts from its previous tenant's state",
    issue="vLLM PR 56524",
    profile="vllm",
    explanation=EXPLANATION,
    subject="metadata_backend",
    scenario=scenario,
    variant=variant,
    mechanism=(TraceEvidence,),
    steps="a scripted 6-step trace on a pool of 4 slots (zeroed at start-up), GDN layer (small, seed 0), decode "
    "buckets 1, 2, 4: request 0 prefills 6 tokens, decodes twice and finishes; request 1 gets its slot, "
    "prefills 5 tokens and decodes twice; every step checked against the float64 shadow of every request",
)
