"""Method contracts: does every subclass still take the calls its base class makes and promises?

The sglang NPU backend is the example. The base grew ``init_forward_metadata_out_graph(self, batch,
in_capture=False)`` and its private hook call ``self._replay_metadata(..., in_capture=in_capture,
mamba_track_indices=...)``; the Ascend override of the hook lacked the keywords, and the scheduler crashed
at start with ``TypeError: ... got an unexpected keyword argument 'in_capture'``: no CPU test had called it.

``check(targets, base=None)`` reads the targets from source (nothing is imported, so a module that imports
``torch_npu`` reads like any other) and reports, per subclass, every call the base makes on itself
(``self.NAME(...)``, ``type(self).NAME(...)``, ``super().NAME(...)``) and every public base method that an
override cannot take, with Python's own ``TypeError`` or what silently changes. ``workbench
check-contracts`` is the command line (text, JSON or GitHub annotations; exit 0 clean, 1 findings, 2 usage).

Modules: :mod:`~workbench.contracts.results` (findings and reports), :mod:`~workbench.contracts.signatures`
(one override against one call), :mod:`~workbench.contracts.source` (reading classes from source),
:mod:`~workbench.contracts.check` (finding the subclasses), :mod:`~workbench.contracts.cli`.
"""

from workbench.contracts.check import DEFAULT_BASE, DEFAULT_TARGETS, ContractError, NothingToCheck, Target, check
from workbench.contracts.cli import add_parser, main
from workbench.contracts.results import (
    CHANGED_DEFAULT,
    DROPPED_VARARGS,
    DROPPED_VARKW,
    KIND_CHANGED,
    KINDS,
    MISSING,
    NEW_REQUIRED,
    RENAMED,
    REORDERED,
    Contract,
    Finding,
    Report,
)
from workbench.contracts.signatures import CallSite, compare_signatures

__all__ = [
    "CHANGED_DEFAULT",
    "DEFAULT_BASE",
    "DEFAULT_TARGETS",
    "DROPPED_VARARGS",
    "DROPPED_VARKW",
    "KINDS",
    "KIND_CHANGED",
    "MISSING",
    "NEW_REQUIRED",
    "RENAMED",
    "REORDERED",
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
