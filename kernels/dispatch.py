"""Which implementation of an op runs: the ``impl`` switch ("auto" | "reference" | "triton"), the one
helper that picks the function for it, the custom-op registration every public op goes through, and
:func:`call_op`, which runs a registered op (through the dispatcher, or directly where nothing can tell)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable

import torch
from torch.library import CustomOpDef
from torch.utils._python_dispatch import _get_current_dispatch_mode

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
        _DIRECT[op] = fn
        return op

    return register


_DIRECT: dict[CustomOpDef, Callable[..., None]] = {}
"""Each op :func:`inplace_custom_op` registered -> the function it was made from (what its one kernel runs)."""


def call_op(op: CustomOpDef, /, **kwargs: object) -> None:
    """Run ``op`` (made by :func:`inplace_custom_op`) on ``kwargs``: through the dispatcher as
    ``torch.ops.<namespace>.<op>``, or, where nothing could tell the difference, by calling the function it was
    made from directly.

    The direct path is the torch reference on plain CPU tensors (``impl="reference"``) with no
    ``TorchDispatchMode`` or ``TorchFunctionMode`` active (so the CPU graph recorder, ``FakeTensorMode`` and
    the kernels' tests' op logs still see one op per call), no functorch transform, not while compiling, and
    no gradient to record. There the dispatcher's layers (autograd, ADInplaceOrView, the backend wrapper,
    argument normalisation) run no code that matters and cost more than a small reference step itself (issue
    33: 20% of a trace replay's loop). The function does the same in-place writes either way, so tensors'
    version counters advance as they would.
    """
    fn = _DIRECT.get(op)
    if fn is not None and kwargs.get("impl") == "reference" and _direct_ok(op, kwargs.values()):
        fn(**kwargs)
    else:
        op(**kwargs)


def _direct_ok(op: CustomOpDef, values: Iterable[object]) -> bool:
    """Whether a call of ``op`` on ``values`` may skip the dispatcher (see :func:`call_op`)."""
    if (
        _get_current_dispatch_mode() is not None
        or torch._C._is_torch_function_mode_enabled()
        or torch._C._are_functorch_transforms_active()
        or torch.compiler.is_compiling()
    ):
        return False
    # a kernel registered for a device (torch.library.register_kernel) or a disabled one: the dispatcher decides
    if getattr(op, "_backend_fns", {None: None}).keys() != {None} or getattr(op, "_disabled_kernel", None):
        return False
    grad = torch.is_grad_enabled()
    # a subclass (FakeTensor, DTensor, ...) has its own dispatch; a gradient needs the autograd kernel
    return not any(
        isinstance(v, torch.Tensor) and (type(v) is not torch.Tensor or not v.is_cpu or (grad and v.requires_grad))
        for v in values
    )
