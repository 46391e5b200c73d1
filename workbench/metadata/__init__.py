"""Per-step metadata of a linear-attention layer: build it (eager), write it in place (graph), validate it.

- :mod:`~workbench.metadata.record`: the :class:`Metadata` record and its views, ``tokens_per_row``,
  ``GRAPH_MODES``;
- :mod:`~workbench.metadata.padding`: the padding rule (what a padded row holds), and the one writer of a
  step's rows that the eager build and the graph buffers share;
- :mod:`~workbench.metadata.build`: ``build_metadata``, the eager build in fresh tensors;
- :mod:`~workbench.metadata.buffers`: ``MetadataBuffers``, static per-bucket tensors updated in place;
- :mod:`~workbench.metadata.invariants`: ``validate``, the invariants of docs/design.md (not `validate.py`:
  a submodule named like the function would shadow it);
- :mod:`~workbench.metadata.access`: ``row_fate`` and ``predicted_access``, what the kernels do with each row;
- :mod:`~workbench.metadata.tree`: ``DraftTree``, a tree verify's draft trees (sglang, ``topk > 1``), and
  ``parents_from_links``, sglang's derivation of ``retrieve_parent_token``;
- :mod:`~workbench.metadata.sizing`: the default bucket list and the memory checks before allocating.

``bucket`` means one thing everywhere: "auto" (the default) pads to the smallest captured bucket that holds
the batch, an int names a captured bucket; only ``build_metadata`` also takes None, for an unpadded step.
"""

from workbench.metadata.access import predicted_access, row_fate
from workbench.metadata.buffers import MetadataBuffers
from workbench.metadata.build import build_metadata
from workbench.metadata.invariants import validate
from workbench.metadata.record import GRAPH_MODES, Metadata, tokens_per_row
from workbench.metadata.tree import DraftTree, parents_from_links

__all__ = [
    "GRAPH_MODES",
    "DraftTree",
    "Metadata",
    "MetadataBuffers",
    "build_metadata",
    "parents_from_links",
    "predicted_access",
    "row_fate",
    "tokens_per_row",
    "validate",
]
