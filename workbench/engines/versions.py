"""Which engine versions have an adapter, and which is installed: read from distribution metadata, so that
``workbench engine-check --help`` and the widgets' engine choices import neither torch nor an engine.

The versions are :data:`workbench.engine_versions.VERIFIED`'s, the one table (``SUPPORTED`` is that table)."""

from __future__ import annotations

import importlib.metadata

from workbench.engine_versions import VERIFIED
from workbench.errors import WorkbenchError

SUPPORTED: dict[str, tuple[str, ...]] = VERIFIED
"""Engine -> the released versions an adapter exists for: :data:`workbench.engine_versions.VERIFIED` itself."""


class EngineError(WorkbenchError, RuntimeError):
    """The engine is not installed, its version has no adapter, or a stand-in it needs is missing."""


def installed_version(engine: str) -> str | None:
    """The installed distribution's version (read from its metadata: the engine is not imported)."""
    try:
        return importlib.metadata.version(engine)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_supported(engine: str) -> str:
    """The installed version of ``engine``, or :class:`EngineError` in one line that says what is supported."""
    if engine not in SUPPORTED:
        raise EngineError(f"engine: {engine!r} is not one of {tuple(SUPPORTED)}")
    version = installed_version(engine)
    supported = ", ".join(SUPPORTED[engine])
    if version is None:
        raise EngineError(
            f"{engine} is not installed; supported: {engine} {supported} (make engines installs them, CPU torch kept)"
        )
    if version not in SUPPORTED[engine]:
        raise EngineError(f"{engine} {version} is installed; supported: {engine} {supported}")
    return version
