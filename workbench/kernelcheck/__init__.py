"""The kernel-conformance harness: check a kernel against its op's float64 reference under every padding
convention, and through the CPU graph recorder.

Every op and variant of :data:`kernels.testing.OPS` is offered (the gated delta rule's recurrent decode,
gating, verify and extend, chunked extend and scatter_accepted; the causal conv1d update, decode and
verify, and its varlen extend; Mamba2's selective state update; plain linear attention). The inputs and the
verdict are ``kernels.testing``'s (:func:`~kernels.testing.make_case`, :meth:`~kernels.testing.Case.check`),
the conventions ``kernels.conventions``'; nothing here builds a case of its own.

- ``check``: :func:`check_kernel` (every convention, then capture), :func:`check_convention`,
  :func:`check_capture`.
- ``results``: :class:`KernelCheck`, :class:`ConventionResult`, :class:`CaptureResult` (each with
  ``summary()``, ``__repr__`` and ``_repr_html_``).
- ``custom_op``: :func:`as_custom_op`, your kernel as one ``torch.library.custom_op`` a graph can hold.
- ``names``: :func:`candidate_name`, :func:`builtin`; ``choices``: :class:`KernelCheckError`.

Above ``workbench.measure`` and the graph backends, beside ``workbench.runner``; the kernel playground
(``workbench.widgets``) and notebook 04 use it.
"""

from workbench.kernelcheck.check import check_capture, check_convention, check_kernel
from workbench.kernelcheck.choices import KernelCheckError
from workbench.kernelcheck.custom_op import as_custom_op, mutated_args
from workbench.kernelcheck.names import builtin, candidate_name
from workbench.kernelcheck.results import CaptureResult, ConventionResult, KernelCheck

__all__ = [
    "CaptureResult",
    "ConventionResult",
    "KernelCheck",
    "KernelCheckError",
    "as_custom_op",
    "builtin",
    "candidate_name",
    "check_capture",
    "check_convention",
    "check_kernel",
    "mutated_args",
]
