"""The kernel-conformance harness: check a kernel against its op's float64 reference under every padding
convention, and through the CPU graph recorder.

Every op and variant of :data:`kernels.testing.OPS` is offered (the gated delta rule's recurrent decode,
gating, verify and extend, chunked extend and scatter_accepted; the causal conv1d update, decode and
verify, and its varlen extend; Mamba2's selective state update; plain linear attention). The inputs and the
verdict are ``kernels.testing``'s (:func:`~kernels.testing.make_case`, :meth:`~kernels.testing.Case.check`),
the conventions ``kernels.conventions``'; nothing here builds a case of its own.

- ``check``: :func:`check_kernel` (every variant, every convention, then capture), :func:`check_variant`,
  :func:`check_convention`, :func:`check_capture`.
- ``results``: :class:`KernelCheck`, :class:`VariantCheck`, :class:`ConventionResult`,
  :class:`CaptureResult` (each with ``summary()``, ``__repr__`` and ``_repr_html_``).
- ``cli``: ``workbench check-kernel MODULE_OR_FILE:FUNCTION --op OP`` (exit 0 ok, 1 a failure, 2 bad input).
- ``custom_op``: :func:`as_custom_op`, your kernel as one ``torch.library.custom_op`` a graph can hold.
- ``names``: :func:`candidate_name`, :func:`builtin`; ``choices``: :class:`KernelCheckError`.

Above ``workbench.measure`` and the graph backends, beside ``workbench.runner``; the kernel playground
(``workbench.widgets``) and notebook 04 use it. Names load on first use (PEP 562), so that the command line's
``--help`` never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.kernelcheck.check import check_capture, check_convention, check_kernel, check_variant
    from workbench.kernelcheck.choices import KernelCheckError
    from workbench.kernelcheck.custom_op import as_custom_op, mutated_args
    from workbench.kernelcheck.names import builtin, candidate_name
    from workbench.kernelcheck.results import CaptureResult, ConventionResult, KernelCheck, VariantCheck

_LAZY = {
    "check_capture": "check",
    "check_convention": "check",
    "check_kernel": "check",
    "check_variant": "check",
    "KernelCheckError": "choices",
    "as_custom_op": "custom_op",
    "mutated_args": "custom_op",
    "builtin": "names",
    "candidate_name": "names",
    "CaptureResult": "results",
    "ConventionResult": "results",
    "KernelCheck": "results",
    "VariantCheck": "results",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench.kernelcheck' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"workbench.kernelcheck.{module}"), name)
    globals()[name] = value  # the next lookup skips this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "CaptureResult",
    "ConventionResult",
    "KernelCheck",
    "KernelCheckError",
    "VariantCheck",
    "as_custom_op",
    "builtin",
    "candidate_name",
    "check_capture",
    "check_convention",
    "check_kernel",
    "check_variant",
    "mutated_args",
]
