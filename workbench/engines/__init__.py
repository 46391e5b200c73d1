"""The engines' own metadata code in the loop: sglang's and vLLM's released backends on a CPU.

As an oracle, :func:`~workbench.engines.oracle.compare` runs random batches of every mode through the
engine's code and through the workbench's profile and reports the first field that differs. As a subject,
:func:`~workbench.engines.subject.engine_backend` wraps the engine's backend class (or a user's modified copy
of it) as a :class:`~workbench.backends.MetadataBackend`, so :class:`~workbench.runner.GraphRunner` captures
and replays with the engine's own ``init_forward_metadata_out_graph(..., in_capture=True)``. ``workbench
engine-check`` is the command line.

Adapters exist per verified release (:data:`workbench.engine_versions.VERIFIED`, the one table;
``SUPPORTED`` is it), their classes in :data:`workbench.engines.registry.ADAPTERS`; each imports the engine
(installed, or a source tree: :mod:`~workbench.engines.identity`) with the stand-ins of
:mod:`~workbench.engines.standins` for device-only modules and runs its capability probes
(:mod:`~workbench.engines.probes`) before any batch. ``make engines`` installs both engines beside the CPU
torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from workbench.engines.versions import SUPPORTED, EngineError, check_supported, installed_version

if TYPE_CHECKING:
    from workbench.engines.base import EngineAdapter
    from workbench.engines.identity import EngineIdentity


def __getattr__(name: str) -> Any:
    if name == "EngineAdapter":  # the adapter base imports torch: only when asked for
        from workbench.engines.base import EngineAdapter

        return EngineAdapter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def adapter_class(engine: str) -> type[EngineAdapter]:
    """The adapter for the ``engine`` this process uses (:func:`~workbench.engines.identity.identify`: a tree
    chosen with ``--engine-root``, else the installed one): a verified release's own, else the newest, whose
    probes then judge the engine when it loads; :class:`EngineError` when the engine is not there. From
    :data:`workbench.engines.registry.ADAPTERS` (imported here: the adapters import torch)."""
    from workbench.engines.identity import identify
    from workbench.engines.registry import adapter_for

    return adapter_for(identify(engine))


def engine_identity(adapter: type[EngineAdapter]) -> EngineIdentity:
    """What engine ``adapter`` runs on, once its probes passed: the engine loaded (:func:`prepare`), its
    identity with the adapter's release and ``probes="passed"``."""
    from workbench.engines.identity import identify

    prepare(adapter)
    return identify(adapter.engine).with_(adapter=adapter.version, probes="passed")


def installed_engines() -> list[str]:
    """The engines installed at a verified release (read from their metadata: nothing imported)."""
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
    "engine_identity",
    "installed_version",
    "prepare",
]
