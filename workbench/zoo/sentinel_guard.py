"""sentinel_guard: padded rows carry 0 while the kernels skip only negative indices, so padded rows read
and write slot 0 (vLLM PR 39064)."""

from __future__ import annotations

from dataclasses import replace

from kernels.conventions import CONVENTIONS
from workbench.batch import Batch
from workbench.pool import StatePool
from workbench.profiles import PROFILES
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.dummy_slot import AllocatesDummySlot
from workbench.zoo.result import Evidence

EXPLANATION = (
    "vLLM switched the padding sentinel of its linear-attention metadata from -1 to 0, its null block, and "
    "the kernels had to switch their guard from `idx < 0` to `idx <= 0` with it. Kernels that still skipped "
    "only negative indices treated every padded row as a request on slot 0: they read it and wrote it at "
    "every padded step under graphs (the PR saw slot 0 of the SSM state corrupted). In vLLM slot 0 is the "
    "null block; to make the write land somewhere visible, the unfixed variant here also lets a request "
    "own slot 0, as it would own any slot the sentinel happened to name. A step of three requests padded to "
    "four (its input row still holding the previous step's token) then rewrites the state of the request "
    "on slot 0, which is alive but sits this step out. The fix "
    "keeps sentinel and guard in agreement: guard `<= 0` with slot 0 never allocated (vLLM's), or pad with "
    "-1."
)

# vLLM's conventions with the kernels' old guard: pad 0, skip only idx < 0
VLLM_OLD_GUARD = replace(
    PROFILES["vllm"],
    name="vllm-old-guard",
    convention=replace(CONVENTIONS["vllm"], name="vllm-old-guard", pad_slot_id=-1),
)


def _run(fixed: bool, backend: str) -> list[Evidence]:
    name, device = h.resolve_backend(backend)
    # unfixed: the old guard, and a request on slot 0 so the write lands somewhere visible
    pool = StatePool(16, "vllm", device=device) if fixed else AllocatesDummySlot(16, VLLM_OLD_GUARD, device=device)
    runner = h.make_runner(h.gdn_layer(device, pool.profile), pool, name)
    runner.capture(progress=False)  # at start, before any request: capture's own writes harm nobody
    rows = pool.alloc(4)
    first = Batch.decode(rows, [5, 6, 7, 8], device=device)
    runner.replay(first, h.inputs_for(runner, first, 0))
    batch = Batch.decode(rows[1:], [7, 8, 9], device=device)  # the request on the lowest slot sits out
    step = h.replay_and_check(runner, batch, h.inputs_for(runner, batch, 1), what="decode replay")
    return [step]


CASE = ZooCase(
    name="sentinel_guard",
    title="padding with 0 while kernels skip only negative indices: padded rows hit slot 0",
    issue="vLLM PR 39064",
    profile="vllm",
    explanation=EXPLANATION,
    run_fn=_run,
    why_not="the case switches the guard of the workbench's own kernels through a profile; a kernel's own "
    "guard is what `workbench check-kernel MODULE_OR_FILE:FUNCTION --op OP --convention vllm` checks (padded "
    "rows on slot 0, a guard band around the pool)",
)
