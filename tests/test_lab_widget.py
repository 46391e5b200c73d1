"""The capture/replay lab's view, driven as a user would (set .value, .click()), without a browser: it shows
only what the model holds, ticks only what passed, and refuses oversized input beside its control."""

import time

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("plotly")

from workbench.profiles import PROFILES  # noqa: E402
from workbench.widgets import CaptureReplayLab  # noqa: E402

TICK, CROSS = "&#10004;", "&#10008;"


def test_an_eager_step_is_shown_as_eager():
    lab = CaptureReplayLab(backend="cpu", buckets="1, 2")
    lab.capture_button.click()
    lab.batch_size.value = 4
    lab.replay_button.click()
    assert "decode bs=4: eager: batch of 4 above the largest bucket 2" in lab.result.value
    assert "replay" not in lab.result.value and "replay" not in lab.timing.value and "eager" in lab.timing.value
    assert "no graph ran" in lab.ops.value and "does not list its ops" not in lab.ops.value


def test_a_vllm_accept_ticks_only_when_true():
    lab = CaptureReplayLab(backend="cpu", buckets="1, 2, 4", profile="vllm")
    assert lab.profile.value == "vllm" and list(lab.profile.options) == list(PROFILES)
    lab.capture_button.click()
    lab.mode.value = "target_verify"
    lab.replay_button.click()
    lab.accepted_text.value = "2, 1, 2"
    lab.accept_button.click()
    assert TICK in lab.accept_result.value and "data-ok='true'" in lab.accept_result.value
    assert "holds its accepted state: True" in lab.accept_result.value and lab.accept_button.disabled
    lab.replay_button.click()  # the same three requests, seed 0
    m = lab.model
    row = m.last.batch.req_pool_indices.tolist()[0]
    m.runner.state.conv[m.accepted_slot(row, 2)] -= 1.0  # spoil the slot the next step would read
    lab.accept_button.click()
    res = lab.accept_result.value
    assert CROSS in res and TICK not in res and "data-ok='false'" in res and "#D55E00" in res
    assert "holds its accepted state: False" in res


def test_an_input_change_clears_what_was_shown():
    lab = CaptureReplayLab(backend="cpu", buckets="1, 2")
    lab.capture_button.click()
    lab.mode.value = "target_verify"
    lab.replay_button.click()
    lab.accept_button.click()
    assert TICK in lab.result.value and TICK in lab.accept_result.value and len(lab.heatmap.data[0].y) == 3
    lab.layer.value = "mamba2"
    assert lab.accept_result.value == "" and lab.timing.value == "" and lab.ops.value == ""
    assert TICK not in lab.result.value and "layer changed: results cleared" in lab.result.value
    assert list(lab.heatmap.data[0].y) == ["(nothing yet)"] and lab.progress.value == 0
    assert lab.replay_button.disabled and lab.accept_button.disabled and not lab.capture_button.disabled
    lab.capture_button.click()
    assert "captured 4 graphs" in lab.result.value and lab.mode.options == ("decode", "target_verify")


def test_the_mode_dropdown_lists_the_modes_the_models_step_takes():
    """Before any capture too: decode and target_verify (with its D), each of which then runs; no mode the
    model would refuse (extend: the lab captures graph modes only)."""
    lab = CaptureReplayLab(backend="cpu", buckets="1, 2")
    assert lab.mode.options == lab.model.modes == ("decode", "target_verify") and lab.mode.value == "decode"
    lab.layer.value = "mamba2"
    assert lab.mode.options == lab.model.modes == ("decode", "target_verify")
    lab.capture_button.click()
    assert lab.mode.options == lab.model.runner.modes
    lab.batch_size.value = 2
    for mode in lab.mode.options:
        lab.mode.value = mode
        lab.replay_button.click()
        assert f"{mode} bs=2 -&gt; 2: replay == eager bitwise: True" in lab.result.value, lab.result.value
        assert "data-ok='false'" not in lab.result.value and lab.notes["mode"].value == ""
    assert "extend" not in lab.mode.options and lab.model.step(1, "extend", time_it=False) is None


def test_bucket_100000_is_refused_beside_its_control_at_once():
    lab = CaptureReplayLab(backend="cpu", buckets="1, 2")
    start = time.perf_counter()
    lab.buckets.value = "1, 100000"
    lab.capture_button.click()
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5, elapsed
    assert "buckets[1] = 100000: must be in [1, 1,024]" in lab.notes["buckets"].value
    assert lab.capture_button.disabled and lab.model.runner is None and lab.error.value == ""
    lab.buckets.value = "1, 2"
    assert lab.notes["buckets"].value == "" and not lab.capture_button.disabled


def test_typed_values_are_never_clamped():
    lab = CaptureReplayLab(backend="cpu", buckets="1, 2")
    lab.draft_tokens.value = 50
    assert lab.draft_tokens.value == 50 and "D = 50: must be in [1, 8]" in lab.notes["draft_tokens"].value
    lab.draft_tokens.value = 2
    lab.capture_button.click()
    lab.batch_size.value = 1000
    lab.replay_button.click()
    assert lab.batch_size.value == 1000 and "batch size = 1000: must be in [1, 5]" in lab.notes["batch_size"].value
    assert lab.result.value.count("wb-verdict") == 1  # still the capture's line: the refused step ran nothing
