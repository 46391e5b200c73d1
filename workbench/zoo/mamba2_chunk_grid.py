"""mamba2_chunk_grid: Mamba2's chunk states form one grid over the flattened batch, and a checkpoint index
computed per request reads another request's state for every request but the first (sglang issue 31833)."""

from __future__ import annotations

from typing import Any

from workbench.layer_names import MAMBA2
from workbench.traces.model import Trace
from workbench.traces.replay import TraceDivergence, TraceReplayer
from workbench.traces.script import scripted
from workbench.zoo._prefix import prefix_case

EXPLANATION = (
    "sglang's extra_buffer strategy checkpoints a prefill row at its last chunk boundary. When that boundary "
    "falls inside the row's chunk, the state comes from the prefill kernel's chunk states `h` "
    "(`track_ssm_h_src` names the entry). For GDN's chunked kernel `h` is one grid per sequence: row b's "
    "chunk j is `h[offset_b + j]`, `offset_b` the ceil(len / C) chunks of the rows before it. Mamba2's SSD "
    "scan cuts the flattened batch into chunks instead, so `h[k]` is the state at flattened token k C, of "
    "whichever sequence holds that token; a sequence that starts off the grid has its boundary on no entry "
    "at all. Before the fix sglang used the per-sequence offsets for Mamba2 too, and every request but the "
    "first checkpointed another request's state (104-214% error in the reporter's kernel-only check). Here "
    "three requests prefill in one step (20, 20 and 12 tokens, C = 16): request 0 tracks its first 16 tokens "
    "at h[1]; request 1's 16 tokens end at flattened position 36, off the grid. Unfixed, its index is the "
    "per-sequence one, h[2 + 1] = h[3], which is request 2's state after 8 tokens, and that is published as "
    "request 1's 16-token checkpoint. Fixed, sglang recomputes it (`track_ssm_seq_idx`, `track_ssm_end_locs`, "
    "`track_ssm_recompute_dst`). The replay reads `h` on the layer's own grid, names the entry at its step and "
    "compares the checkpoint with the float64 state of exactly its prefix."
)

LENS = {0: 20, 1: 20, 2: 12}
CHUNK = 16
TRACK = {0: 4, 1: 5}  # track slots (requests 0, 1, 2 run on slots 1, 2, 3)


def plan(fixed: bool) -> list[dict[str, Any]]:
    """One extend step of three requests, requests 0 and 1 tracked at 16 tokens and published there (request
    1's state recomputed when fixed, read from the per-sequence index h[3] when not); a decode of all three."""
    md: dict[str, Any] = {
        "mamba_track_mask": [True, True, False],
        "mamba_track_indices": [TRACK[0], TRACK[1], 6],
        "mamba_track_seqlens": [LENS[0], LENS[1], -1],
        "mamba_chunk_size": CHUNK,
        "track_conv_indices": [[13, 14, 15], [33, 34, 35]],
        "checkpoints": [{"request": r, "tokens": CHUNK, "slot": TRACK[r]} for r in (0, 1)],
    }
    if fixed:  # request 0 on the grid (16 // 16 = h[1]); request 1 off it (20 + 16 = 36): recomputed
        md.update(track_ssm_h_src=[1], track_ssm_h_dst=[TRACK[0]], track_ssm_seq_idx=[1], track_ssm_end_locs=[36],
                  track_ssm_recompute_dst=[TRACK[1]])  # fmt: skip
    else:  # per-sequence offsets: request 1's chunks "start" at h[ceil(20 / 16)] = h[2]
        md.update(track_ssm_h_src=[1, 3], track_ssm_h_dst=[TRACK[0], TRACK[1]])
    return [
        {"mode": "extend", "rows": dict(LENS), "metadata": md},
        {"mode": "decode", "rows": [0, 1, 2], "finish": [0, 1, 2]},
    ]


def scenario_trace(fixed: bool) -> Trace:
    return scripted("sglang", MAMBA2, plan(fixed), num_slots=8, buckets={"decode": [1, 2, 4]}, tokens=True)


def reading(rep: TraceReplayer, d: TraceDivergence) -> tuple[bool, str]:
    """This bug: an extend step's ``track_ssm_h_src`` names an entry of the batch's chunk grid that holds
    another row's state; what the checkpoint published from it is off by."""
    step = rep.trace.steps[d.step]
    if d.kind != "prefix" or d.field != "track" or "track_ssm_h_src" not in d.detail or "is row" not in d.detail:
        return False, ""
    cp = next(
        ((c["request"], c["tokens"]) for c in (step.metadata or {}).get("checkpoints", []) if c["slot"] == d.slot), None
    )
    if cp is None:
        return False, f"slot {d.slot} is published as no checkpoint at step {d.step}"
    request, tokens = cp
    row = next(r for r in step.rows if r.id == request)
    assert row.tokens is not None  # the scenario gives every row its token ids
    _, ssm = rep.book.prefix_state(tuple(row.tokens[:tokens]))
    err = float((rep.runner.state.ssm[d.slot].double() - ssm).abs().max())
    return True, (
        f"{d.detail.split(': ', 1)[1]}; the checkpoint of request {request}'s first {tokens} tokens (slot {d.slot}) "
        f"is off the float64 state of exactly them by {err:.3g} (recurrent state, max abs)"
    )


CASE = prefix_case(
    scenario_trace=scenario_trace,
    reading=reading,
    records="track fields (track_ssm_h_src / _dst and the recompute lists) and checkpoints",
    lives_in="tracking metadata",
    name="mamba2_chunk_grid",
    title="a Mamba2 checkpoint read from the chunk grid with per-request offsets is another request's state",
    issue="sglang issue 31833",
    profile="sglang",
    explanation=EXPLANATION,
    steps="a scripted 2-step trace with token ids, Mamba2 layer (small, seed 0, C = 16), 8 slots, decode buckets "
    "1, 2, 4: three requests prefill 20, 20 and 12 tokens in one step; requests 0 and 1 are tracked at 16 "
    "tokens into slots 4 and 5 and published, request 1 read from h[3] with per-request offsets (unfixed) or "
    "recomputed off the grid (fixed); a decode; each checkpoint recomputed in float64",
)
