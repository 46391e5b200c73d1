"""What the kernels do with each row of a step, and which state slots they therefore read and write.

The skip rule is the profile's convention (:meth:`kernels.conventions.Convention.skips`, the host form of
``kernels.padding.skipped_rows``): figures, widgets and tests ask here instead of restating it.
"""

from __future__ import annotations

from workbench.errors import MetadataError
from workbench.metadata.record import ROW_FATES, Metadata, RowFate
from workbench.metadata.record import fate as _fate


def _first(entry: int | list[int]) -> int:
    """The first state index of a row (vLLM verify rows carry one per draft position, all the sentinel)."""
    return entry[0] if isinstance(entry, list) else entry


def row_fate(meta: Metadata, row: int) -> RowFate:
    """What the kernel does with batch row ``row``: "live", "skipped" or "processed" (on the dummy slot).

    One host read of the row's state index.

    >>> from workbench import Batch, StatePool, build_metadata
    >>> def fates(profile):
    ...     pool = StatePool(8, profile)
    ...     meta = build_metadata(Batch.decode(pool.alloc(1), [5]), pool, bucket=2, buckets=[2])
    ...     return [row_fate(meta, i) for i in range(meta.batch_size)]
    >>> fates("sglang"), fates("sglang-ascend"), fates("vllm")
    (['live', 'skipped'], ['live', 'processed'], ['live', 'skipped'])
    """
    if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < meta.batch_size:
        raise MetadataError(f"row: expected a batch row in [0, batch_size={meta.batch_size}), got {row!r}", field="row")
    return _fate(meta, row, _first(meta.state_indices[row].tolist()))


def predicted_access(meta: Metadata) -> tuple[list[int], list[int]]:
    """Slots the kernels read and write for ``meta`` (sorted): every processed row's slot(s), the dummy
    slot included where padded rows are processed; nothing written to the pool in target_verify (the
    per-step states go to the intermediate buffer until acceptance) and nothing read by a live row without
    an initial state. Reads the metadata to the host once."""
    read: set[int] = set()
    written: set[int] = set()
    idx = meta.state_indices.tolist()
    init = meta.has_initial_state.tolist()
    for row in range(meta.batch_size):
        slots = idx[row] if isinstance(idx[row], list) else [idx[row]]
        if _fate(meta, row, slots[0]) == "skipped":
            continue
        # padded rows processed on the dummy slot carry has_initial_state=False, but the kernel still
        # reads slot 0 where the profile ignores that flag; count them as read
        if init[row] or row >= meta.raw_batch_size:
            read.update(slots)
        if meta.forward_mode != "target_verify":
            written.update(slots)
    return sorted(read), sorted(written)


__all__ = ["ROW_FATES", "RowFate", "predicted_access", "row_fate"]
