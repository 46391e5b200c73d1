"""The layer contract itself: `workbench.cli` alone on top, the other entry points independent of each other,
no optional (parenthesised) module that exists, and one preset vocabulary below them (workbench.sweeps)."""

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
ENTRY_POINTS = {"workbench.demo", "workbench.bench", "workbench.contracts", "workbench.report", "workbench.widgets"}


def _modules(layer: str) -> list[str]:
    return [m.strip() for m in re.split(r"[:|]", layer)]


def test_cli_dispatches_and_the_other_entry_points_are_independent():
    assert LAYERS[0] == "workbench.cli"
    second = LAYERS[1]
    assert ":" not in second and set(_modules(second)) == ENTRY_POINTS  # "|": none may import another
    assert LAYERS[2:4] == ["workbench.sweeps", "workbench.viz"]


def test_an_optional_layer_names_only_a_module_that_does_not_exist_yet():
    """A parenthesised module that exists would have its checks silently skipped were it ever misspelled."""
    optional = [m.strip("()") for layer in LAYERS for m in _modules(layer) if m.startswith("(")]
    existing = [name for name in optional if importlib.util.find_spec(name) is not None]
    assert not existing, f"{existing} exist: drop their parentheses in pyproject.toml"


def test_one_preset_vocabulary():
    from workbench.sweeps.common import PRESET_NAMES
    from workbench.sweeps.replay import PRESETS
    from workbench.widgets.lab_model import PRESETS as LAB_PRESETS

    assert PRESET_NAMES == ("small", "quarter", "engine") and tuple(PRESETS) == PRESET_NAMES
    assert set(LAB_PRESETS) <= set(PRESET_NAMES)
    quarter, engine = PRESETS["quarter"]["gdn"], PRESETS["engine"]["gdn"]
    assert 4 * quarter.num_v_heads == engine.num_v_heads  # a quarter of the engine layer's value heads


def test_recorded_impl_is_the_kernels_own_rule():
    import torch

    from kernels.dispatch import resolve_impl
    from workbench.sweeps.common import recorded_impl

    assert recorded_impl("auto", "cpu") == resolve_impl("auto", torch.device("cpu")) == "reference"
    assert recorded_impl("reference", "cuda") == "reference"
    with pytest.raises(ValueError, match="impl must be one of"):
        recorded_impl("fast", "cpu")
