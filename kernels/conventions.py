"""The engines' padding conventions, as the kernels see them: the one place they are written down.

A convention says what a padded batch row carries in ``state_indices`` (its *sentinel*), which rows the
kernels skip (``pad_slot_id``: rows with ``index <= pad_slot_id`` are skipped, ``None`` skips nothing) and
which state slot is reserved as the dummy slot. ``workbench.profiles.Profile`` takes these fields from
here; the kernel tests, the kernel-conformance harness, the benchmarks and the GPU scripts iterate
:data:`CONVENTIONS`. The device-side rule is :func:`kernels.padding.skipped_rows`; :meth:`Convention.skips`
is the same rule for one host integer.

>>> [(c.name, c.sentinel, c.pad_slot_id) for c in CONVENTIONS.values()]
[('sglang', -1, -1), ('sglang-ascend', 0, None), ('vllm', 0, 0)]
>>> CONVENTIONS["vllm"].skips(0), CONVENTIONS["sglang"].skips(0), CONVENTIONS["sglang-ascend"].skips(0)
(True, False, False)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Convention:
    """One engine's padding convention.

    Attributes:
        name: the profile name it belongs to (``sglang``, ``sglang-ascend``, ``vllm``).
        sentinel: the ``state_indices`` value of a padded row.
        pad_slot_id: the kernels' skip rule: a row is skipped iff ``pad_slot_id is not None`` and
            ``index <= pad_slot_id``; None: padded rows are really processed, on :attr:`dummy_slot`.
        dummy_slot: the state slot no request is ever given (capture, and under Ascend padded rows, may
            write it; under vLLM it is the never-allocated null block).
        first_live_slot: the lowest slot a live row may own (slot 0 is the dummy in every convention).
    """

    name: str
    sentinel: int
    pad_slot_id: int | None
    dummy_slot: int = 0

    @property
    def first_live_slot(self) -> int:
        return self.dummy_slot + 1

    @property
    def processes_padding(self) -> bool:
        """True when padded rows run on the dummy slot instead of being skipped (Ascend)."""
        return self.pad_slot_id is None

    def skips(self, index: int) -> bool:
        """The skip rule for one host integer (``kernels.padding.skipped_rows`` is its tensor form)."""
        return self.pad_slot_id is not None and index <= self.pad_slot_id

    @property
    def guard(self) -> str:
        """The skip condition, as text."""
        if self.pad_slot_id is None:
            return "none (padded rows processed on the dummy slot)"
        if self.pad_slot_id < 0:
            return "skip idx < 0"
        return f"skip idx <= {self.pad_slot_id}"


CONVENTIONS: dict[str, Convention] = {
    "sglang": Convention("sglang", sentinel=-1, pad_slot_id=-1),
    "sglang-ascend": Convention("sglang-ascend", sentinel=0, pad_slot_id=None),
    "vllm": Convention("vllm", sentinel=0, pad_slot_id=0),
}


def get_convention(convention: str | Convention) -> Convention:
    """Look a convention up by name (a Convention passes through); ValueError names the choices."""
    if isinstance(convention, Convention):
        return convention
    try:
        return CONVENTIONS[convention]
    except (KeyError, TypeError):
        raise ValueError(f"convention: unknown convention {convention!r}; choose one of {list(CONVENTIONS)}") from None
