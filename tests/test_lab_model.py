"""The capture/replay lab's model says only what is true: eager steps labelled eager, the accept checked
against the float64 reference under every profile, results dropped when their inputs change or an action
fails, oversized settings refused before any work starts."""

import time

import pytest
import torch

from workbench.errors import CaptureError
from workbench.layers import GatedDeltaNetLayer, KDALayer, Mamba2Layer
from workbench.profiles import PROFILES
from workbench.runner import GraphRunner
from workbench.widgets import lab_plan
from workbench.widgets.lab_model import INPUTS, LabModel


def captured(**kw) -> LabModel:
    m = LabModel(**{"layer": "gdn", "preset": "small", "backend": "cpu", "buckets": "1, 2, 4", **kw})
    assert m.capture(), m.error
    return m


@pytest.fixture(scope="module")
def vllm():
    return captured(profile="vllm", draft_tokens=3)


# -- accept ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layer", ["gdn", "mamba2", "kda"])
@pytest.mark.parametrize("profile", list(PROFILES))
def test_accept_holds_the_reference_state_under_every_profile(profile, layer):
    m = captured(profile=profile, draft_tokens=3, layer=layer)
    rep = m.step(3, "target_verify", seed=2, time_it=False)
    assert rep is not None and rep.clean, m.error
    res = m.accept([3, 1, 2])
    assert res is not None and res.ok and res.verdict().ok is True, res.verdict().text
    assert "each live slot holds its accepted state: True" in res.verdict().text
    rows = rep.batch.req_pool_indices.tolist()
    per_slot = PROFILES[profile].spec_indices_2d
    want = [m.runner.pool.slots_of(r)[a - 1 if per_slot else 0] for r, a in zip(rows, [3, 1, 2], strict=True)]
    assert res.accepted_slots == want and res.per_slot == per_slot
    assert res.changed == ([] if per_slot else sorted(want))  # vLLM's verify already wrote every draft slot
    # the same requests verify again: vLLM carries the counts, so the next step reads the accepted slots
    again = m.step(3, "target_verify", seed=2, time_it=False)
    assert again is not None and again.clean
    acc = again.batch.num_accepted_tokens
    assert (acc.tolist() == [3, 1, 2]) if per_slot else acc is None
    assert m.accept().ok  # random counts, checked the same way


def test_vllm_accept_is_false_on_a_corrupted_slot(vllm):
    rep = vllm.step(2, "target_verify", seed=5, time_it=False)
    assert rep is not None and rep.clean
    row = rep.batch.req_pool_indices.tolist()[1]
    bad = vllm.accepted_slot(row, 2)
    vllm.runner.state.ssm[bad] += 0.5  # the state a correct verify wrote there, spoilt
    res = vllm.accept([1, 2])
    assert res is not None and not res.ok and res.holds_accepted_state == [True, False]
    v = res.verdict()
    assert v.ok is False and "holds its accepted state: False" in v.text and f"slot {bad} off" in v.text


def test_sglang_accept_that_copies_nothing_is_false(monkeypatch):
    m = captured(profile="sglang", draft_tokens=2)
    rep = m.step(2, "target_verify", seed=1, time_it=False)
    assert rep is not None
    monkeypatch.setattr(m.runner, "accept", lambda acc: None)  # a broken accept: the slots keep the old state
    res = m.accept([2, 2])
    assert res is not None and res.changed == [] and res.verdict().ok is False
    assert res.holds_accepted_state == [False, False]


def test_accept_is_refused_twice_and_without_a_verify(vllm):
    assert vllm.step(1, "decode", seed=1, time_it=False) is not None
    assert vllm.accept() is None and vllm.error_control == "accepted" and "target_verify" in vllm.error
    assert vllm.step(2, "target_verify", seed=7, time_it=False) is not None
    assert vllm.accept([1, 9]) is None and "num_accepted" in vllm.error  # a bad typed list, in words
    assert vllm.accept([1, 1]) is not None
    assert vllm.accept([1, 1]) is None and "accepted already" in vllm.error


def test_timing_a_verify_step_keeps_the_accept_true(vllm):
    rep = vllm.step(2, "target_verify", seed=8, time_it=True)
    assert rep is not None and rep.replay_us is not None
    assert vllm.accept([3, 2]).ok  # the timed runs restored the slots and the verify buffers


# -- eager steps -----------------------------------------------------------------------------------------
def test_an_eager_step_claims_no_replay():
    m = captured(buckets="1, 2")
    rep = m.step(4, "decode", seed=1, time_it=True)
    assert rep is not None and not rep.replayed and rep.clean
    how, integrity = rep.verdicts()
    assert how.ok is None and how.text.startswith("decode bs=4: eager: batch of 4 above the largest bucket 2 (")
    assert rep.comparison.reason in how.text  # the runner's own reason
    assert "replay" not in how.text and integrity.ok is True
    assert rep.eager_us > 0 and rep.replay_us is None and "replay" not in rep.timing_text()
    assert m.ops_rows() == [] and m.ops_note().startswith("no graph ran: ")
    assert "device" not in m.ops_note()
    assert m.history[-1].label == "decode bs=4 -> eager"


def test_a_replayed_step_on_the_cpu_lists_its_ops():
    m = captured(buckets="1, 2", layer="mamba2")
    rep = m.step(2, "decode", seed=1, time_it=False)
    assert rep is not None and rep.replayed
    assert rep.verdicts()[0].ok is True and "replay == eager bitwise: True" in rep.verdicts()[0].text
    assert m.ops_rows() and m.ops_note() == ""


# -- results dropped -------------------------------------------------------------------------------------
def _with_results() -> LabModel:
    m = captured(buckets="1, 2", draft_tokens=2)
    assert m.step(2, "target_verify", seed=1, time_it=False) is not None
    assert m.accept() is not None
    return m


def _dropped(m: LabModel, generation: int) -> None:
    assert m.runner is None and m.last is None and m.accepted is None and m.history == []
    assert m.verdicts() == [] and m.heatmap_data()[3] == [] and m.ops_rows() == []
    assert m.generation > generation


def test_a_failed_capture_drops_every_result(monkeypatch):
    m = _with_results()
    gen = m.generation

    def refuse(self, **kw):
        raise CaptureError("host sync during capture: on purpose")

    monkeypatch.setattr(GraphRunner, "capture", refuse)
    assert not m.capture()
    assert m.error == "capture failed: host sync during capture: on purpose"
    _dropped(m, gen)


@pytest.mark.parametrize(
    "name,value",
    [("layer", "mamba2"), ("preset", "engine"), ("profile", "vllm"), ("backend", "auto"), ("buckets", "1, 4")]
    + [("draft_tokens", 3)],
)
def test_an_input_change_drops_every_result(name, value):
    m = _with_results()
    gen = m.generation
    assert m.set(**{name: value}), m.error
    _dropped(m, gen)
    assert m.notice.startswith(f"{name} changed: results cleared")
    assert m.step(1) is None and "press Capture" in m.error


def test_setting_the_same_value_keeps_the_results():
    m = _with_results()
    assert m.set(**{name: getattr(m, attr) for name, attr in INPUTS.items()})
    assert m.runner is not None and m.accepted is not None and m.notice is None


def test_a_failed_step_drops_the_step_and_logs_what_it_changed(monkeypatch):
    m = _with_results()
    gen = m.generation

    def half_done(batch, x):
        m.runner.state.ssm[5] += 1.0  # a step that wrote something, then failed
        raise RuntimeError("kernel died")

    monkeypatch.setattr(m.runner, "compare", half_done)
    assert m.step(2, "decode", seed=3, time_it=False) is None and m.error == "replay failed: kernel died"
    assert m.last is None and m.accepted is None and m.generation > gen
    assert m.history[-1].label == "FAILED decode bs=2" and m.history[-1].changed == [5]


# -- refused before the work starts ------------------------------------------------------------------------
def test_bucket_100000_is_refused_at_once():
    m = LabModel(backend="cpu", buckets="1, 100000")
    start = time.perf_counter()
    ok = m.capture()
    elapsed = time.perf_counter() - start
    assert not ok and m.runner is None and elapsed < 0.25, elapsed
    assert m.error_control == "buckets" and m.error.startswith("buckets[1] = 100000: must be in [1, 1,024]")


@pytest.mark.parametrize(
    "kw,control,words",
    [
        ({"draft_tokens": 20}, "draft_tokens", "D = 20: must be in [1, 8]"),
        ({"draft_tokens": 0}, "draft_tokens", "D = 0: must be in [1, 8]"),
        ({"buckets": "4, 2"}, "buckets", "strictly increasing: buckets[1] = 2 after 4"),
        ({"buckets": "1, x"}, "buckets", "item 1 is 'x'"),
        ({"buckets": ", ".join(map(str, range(1, 70)))}, "buckets", "69 sizes; the lab captures at most 64"),
        ({"buckets": "1024", "profile": "vllm", "draft_tokens": 8}, "buckets", "needs a pool of 16,393 slots"),
        ({"preset": "engine", "draft_tokens": 8}, "buckets", "above the lab's CPU bound"),
        ({"profile": "nope"}, "profile", "profile: 'nope' is not one of"),
        ({"layer": "rwkv"}, "layer", "layer: 'rwkv' is not one of"),
        ({"num_slots": 3}, "general", "num_slots = 3: must be in [9, 8,192]"),
    ],
)
def test_refusals_name_their_control(kw, control, words):
    m = LabModel(**{"backend": "cpu", "buckets": "1, 2, 4, 8", **kw})
    assert m.check() is None and not m.capture()
    assert m.error_control == control and words in m.error, m.error


def test_memory_is_checked_as_the_cli_does(monkeypatch):
    import workbench.limits

    monkeypatch.setattr(workbench.limits, "host_memory_bytes", lambda: 2**28)  # 256 MiB free
    m = LabModel(backend="cpu", preset="engine", buckets="1, 2")
    assert not m.capture() and m.error_control == "buckets"
    assert m.error.startswith("buckets up to 2 needs ") and "this machine has 256 MiB free" in m.error


def test_step_sizes_are_refused_beside_their_controls():
    m = captured(buckets="1, 2")
    assert m.plan.capacity == m.runner.pool.capacity == 5  # the plan's arithmetic is the pool's
    assert m.step(6, "decode") is None and m.error_control == "batch_size"
    assert m.error.startswith("batch size = 6: must be in [1, 5]")
    assert m.step(0, "decode") is None and m.error_control == "batch_size"
    assert m.step(2, "decode", seed=-1) is None and m.error_control == "seed"
    assert m.step(2, "extend") is None and m.error_control == "mode"
    assert m.runner is not None and len(m.history) == 1  # refusals change nothing


def test_an_engine_step_above_the_cpu_bound_is_refused():
    plan = LabModel(backend="cpu", preset="engine").check()
    assert plan is not None and plan.capacity == 17
    plan.check_step(8, "target_verify")
    with pytest.raises(lab_plan.Refusal, match=r"above the lab's CPU bound 8e\+09; at most \d+ here"):
        plan.check_step(17, "target_verify")


@pytest.mark.parametrize("layer,cls", [("gdn", GatedDeltaNetLayer), ("mamba2", Mamba2Layer), ("kda", KDALayer)])
@pytest.mark.parametrize("preset", lab_plan.PRESETS)
def test_slot_size_is_the_layers_own(layer, cls, preset):
    cfg = lab_plan.layer_config(layer, preset)
    shapes = cls.state_shapes(cfg, 1)  # the layer's own rule, without its weights
    assert lab_plan.slot_elements(layer, cfg) == sum(torch.Size(s[1:]).numel() for s in shapes)
