"""Shared helpers of the kernel folders: implementation choice, the padding rule (and what the torch
references build on it), argument checks of the public ops, custom-op registration, cost records.

Padding rule (one parameter for all three engine conventions of DESIGN.md):
a row `i` is *skipped* (no state read, no state write, output zeros) iff
``pad_slot_id is not None and state_indices[i] <= pad_slot_id``.

- ``pad_slot_id=-1``  sglang (CUDA): padded rows carry -1; negative indices are skipped.
- ``pad_slot_id=0``   vLLM: slot 0 is the never-allocated null block; indices ``<= 0`` are skipped.
- ``pad_slot_id=None`` sglang on Ascend: nothing is skipped; padded rows point at the dummy slot 0 and
  are really processed there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

import torch

IMPLS = ("auto", "reference", "triton")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
STATE_DTYPES = (torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)


def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # a broken install must not break the reference path
        return False
    return True


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_impl(impl: str, device: torch.device) -> str:
    """Map ``impl`` to "reference" or "triton" for tensors on ``device``.

    "auto" picks Triton on an accelerator where it compiles (cuda, npu, xpu) and the reference on the
    CPU: the interpreter is a correctness tool, far too slow to be a default, so it is opt-in with
    ``impl="triton"`` (and needs ``TRITON_INTERPRET=1`` set before the kernel modules are imported).
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "reference":
        return "reference"
    on_cpu = device.type == "cpu"
    if impl == "auto":
        return "triton" if (not on_cpu and triton_importable()) else "reference"
    if not triton_importable():
        raise RuntimeError("impl='triton' but triton cannot be imported")
    if on_cpu and not interpreter_on():
        raise RuntimeError(
            "impl='triton' on CPU tensors needs TRITON_INTERPRET=1 set before kernel modules are imported"
        )
    return "triton"


def skipped_rows(state_indices: torch.Tensor, pad_slot_id: int | None) -> torch.Tensor:
    """Bool mask [N]: rows that touch no state slot under the padding rule above."""
    if pad_slot_id is None:
        return torch.zeros_like(state_indices, dtype=torch.bool)
    return state_indices <= pad_slot_id


def live_rows_and_slots(
    indices: torch.Tensor, pad_slot_id: int | None, num_slots: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows that are processed under the padding rule, and their slots (int64), checked against the pool.

    Raises IndexError naming the first processed row whose slot is outside ``[0, num_slots)``. Reads the
    indices on the host: for the torch references only.
    """
    rows = (~skipped_rows(indices, pad_slot_id)).nonzero().squeeze(1)
    slots = indices[rows].long()
    bad = (slots < 0) | (slots >= num_slots)
    if bool(bad.any()):
        row = int(rows[bad.nonzero()[0, 0]])
        raise IndexError(
            f"row {row} has slot {int(indices[row])}, outside the pool [0, {num_slots}) and not skipped "
            f"under pad_slot_id={pad_slot_id}"
        )
    return rows, slots


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """Arithmetic dtype of the torch references: float64 if any given tensor is float64, else float32
    (fp16/bf16 are never accumulated in)."""
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


class ArgChecker:
    """Metadata checks of one public op's arguments: types, shapes, dtypes, devices, never tensor values
    (reading device memory would synchronise the host, which graph capture forbids).

    Every failure is a ValueError whose message starts with the op and names the argument and what is
    wrong with it, e.g. ``linear_attn.recurrent: k must have shape [3, 2, 4], got [3, 2, 5]``.
    """

    def __init__(self, op: str, device_of: str) -> None:
        self.op = op  # as the user calls it, e.g. "mamba2.selective_state_update"
        self.device_of = device_of  # the argument whose device every other tensor must share

    def fail(self, msg: str) -> NoReturn:
        raise ValueError(f"{self.op}: {msg}")

    def require(self, cond: bool, msg: str) -> None:
        if not cond:
            self.fail(msg)

    def is_tensor(self, name: str, t: object) -> None:
        if not isinstance(t, torch.Tensor):
            self.fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")

    def layout(self, name: str, t: object, doc: str, ndim: int, *, length: int | None = None) -> None:
        """``t`` is a tensor with ``ndim`` dims (and ``length`` entries along the first one, if given).

        Check this before reading sizes off ``t``; ``doc`` describes the expected layout."""
        self.is_tensor(name, t)
        if t.dim() != ndim or (length is not None and t.shape[0] != length):
            self.fail(f"{name} must be {doc}, got shape {list(t.shape)}")

    def leading(self, name: str, t: object, doc: str, ndim: int) -> None:
        """The argument that fixes the sizes and the device of the others: a floating tensor of ``ndim`` dims."""
        self.layout(name, t, doc, ndim)
        if t.dtype not in FLOAT_DTYPES:
            self.fail(f"{name} must be floating point, got {t.dtype}")

    def tensor(
        self,
        name: str,
        t: object,
        shape: Sequence[int | None],
        dtypes: tuple[torch.dtype, ...],
        device: torch.device,
    ) -> None:
        """``t`` is a tensor of ``shape`` (None: any size, e.g. a pool's number of slots), of a dtype in
        ``dtypes``, on ``device``."""
        self.is_tensor(name, t)
        if t.dim() == len(shape):
            shape = [t.shape[i] if s is None else s for i, s in enumerate(shape)]
        if tuple(t.shape) != tuple(shape):
            self.fail(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
        if t.dtype not in dtypes:
            self.fail(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
        if t.device != device:
            self.fail(f"{name} is on {t.device}, expected {device} (the device of {self.device_of})")

    def pool(
        self,
        name: str,
        t: object,
        doc: str,
        slot_shape: Sequence[int | None],
        dtypes: tuple[torch.dtype, ...],
        device: torch.device,
    ) -> None:
        """A pool of per-slot states ``[num_slots, *slot_shape]`` with any number of slots; ``doc`` names its
        dims, e.g. ``"[num_slots, HV, K, V]"``."""
        self.layout(name, t, f"a {1 + len(slot_shape)}-D pool {doc}", 1 + len(slot_shape))
        self.tensor(name, t, (None, *slot_shape), dtypes, device)

    def cu_seqlens(self, cu_seqlens: object, device: torch.device) -> int:
        """Offsets ``[N+1]`` of N packed sequences; returns N."""
        self.is_tensor("cu_seqlens", cu_seqlens)
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


def inplace_custom_op(name: str, mutates_args: tuple[str, ...]) -> Callable[[Callable[..., None]], object]:
    """``torch.library.custom_op`` for an op that only mutates its arguments and returns None, with the
    matching fake (meta) kernel, which has nothing to do. The op is what a ``TorchDispatchMode`` (the CPU
    graph recorder) sees: one op per kernel call, whatever the implementation runs inside."""

    def register(fn: Callable[..., None]) -> object:
        op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)
        op.register_fake(lambda *args, **kwargs: None)
        return op

    return register


@dataclass(frozen=True)
class Cost:
    """Bytes moved to/from memory and floating-point operations of one op call (for the roofline)."""

    bytes: int
    flops: int

    @property
    def intensity(self) -> float:
        """FLOPs per byte."""
        return self.flops / max(self.bytes, 1)

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.bytes + other.bytes, self.flops + other.flops)
