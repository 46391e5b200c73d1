"""The model behind ``BugZoo``: run one known bug unfixed and fixed, side by side (its evidence as a figure),
and run the zoo's cases against the user's own metadata backend (plain Python)."""

from __future__ import annotations

from typing import Any

from workbench.errors import WorkbenchError

SPEC_HINT = "enter MODULE_OR_FILE:CLASS, e.g. my_backend.py:AscendBackend"


class ZooModel:
    """Pick a case of ``workbench.zoo`` and run both variants, or check a backend class against every case;
    ``error`` in words instead of raising.

    Attributes: ``backend`` (the graph backend the cases run on), ``last`` (the last pair of runs; its
    evidence drawn by :meth:`figure`),
    ``backend_spec`` (the user's ``MODULE_OR_FILE:CLASS``) and ``checks`` (its ``ZooChecks``, None when
    there is none for the spec as it stands).
    """

    def __init__(self, backend: str = "auto") -> None:
        from workbench import zoo

        self._zoo = zoo
        self.backend = backend
        self.error: str | None = None
        self.last: tuple[Any, Any] | None = None
        self.backend_spec = ""
        self.checks: Any = None

    def names(self) -> list[str]:
        return [c.name for c in self._zoo.cases()]

    def titles(self) -> list[tuple[str, str]]:
        """``(label, name)`` for a dropdown."""
        return [(f"{c.name}: {c.title}", c.name) for c in self._zoo.cases()]

    def case(self, name: str) -> Any:
        return self._zoo.get(name)

    def run(self, name: str) -> tuple[Any, Any] | None:
        """``(unfixed, fixed)`` ZooResults of case ``name`` (None, and ``last`` cleared, on an error)."""
        self.error = None
        self.last = None
        try:
            case = self._zoo.get(name)
            pair = (case.run(False, backend=self.backend), case.run(True, backend=self.backend))
        except (WorkbenchError, ValueError, RuntimeError) as e:
            self.error = str(e)
            return None
        self.last = pair
        return pair

    def panels(self) -> list[Any]:
        """What the last run's figure draws (``viz.zoo.evidence_panels``: a row per kind of evidence, each
        with the broken and the fixed run's); empty before a run or after a failed one."""
        from workbench.viz.zoo import evidence_panels

        return evidence_panels(*self.last) if self.last is not None else []

    def figure(self) -> Any:
        """The last run's evidence, broken beside fixed (``viz.zoo_evidence``: the padding map of the metadata
        the graph ran with, the slots each step wrote, the NaN rows, or a trace's slot timeline); None before
        a run or after a failed one."""
        from workbench.viz.zoo import zoo_evidence

        return zoo_evidence(*self.last) if self.last is not None else None

    def set_backend_spec(self, spec: str) -> None:
        """A new spec: the checks of the previous one no longer describe it, so they are dropped."""
        if spec.strip() != self.backend_spec:
            self.backend_spec = spec.strip()
            self.checks = None

    def check_backend(self, spec: str | None = None) -> Any:
        """``zoo.check_backend`` of ``spec`` (default: ``backend_spec``): a ``ZooChecks``, or None with
        ``error`` saying why (an empty spec, a file or name that does not load, not a backend class)."""
        if spec is not None:
            self.set_backend_spec(spec)
        self.error = None
        self.checks = None
        if not self.backend_spec:
            self.error = f"your backend: {SPEC_HINT}"
            return None
        try:
            checks = self._zoo.check_backend(self.backend_spec, backend=self.backend)
        except (WorkbenchError, ValueError, RuntimeError) as e:
            self.error = f"your backend: {e}"
            return None
        self.checks = checks
        return checks

    def check_rows(self) -> list[dict[str, str]]:
        """One row per case of the last check: case, issue, status, evidence (empty without a check)."""
        if self.checks is None:
            return []
        return [{"case": r.case, "issue": r.issue, "status": r.status, "evidence": r.summary} for r in self.checks]
