"""The engine adapters, one per verified release: ``ADAPTERS[engine][version]`` is its adapter class.

The releases are :data:`workbench.engine_versions.VERIFIED`'s (the one table, torch-free); this module holds
their classes (each says its ``engine`` and ``version``) and refuses, on import, a verified release without
a class or a class of a release the table does not name. Importing it imports the adapter modules (torch,
no engine: each imports its engine in ``load()``); ``workbench.engines.adapter_class`` imports it only when
asked for an adapter.

Adding an older release: its version in ``VERIFIED`` and an entry in ``releases.RELEASES``; a new newest
release that the probes pass on: its version in ``VERIFIED`` and a :class:`~workbench.engines.releases.Release`
for the one it replaces, or a new adapter module when the engine changed under the probes.

    >>> get_adapter("sglang").version, get_adapter("vllm", "0.31.0").engine
    ('0.5.23', 'vllm')
    >>> {engine: list(by_version) for engine, by_version in ADAPTERS.items()}
    {'sglang': ['0.5.21', '0.5.22', '0.5.23'], 'vllm': ['0.31.0', '0.32.0', '0.33.0']}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from workbench.engine_versions import VERIFIED
from workbench.engines import releases, sglang_0_5_23, vllm_0_33_0
from workbench.engines.base import EngineAdapter
from workbench.engines.identity import EngineIdentity
from workbench.engines.versions import EngineError

_CLASSES: tuple[type[EngineAdapter], ...] = (*releases.CLASSES, sglang_0_5_23.Adapter, vllm_0_33_0.Adapter)
"""Every adapter class, one per verified release: the newest of each engine, and the older ones as tables over
it (:mod:`workbench.engines.releases`)."""


def build_registry(
    classes: Iterable[type[EngineAdapter]], verified: Mapping[str, tuple[str, ...]] = VERIFIED
) -> dict[str, dict[str, type[EngineAdapter]]]:
    """``{engine: {version: class}}`` in ``verified``'s order; ``RuntimeError`` naming the release when a
    verified release has no class, two classes claim one, or a class's release is not verified."""
    by_release: dict[tuple[str, str], type[EngineAdapter]] = {}
    for cls in classes:
        release = (cls.engine, cls.version)
        if release in by_release:
            raise RuntimeError(f"{cls.engine} {cls.version}: two adapters, {by_release[release]} and {cls}")
        if cls.version not in verified.get(cls.engine, ()):
            raise RuntimeError(f"{cls.engine} {cls.version}: {cls} is for a release VERIFIED does not name")
        by_release[release] = cls
    missing = [f"{e} {v}" for e, versions in verified.items() for v in versions if (e, v) not in by_release]
    if missing:
        raise RuntimeError(f"{', '.join(missing)}: verified, but no adapter class is registered")
    return {e: {v: by_release[(e, v)] for v in versions} for e, versions in verified.items()}


ADAPTERS: dict[str, dict[str, type[EngineAdapter]]] = build_registry(_CLASSES)
"""Engine -> verified version (oldest first) -> its adapter class."""


def adapter_for(ident: EngineIdentity) -> type[EngineAdapter]:
    """The adapter for the engine ``ident`` names: its verified release's own, else the engine's newest (an
    unverified build, a source tree: the adapter's probes judge it when it loads)."""
    return get_adapter(ident.name, ident.version if ident.verified else None)


def get_adapter(engine: str, version: str | None = None) -> type[EngineAdapter]:
    """The adapter class of ``engine`` at ``version`` (default: its newest verified release), whether or not
    that engine is installed (:func:`workbench.engines.adapter_class` takes the installed one);
    :class:`EngineError` in one line naming what exists otherwise."""
    if engine not in ADAPTERS:
        raise EngineError(f"engine: {engine!r} is not one of {tuple(ADAPTERS)}")
    by_version = ADAPTERS[engine]
    if version is None:
        return by_version[next(reversed(by_version))]
    if version not in by_version:
        raise EngineError(f"{engine} {version} has no adapter; verified: {engine} {', '.join(by_version)}")
    return by_version[version]


__all__ = ["ADAPTERS", "adapter_for", "build_registry", "get_adapter"]
