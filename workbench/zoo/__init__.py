"""The bug zoo: real production bugs of linear-attention serving, switched on, watched, and fixed.

Each case reproduces one public bug's mechanism with the workbench's own pieces (metadata backends, the
graph runner, the kernels, the CPU recorder, the integrity check; for the bugs that need several steps, a
scripted serving trace replayed against the float64 shadow of every request) and runs it unfixed and
fixed::

    from workbench import zoo
    for broken, fixed in zoo.run_all():
        print(broken.case, broken.summary, "|", fixed.summary)
    zoo.get("in_capture").run(fixed=False).evidence

A case that cannot fail would be a defect: ``ZooResult.broken`` is computed from what the run produced.

Cases whose scenario exercises a metadata backend or a kernel also run against the user's own::

    zoo.check_backend("my_backend.py:AscendBackend")      # every metadata-backend case; a ZooChecks list
    zoo.get("in_capture").run_with(MyBackend)             # one case: status reproduced | clean | ...
    zoo.check_kernel("my_kernels.py:conv_update")         # the kernel cases (uninit_pad)
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.zoo.case import ZooCase, family_profile
from workbench.zoo.check import ZooChecks, check_backend, check_kernel
from workbench.zoo.registry import MODULES, cases, get, names
from workbench.zoo.result import (
    STATUSES,
    AddressMismatch,
    Evidence,
    IntegrityEvidence,
    Interrupted,
    Propagation,
    RaisedError,
    RecorderError,
    RowsDiffer,
    Survived,
    TraceEvidence,
    ZooError,
    ZooResult,
)


def run_all(names: Sequence[str] | None = None, *, backend: str = "auto") -> list[tuple[ZooResult, ZooResult]]:
    """Run each case (all, or those named) unfixed then fixed: ``[(broken run, fixed run), ...]``."""
    chosen = cases() if names is None else [get(n) for n in names]
    return [(c.run(False, backend=backend), c.run(True, backend=backend)) for c in chosen]


__all__ = [
    "STATUSES",
    "AddressMismatch",
    "ZooCase",
    "ZooChecks",
    "Evidence",
    "IntegrityEvidence",
    "Interrupted",
    "Propagation",
    "RaisedError",
    "RecorderError",
    "RowsDiffer",
    "Survived",
    "TraceEvidence",
    "ZooError",
    "ZooResult",
    "MODULES",
    "cases",
    "check_backend",
    "check_kernel",
    "family_profile",
    "get",
    "names",
    "run_all",
]
