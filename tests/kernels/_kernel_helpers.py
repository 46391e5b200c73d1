"""Helpers shared by the kernel tests: padding conventions, tolerances, comparisons, an op recorder.

A plain module beside the tests (``tests`` is not a package), imported as ``_kernel_helpers``: this
folder is on ``sys.path`` under pytest's default import mode, and ``conftest.py`` puts it there otherwise.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# (atol, rtol) of each implementation and input dtype against the float64 reference run on the same
# (already rounded) inputs. fp16/bf16 errors come from rounding the output; the interpreter's bf16 store
# truncates instead of rounding, hence a full bf16 ulp. Ops whose outputs carry more error keep a table
# of their own (linear attention sums over tokens).
TOLERANCES = {
    ("reference", torch.float32): (1e-5, 1e-5),
    ("reference", torch.bfloat16): (2e-2, 2e-2),
    ("triton", torch.float32): (1e-5, 1e-5),
    ("triton", torch.float16): (2e-3, 2e-3),
    ("triton", torch.bfloat16): (2e-2, 2e-2),
}

# Engine padding conventions: name -> (pad_slot_id, index of a padded row).
CONVENTIONS = {
    "sglang": (-1, -1),  # -1 rows skipped
    "vllm": (0, 0),  # null slot 0, rows <= 0 skipped
    "ascend": (None, 0),  # nothing skipped: padded rows really run on the dummy slot 0
}


def make_indices(convention: str, n_live: int, n_pad: int, num_slots: int, dtype=torch.int32):
    """Live rows on distinct slots that include both edges of the usable pool, padded rows at the tail.

    Returns (indices, pad_slot_id, slots written by live rows, slots written by padded rows).
    """
    pad_slot_id, sentinel = CONVENTIONS[convention]
    first = 0 if convention == "sglang" else 1  # under vLLM/Ascend slot 0 is never a live slot
    middle = [int(s) for s in torch.randperm(num_slots - first - 2) + first + 1]
    live = ([first, num_slots - 1] + middle)[:n_live]
    live = [live[i] for i in torch.randperm(n_live).tolist()]
    idx = torch.tensor(live + [sentinel] * n_pad, dtype=dtype)
    dummy = {0} if (pad_slot_id is None and n_pad) else set()
    return idx, pad_slot_id, set(live), dummy


def cu_from_lens(lens: list[int]) -> torch.Tensor:
    """int32 cu_seqlens ``[0, l0, l0+l1, ...]`` of packed sequences of these lengths."""
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def nan_like(t: torch.Tensor) -> torch.Tensor:
    """A NaN-poisoned buffer like ``t``: whatever a kernel leaves unwritten shows up."""
    return torch.full_like(t, float("nan"))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: tuple[float, float]) -> None:
    torch.testing.assert_close(actual.double(), expected.double(), atol=tol[0], rtol=tol[1])


def assert_pool(after, before, expected, written: set[int], tol) -> None:
    """Written slots match the float64 result; every other slot is bitwise unchanged."""
    for s in range(before.shape[0]):
        if s in written:
            assert_close(after[s], expected[s], tol)
        else:
            assert torch.equal(after[s], before[s]), f"slot {s} changed but no live row owns it"


class OpLog(TorchDispatchMode):
    """Records the name of every op dispatched while active (``with OpLog() as log: ...; log.ops``)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def opcheck_mutations(op, args) -> None:
    """torch.library.opcheck of a custom op's schema (declared mutations) and fake kernel."""
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
