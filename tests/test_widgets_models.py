"""The widgets' models (plain Python): metadata, errors by control, capture/replay, kernel checks."""

import pytest
import torch

from workbench.widgets.explorer_model import MODES, ExplorerModel, control_of, parse_int_list
from workbench.widgets.lab_model import LabModel
from workbench.widgets.playground_model import PlaygroundModel


@pytest.mark.slow  # a fresh interpreter importing the models
def test_models_do_not_import_ipywidgets():
    import subprocess
    import sys

    code = "import sys, workbench.widgets.models; print('ipywidgets' in sys.modules, 'plotly' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.split() == ["False", "False"]


# -- explorer ---------------------------------------------------------------------------------------
def test_explorer_builds_one_step_per_profile_with_each_profiles_padding():
    m = ExplorerModel(profile="all", mode="decode", raw_batch_size=5, seq_lens="7, 3, 9, 4, 12", pool_size=32)
    st = m.state
    assert st.ok and [x.profile.name for x in st.metas] == ["sglang", "sglang-ascend", "vllm"]
    for meta in st.metas:
        assert meta.raw_batch_size == 5 and meta.batch_size == 8  # bucket 8 of the engine list
        assert meta.seq_lens[:5].tolist() == [7, 3, 9, 4, 12]
    assert st.metas[0].state_indices[5:].tolist() == [-1, -1, -1]
    assert st.metas[1].state_indices[5:].tolist() == [0, 0, 0]
    # fragmentation: earlier requests left holes and some stayed live (slots outside this batch)
    pool = st.pools[0]
    assert set(pool.owned_slots()) - set(st.metas[0].state_indices[:5].tolist())


def test_explorer_typed_list_decides_the_batch_and_random_lengths_follow_the_seed():
    m = ExplorerModel(profile="sglang", raw_batch_size=9)
    assert m.state.metas[0].raw_batch_size == 9
    a = m.update(seed=3).metas[0].seq_lens.tolist()
    assert m.update(seed=4).metas[0].seq_lens.tolist() != a
    assert m.update(seed=3).metas[0].seq_lens.tolist() == a
    st = m.update(seq_lens="5,6")
    assert st.raw_batch_size == 2 and st.metas[0].seq_lens[:2].tolist() == [5, 6]


@pytest.mark.parametrize(
    "changes, control, words",
    [
        ({"seq_lens": "7, x, 9"}, "seq_lens", "item 1 is 'x'"),
        ({"seq_lens": "7, 0"}, "seq_lens", "seq_lens"),
        ({"buckets": "8, 4"}, "buckets", "strictly increasing"),
        ({"buckets": "2, 4", "raw_batch_size": 2}, "general", None),  # fine: no error at all
        ({"pool_size": 3, "raw_batch_size": 5}, "pool_size", "fewer than the 5 live requests"),
        ({"fragmentation": 1.5}, "fragmentation", "not in [0, 1]"),
        ({"mode": "prefill"}, "mode", "'prefill'"),
    ],
)
def test_explorer_bad_input_comes_back_in_words_beside_its_control(changes, control, words):
    m = ExplorerModel(profile="all")
    st = m.update(**changes)  # never raises
    if words is None:
        assert st.ok
        return
    assert control in st.errors and words in st.errors[control], st.errors
    assert not st.metas


def test_explorer_modes_verify_extend_idle():
    m = ExplorerModel(profile="vllm", raw_batch_size=3, draft_tokens=3, pool_size=40)
    st = m.update(mode="target_verify")
    assert st.ok and tuple(st.metas[0].state_indices.shape) == (st.metas[0].batch_size, 3)  # [bs, D]
    st = m.update(mode="extend", profile="sglang", seq_lens="4, 2, 5")
    assert st.ok and st.metas[0].query_start_loc.tolist() == [0, 4, 6, 11]
    assert st.metas[0].has_initial_state.tolist() == [True, False, True]  # prefix, none, prefix
    st = m.update(mode="idle")
    assert st.ok and st.metas[0].raw_batch_size == 0


@pytest.mark.parametrize("buckets, words", [("8, 4", "strictly increasing"), ("4, 0", "must be a positive int")])
@pytest.mark.parametrize("mode", MODES)
def test_explorer_refuses_a_bad_bucket_list_in_every_mode(buckets, words, mode):
    """A bucket list is wrong whatever the mode: extend pads nothing, but the refusal stays beside the field."""
    m = ExplorerModel(profile="all")
    st = m.update(mode=mode, buckets=buckets)
    assert words in st.errors.get("buckets", ""), st.errors
    assert not st.metas and m.stale is not None


def test_parse_int_list_and_control_of():
    assert parse_int_list("x", " 1, 2;3 ,") == [1, 2, 3]
    with pytest.raises(ValueError, match="item 0 is 'a'"):
        parse_int_list("x", "a")
    assert control_of("buckets[1] must be a positive int") == "buckets"
    assert control_of("pool exhausted: asked for 3") == "pool_size"
    assert control_of("something else") == "general"


# -- capture / replay lab -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lab():
    m = LabModel(layer="gdn", preset="small", backend="cpu", buckets="1, 2, 4", draft_tokens=2)
    seen = []
    assert m.capture(progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (6, 6) and [d for d, _ in seen] == list(range(1, 7))  # 3 buckets x (decode, verify)
    return m


def test_lab_capture_writes_only_the_dummy_slot(lab):
    assert lab.history[0].label == "capture" and lab.history[0].changed == [0]


def test_lab_replay_is_clean_and_changes_only_live_slots(lab):
    rep = lab.step(3, "decode", seed=1, time_it=False)
    assert rep is not None and rep.clean and rep.comparison.bitwise_equal and rep.comparison.bucket == 4
    assert rep.changed and set(rep.changed) <= set(rep.live_slots)
    other = set(lab.runner.pool.owned_slots()) - set(rep.live_slots)
    assert other and not (other & set(rep.changed))  # requests outside the batch untouched
    changed, allowed, slots, steps = lab.heatmap_data()
    assert len(changed) == len(steps) == len(lab.history) and len(slots) == lab.runner.pool.num_slots
    assert lab.ops_rows() and all("op" in r for r in lab.ops_rows())


def test_lab_verify_then_accept_writes_the_accepted_states(lab):
    rep = lab.step(2, "target_verify", seed=2, time_it=False)
    assert rep is not None and rep.clean and rep.changed == []  # verify leaves the pool alone
    res = lab.accept([2, 1])
    assert res is not None and res.ok and res.foreign == [] and all(res.holds_accepted_state)
    assert set(res.changed) <= set(rep.live_slots)


def test_lab_timing_restores_the_state(lab):
    before = lab.runner.state.ssm.clone()
    rep = lab.step(1, "decode", seed=5, time_it=True)
    after_step = lab.runner.state.ssm.clone()
    assert rep.eager_us > 0 and rep.replay_us > 0
    assert not torch.equal(before, after_step)
    assert torch.equal(lab.runner.state.ssm, after_step)  # timing runs did not advance it further


@pytest.mark.parametrize("profile", ["vllm", "sglang-ascend"])
def test_lab_captures_and_replays_under_every_profile(profile):
    # vLLM owns D slots per request (verify indices [bs, D]); the lab's pool must be sized for it
    m = LabModel(layer="gdn", preset="small", backend="cpu", buckets="1, 2", draft_tokens=2, profile=profile)
    assert m.capture(), m.error
    assert set(m.history[0].changed) <= {m.runner.pool.profile.dummy_slot}  # vLLM skips even the null slot
    rep = m.step(2, "target_verify", seed=3, time_it=False)
    assert rep is not None and rep.clean, m.error
    assert set(rep.changed) <= set(rep.live_slots)  # vLLM writes its per-draft slots; sglang none
    assert len(rep.live_slots) == 2 * m.runner.pool.slots_per_request
    rep = m.step(2, "decode", seed=4, time_it=False)
    assert rep is not None and rep.clean and rep.changed and set(rep.changed) <= set(rep.live_slots)


def test_lab_errors_in_words():
    m = LabModel(backend="cpu", buckets="1, x")
    assert not m.capture() and "item 1 is 'x'" in m.error
    m = LabModel(backend="cpu")
    assert m.step(2) is None and "Capture first" in m.error
    m = LabModel(backend="cuda")
    if not torch.cuda.is_available():
        assert not m.capture() and "cuda" in m.error


# -- kernel playground (the harness itself: tests/test_kernelcheck.py) ----------------------------------
def test_playground_model_offers_every_op_and_variant_of_the_one_registry():
    from kernels.testing import OPS, SHAPES

    m = PlaygroundModel(op="causal_conv1d.update", variant="verify", impl="reference")
    assert m.ops() == list(OPS) and m.presets() == list(SHAPES)
    assert m.variants("gated_delta_rule.recurrent") == ["decode", "gating", "verify", "tree", "extend"]
    res = m.run()
    assert res is not None and res.ok and m.error is None, m.error
    assert (res.op, res.names) == ("causal_conv1d.update", ["verify"])  # the variant chosen, not every one
    assert res.candidate == 'causal_conv1d.update (impl="reference")'
    assert [c.name for c in res.results] == ["sglang", "sglang-ascend", "vllm"] and res["verify"].capture is not None


def test_playground_model_checks_a_user_kernel_and_says_what_is_wrong_in_words():
    def zeros(**kw):
        kw["out"].zero_()

    m = PlaygroundModel(op="linear_attn.recurrent", variant="extend", shapes={"K": 8}, rows=2, padded=1)
    m.use_kernel(zeros)
    res = m.run()
    assert res is not None and not res.ok and res.candidate.endswith("zeros") and res.shapes == "small, K=8"
    assert "out off the float64 reference" in res["vllm"].summary()
    m.use_kernel(None)
    m.variant = "verify"  # linear attention has no verify variant
    assert m.run() is None and m.error is not None and m.result is None
    assert m.errors["variant"].startswith("variants: linear_attn.recurrent has no variant 'verify'; choose one of")
    m.variant, m.impl = None, "cuda"
    assert m.run() is None and m.error is not None and m.error.startswith("impl: unknown implementation 'cuda'")
    assert list(m.errors) == ["impl"]


def test_playground_impl_defaults_to_what_runs_here_and_triton_says_how_to_restart(monkeypatch):
    import sys
    import types

    import workbench.widgets.playground_model as pm

    assert PlaygroundModel().impl == "triton"  # conftest set TRITON_INTERPRET=1 before any kernel import
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert PlaygroundModel().impl == "reference" and pm.default_impl() == "reference"
    monkeypatch.setattr(pm, "check_kernel", lambda *a, **k: pytest.fail("a check ran where Triton cannot"))
    m = PlaygroundModel(op="causal_conv1d.update", impl="triton")
    assert m.run() is None and m.errors == {"impl": pm.TRITON_HINT}
    assert pm.TRITON_HINT.startswith("Triton needs TRITON_INTERPRET=1 before torch and the kernels are imported")
    m.use_kernel(lambda **kw: None)  # a user kernel: the impl choice is ignored, so is its problem
    assert m.plan().ok
    # the variable set too late: a kernel module was already compiled for a GPU
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pm.triton_problem() is None
    JITFunction = type("JITFunction", (), {})
    monkeypatch.setitem(sys.modules, "kernels._compiled_too_early", types.SimpleNamespace(kernel=JITFunction()))
    assert pm.triton_problem().endswith(pm.TRITON_HINT) and PlaygroundModel().impl == "reference"


def test_playground_refuses_a_huge_request_before_any_work_in_well_under_a_second(monkeypatch):
    import time

    import workbench.widgets.playground_model as pm

    monkeypatch.setattr(pm, "check_kernel", lambda *a, **k: pytest.fail("a refused request ran"))
    m = PlaygroundModel(shapes={"K": 8192, "V": 8192, "HV": 64, "H": 64}, rows=64, impl="reference")
    t0 = time.perf_counter()
    assert m.run() is None
    took = time.perf_counter() - t0
    assert took < 0.2, took
    assert (
        list(m.errors) == ["shapes"] and "would hold" in m.errors["shapes"] and "at most 256 MiB" in m.errors["shapes"]
    )
    # the interpreter's bound is lower: quarter-sized shapes run in the reference, not in Triton
    assert PlaygroundModel(shapes="quarter", impl="reference").plan().ok
    refused = PlaygroundModel(shapes="quarter", impl="triton").plan()
    assert "Triton's interpreter runs at most 16 MiB" in refused.errors["shapes"]


def test_playground_says_what_it_clamped():
    m = PlaygroundModel(op="causal_conv1d.update", variant="decode", impl="reference", rows=100_000, padded=-3,
                        shapes={"dim": 10**9})  # fmt: skip
    plan = m.plan()
    assert (plan.rows, plan.padded, plan.sizes["dim"]) == (64, 0, 8192)
    assert plan.notes["shapes"] == (
        "rows: 100,000 clamped to 64 (the playground takes 1 to 64); padded: -3 clamped to 0 (the playground "
        "takes 0 to 64); dim: 1,000,000,000 clamped to 8192 (the playground takes 1 to 8192)"
    )
    m.rows, m.shapes = 2, {"dim": 9000}
    res = m.run()
    assert res is not None and res.ok and res.padded == 0 and res.shapes == "small, dim=8192", m.errors
    assert m.notes["shapes"].endswith("; dim: 9,000 clamped to 8192 (the playground takes 1 to 8192)")
    m.shapes = {"dim": "wide"}
    assert m.run() is None and m.errors == {"shapes": "dim: must be an int, got 'wide'"}


# -- timing dashboard and bug zoo ---------------------------------------------------------------------
def test_timing_model_sweeps_overlays_and_compares_bucket_lists(tmp_path):
    from workbench.widgets.timing_model import TimingModel

    m = TimingModel(batch_sizes="1, 2", min_run_time=0.01)
    seen = []
    res = m.sweep(lambda done, total: seen.append((done, total)))
    assert res is not None and seen == [(1, 2), (2, 2)]
    assert {(r.shape["bs"], r.mode) for r in res} == {(1, "eager"), (1, "replay"), (2, "eager"), (2, "replay")}
    assert all(r.median_us > 0 for r in res)
    path = res.save(tmp_path / "run_cpu.json")
    assert m.load(path, label="saved") is not None
    impls = {r.impl for r in m.combined()}
    assert impls == {"reference [this run]", "reference [saved]"}  # two runs, two sets of lines
    assert m.load(tmp_path / "missing.json") is None and "missing.json" in m.error
    m.buckets = "1, 8, 32"
    lists = m.bucket_lists(32)
    assert lists["yours"] == [1, 8, 32] and lists["sglang default"][-1] == 32
    m.buckets = "8, 2"
    assert m.bucket_lists(32) is None and "strictly increasing" in m.error
    m.batch_sizes = "1, two"
    assert m.sweep() is None and "item 1 is 'two'" in m.error


def test_zoo_model_runs_a_case_broken_then_fixed():
    from workbench.widgets.zoo_model import ZooModel

    m = ZooModel()
    name = m.names()[0]
    broken, fixed = m.run(name)
    assert broken.case == fixed.case == name and broken.broken and not fixed.broken
    assert m.run("no_such_case") is None and "no_such_case" in m.error
