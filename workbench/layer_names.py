"""The layers' names and the presets' names, without torch: what a command line offers before it parses.

``LAYER_NAMES`` are the keys of :data:`workbench.layers.LAYERS` (the registry itself imports torch;
``tests/test_layers_registry.py`` holds the two equal), so ``workbench trace --help``, the trace reader and
every ``--layer`` flag name the layers without importing a tensor library. Code that needs a particular
layer names it through ``GDN``, ``MAMBA2`` or ``KDA``; code that works for any layer reads the registry.

    >>> LAYER_NAMES, DEFAULT_LAYER, PRESET_NAMES
    (('gdn', 'mamba2', 'kda'), 'gdn', ('small', 'quarter', 'engine'))
"""

from __future__ import annotations

GDN = "gdn"
"""Gated DeltaNet: ``workbench.layers.GatedDeltaNetLayer``."""

MAMBA2 = "mamba2"
"""Mamba2: ``workbench.layers.Mamba2Layer``."""

KDA = "kda"
"""Kimi Delta Attention (the gated delta rule with a per-key-channel gate): ``workbench.layers.KDALayer``."""

LAYER_NAMES: tuple[str, ...] = (GDN, MAMBA2, KDA)
"""Every layer's name, in the registry's order (``tuple(workbench.layers.LAYERS)``)."""

DEFAULT_LAYER = GDN
"""The layer a command, a sweep or a widget runs when none is named."""

PRESET_NAMES: tuple[str, ...] = ("small", "quarter", "engine")
"""The shape presets, one vocabulary across the workbench: ``"small"`` (tests, the Triton interpreter: seconds on
a CPU), ``"quarter"`` (a quarter-width engine layer whose state pool still fits a CPU bench), ``"engine"``
(engine-like, for a GPU). A layer's configs per preset: ``workbench.layers.LAYERS[name].presets``."""

__all__ = ["DEFAULT_LAYER", "GDN", "KDA", "LAYER_NAMES", "MAMBA2", "PRESET_NAMES"]
