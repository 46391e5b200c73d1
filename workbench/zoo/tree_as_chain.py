"""tree_as_chain: a verify whose kernels are not given the draft tree runs every node after the node before
it, as if the tree were a chain (sglang 0.5.23's Ascend GDN backend, read from its code)."""

from __future__ import annotations

from typing import Any

import torch

from workbench.batch import Batch
from workbench.layers import GatedDeltaNetLayer, GDNConfig, float64_reference
from workbench.measure.integrity import check, snapshot
from workbench.metadata import Metadata, build_metadata
from workbench.metadata.tree import DraftTree
from workbench.pool import StatePool
from workbench.profiles import get_profile
from workbench.zoo import _harness as h
from workbench.zoo.case import ZooCase
from workbench.zoo.result import Evidence, IntegrityEvidence, RowsDiffer

EXPLANATION = (
    "With `--speculative-eagle-topk` above 1, sglang drafts a tree: each verify row's D tokens are nodes, and "
    "node t must start from the state after its parent, not after node t - 1. The backend hands the kernels "
    "the tree as `retrieve_next_token` / `retrieve_next_sibling`, the conv kernel derives "
    "`retrieve_parent_token` from them, and the recurrent kernel reloads the parent's state from the "
    "intermediate buffer before each node. sglang 0.5.23's Ascend backend fills the same per-bucket tree "
    "buffers, but its calls of `torch.ops.npu.causal_conv1d` and `recurrent_gated_delta_rule` take none of "
    "them, and no guard refuses topk > 1: read from the code, a tree is verified there as a chain. A node "
    "whose parent is the node before it (the first branch, and every chain) still comes out right; a sibling "
    "reads its elder sibling's state instead of their parent's, so its output and its intermediate state are "
    "off, and so is everything the commit takes from them when the sampler accepts that branch. Here three "
    "requests verify 4 nodes each on sglang-ascend's conventions: row 0 sglang's own example tree (0 -> 1, "
    "2; 1 -> 3), row 1 a chain (the control: right both ways), row 2 a star (0 -> 1, 2, 3), captured and "
    "replayed, every node's output and state against a float64 recurrence along its ancestors. The fix "
    "passes the parents to both kernels (`retrieve_parent_token=`)."
)

PARENTS = [[-1, 0, 0, 1], [-1, 0, 1, 2], [-1, 0, 0, 0]]
"""The three rows' trees: sglang's documented example, a chain, a star."""
D = 4
PROFILE = "sglang-ascend"


class TreeBlindGDN(GatedDeltaNetLayer):
    """A Gated DeltaNet layer whose verify kernels, when ``blind``, are not given the draft tree (the parents
    dropped from the conv and the recurrence), as sglang 0.5.23's Ascend backend calls its NPU kernels.

    ``blind`` is an instance attribute: the float64 reference copy (``Layer.to``) does not carry it and
    follows the tree."""

    def __init__(self, *args: Any, blind: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.blind = blind

    def _tree_args(self, meta: Metadata) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return {} if self.__dict__.get("blind") else GatedDeltaNetLayer._tree_args(meta)


def _node(token: int) -> str:
    row, node = divmod(token, D)
    return f"row {row} node {node} (parent {PARENTS[row][node]})"


def _run(fixed: bool, backend: str) -> list[Evidence]:
    name, device = h.resolve_backend(backend)
    pool = StatePool(16, PROFILE, device=device)
    layer = TreeBlindGDN(
        GDNConfig.small(), seed=0, device=device, state_layout=get_profile(PROFILE).state_layout, blind=not fixed
    )
    runner = h.make_runner(layer, pool, name, modes=("target_verify",), draft_tokens=D, tree=True)
    runner.capture(progress=False)
    rows = pool.alloc(3)
    batch = Batch.target_verify(rows, [9, 12, 7], D, tree=DraftTree.from_parents(PARENTS), device=device)
    x = h.inputs_for(runner, batch, 0)
    before = runner.state.clone()
    # the float64 recurrence of every node along its ancestors, from the same states
    ref = float64_reference(layer)
    inter_r = ref.new_intermediate(batch.raw_batch_size, D, torch.float64)
    out_r = ref.forward(x.double(), build_metadata(batch, pool, bucket=None), before.to(torch.float64), inter_r)
    pre = snapshot(before.tensors())
    res = runner.replay(batch, x)
    assert runner.last_intermediate is not None  # a verify step leaves its per-node states
    # the step as a whole: a verify writes no slot (the dummy may be, Ascend runs padded rows there); outputs
    dummy = pool.profile.dummy_slot
    report = check(
        pre, runner.state.tensors(), allowed_slots={dummy}, live_slots=[],
        reference_state=before.to(torch.float64).tensors(), live_outputs=res.output.clone(), reference_outputs=out_r,
    )  # fmt: skip
    step = h.integrity_evidence(
        "verify replay (pool and outputs)", report, pool, pre, runner.state.tensors(), [], [dummy]
    )
    got_out = (res.output.double() - out_r).abs().amax(dim=1)
    states = runner.last_intermediate.ssm[: batch.raw_batch_size].double() - inter_r.ssm
    got_state = states.abs().flatten(2).amax(dim=2).flatten()  # [rows * D]: one error per node
    evidence: list[Evidence] = [step]
    for what, err in (
        ("verify outputs of each node (token = 4 * row + node) against its float64 recurrence", got_out),
        ("intermediate state of each node against the float64 state along its ancestors", got_state),
    ):
        bad = [t for t, e in enumerate(err.tolist()) if not e <= 1e-4]
        evidence.append(
            RowsDiffer(f"{what}; off: {', '.join(map(_node, bad)) or 'none'}", bad, [err[t].item() for t in bad])
        )
    return evidence


CASE = ZooCase(
    name="tree_as_chain",
    title="a tree verify whose kernels are not given the tree runs it as a chain: siblings read the wrong state",
    issue="sglang 0.5.23 Ascend GDN backend",
    profile=PROFILE,
    explanation=EXPLANATION,
    run_fn=_run,
    mechanism=(RowsDiffer, IntegrityEvidence),
    why_not="the case swaps the verify kernels' tree arguments of the workbench's own layer; your kernel's tree "
    "handling is what `workbench check-kernel MODULE_OR_FILE:FUNCTION --op gated_delta_rule.recurrent` checks "
    "(its `tree` variant), and `workbench engine-check sglang --topk 2` checks the engine's backends",
    steps="pool of 16 slots (sglang-ascend), GDN layer (small, seed 0) with a V-first pool, verify buckets 1, 2, 4 "
    "with D=4 and tree buffers, capture(); one verify of 3 requests (seq_lens 9, 12, 7) padded to 4, trees "
    "[-1, 0, 0, 1], [-1, 0, 1, 2], [-1, 0, 0, 0]; every node's output and intermediate state against float64",
)
