"""Issue 31: a layer keeps its gated-delta-rule state in a layout (``state_layout``), the workbench builds it in
the profile's (``Profile.state_layout``), and the layouts give the same steps, states transposed."""

import pytest
import torch

from kernels.conventions import to_layout
from workbench import Batch, StatePool
from workbench.layers import (
    LAYERS,
    GatedDeltaNetLayer,
    GDNConfig,
    LayerError,
    Mamba2Config,
    Mamba2Layer,
    float64_reference,
    make_layer,
)
from workbench.profiles import PROFILES
from workbench.runner import GraphRunner

D = 2


def test_small_gdn_has_k_not_equal_v_and_the_engine_presets_keep_the_models_heads():
    small = GDNConfig.small()
    assert small.head_k_dim != small.head_v_dim  # a transposed read cannot hide behind equal shapes
    assert GDNConfig.engine().head_k_dim == GDNConfig.engine().head_v_dim == 128  # Qwen3-Next's own
    assert GDNConfig.quarter().head_k_dim == GDNConfig.quarter().head_v_dim == 128


def test_released_engines_profiles_are_v_first():
    assert {name: p.state_layout for name, p in PROFILES.items()} == {
        "sglang": "v_first",
        "sglang-ascend": "v_first",
        "vllm": "v_first",
    }


def test_state_shapes_follow_the_layout_and_default_to_k_first():
    c = GDNConfig.small()
    HV, K, V = c.num_v_heads, c.head_k_dim, c.head_v_dim
    spec = LAYERS["gdn"]
    assert spec.state_layouts == ("k_first", "v_first") and LAYERS["mamba2"].state_layouts == ()
    assert spec.state_shapes("small", 5)[1] == (5, HV, K, V) == spec.state_shapes("small", 5, "k_first")[1]
    assert spec.state_shapes("small", 5, "v_first")[1] == (5, HV, V, K)
    for layout, want in (("k_first", (K, V)), ("v_first", (V, K))):
        layer = make_layer("gdn", state_layout=layout)
        assert layer.state_layout == layout and float64_reference(layer).state_layout == layout
        assert layer.new_state(3).ssm.shape[2:] == want
        assert layer.new_intermediate(2, D).ssm.shape == (2, D, HV, *want)
    assert make_layer("gdn").state_layout == "k_first"  # old callers keep their pools
    assert "state_layout='v_first'" in repr(make_layer("gdn", state_layout="v_first"))
    assert "state layout" in make_layer("gdn", state_layout="v_first")._repr_html_()


def test_a_bad_layout_is_refused_and_mamba2_has_no_layout():
    with pytest.raises(LayerError, match=r"state_layout: 'kv' is not one of \('k_first', 'v_first'\)"):
        GatedDeltaNetLayer(GDNConfig.small(), state_layout="kv")
    with pytest.raises(LayerError, match="state_layout"):
        LAYERS["gdn"].state_shapes("small", 2, "transposed")
    m = make_layer("mamba2", state_layout="v_first")  # the profile's layout passes through, unused
    assert m.state_layout is None and isinstance(m, Mamba2Layer)
    assert m.new_state(2).ssm.shape == Mamba2Layer.state_shapes(Mamba2Config.small(), 2)[1]


def _run(profile: str, layout: str, mode: str):
    """One seeded step under ``profile`` with a GDN layer in ``layout`` (a verify also accepts, sglang-style);
    returns the outputs and the state after, K-first."""
    p = PROFILES[profile]
    layer = GatedDeltaNetLayer(GDNConfig.small(), seed=3, impl="reference", state_layout=layout)
    pool = StatePool(12, profile, slots_per_request=p.slots_per_request(D))
    kstate = GatedDeltaNetLayer(GDNConfig.small(), seed=3).new_state(12, seed=7)  # the same values, K-first
    state = kstate.clone()
    state.ssm = to_layout(kstate.ssm, "k_first", layout)
    runner = GraphRunner(layer, pool, buckets=[1, 2, 4], draft_tokens=D, backend="cpu", state=state)
    runner.capture(progress=False)
    rows = pool.alloc(3)
    batch = Batch.decode(rows, [5, 9, 3]) if mode == "decode" else Batch.target_verify(rows, [5, 9, 3], D)
    x = torch.randn(3 * (D if mode == "target_verify" else 1), 32, generator=torch.Generator().manual_seed(1))
    before = runner.state.clone()
    eager = runner.eager(batch, x).output  # the step's outputs, eagerly; then the state as it was before
    for name, t in runner.state.tensors().items():
        t.copy_(before.tensors()[name])
    cmp = runner.compare(batch, x)
    assert cmp.ok, cmp.integrity
    if mode == "target_verify":
        runner.accept(torch.tensor([2, 1, 2]))
    return eager, to_layout(runner.state.ssm, layout, "k_first")


@pytest.mark.parametrize("profile", ["sglang", "vllm"])
@pytest.mark.parametrize("mode", ["decode", "target_verify"])
def test_a_v_first_layer_runs_the_same_steps_as_a_k_first_one(profile, mode):
    """Captured, replayed, compared with its float64 reference (in its own layout) and, for a verify,
    accepted: the V-first pool holds the K-first pool's states, transposed."""
    k_out, k_state = _run(profile, "k_first", mode)
    v_out, v_state = _run(profile, "v_first", mode)
    assert torch.allclose(k_out, v_out, atol=1e-6, rtol=1e-5) and torch.allclose(k_state, v_state, atol=1e-6)


def test_every_builder_for_a_profile_uses_its_layout():
    from workbench.traces.replay import TraceReplayer
    from workbench.traces.simulate import SimConfig, simulate
    from workbench.widgets.lab_model import LabModel
    from workbench.zoo import _harness

    assert _harness.gdn_layer(torch.device("cpu"), "vllm").state_layout == "v_first"
    lab = LabModel(layer="gdn", preset="small", profile="sglang-ascend", num_slots=16, buckets="1, 2")
    assert lab.capture() and lab.runner is not None and lab.runner.layer.state_layout == "v_first"
    trace = simulate(SimConfig(profile="vllm", steps=2, seed=0))
    rep = TraceReplayer(trace)
    assert rep.runner.layer.state_layout == rep.ref.state_layout == "v_first"
    assert rep.runner.state.ssm.shape[2:] == (GDNConfig.small().head_v_dim, GDNConfig.small().head_k_dim)


def test_the_explorer_says_each_profiles_layout():
    from workbench.widgets.explorer_model import ExplorerModel

    m = ExplorerModel(profile="all")
    assert m.notes()["profile"] == (
        "state layout: sglang v_first [slots, HV, V, K], sglang-ascend v_first [slots, HV, V, K], "
        "vllm v_first [slots, HV, V, K]"
    )
    m.update(profile="vllm")
    assert m.notes()["profile"] == "state layout: vllm v_first [slots, HV, V, K]"


def test_the_report_names_each_profiles_layout_and_draws_the_first_ones_read():
    from workbench.report.sections import state_layout_section
    from workbench.viz.page import Page

    page = Page("t")
    parts: list[str] = []
    state_layout_section(parts, page)
    text = "".join(parts)
    assert text.count("v_first") >= 3 and "[slots, HV, V, K]" in text and "K=8, V=12" in text
    assert "A k_first read of a v_first slot, K=8, V=12" in text  # the state_layout_map figure
