"""Shared helpers of the kernel folders: implementation choice, the padding rule, cost records.

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
from dataclasses import dataclass

import torch

IMPLS = ("auto", "reference", "triton")


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
