"""A zoo case: a known production bug, runnable unfixed and fixed on the workbench's own machinery."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from workbench.zoo.result import Evidence, ZooError, ZooResult

RunFn = Callable[[bool, str], Sequence[Evidence]]


@dataclass(frozen=True)
class ZooCase:
    """One bug of the zoo.

    Attributes:
        name: short id (``workbench zoo NAME``); title: one line; issue: the public reference.
        profile: the engine conventions the case runs under ("sglang", "sglang-ascend", "vllm").
        explanation: the mechanism, what the engine did, the fix (one paragraph).
    """

    name: str
    title: str
    issue: str
    profile: str
    explanation: str
    run_fn: RunFn = field(repr=False, compare=False)

    def run(self, fixed: bool, *, backend: str = "auto") -> ZooResult:
        """Run the unfixed (``fixed=False``) or the fixed variant and return what it produced.

        ``backend``: "auto" or "cpu" (the CPU recorder), "cuda" or "npu" (that device's graphs; not run on
        a device in this repository's tests).
        """
        if not isinstance(fixed, bool):
            raise ZooError(f"fixed: expected a bool, got {fixed!r}")
        evidence = tuple(self.run_fn(fixed, backend))
        if not evidence:
            raise ZooError(f"case {self.name!r} produced no evidence (a case must be able to fail)")
        return ZooResult(self.name, self.issue, fixed, evidence, self.explanation)
