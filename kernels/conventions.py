"""The engines' padding conventions and state layouts, as the kernels see them: the one place they are
written down.

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

A *state layout* (:data:`STATE_LAYOUTS`) says how a pool lays out the ``K x V`` recurrent state of one value
head of the gated delta rule and of linear attention: ``"k_first"`` ``[slots, HV, K, V]`` (the workbench's
default, fla's) or ``"v_first"`` ``[slots, HV, V, K]`` (the released sglang and vLLM GDN pools). A transposed
read has the right shape while ``K == V``. :func:`to_layout` converts a state, :func:`layout_view` re-reads
one without copying. Mamba2's ``[slots, H, headdim, dstate]`` state is another object: no layout choice.

>>> import torch
>>> pool = torch.arange(6.0).view(1, 1, 2, 3)  # one slot, one head, K=2, V=3, k_first
>>> to_layout(pool, "k_first", "v_first").shape, to_layout(pool, "k_first", "v_first").is_contiguous()
(torch.Size([1, 1, 3, 2]), True)
>>> torch.equal(layout_view(to_layout(pool, "k_first", "v_first"), "v_first", "k_first"), pool)
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


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


STATE_LAYOUTS: tuple[str, ...] = ("k_first", "v_first")
"""How a pool lays out one value head's recurrent state: ``"k_first"`` ``[K, V]``, ``"v_first"`` ``[V, K]``."""

DEFAULT_STATE_LAYOUT = "k_first"
"""The ops' default ``state_layout`` (fla's default; the released engines' GDN pools are ``"v_first"``)."""


def check_state_layout(layout: object) -> str:
    """``layout`` if it is one of :data:`STATE_LAYOUTS`; ValueError naming ``state_layout`` and the choices."""
    if not isinstance(layout, str) or layout not in STATE_LAYOUTS:
        raise ValueError(f"state_layout: unknown layout {layout!r}; choose one of {list(STATE_LAYOUTS)}")
    return layout


def state_dims(layout: str, K: int, V: int) -> tuple[int, int]:
    """The last two sizes of a state tensor in ``layout``: ``(K, V)`` k_first, ``(V, K)`` v_first.

    >>> state_dims("k_first", 12, 20), state_dims("v_first", 12, 20)
    ((12, 20), (20, 12))
    """
    return (K, V) if check_state_layout(layout) == "k_first" else (V, K)


def layout_view(state: torch.Tensor, src: str, dst: str) -> torch.Tensor:
    """The same memory indexed as ``dst``: ``state``'s last two dims swapped (a view, no copy) when the layouts
    differ, ``state`` itself when they agree. Any leading dims (a pool, an intermediate buffer ``[N, D, HV, ...]``).

    The kernels read a pool through its K-first view: ``layout_view(state, state_layout, "k_first")``."""
    return state if check_state_layout(src) == check_state_layout(dst) else state.transpose(-1, -2)


def to_layout(state: torch.Tensor, src: str, dst: str) -> torch.Tensor:
    """The values of ``state`` (laid out ``src``) laid out ``dst`` in memory: a contiguous copy when the layouts
    differ, ``state`` itself when they agree. Any leading dims, as :func:`layout_view`."""
    return state if check_state_layout(src) == check_state_layout(dst) else state.transpose(-1, -2).contiguous()
