"""The engines' own metadata code in the loop: sglang's and vLLM's released backends on a CPU.

As an oracle, :func:`~workbench.engines.oracle.compare` runs random batches of every mode through the
engine's code and through the workbench's profile and reports the first field that differs. As a subject,
:func:`~workbench.engines.subject.engine_backend` wraps the engine's backend class (or a user's modified copy
of it) as a :class:`~workbench.backends.MetadataBackend`, so :class:`~workbench.runner.GraphRunner` captures
and replays with the engine's own ``init_forward_metadata_out_graph(..., in_capture=True)``. ``workbench
engine-check`` is the command line.

Adapters exist per verified release (:data:`workbench.engine_versions.VERIFIED`, the one table;
``SUPPORTED`` is it), their classes in :data:`workbench.engines.registry.ADAPTERS`; each imports the installed
engine with the stand-ins of :mod:`~workbench.engines.standins` for device-only modules. ``make engines``
installs both engines beside the CPU torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from workbench.engines.versions import SUPPORTED, EngineError, check_supported, installed_version

if TYPE_CHECKING:
    from workbench.engines.base import EngineAdapter


def __getattr__(name: str) -> Any:
    if name == "EngineAdapter":  # the adapter base imports torch: only when asked for
        from workbench.engines.base import EngineAdapter

        return EngineAdapter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def adapter_class(engine: str) -> type[EngineAdapter]:
    """The adapter of the installed version of ``engine`` (:class:`EngineError` when there is none), from
    :data:`workbench.engines.registry.ADAPTERS` (imported here: the adapters import torch)."""
    version = check_supported(engine)
    from workbench.engines.registry import get_adapter

    return get_adapter(engine, version)


def installed_engines() -> list[str]:
    """The engines installed at a version an adapter exists for (read from their metadata: nothing imported)."""
    return [name for name, versions in SUPPORTED.items() if installed_version(name) in versions]


def prepare(adapter: type[EngineAdapter]) -> None:
    """Import the adapter's engine (its stand-ins installed): before loading a user's file that imports it."""
    load = getattr(importlib.import_module(adapter.__module__), "load", None)
    if callable(load):
        load()


__all__ = [
    "SUPPORTED",
    "EngineAdapter",
    "EngineError",
    "adapter_class",
    "check_supported",
    "installed_version",
    "prepare",
]
