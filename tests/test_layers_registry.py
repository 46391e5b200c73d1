"""The layer registry (``workbench.layers.LAYERS``): every entry runs, every consumer offers the same names, and
no product file outside the registry spells a layer's name to decide what to do."""

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench import Batch, StatePool, WorkbenchError
from workbench.batch import MODES
from workbench.layer_names import DEFAULT_LAYER, GDN, LAYER_NAMES, MAMBA2, PRESET_NAMES
from workbench.layers import (
    LAYERS,
    GatedDeltaNetLayer,
    GDNConfig,
    LayerError,
    LayerSpec,
    Mamba2Config,
    Mamba2Layer,
    get_layer_spec,
    make_layer,
)
from workbench.runner import GraphRunner

ROOT = Path(__file__).resolve().parents[1]
SPECS = list(LAYERS.values())
IDS = list(LAYERS)


# -- the entries ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_every_entry_captures_and_replays_a_clean_decode_step_on_its_small_preset(spec):
    layer = make_layer(spec.name, seed=1, impl="reference")
    assert type(layer) is spec.layer_class and isinstance(layer.config, spec.config_class)
    runner = GraphRunner(layer, StatePool(8, "sglang"), buckets=[1, 2, 4], modes=["decode"], state_seed=1)
    runner.capture(progress=False)
    rows = runner.pool.alloc(3)
    cmp = runner.compare(Batch.decode(rows, [3, 5, 7]), torch.randn(3, layer.config.hidden_size))
    assert cmp.replayed and cmp.bucket == 4 and cmp.integrity.ok and cmp.bitwise_equal


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_an_entry_reads_its_facts_from_its_class(spec):
    cls = spec.layer_class
    assert spec.name in LAYERS and LAYERS[spec.name] is spec and spec.title
    assert spec.config_class is cls.config_class and spec.supported_modes == cls.supported_modes
    assert set(spec.supported_modes) <= set(MODES) and "decode" in spec.supported_modes
    assert spec.chunk_grid == cls.chunk_grid and spec.chunk_grid in ("sequence", "batch")
    assert "small" in spec.presets and set(spec.presets) <= set(PRESET_NAMES)
    for preset in spec.presets:
        cfg = spec.config(preset)
        assert isinstance(cfg, spec.config_class) and cfg == spec.config(preset)  # a fresh, equal config
        assert spec.slot_elements(preset) == spec.slot_elements(cfg) > 0
        assert spec.token_macs(preset) == cls.token_macs(cfg) > 0
    # the registry's slot size is the size of a real pool's slot
    state = make_layer(spec.name).new_state(3)
    assert spec.slot_elements("small") == sum(t[0].numel() for t in state.tensors().values())
    assert spec.state_shapes("small", 3) == tuple(tuple(t.shape) for t in state.tensors().values())


def test_the_presets_are_the_constructors_they_replace():
    gdn, mamba2 = LAYERS[GDN], LAYERS[MAMBA2]
    assert (gdn.layer_class, mamba2.layer_class) == (GatedDeltaNetLayer, Mamba2Layer)
    assert gdn.config("small") == GDNConfig.small() and gdn.config("engine") == GDNConfig()
    assert gdn.config("quarter") == GDNConfig(hidden_size=1024, num_v_heads=8, num_k_heads=4)
    assert mamba2.config("small") == Mamba2Config.small() and mamba2.config("engine") == Mamba2Config()
    assert mamba2.config("quarter") == Mamba2Config(hidden_size=1024, num_heads=16, n_groups=2)
    assert (gdn.chunk_grid, mamba2.chunk_grid) == ("sequence", "batch")


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_make_layer_is_the_seeded_constructor(spec):
    want = spec.layer_class(spec.config_class.small(), seed=0)
    got = make_layer(spec.name)
    assert got.config == want.config and got.seed == 0 and got.impl == "auto"
    assert all(torch.equal(got.weights[k], want.weights[k]) for k in want.weights)
    other = make_layer(spec.name, "small", 3, dtype=torch.float64, impl="reference")
    assert other.seed == 3 and other.dtype == torch.float64 and other.impl == "reference"
    assert get_layer_spec(spec) is spec  # an entry passes through


def test_the_simulators_conv_window_holds_for_every_layer():
    from workbench.traces.simulate import CONV_WINDOW

    assert {spec.config("small").conv_kernel - 1 for spec in SPECS} == {CONV_WINDOW}


# -- one vocabulary ------------------------------------------------------------------------------------------
def test_names_match_the_torch_free_tuple_the_clis_and_the_schema():
    from workbench.engines.cli import configure as engine_configure
    from workbench.traces import format as fmt
    from workbench.traces.cli import configure as trace_configure
    from workbench.widgets import lab_plan, timeline_model

    assert tuple(LAYERS) == LAYER_NAMES and DEFAULT_LAYER in LAYERS
    assert all(isinstance(spec, LayerSpec) and spec.name == name for name, spec in LAYERS.items())
    trace = trace_configure(argparse.ArgumentParser())
    (run,) = [a.choices["run"] for a in trace._actions if isinstance(a.choices, dict)]
    engine = engine_configure(argparse.ArgumentParser())
    for parser in (run, engine):
        (layer,) = [a for a in parser._actions if "--layer" in a.option_strings]
        assert tuple(layer.choices) == LAYER_NAMES and layer.default == DEFAULT_LAYER
    schema = json.loads((ROOT / "docs" / "trace.schema.json").read_text())
    assert tuple(schema["$defs"]["header"]["properties"]["layer"]["enum"]) == LAYER_NAMES
    assert fmt.LAYERS == lab_plan.LAYERS == timeline_model.LAYERS == LAYER_NAMES


def test_the_presets_are_one_vocabulary():
    from workbench.sweeps.common import PRESET_NAMES as SWEEP_PRESETS
    from workbench.sweeps.replay import PRESETS

    assert SWEEP_PRESETS == PRESET_NAMES == tuple(PRESETS)
    for preset, configs in PRESETS.items():
        assert configs == {name: spec.config(preset) for name, spec in LAYERS.items() if preset in spec.presets}


def test_the_command_lines_offer_the_layers_without_torch():
    code = (
        "import sys, contextlib, io\n"
        "import workbench.cli as cli, workbench.traces.format, workbench.layer_names\n"
        "for argv in (['trace', 'run', '--help'], ['engine-check', '--help'], ['trace', 'run', '--layer', 'x']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            cli.main(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "print(sorted(m for m in ('torch', 'workbench.layers') if m in sys.modules))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


# -- refusals ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mamba", "GDN", "", None, 3, ["gdn"]])
def test_an_unknown_layer_is_one_line_naming_the_choices(name):
    with pytest.raises(LayerError) as info:
        get_layer_spec(name)
    assert isinstance(info.value, WorkbenchError)
    assert str(info.value) == f"layer: {name!r} is not one of ('gdn', 'mamba2', 'kda')"
    with pytest.raises(LayerError, match=r"^layer: .* is not one of \('gdn', 'mamba2', 'kda'\)$"):
        make_layer(name)


@pytest.mark.parametrize("preset", ["huge", "Small", None, ["small"]])
def test_an_unknown_preset_is_one_line_naming_the_layers_presets(preset):
    with pytest.raises(LayerError) as info:
        make_layer(GDN, preset)
    assert str(info.value) == f"preset: {preset!r} is not one of ('small', 'quarter', 'engine') for layer 'gdn'"
    assert "\n" not in str(info.value)


# -- no layer spelled outside the registry -------------------------------------------------------------------
ALLOWED = {"workbench/layers.py", "workbench/layer_names.py"}
PENDING: set[str] = set()
"""Files whose layer names await another change (``replay.make_layer`` -> ``workbench.layers.make_layer``);
drop an entry once its file reads the registry (``test_pending_files_still_need_their_entry`` says when)."""


def _spelled(source: str) -> list[int]:
    """The lines of every string constant equal to a layer's name (a comparison, a default, a dict key, an
    argument), documentation aside: a bare string statement (docstrings, attribute docs), comments, and text
    that only contains a name (an example command line: ``--layer mamba2``)."""
    tree = ast.parse(source)
    docs = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in LAYER_NAMES and id(node) not in docs
    ]


def test_the_search_sees_code_and_skips_documentation():
    source = (
        '"""A module about "gdn"."""\n'
        'DEFAULT = "gdn"  # "mamba2"\n'
        '"mamba2"\n'
        'EXAMPLE = "workbench trace run --layer mamba2"\n'
        "def f(layer):\n"
        '    """layer: "gdn" or "mamba2"."""\n'
        '    return layer == "mamba2" or layer in ("gdn", "mamba2") or {"gdn": 1}\n'
    )
    assert _spelled(source) == [2, 7, 7, 7, 7]


@pytest.mark.slow  # scans every source file
def test_no_product_file_outside_the_registry_spells_a_layers_name():
    found = [
        f"{rel}:{line}"
        for path in sorted((ROOT / "workbench").rglob("*.py"))
        if (rel := path.relative_to(ROOT).as_posix()) not in ALLOWED | PENDING
        for line in _spelled(path.read_text())
    ]
    assert not found, f"read workbench.layers.LAYERS (or layer_names.GDN / MAMBA2) instead: {found}"


def test_pending_files_still_need_their_entry():
    for rel in PENDING:
        assert _spelled((ROOT / rel).read_text()), f"{rel} spells no layer name any more: drop it from PENDING"
