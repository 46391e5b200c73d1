"""stale_track_mask: a verify step reuses the track indices of the extend before it, and its tracking copy
overwrites the checkpoint that extend published (sglang PR 19415)."""

from __future__ import annotations

from typing import Any

from workbench.layer_names import GDN
from workbench.traces.model import Trace
from workbench.traces.replay import TraceDivergence, TraceReplayer
from workbench.traces.script import scripted
from workbench.zoo._prefix import prefix_case

EXPLANATION = (
    "sglang tracks prefix states through per-step metadata: `mamba_track_mask` (which rows checkpoint), "
    "`mamba_track_indices` (into which slot) and `mamba_track_seqlens`. An extend step sets them for the rows "
    "that reach a tracked length; a target-verify step must rebuild them from its own requests, since it "
    "tracks only where the accepted tokens cross a track interval. Before PR 19415 the verify step found the "
    "extend-time mask still set and tracked with it: in the engine the prefill-sized indices addressed the "
    "verify buffers out of range (an illegal memory access); where they stay in range, the verify's state is "
    "copied into the slot the extend had committed. Here request 0 prefills 8 tokens, tracked into slot 5 and "
    "published as their checkpoint, with the extend's track fields recorded (mask [True], indices [5], "
    "seqlens [8]); the next step verifies 2 draft tokens and, unfixed, still carries those fields and repeats "
    "the copy. The replay checks the track fields against the step: a tracked row must hold exactly the "
    "tracked length, and after the verify the state holds 10 tokens, not 8 (the copy would also overwrite "
    "the live checkpoint). The fix rebuilds the track metadata for verify from the requests and clears the "
    "extend's mask."
)

PROMPT = [90, 14, 14, 2, 6, 33, 71, 5]
TRACK = 5


def _fields(mask: bool, length: int) -> dict[str, list[Any]]:
    """sglang's track fields of a one-row step."""
    return {"mamba_track_mask": [mask], "mamba_track_indices": [TRACK], "mamba_track_seqlens": [length]}


def plan(fixed: bool) -> list[dict[str, Any]]:
    """Request 0's prompt tracked into slot 5 (its track fields recorded); a verify that keeps the extend's
    track fields and repeats its copy (unfixed) or rebuilds them (fixed: nothing to track); a decode."""
    track = {
        "copies_after": [[1, TRACK]],
        "checkpoints": [{"request": 0, "tokens": len(PROMPT), "slot": TRACK}],
        **_fields(True, len(PROMPT)),
    }
    verify: dict[str, Any] = {"mode": "target_verify", "rows": {0: 2}}
    if fixed:
        verify["metadata"] = _fields(False, -1)
    else:  # the extend's mask, indices and lengths, still set: the tracking copy runs again
        verify["metadata"] = {"copies_after": [[1, TRACK]], **_fields(True, len(PROMPT))}
    return [
        {"mode": "extend", "rows": {0: len(PROMPT)}, "tokens": {0: PROMPT}, "metadata": track},
        verify,
        {"mode": "decode", "rows": [0], "finish": [0]},
    ]


def scenario_trace(fixed: bool) -> Trace:
    return scripted(
        "sglang", GDN, plan(fixed), num_slots=6, buckets={"decode": [1, 2, 4], "target_verify": [1, 2, 4]},
        draft_tokens=2, tokens=True,
    )  # fmt: skip


def reading(rep: TraceReplayer, d: TraceDivergence) -> tuple[bool, str]:
    """This bug: a verify step's track fields are the extend's before it (their length is not the verify's)."""
    step = rep.trace.steps[d.step]
    if d.kind != "prefix" or d.field != "track" or step.mode != "target_verify":
        return False, ""
    md = step.metadata or {}
    earlier = [
        s.step
        for s in rep.trace.steps[: d.step]
        if (s.metadata or {}).get("mamba_track_seqlens") == md.get("mamba_track_seqlens") and s.mode == "extend"
    ]
    if not earlier:
        return False, "no earlier extend step has these track fields"
    return True, f"verify step {d.step} carries the track fields of extend step {earlier[-1]}"


CASE = prefix_case(
    scenario_trace=scenario_trace,
    reading=reading,
    name="stale_track_mask",
    title="a verify step tracks with the extend's stale mask and overwrites its checkpoint",
    issue="sglang PR 19415",
    profile="sglang",
    explanation=EXPLANATION,
    steps="a scripted 3-step trace with token ids, GDN layer (small, seed 0), 6 slots, decode and verify "
    "buckets 1, 2, 4, D=2: request 0 prefills 8 tokens, tracked into slot 5 and published, with sglang's track "
    "fields; a verify of 2 tokens keeps the extend's fields and copy (unfixed); a decode; the fields checked "
    "against each step",
)
