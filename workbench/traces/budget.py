"""One memory budget for a whole replay, checked before its first allocation.

A replay holds the layer's state pool, its float64 shadow, a copy of both per step, one recorded graph per
captured bucket (the CPU recorder keeps every tensor of its ops), the metadata buffers of every bucket and the
verify buffers, and each step allocates its own tokens' activations on top. Checking each allocation alone
against what is free at that moment lets their sum run past the machine (a 3-line trace with a bucket of 10M
was killed by the kernel's OOM killer). :func:`replay_budget` adds them up from the header and the steps,
names the field that weighs most, and :meth:`ReplayBudget.check` refuses the trace on one line when the sum
does not fit what the device has free.

The bytes per token and per slot are measured, not derived: on the replay's small layers (hidden size 32) a
captured bucket keeps 5.4-7.0 KB per token at peak, an eager extend step peaks at 3.8 (Mamba2) to 8.5 KB (GDN)
per token, its float64 reference included, and a slot costs 5.3 float32 slots. :data:`TOKEN_BYTES_PER_HIDDEN`
and :data:`POOL_COPIES` cover the largest with a margin.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

from workbench.limits import check_memory, gib
from workbench.metadata.record import tokens_per_row
from workbench.traces.model import Trace
from workbench.traces.steps import slots_per_request

TOKEN_BYTES_PER_HIDDEN = 96 * 4
"""Bytes a token of a captured graph or an eager step may hold per unit of the layer's hidden size (float32
activations and their float64 reference; 12 KB per token at hidden size 32, against 8.5 KB measured)."""

POOL_COPIES = 8
"""Float32 pools' worth of bytes the replay holds per state slot: the pool, its float64 shadow (2), the step's
copy and the integrity check's temporaries; 5.3 measured at 600,000 slots (5.75 GB peak), with a margin."""


@dataclass(frozen=True)
class ReplayBudget:
    """What a replay will hold at most, by part (bytes), and the input field each part grows with."""

    parts: dict[str, int]
    fields: dict[str, str]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def heaviest(self) -> str:
        """The part that weighs most."""
        return max(self.parts, key=lambda k: self.parts[k])

    def describe(self) -> str:
        """``3.1 GiB: captured graphs 2.9 GiB, state pool and shadow 150 MiB, ...`` (heaviest first)."""
        parts = sorted(self.parts.items(), key=lambda kv: -kv[1])
        return f"{gib(self.total)}: " + ", ".join(f"{k} {gib(v)}" for k, v in parts if v)

    def check(self, device: object = "cpu") -> None:
        """Refuse (``MetadataError`` naming the heaviest part's field) a replay that does not fit the device."""
        what = "a replay of this trace (" + self.describe() + ")"
        check_memory(self.fields[self.heaviest], self.total, what, device)

    def to_dict(self) -> dict[str, Any]:
        return {"total_bytes": self.total, "parts_bytes": dict(self.parts)}


def slot_bytes(layer: Any) -> int:
    """Float32 bytes of one state slot of ``layer`` (conv window and recurrent state)."""
    return 4 * sum(prod(shape[1:]) for shape in layer._state_shapes(1))


def replay_budget(trace: Trace, layer: Any) -> ReplayBudget:
    """The most a replay of ``trace`` on ``layer`` holds at once (see the module)."""
    h = trace.header
    per_slot = slot_bytes(layer)
    per_token = TOKEN_BYTES_PER_HIDDEN * layer.config.hidden_size
    d = h.draft_tokens
    spec = "target_verify" in h.buckets
    per_request = slots_per_request(h)  # the pool's: D a request where the profile keeps one per draft
    # the runner's float32 pool, the float64 shadow (2x), the step's copy of the pool, the integrity check's
    # whole-pool temporaries (measured: 600,000 slots peaked at 5.3x the float32 pool), and the shadow's copy
    # (2x) where a chunk track needs the states before the step
    copies = POOL_COPIES + (2 if any("mamba_chunk_size" in (s.metadata or {}) for s in trace.steps) else 0)
    captured = sum(bs * tokens_per_row(mode, d) for mode, sizes in h.buckets.items() for bs in sizes)
    rows = sum(sum(sizes) for sizes in h.buckets.values())
    largest_verify = max(h.buckets.get("target_verify", [0]))
    step_tokens = max((sum(r.new_tokens for r in s.rows) for s in trace.steps), default=0)
    # verify rows of a verify step or of a mixed step that holds them (each verify row keeps D states)
    verify_rows = max((s.kinds.count("verify") for s in trace.steps), default=0)
    # draft trees (topk > 1): three int32 [bs, D] link buffers in each target_verify bucket
    tree_links = 3 * 4 * d * sum(h.buckets.get("target_verify", [])) if h.topk > 1 else 0
    parts = {
        "state pool, shadow and copies": copies * h.num_slots * per_slot,
        "captured graphs": captured * per_token,
        "metadata buffers": rows * (4 * per_request + 25) + tree_links,
        # the runner's intermediate states, and each verify step's own in float32 and float64
        "verify buffers": (largest_verify + 3 * verify_rows) * d * per_slot if spec else 0,
        "the largest step's tokens": step_tokens * per_token,
    }
    largest = {mode: sizes[-1] for mode, sizes in h.buckets.items()}
    fields = {
        "state pool, shadow and copies": f"num_slots={h.num_slots}",
        "captured graphs": (
            f"draft_tokens={d} with buckets.target_verify up to {largest['target_verify']}"
            if spec and largest["target_verify"] * d >= largest.get("decode", 0)
            else f"buckets.decode up to {largest.get('decode', 0)}"
        ),
        "metadata buffers": "buckets up to " + str(max(largest.values(), default=0)),
        "verify buffers": f"draft_tokens={d}",
        "the largest step's tokens": f"a step of {step_tokens:,} tokens",
    }
    return ReplayBudget(parts, fields)
