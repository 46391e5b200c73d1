"""The engine releases the workbench is verified on: one table, without torch.

:data:`VERIFIED` names, per engine, the released versions whose own metadata code ``workbench.engines`` runs
(an adapter each: ``workbench.engines.registry.ADAPTERS``) and compared bitwise with the engine's profiles
(``make test-engines``). Whatever names a supported release reads it: the adapters' registry and its loaders
(``workbench.engines.check_supported``), ``workbench engine-check``, the widgets' engine choices, the
profiles' ``checked_against`` text and a trace header's engine note (``workbench.traces.model.engine_note``).
It imports nothing, so a command's ``--help`` and the trace reader read it without torch or an engine.

Adding a release is one more version here, in the order the engine released them, and its adapter class in
``workbench.engines.registry`` (an older one: a table entry of ``workbench.engines.releases``). An engine at
another version (a clone, a nightly) runs on the newest adapter once its probes pass, reported unverified.

    >>> VERIFIED["sglang"], verified_versions("vllm")[-1], verified_versions("tgi")
    (('0.5.21', '0.5.22', '0.5.23'), '0.33.0', ())
    >>> releases("sglang"), releases("vllm", "vLLM")
    ('sglang 0.5.21, 0.5.22, 0.5.23', 'vLLM 0.31.0, 0.32.0, 0.33.0')
"""

from __future__ import annotations

VERIFIED: dict[str, tuple[str, ...]] = {
    "sglang": ("0.5.21", "0.5.22", "0.5.23"),
    "vllm": ("0.31.0", "0.32.0", "0.33.0"),
}
"""Engine -> the released versions an adapter exists for and is verified on, oldest first."""

ENGINE_NAMES: tuple[str, ...] = tuple(VERIFIED)
"""The engines the workbench has adapters for: a trace header's ``engine.name``, ``engine-check``'s choices."""


def verified_versions(engine: str) -> tuple[str, ...]:
    """The verified releases of ``engine``, oldest first (``()`` for an engine without an adapter)."""
    return VERIFIED.get(engine, ())


def releases(engine: str, label: str | None = None) -> str:
    """``"sglang 0.5.23"``: the engine (spelled ``label`` when given) and its verified versions, comma-joined."""
    return f"{label or engine} {', '.join(verified_versions(engine))}"


__all__ = ["ENGINE_NAMES", "VERIFIED", "releases", "verified_versions"]
