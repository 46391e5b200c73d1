"""The engines layer's one error, in a module of its own so that the torch-free modules that raise it
(``identity``, ``probes``, ``versions``) import no one but ``workbench.errors``."""

from __future__ import annotations

from workbench.errors import WorkbenchError


class EngineError(WorkbenchError, RuntimeError):
    """The engine is not installed, lacks a capability its adapter probes for, or a stand-in it needs is
    missing."""


__all__ = ["EngineError"]
