"""Which engine versions are verified, and which is installed: read from distribution metadata, so that
``workbench engine-check --help`` and the widgets' engine choices import neither torch nor an engine.

The versions are :data:`workbench.engine_versions.VERIFIED`'s, the one table (``SUPPORTED`` is that table).
An engine at another version (a source checkout, a nightly) runs too, judged by its adapter's probes
(``workbench.engines.probes``); ``workbench.engines.identity`` says what it is."""

from __future__ import annotations

import importlib.metadata

from workbench.engine_versions import VERIFIED
from workbench.engines.errors import EngineError

SUPPORTED: dict[str, tuple[str, ...]] = VERIFIED
"""Engine -> the released versions an adapter exists for: :data:`workbench.engine_versions.VERIFIED` itself."""


def installed_version(engine: str) -> str | None:
    """The installed distribution's version (read from its metadata: the engine is not imported)."""
    try:
        return importlib.metadata.version(engine)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_supported(engine: str) -> str:
    """The version of ``engine`` this process uses (a tree chosen with ``--engine-root``, else the installed
    distribution), or :class:`EngineError` in one line when it is not there. Any version passes: an engine
    that is not a verified release is judged by its adapter's probes when the adapter loads it
    (``workbench.engines.probes``)."""
    from workbench.engines.identity import identify

    return identify(engine).version


__all__ = ["SUPPORTED", "EngineError", "check_supported", "installed_version"]
