"""Does a tree reach the verify kernels? A class's verify forward run on a tree and on a chain of the same rows.

For an engine class whose verify forward the adapter can drive on the CPU with its device-only kernels recorded
(``adapter.verify_forward(batch)``: sglang's Ascend GDN class), :func:`tree_as_chain` draws tree verify batches
from the check's seed and runs the forward twice per batch: on the batch's trees, then on chains of the same
rows (``DraftTree.chain``). When no kernel got any of the metadata's tree tensors and every kernel's arguments
are bitwise equal between the two runs, the kernels cannot tell the tree from the chain: the class verifies a
tree as a chain, and :class:`TreeAsChain` says so with the batch, a row whose tree branches and its parents.
Computed from what the engine's code passes, never from a list of known classes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from workbench.batch import Batch
from workbench.engines.base import EngineAdapter
from workbench.engines.oracle import describe, random_batch
from workbench.metadata.tree import TREE_FIELDS, DraftTree

TRIES = 3
"""Tree batches driven before concluding the kernels see the trees (one that branches is enough to show either)."""


@dataclass(frozen=True)
class TreeAsChain:
    """A verify forward whose kernels got nothing of the tree: what the check prints and its JSON carries."""

    profile: str
    method: str  # "AscendGDNAttnBackend.forward_extend"
    kernels: tuple[str, ...]  # every kernel the forward called, in call order
    fields: tuple[str, ...]  # the metadata's tree fields, none of which reached a kernel
    index: int  # the batch's number among the tree batches drawn
    batch: str
    row: int  # a row whose tree branches
    parents: list[int]  # that row's parents (node 0's is -1)

    def __str__(self) -> str:
        return (
            f"{self.profile}: {self.method} (target_verify) passes none of {'/'.join(self.fields)} to "
            f"{', '.join(self.kernels)}: a tree (batch {self.index}, row {self.row}, parents {self.parents}) is "
            "verified as a chain (every kernel argument equals the one for a chain of the same rows)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "kernels": list(self.kernels), "fields": list(self.fields), "text": str(self)}


def tree_as_chain(adapter: EngineAdapter, *, seed: int = 0, max_rows: int = 4) -> TreeAsChain | None:
    """The finding for ``adapter`` (built with ``topk`` > 1 over a pool with live requests), or None: the
    kernels see the trees, or the adapter drives no verify forward for its class."""
    drive = getattr(adapter, "verify_forward", None)
    if drive is None or adapter.topk < 2:
        return None
    rng = random.Random(seed)
    for index in range(TRIES):
        batch = random_batch(adapter, "target_verify", rng, max_rows)
        tree = batch.tree
        assert tree is not None  # the adapter's topk > 1 draws trees
        branching = [b for b, p in enumerate(tree.parents.tolist()) if p != list(range(-1, len(p) - 1))]
        if not branching:
            continue
        on_tree = drive(batch)
        if on_tree is None:
            return None
        on_chain = drive(_as_chains(batch))
        if on_chain is None:
            return None
        reached = {name: kernels for name, kernels in on_tree.passed().items() if kernels}
        if reached or not on_tree.same_as(on_chain):
            return None  # the tree reaches the kernels
        row = branching[0]
        return TreeAsChain(
            adapter.profile,
            on_tree.method,
            on_tree.kernels,
            tuple(on_tree.tree_tensors) or TREE_FIELDS,  # none at all: the metadata carries no tree either
            index,
            describe(batch),
            row,
            tree.parents[row].tolist(),
        )
    return None


def _as_chains(batch: Batch) -> Batch:
    """``batch`` with each row's drafts a chain (the same rows, seq_lens and D)."""
    chain = DraftTree.chain(batch.raw_batch_size, batch.draft_tokens)
    return Batch.target_verify(
        batch.req_pool_indices, batch.seq_lens, batch.draft_tokens, tree=chain, device=batch.req_pool_indices.device
    )


__all__ = ["TRIES", "TreeAsChain", "tree_as_chain"]
