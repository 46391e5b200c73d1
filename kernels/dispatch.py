"""Which implementation of an op runs: the ``impl`` switch ("auto" | "reference" | "triton"), the one
helper that picks the function for it, and the custom-op registration every public op goes through."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

import torch
from torch.library import CustomOpDef

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


def implementation(impl: str, *, reference: Callable[..., None], triton: str) -> Callable[..., None]:
    """The function that runs a resolved ``impl``: ``reference`` itself, or the Triton launcher named
    ``"package.module:function"``, imported only now (so the references run where triton is absent, and
    ``TRITON_INTERPRET`` is read as late as possible)."""
    if impl == "reference":
        return reference
    if impl != "triton":
        raise ValueError(f"impl must be resolved to 'reference' or 'triton' first, got {impl!r}")
    module, _, name = triton.partition(":")
    return getattr(importlib.import_module(module), name)


def inplace_custom_op(name: str, mutates_args: tuple[str, ...]) -> Callable[[Callable[..., None]], CustomOpDef]:
    """``torch.library.custom_op`` for an op that only mutates its arguments and returns None, with the
    matching fake (meta) kernel, which has nothing to do. The op is what a ``TorchDispatchMode`` (the CPU
    graph recorder) sees: one op per kernel call, whatever the implementation runs inside.

    The decorated name becomes the ``CustomOpDef``: calling it runs the op (``torch.ops.<namespace>.<op>``
    is the same op)."""

    def register(fn: Callable[..., None]) -> CustomOpDef:
        op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)
        op.register_fake(lambda *args, **kwargs: None)
        return op

    return register
