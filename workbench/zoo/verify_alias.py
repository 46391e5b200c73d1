"""verify_alias: padded verify rows share request 0's intermediate scratch slot, so request 0 accepts a
state a padded row computed (sglang PR 27202, Ascend)."""

from __future__ import annotations

from typing import Any

import torch

from workbench.backends import MetadataBackend, NpuMetadataBackend
from workbench.batch import Batch
from workbench.layers import GatedDeltaNetLayer, GDNConfig, Intermediate, LayerState, float64_reference
from workbench.measure.integrity import check, snapshot
from workbench.metadata import Metadata, build_metadata
from workbench.pool import StatePool
from workbench.profiles import Profile
from workbench.runner import GraphRunner
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence, IntegrityEvidence, RowsDiffer

EXPLANATION = (
    "In speculative verify the kernels do not touch the state pool: each batch row writes its per-draft-step "
    "states into a scratch buffer, and after acceptance the state of the last accepted step is copied from "
    "row i's scratch to request i's slot. On Ascend padded rows are really processed (on the dummy slot), so "
    "they also write scratch, and the scratch index of a padded row must be its own row. The NPU backend "
    "before PR 27202 gave padded rows scratch index 0, request 0's: the padded row's states, computed from "
    "the dummy slot and stale inputs, overwrote request 0's, and request 0 accepted a state that was not its "
    "own (seen as repetition and lost accuracy). Here a layer routes each row's scratch through "
    "`intermediate_state_indices`, rows in order; with padded rows aliased to 0, request 0's slot leaves the "
    "float64 reference after acceptance while every other request is exact. The fix: the scratch index of "
    "every row, padded or not, is its batch row."
)


class ScratchRoutedGDN(GatedDeltaNetLayer):
    """Gated DeltaNet whose verify scratch is written through ``meta.intermediate_state_indices`` (rows in
    order, so where two rows share a scratch slot the later row's write is what stays)."""

    def forward(
        self, x: torch.Tensor, meta: Metadata, state: LayerState, intermediate: Intermediate | None = None
    ) -> torch.Tensor:
        where = meta.intermediate_state_indices
        if meta.forward_mode != "target_verify" or where is None or intermediate is None:
            return super().forward(x, meta, state, intermediate)
        n = meta.state_indices.shape[0]
        local = Intermediate(torch.empty_like(intermediate.conv[:n]), torch.empty_like(intermediate.ssm[:n]))
        out = super().forward(x, meta, state, local)
        rows = where.long()
        for i in range(n):
            intermediate.conv.index_copy_(0, rows[i : i + 1], local.conv[i : i + 1])
            intermediate.ssm.index_copy_(0, rows[i : i + 1], local.ssm[i : i + 1])
        return out


def _backend(own_rows: bool) -> type[MetadataBackend]:
    class AscendVerifyBackend(NpuMetadataBackend):
        def init_forward_metadata_out_graph(self, batch: Batch, in_capture: bool = False) -> Metadata:
            meta = super().init_forward_metadata_out_graph(batch, in_capture=in_capture)
            inter = meta.intermediate_state_indices
            if inter is not None and not in_capture:
                rows = torch.arange(meta.batch_size, dtype=inter.dtype, device=inter.device)
                # unfixed: padded rows get request 0's scratch index; fixed: every row its own
                inter.copy_(rows if own_rows else torch.where(rows < batch.raw_batch_size, rows, 0))
            return meta

    return AscendVerifyBackend


def verify_and_accept(
    runner: GraphRunner, batch: Batch, inputs: torch.Tensor, accepted: list[int]
) -> IntegrityEvidence:
    """Replay a verify step and accept ``accepted`` tokens per row; check slots and outputs against the
    float64 reference doing the same unpadded."""
    pool = runner.pool
    before = runner.state.clone()
    pre = snapshot(before.tensors())
    layer: Any = runner.layer
    ref = float64_reference(layer)
    meta_r = build_metadata(batch, pool, bucket=None)
    st_r = before.to(torch.float64)
    inter_r = ref.new_intermediate(batch.raw_batch_size, runner.draft_tokens, torch.float64)
    out_r = ref.forward(inputs.double(), meta_r, st_r, inter_r)
    acc = torch.tensor(accepted, dtype=torch.int32, device=pool.device)
    ref.accept(st_r, inter_r, meta_r, acc)
    res = runner.replay(batch, inputs)
    out_g = res.output.clone()
    runner.accept(acc)
    live = sorted(int(s) for s in meta_r.state_indices.tolist())
    report = check(
        pre,
        runner.state.tensors(),
        allowed_slots=live,
        live_slots=live,
        reference_state=st_r.tensors(),
        live_outputs=out_g,
        reference_outputs=out_r,
    )
    return h.integrity_evidence("verify + accept", report, pool, pre, runner.state.tensors(), live)


def variant(fixed: bool) -> type[MetadataBackend]:
    """The case's own backend: padded rows on request 0's scratch (unfixed) or on their own (fixed)."""
    return _backend(own_rows=fixed)


def padding_is_processed(cls: type[MetadataBackend], profile: Profile) -> str | None:
    """The alias needs padded rows that really run and write scratch (a profile without a skip guard)."""
    if profile.convention.processes_padding:
        return None
    return (
        f"under {profile.name} the kernels skip padded rows ({profile.convention.guard}): they write no verify "
        "scratch, so none can overwrite request 0's (the case needs padded rows processed, as under sglang-ascend)"
    )


def scenario(cls: type[MetadataBackend], profile: str, backend: str) -> list[Evidence]:
    """Capture target-verify buckets 2 and 4 (D = 2) with ``cls`` and a layer that routes each row's scratch
    through ``intermediate_state_indices``; replay a verify step of three requests padded to 4, accept
    (2, 1, 2) tokens and check. Evidence of the bug: a row's scratch index that is not its own row."""
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, profile, device=device)
    layer = ScratchRoutedGDN(GDNConfig.small(), seed=0, device=device, state_layout=pool.profile.state_layout)
    runner = h.make_runner(layer, pool, name, buckets=(2, 4), modes=("target_verify",), metadata_backend=cls)
    runner.capture(progress=False)
    rows = pool.alloc(3)
    batch = Batch.target_verify(rows, [7, 8, 9], draft_tokens=2, device=device)
    step = verify_and_accept(runner, batch, h.inputs_for(runner, batch, 0), accepted=[2, 1, 2])
    return [step, h.metadata_rows_differ(runner, batch, "intermediate_state_indices")]


CASE = ZooCase(
    name="verify_alias",
    title="padded verify rows alias request 0's scratch: request 0 accepts a wrong state",
    issue="sglang PR 27202",
    profile="sglang-ascend",
    explanation=EXPLANATION,
    subject="metadata_backend",
    scenario=scenario,
    variant=variant,
    mechanism=(RowsDiffer,),
    applies=padding_is_processed,
    steps="pool of 16 slots, GDN layer (small, seed 0) writing verify scratch by intermediate_state_indices, "
    "target_verify buckets 2, 4 with 2 draft tokens; capture(); one verify step of 3 requests (seq_lens 7, 8, "
    "9) padded to 4, accepting 2, 1, 2 tokens: intermediate_state_indices compared with build_metadata's, "
    "slots and outputs checked against the float64 reference",
)
