"""Method contracts: does every override still take the calls made on it?

The sglang NPU backend is the example. The base grew ``init_forward_metadata_out_graph(self, batch,
in_capture=False)`` and its private hook call ``self._replay_metadata(..., in_capture=in_capture,
mamba_track_indices=...)``; the Ascend override of the hook lacked the keywords, and the scheduler crashed
at start with ``TypeError: ... got an unexpected keyword argument 'in_capture'``: no CPU test had called it.

``check(targets, base=None)`` reads the targets from source (nothing is imported, so a module that imports
``torch_npu`` reads like any other) and reports two tiers. A *break* is a call that code in the trees makes
(``self.NAME(...)``, ``super().NAME(...)``, ``type(self).NAME(...)`` in any class above the override, and
calls through annotated attributes and parameters, ``self.linear_attn_backend.forward_decode(...)``) that
the override cannot take, with Python's own ``TypeError``, or that silently changes meaning (an argument in
another parameter, a default the call relies on, a renamed keyword a ``**kwargs`` swallows). A *drift* is a
public signature that differs from the one it overrides where no call in the trees shows it. ``workbench
check-contracts`` is the command line (text, JSON or GitHub annotations; exit 0 no breaks, 1 breaks, 2
usage).

Modules: :mod:`~workbench.contracts.results` (findings and reports), :mod:`~workbench.contracts.signatures`
(one override against one call), :mod:`~workbench.contracts.source` (reading classes from source),
:mod:`~workbench.contracts.calls` (the calls the trees make, and on what), :mod:`~workbench.contracts.check`
(which calls reach which overrides), :mod:`~workbench.contracts.cli`.
"""

from workbench.contracts.check import (
    DEFAULT_BASE,
    DEFAULT_TARGETS,
    IGNORE,
    ContractError,
    NothingToCheck,
    Target,
    check,
)
from workbench.contracts.cli import add_parser, main
from workbench.contracts.results import (
    BREAK,
    CHANGED_DEFAULT,
    DRIFT,
    DROPPED_VARARGS,
    DROPPED_VARKW,
    KIND_CHANGED,
    KINDS,
    MISSING,
    NEW_REQUIRED,
    RENAMED,
    REORDERED,
    SWALLOWED,
    TIERS,
    Contract,
    Finding,
    Report,
)
from workbench.contracts.signatures import CallSite, compare_signatures

__all__ = [
    "BREAK",
    "DRIFT",
    "CHANGED_DEFAULT",
    "DEFAULT_BASE",
    "DEFAULT_TARGETS",
    "DROPPED_VARARGS",
    "DROPPED_VARKW",
    "IGNORE",
    "KINDS",
    "KIND_CHANGED",
    "MISSING",
    "NEW_REQUIRED",
    "RENAMED",
    "REORDERED",
    "SWALLOWED",
    "TIERS",
    "CallSite",
    "Contract",
    "ContractError",
    "Finding",
    "NothingToCheck",
    "Report",
    "Target",
    "add_parser",
    "check",
    "compare_signatures",
    "main",
]
