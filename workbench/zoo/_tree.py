"""What the zoo's draft-tree trace cases share: a hand-written sglang trace with ``topk = 2``, D = 4, and
its rows (request 0 on request-pool row 1 and slot 1, request 1 on row 2 and slot 2)."""

from __future__ import annotations

from typing import Any

from workbench.layer_names import GDN
from workbench.traces.model import Trace, TraceHeader, TraceRow, TraceStep

D = 4
TOPK = 2
PROMPTS = ((11, 42, 7, 300, 5, 19), (90, 14, 14, 2, 6, 33))
"""The two requests' prompts (6 token ids each)."""
DRAFTS = ((3, 8, 9, 21), (4, 4, 8, 15))
"""The ids each request's verify feeds: its last sampled token (the root), then 3 draft nodes."""


def header(num_slots: int = 6) -> TraceHeader:
    """sglang, GDN, decode and verify buckets 1, 2, D = 4, draft trees of topk 2."""
    buckets = {"decode": [1, 2], "target_verify": [1, 2]}
    return TraceHeader("sglang", GDN, num_slots, buckets, draft_tokens=D, topk=TOPK)


def prefill() -> TraceStep:
    """Step 0: both requests admitted, each prefilling its prompt in one chunk."""
    rows = tuple(TraceRow(i, i + 1, i + 1, 6, 6, 0, tokens=PROMPTS[i]) for i in range(2))
    return TraceStep(0, "extend", rows, admit=(0, 1))


def verify(
    trees: tuple[tuple[int, ...], ...], paths: tuple[tuple[int, ...], ...], metadata: dict[str, Any]
) -> TraceStep:
    """Step 1: both requests verify their draft tree (parents) and keep ``paths`` (root-first nodes); the
    step records sglang's ``accept_index`` (``b * D + node``, -1 after each path) beside ``metadata``."""
    rows = tuple(
        TraceRow(i, i + 1, i + 1, 6 + D, D, 6, accepted=len(paths[i]), tokens=DRAFTS[i], tree=trees[i])
        for i in range(2)
    )
    width = max(len(p) for p in paths)
    accept_index = [[b * D + n for n in p] + [-1] * (width - len(p)) for b, p in enumerate(paths)]
    return TraceStep(1, "target_verify", rows, metadata={"accept_index": accept_index, **metadata})


def decode(kept: tuple[int, ...], metadata: dict[str, Any] | None = None) -> TraceStep:
    """Step 2: both requests decode once (their states hold 6 + kept tokens before it) and finish."""
    rows = tuple(TraceRow(i, i + 1, i + 1, 7 + kept[i], 1, 6 + kept[i], tokens=(5,)) for i in range(2))
    return TraceStep(2, "decode", rows, finish=(0, 1), metadata=metadata)


def trace(steps: list[TraceStep], num_slots: int = 6) -> Trace:
    return Trace(header(num_slots), steps)
