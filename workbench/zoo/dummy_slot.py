"""dummy_slot: the allocator can hand out slot 0 while capture and warm-up write dummy state there, so
capturing corrupts a live request (sglang PR 17404)."""

from __future__ import annotations

from typing import Any

from workbench.batch import Batch
from workbench.pool import LowestFirst, StatePool
from workbench.profiles import Profile
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence

EXPLANATION = (
    "A graph is captured on made-up inputs: every row of the capture batch is request row 0, which maps to "
    "slot 0, and warm-up really runs the kernels, so slot 0 is read and written with dummy data at every "
    "capture (and, on Ascend, by every padded row afterwards). sglang's mamba pool still listed slot 0 among "
    "its free slots, so a request could own it; its state then held whatever capture left there (the PR saw "
    "garbage reach the prefix cache, hidden until then by the server's warm-up prompt). Here a pool whose "
    "allocator does not skip slot 0 hands it to the first request; capturing the graphs rewrites that slot, "
    "and the request's next step starts from the dummy state: its slot and its output leave the float64 "
    "reference computed from the state it had. The fix keeps slot 0 out of the free list: it is a dummy "
    "target, never a request's."
)


class AllocatesDummySlot(StatePool):
    """A pool whose allocator also hands out the dummy slot (sglang's mamba pool before PR 17404)."""

    def __init__(self, num_slots: int, profile: str | Profile = "sglang", **kwargs: Any) -> None:
        super().__init__(num_slots, profile, **kwargs)
        self._free_slots = LowestFirst(self.num_slots, reserved=-1)  # nothing reserved: slot 0 too


def _run(fixed: bool, backend: str) -> list[Evidence]:
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, "sglang", device=device) if fixed else AllocatesDummySlot(16, "sglang", device=device)
    rows = pool.alloc(3)  # live before capture: the capture must not touch their slots
    runner = h.make_runner(h.gdn_layer(device, pool.profile), pool, name)
    before = runner.state.clone()
    runner.capture(progress=False)
    batch = Batch.decode(rows, [9, 10, 11], device=device)
    dummy = pool.profile.dummy_slot
    free_dummy = [dummy] if h.owners(pool, [dummy])[dummy] is None else []
    step = h.replay_and_check(
        runner,
        batch,
        h.inputs_for(runner, batch, 0),
        what="capture + first decode",
        before=before,
        may_write=free_dummy,
    )
    return [step]


CASE = ZooCase(
    name="dummy_slot",
    title="slot 0 is allocatable while capture writes dummy state there",
    issue="sglang PR 17404",
    profile="sglang",
    explanation=EXPLANATION,
    run_fn=_run,
    why_not="the case exercises the state pool's allocator (whether it hands out slot 0), not a metadata "
    "backend or a kernel",
)
