"""The verified releases before each engine's newest: each a small table over the newest adapter, not a copy.

Between sglang 0.5.21 and 0.5.23, and vLLM 0.31.0 and 0.33.0, what the adapters touch barely moved: the hook
and builder signatures, the metadata fields read and the config leaves stood in are the same in all six
releases (their probes pass on each). The two differences are capability switches in the newest adapters'
``load()``, chosen by what the engine has rather than by its version string, so a source tree between two
releases gets the right one too:

- sglang before 0.5.22 has no ``select_verify_intermediate_state_indices``: the adapter reads the verify
  intermediate rows as the backend's table itself, as 0.5.21's GDN backend does;
- vLLM 0.32.0 answers ``vllm.utils.torch_utils.PIN_MEMORY`` lazily and its helpers ask
  ``is_pin_memory_available()`` themselves: the post-import fix answers False there too.

So an older release is its version, the adapter it runs on and what a reader should know of it
(:data:`RELEASES`); :data:`CLASSES` are the registry's classes for them. ``make test-engines-matrix`` runs
``engine-check`` on each (``workbench.engines.matrix``).
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.engines import sglang_0_5_23, vllm_0_33_0
from workbench.engines.base import EngineAdapter


@dataclass(frozen=True)
class Release:
    """A verified release that runs on a newer release's adapter: ``base`` that adapter's class, ``notes``
    what differs in the engine (the adapter's switches, behaviour its batches do not reach)."""

    engine: str
    version: str
    base: type[EngineAdapter]
    notes: str


RELEASES: tuple[Release, ...] = (
    Release(
        "sglang",
        "0.5.21",
        sglang_0_5_23.Adapter,
        "no select_verify_intermediate_state_indices (0.5.22 added it, linear/utils.py): the verify intermediate "
        "rows are the backend's table, as 0.5.21's gdn_backend.py reads them",
    ),
    Release("sglang", "0.5.22", sglang_0_5_23.Adapter, "nothing the adapter touches differs from 0.5.23"),
    Release(
        "vllm",
        "0.31.0",
        vllm_0_33_0.Adapter,
        "GDN leaves the speculative path when every spec row of a step drafted nothing (gdn_attn.py:255-262; "
        "0.32 keeps it); the adapter's verify rows always carry D - 1 drafts, so engine-check does not reach it",
    ),
    Release(
        "vllm",
        "0.32.0",
        vllm_0_33_0.Adapter,
        "torch_utils answers PIN_MEMORY lazily and its helpers call is_pin_memory_available() themselves "
        "(torch_utils.py:77-83, 729-749): the post-import fix answers False there",
    ),
)
"""The verified releases older than each engine's newest, oldest first per engine."""


def release_class(release: Release) -> type[EngineAdapter]:
    """The registry's class for ``release``: its base adapter with its ``version`` and ``release_notes``."""
    suffix = release.version.replace(".", "_")
    return type(
        f"Adapter_{suffix}",
        (release.base,),
        {"version": release.version, "release_notes": release.notes, "__module__": __name__},
    )


CLASSES: tuple[type[EngineAdapter], ...] = tuple(release_class(r) for r in RELEASES)
"""One adapter class per release of :data:`RELEASES`."""

__all__ = ["CLASSES", "RELEASES", "Release", "release_class"]
