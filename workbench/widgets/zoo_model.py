"""The model behind ``BugZoo``: run one known bug unfixed and fixed, side by side (plain Python)."""

from __future__ import annotations

from typing import Any

from workbench.errors import WorkbenchError


class ZooModel:
    """Pick a case of ``workbench.zoo`` and run both variants; ``error`` in words instead of raising."""

    def __init__(self, backend: str = "auto") -> None:
        from workbench import zoo

        self._zoo = zoo
        self.backend = backend
        self.error: str | None = None
        self.last: tuple[Any, Any] | None = None

    def names(self) -> list[str]:
        return [c.name for c in self._zoo.cases()]

    def titles(self) -> list[tuple[str, str]]:
        """``(label, name)`` for a dropdown."""
        return [(f"{c.name}: {c.title}", c.name) for c in self._zoo.cases()]

    def case(self, name: str) -> Any:
        return self._zoo.get(name)

    def run(self, name: str) -> tuple[Any, Any] | None:
        """``(unfixed, fixed)`` ZooResults of case ``name``."""
        self.error = None
        try:
            case = self._zoo.get(name)
            pair = (case.run(False, backend=self.backend), case.run(True, backend=self.backend))
        except (WorkbenchError, ValueError, RuntimeError) as e:
            self.error = str(e)
            return None
        self.last = pair
        return pair
