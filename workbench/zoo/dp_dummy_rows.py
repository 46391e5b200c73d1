"""dp_dummy_rows: a graph's padded rows, and a data-parallel rank's dummy run, read the persistent batch's
rows past the live batch, which still name earlier steps' slots, and write state through them (vLLM PRs
37728, 49757)."""

from __future__ import annotations

import torch

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
    "vLLM keeps a persistent batch: one block table with a row per request slot of the batch, rewritten for "
    "the requests of each step, and the graph of a padded bucket reads the rows past the live ones. When a "
    "request finishes, `condense()` moves the last rows into the hole and leaves the tail rows as they were "
    "(PR 49757), and a data-parallel rank with nothing to run replays a dummy batch over those rows too "
    "(PR 37728, `dummy_run`'s seq_lens [1, 0, 0, ...]; vllm-ascend PR 10901 on NPU). Unless the padded rows "
    "are set to the null block, they name whatever slot their row held at an earlier step: a finished "
    "request's freed slot, or the slot of a live request that sits this step out, and the kernels update "
    "that state with a dummy token. Two scripted traces show it: four requests decode, one finishes, and the "
    "next step of three pads to four through the finished request's row; and three requests decode, then "
    "this rank runs a dummy step while they hold their slots. The replay names the step, the slot and whose "
    "it is. The fixes write the null block (the profile's padding sentinel) into every padded row each step."
)

CONDENSED = (
    {"mode": "extend", "rows": {0: 4, 1: 4, 2: 4, 3: 4}},
    {"mode": "decode", "rows": [0, 1, 2, 3], "finish": [3]},
    {"mode": "decode", "rows": [0, 1, 2]},
    {"mode": "decode", "rows": [0, 1, 2], "finish": [0, 1, 2]},
)
DUMMY_RUN = (
    {"mode": "extend", "rows": {0: 4, 1: 4, 2: 4}},
    {"mode": "decode", "rows": [0, 1, 2]},
    {"mode": "idle"},
    {"mode": "decode", "rows": [0, 1, 2], "finish": [0, 1, 2]},
)


def scenario_traces(profile: str) -> dict[str, Trace]:
    """The two traces (Gated DeltaNet, 6 slots, decode buckets 1, 2, 4): a batch condensed after a finish,
    and a dummy run while requests hold their slots."""
    return {
        name: scripted(profile, GDN, plan, num_slots=6, buckets={"decode": [1, 2, 4]})
        for name, plan in (("condensed batch", CONDENSED), ("DP dummy run", DUMMY_RUN))
    }


class PersistentBatchRows(MetadataBackend):
    """A persistent batch's rows: each graph step rewrites the rows of its live requests only, and the
    padded rows take what the rows past them still hold from earlier steps."""

    null_padded_rows = False

    def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
        meta = super().init_forward_metadata_out_graph(batch, in_capture=in_capture)
        if in_capture or self.null_padded_rows:
            return meta
        r, bs = batch.raw_batch_size, meta.batch_size
        idx = meta.state_indices
        rows = self.__dict__.get("_rows")
        if rows is None or rows.shape[1:] != idx.shape[1:]:
            largest = max(max(b.buckets) for b in self.buffers.values())
            rows = torch.full((largest, *idx.shape[1:]), self.pool.profile.sentinel, dtype=idx.dtype, device=idx.device)
            self.__dict__["_rows"] = rows
        rows[:r].copy_(idx[:r])
        idx[r:bs].copy_(rows[r:bs])  # the bug: rows past the live batch are never reset
        return meta


class NullPaddedRows(PersistentBatchRows):
    """The fix: every padded row is the null block (the profile's sentinel) at every step."""

    null_padded_rows = True


def variant(fixed: bool) -> type[MetadataBackend]:
    """The case's own backend: padded rows read stale persistent-batch rows (unfixed) or the null block."""
    return NullPaddedRows if fixed else PersistentBatchRows


def reading(rep: TraceReplayer, d: TraceDivergence) -> tuple[bool, str]:
    """This bug: a slot no row of the step owns changed, and a padded row of the step's graph named it."""
    meta = rep.runner.last_metadata
    if d.kind != "foreign" or d.slot is None or meta is None:
        return False, ""
    r, idx = meta.raw_batch_size, meta.state_indices.reshape(meta.batch_size, -1)
    named = [k for k in range(r, meta.batch_size) if d.slot in idx[k].tolist()]
    if not named:
        return False, "no padded row named it"
    facts = f"padded row(s) {named} of the bucket-{meta.batch_size} graph ({r} live) named it"
    held = rep.tenants.get(d.slot, [])
    if rep.owner(d.slot) is None and held:
        facts += f"; request {held[-1]} had freed it"
    return True, facts


def scenario(cls: type[MetadataBackend], profile: str, backend: str) -> list[Evidence]:
    """Replay both traces with ``cls``. Evidence of the bug: a slot no row of the step owns changed."""
    return [
        h.replay_trace(trace, cls, backend, what=name, reading=reading)
        for name, trace in scenario_traces(profile).items()
    ]


CASE = ZooCase(
    name="dp_dummy_rows",
    title="padded rows and DP dummy runs write state through stale persistent-batch rows",
    issue="vLLM PRs 37728, 49757",
    profile="vllm",
    explanation=EXPLANATION,
    subject="metadata_backend",
    scenario=scenario,
    variant=variant,
    mechanism=(TraceEvidence,),
    steps="two scripted 4-step traces on a pool of 6 slots, GDN layer (small, seed 0), decode buckets 1, 2, 4: "
    "four requests prefill and decode, one finishes, three decode padded to 4; three requests prefill and "
    "decode, then a DP dummy (idle) step replays the decode graph with no live row; every step checked "
    "against the float64 shadow, every slot no row of the step owns bitwise",
)
