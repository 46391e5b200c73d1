"""What every sweep shares: the names of the shape presets and the implementation a record names.

Presets, one vocabulary across the workbench (the sweeps, the bench, the CPU lab, the dashboard), named in
``workbench.layer_names.PRESET_NAMES`` (each layer's configs: ``workbench.layers.LAYERS[name].presets``):

- ``"small"``: the test layer (``GDNConfig.small()``), seconds on a CPU;
- ``"quarter"``: a quarter-width engine layer (``GDNConfig.quarter()``), whose state pool still fits a CPU bench
  in a minute;
- ``"engine"``: engine-like (``GDNConfig.engine()``, Qwen3-Next-sized), for a GPU.

    >>> recorded_impl("auto", "cpu")
    'reference'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kernels.dispatch import resolve_impl
from workbench.layer_names import PRESET_NAMES as PRESET_NAMES  # re-exported: the sweeps' vocabulary
from workbench.measure.timing import TimingError


def recorded_impl(impl: str, device: str) -> str:
    """The implementation ``impl`` runs as on ``device``, for the record ("reference" | "triton"): the
    kernels' own rule (:func:`kernels.dispatch.resolve_impl`), so "auto" names what really ran."""
    return resolve_impl(impl, torch.device(device))


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    """Raise ``TimingError`` (a ValueError) naming ``name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise TimingError(f"{name}: expected one of {list(choices)}, got {value!r}")
