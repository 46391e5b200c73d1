"""Argument checks of the public ops (metadata only: types, shapes, dtypes, devices)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from kernels.conventions import STATE_LAYOUTS
from kernels.dispatch import IMPLS, resolve_impl
from kernels.dtypes import FLOAT_DTYPES, INDEX_DTYPES
from kernels.padding import skipped_rows


def value_checks(dev: torch.device) -> bool:
    """Whether to read tensor values for validation: CPU tensors only (no host sync with an accelerator),
    and not while a TorchDispatchMode (the CPU graph recorder) is active: values seen at capture are not
    those of later replays, and the recorder must see the op alone."""
    return dev.type == "cpu" and _get_current_dispatch_mode() is None


class ArgChecker:
    """Metadata checks of one public op's arguments: types, shapes, dtypes, devices, never tensor values
    (reading device memory would synchronise the host, which graph capture forbids).

    Every failure is a ValueError whose message starts with the op and names the argument and what is
    wrong with it, e.g. ``linear_attn.recurrent: k must have shape [3, 2, 4], got [3, 2, 5]``. The tensor
    checks return the tensor they passed, typed as one (``A_log = check.tensor("A_log", A_log, ...)``).
    """

    def __init__(self, op: str, device_of: str) -> None:
        self.op = op  # as the user calls it, e.g. "mamba2.selective_state_update"
        self.device_of = device_of  # the argument whose device every other tensor must share

    def fail(self, msg: str) -> NoReturn:
        raise ValueError(f"{self.op}: {msg}")

    def require(self, cond: bool, msg: str) -> None:
        if not cond:
            self.fail(msg)

    def is_tensor(self, name: str, t: object) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            self.fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        return t

    def layout(self, name: str, t: object, doc: str, ndim: int, *, length: int | None = None) -> torch.Tensor:
        """``t`` is a tensor with ``ndim`` dims (and ``length`` entries along the first one, if given).

        Check this before reading sizes off ``t``; ``doc`` describes the expected layout."""
        t = self.is_tensor(name, t)
        if t.dim() != ndim or (length is not None and t.shape[0] != length):
            self.fail(f"{name} must be {doc}, got shape {list(t.shape)}")
        return t

    def leading(self, name: str, t: object, doc: str, ndim: int) -> torch.Tensor:
        """The argument that fixes the sizes and the device of the others: a floating tensor of ``ndim`` dims."""
        t = self.layout(name, t, doc, ndim)
        if t.dtype not in FLOAT_DTYPES:
            self.fail(f"{name} must be floating point, got {t.dtype}")
        return t

    def tensor(
        self,
        name: str,
        t: object,
        shape: Sequence[int | None],
        dtypes: tuple[torch.dtype, ...],
        device: torch.device,
    ) -> torch.Tensor:
        """``t`` is a tensor of ``shape`` (None: any size, e.g. a pool's number of slots), of a dtype in
        ``dtypes``, on ``device``."""
        t = self.is_tensor(name, t)
        if t.dim() == len(shape):
            shape = [t.shape[i] if s is None else s for i, s in enumerate(shape)]
        if tuple(t.shape) != tuple(shape):
            self.fail(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
        if t.dtype not in dtypes:
            self.fail(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
        if t.device != device:
            self.fail(f"{name} is on {t.device}, expected {device} (the device of {self.device_of})")
        return t

    def pool(
        self,
        name: str,
        t: object,
        doc: str,
        slot_shape: Sequence[int | None],
        dtypes: tuple[torch.dtype, ...],
        device: torch.device,
    ) -> torch.Tensor:
        """A pool of per-slot states ``[num_slots, *slot_shape]`` with any number of slots; ``doc`` names its
        dims, e.g. ``"[num_slots, HV, K, V]"``."""
        self.layout(name, t, f"a {1 + len(slot_shape)}-D pool {doc}", 1 + len(slot_shape))
        return self.tensor(name, t, (None, *slot_shape), dtypes, device)

    def state_layout(self, layout: object) -> str:
        """``layout`` if it is one of :data:`kernels.conventions.STATE_LAYOUTS`, else a failure naming it."""
        if not isinstance(layout, str) or layout not in STATE_LAYOUTS:
            self.fail(f"state_layout: must be one of {list(STATE_LAYOUTS)}, got {layout!r}")
        return layout

    def states(
        self,
        name: str,
        t: object,
        dims: Sequence[tuple[str, int | None]],
        layout: str,
        dtypes: tuple[torch.dtype, ...],
        device: torch.device,
    ) -> torch.Tensor:
        """``t`` holds K x V states laid out ``layout``: ``dims`` are its (label, size) pairs as a k_first tensor
        would have them, the last two K and V (size None: any), e.g. ``[("slots", None), ("HV", 2), ("K", 12),
        ("V", 20)]``; v_first swaps the last two. A wrong shape fails naming the layout:
        ``state: [9, 2, 20, 12] is not [slots, HV=2, K=12, V=20] (state_layout='k_first')``."""
        t = self.is_tensor(name, t)
        laid = [*dims[:-2], dims[-1], dims[-2]] if layout == "v_first" else list(dims)
        doc = ", ".join(label if size is None else f"{label}={size}" for label, size in laid)
        if t.dim() != len(laid) or any(size is not None and t.shape[i] != size for i, (_, size) in enumerate(laid)):
            self.fail(f"{name}: {list(t.shape)} is not [{doc}] (state_layout={layout!r})")
        return self.tensor(name, t, [size for _, size in laid], dtypes, device)

    def cu_seqlens(self, cu_seqlens: object, device: torch.device) -> int:
        """Offsets ``[N+1]`` of N packed sequences; returns N."""
        cu_seqlens = self.is_tensor("cu_seqlens", cu_seqlens)
        if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
            self.fail(f"cu_seqlens must be a 1-D tensor [N+1], got shape {list(cu_seqlens.shape)}")
        self.tensor("cu_seqlens", cu_seqlens, (None,), INDEX_DTYPES, device)
        return cu_seqlens.shape[0] - 1

    def impl(self, impl: str, device: torch.device) -> str:
        """``resolve_impl``, with the op named when ``impl`` is not one of ``IMPLS``."""
        if impl not in IMPLS:
            self.fail(f"impl must be one of {IMPLS}, got {impl!r}")
        return resolve_impl(impl, device)

    def pad_slot_id(self, pad_slot_id: object) -> None:
        if not (pad_slot_id is None or (isinstance(pad_slot_id, int) and not isinstance(pad_slot_id, bool))):
            self.fail(f"pad_slot_id must be an int or None, got {pad_slot_id!r}")

    def tree(
        self,
        parents: object,
        N: int,
        depth: int | None,
        *,
        intermediate: str,
        has_intermediate: bool,
        disable_state_update: bool,
        dev: torch.device,
    ) -> torch.Tensor:
        """``retrieve_parent_token`` of a tree verify, metadata only: ``[N, D']`` int on ``dev``, given with the
        intermediate buffer (``has_intermediate``; its argument is named ``intermediate``) and
        ``disable_state_update=True``. ``depth``: the width D' must reach when the op knows its rows' length
        without reading values (every row L tokens), else None. :meth:`tree_values` checks the values."""
        parents = self.layout("retrieve_parent_token", parents, f"[N={N}, D] (each draft node's parent)", 2, length=N)
        self.tensor("retrieve_parent_token", parents, (N, None), INDEX_DTYPES, dev)
        if depth is not None and parents.shape[1] < depth:
            self.fail(
                f"retrieve_parent_token: {list(parents.shape)} has D={parents.shape[1]} columns for rows of "
                f"{depth} nodes; D must be >= every row's length"
            )
        if not has_intermediate:
            self.fail(
                f"retrieve_parent_token: a tree verify needs {intermediate}: each node starts from its parent's "
                "state, read back from there"
            )
        if not disable_state_update:
            self.fail(
                "retrieve_parent_token: a tree verify needs disable_state_update=True: its last node is a leaf of "
                "one branch, not the sequence's final state (commit the accepted node's state afterwards)"
            )
        return parents

    def tree_values(self, parents: torch.Tensor, lengths: Sequence[int], skipped: Sequence[bool]) -> None:
        """The parents of each processed row's nodes (call where :func:`value_checks`): ``parents[n, t]`` in
        ``0..t-1`` for ``1 <= t < lengths[n]`` (node 0 starts from the slot: ``parents[n, 0]`` is ignored), and
        the width ``D' >= lengths[n]`` of every row. Skipped rows' parents are never read."""
        width = parents.shape[1]
        for n, length in enumerate(lengths):
            if length > width:
                self.fail(
                    f"retrieve_parent_token: D={width} columns < length {length} of row {n}; "
                    "D must be >= every row's length"
                )
        for n, (row, length, skip) in enumerate(zip(parents.tolist(), lengths, skipped, strict=True)):
            if skip:
                continue
            for t in range(1, length):
                if not 0 <= row[t] < t:
                    self.fail(
                        f"retrieve_parent_token[{n}, {t}] = {row[t]}: a node's parent must come before it (0..{t - 1})"
                    )

    def varlen_rows(
        self,
        state: object,
        doc: str,
        slot_shape: Sequence[int | None],
        state_indices: object,
        cu_seqlens: object,
        has_initial_state: object,
        T: int,
        pad_slot_id: object,
        dev: torch.device,
    ) -> int:
        """A state pool and the rows of a packed batch (``state_indices`` [N], ``cu_seqlens`` [N+1],
        ``has_initial_state`` [N] or None); values only where :func:`value_checks`. Returns N.

        ``cu_seqlens[-1]`` may be < T: a graph's static buffers hold a bucket's worth of tokens and the tokens
        past the last row belong to nobody (their outputs are written as zeros)."""
        state = self.pool("state", state, doc, slot_shape, FLOAT_DTYPES, dev)
        state_indices = self.layout("state_indices", state_indices, "[N]", 1)
        N = state_indices.shape[0]
        self.tensor("state_indices", state_indices, (N,), INDEX_DTYPES, dev)
        cu_seqlens = self.tensor("cu_seqlens", cu_seqlens, (N + 1,), INDEX_DTYPES, dev)
        if has_initial_state is not None:
            self.tensor("has_initial_state", has_initial_state, (N,), (torch.bool, *INDEX_DTYPES), dev)
        self.pad_slot_id(pad_slot_id)
        if not value_checks(dev):
            return N
        cu = cu_seqlens.tolist()
        if cu[0] != 0:
            self.fail(f"cu_seqlens: must start at 0, got cu_seqlens[0] = {cu[0]}")
        for n in range(N):
            if cu[n + 1] < cu[n]:
                self.fail(f"cu_seqlens: must be non-decreasing, row {n}: {cu[n]} -> {cu[n + 1]}")
        if cu[-1] > T:
            self.fail(f"cu_seqlens: last entry {cu[-1]} exceeds the number of tokens T={T}")
        num_slots = state.shape[0]
        skipped = skipped_rows(state_indices, pad_slot_id).tolist()  # type: ignore[arg-type]
        for n, (slot, skip) in enumerate(zip(state_indices.tolist(), skipped, strict=True)):
            if not skip and not 0 <= slot < num_slots:
                self.fail(
                    f"state_indices: row {n} has slot {slot}, outside [0, {num_slots}) "
                    f"(and not a padding row under pad_slot_id={pad_slot_id})"
                )
        return N
