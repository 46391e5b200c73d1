"""Hooks on an engine's live objects, set on the instances (never on their classes) and put back on detach:
what both recorders (``vllm_recorder``, ``sglang_recorder``) attach with. Imports no engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def patch(obj: Any, name: str, new: Any) -> Callable[[], None]:
    """Set ``obj.name = new`` on the instance; returns the function that puts back what was there."""
    own = name in vars(obj)
    old = vars(obj).get(name)
    setattr(obj, name, new)

    def restore() -> None:
        if own:
            setattr(obj, name, old)
        else:
            delattr(obj, name)

    return restore


class Hooked:
    """A recorder's life on an engine's instances: ``active`` while attached, ``_restore`` the functions
    :func:`patch` returned, undone in reverse by :meth:`detach`; :meth:`failed` and :meth:`written` are what a
    live dumper overrides."""

    active: bool = False
    _restore: list[Callable[[], None]]

    def detach(self) -> None:
        """Put back what was wrapped (in reverse order); the recorder stops."""
        self.active = False
        for restore in reversed(self._restore):
            restore()
        self._restore = []

    def failed(self, error: Exception) -> None:
        """An error while recording a step: raised (the driver's rule; the dumper overrides)."""
        raise error

    def written(self) -> None:
        """Called after steps reached the trace (the dumper writes the final ones)."""


__all__ = ["Hooked", "patch"]
