"""``@triton.jit`` helpers and launch helpers shared by the kernel folders' Triton kernels.

Importing this module needs triton; the other ``kernels/*.py`` modules do not, so that the torch
references run without it."""

from __future__ import annotations

import dataclasses
import sys

import torch
import triton
import triton.language as tl

from kernels.dispatch import interpreter_on


@triton.jit
def sigmoid(v):
    """1 / (1 + exp(-v)) from exp(-|v|), which cannot overflow."""
    e = tl.exp(-tl.abs(v))
    return tl.where(v >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def named_strides(name: str, t: torch.Tensor | None, dims: str) -> dict[str, int]:
    """``{"stride_<name>_<d>": t.stride(i)}`` for the i-th letter d of ``dims``; zeros when ``t`` is None
    (the kernel never reads it)."""
    return {f"stride_{name}_{d}": (t.stride(i) if t is not None else 0) for i, d in enumerate(dims)}


def skip_dead_overflow_checks() -> bool:
    """In Triton's interpreter, stop building integer-overflow checks that nothing reads; True if it did.

    With ``sanitize_overflow`` on (the interpreter's default), every integer ``+``, ``-`` and ``*`` of a kernel
    (its index arithmetic) is done again in int64 with a range test, and the test goes to ``device_assert``,
    which drops it unless the options' ``debug`` is set. The interpreter's options (Triton 3.x) never set it,
    so the checks are computed and thrown away: about a quarter of the kernel tests' CPU under the interpreter
    (issue 33). Nothing else reads them, so results and errors are the same without. Left on where ``debug``
    is set (then the checks assert), outside the interpreter (compiled kernels have their own options), and
    where the interpreter is not laid out as this expects (another Triton release)."""
    if not interpreter_on():
        return False
    interpreter = sys.modules.get("triton.runtime.interpreter")
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if builder is None or not dataclasses.is_dataclass(options) or isinstance(options, type):
        return False
    if getattr(options, "debug", True) or not getattr(options, "sanitize_overflow", False):
        return False
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


skip_dead_overflow_checks()  # the kernels above are defined, so the interpreter is loaded when it is on
