"""The zoo's cases by name: :data:`MODULES` in the order the zoo presents them, :func:`cases`, :func:`get`.

Below the package's ``__init__``, the user checks (:mod:`workbench.zoo.check`) and the export
(:mod:`workbench.zoo.export`), which all look cases up, so none of them imports the package it belongs to.
"""

from __future__ import annotations

from importlib import import_module

from workbench.zoo.case import ZooCase
from workbench.zoo.result import ZooError

# In the order the zoo presents them.
MODULES = (
    "in_capture",
    "contract_drift",
    "dummy_slot",
    "stale_rows",
    "sentinel_guard",
    "verify_alias",
    "uninit_pad",
    "host_value",
    "tail_slice",
    "rebuilt_tensors",
    "fill_count",
    "slot_reuse",
    "dp_dummy_rows",
    "chunk_initial_state",
    "prefix_over_reuse",
    "publish_before_write",
    "unwritten_track_slot",
    "stale_track_mask",
    "mamba2_chunk_grid",
    "backward_post_copy",
    "running_block_publish",
    "transposed_state_read",
    "kda_sentinel_rows",
    "kda_frozen_accept_lists",
    "tree_as_chain",
    "tree_commit_depth",
    "tree_track_unclamped",
    "ghost_node_cow",
)


def cases() -> list[ZooCase]:
    """Every case, in order."""
    return [import_module(f"workbench.zoo.{m}").CASE for m in MODULES]


def names() -> list[str]:
    return [c.name for c in cases()]


def get(name: str) -> ZooCase:
    """The case called ``name``; ``ZooError`` naming the choices when there is none."""
    for case in cases():
        if case.name == name:
            return case
    raise ZooError(f"no zoo case named {name!r}; choose from {', '.join(names())}")
