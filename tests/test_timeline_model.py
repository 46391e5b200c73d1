"""The serving timeline's model (and its view, driven without a browser): it records who owns every state
slot at every step of a replayed trace, consistently with the trace's own rows, and refuses a bad setting
beside its control."""

import pytest

from workbench.widgets.timeline_model import CONTROLS, MAX_STEPS, ROW_COLUMNS, TimelineModel


@pytest.fixture(scope="module")
def built() -> TimelineModel:
    m = TimelineModel(steps=60, seed=0)
    assert m.build(), m.error
    return m


def test_the_model_builds_one_record_per_step(built):
    m = built
    assert m.error is None and m.trace is not None and m.result is not None
    assert len(m.owners) == len(m.padding) == len(m.step_numbers) == 60
    assert all(len(line) == len(m.slots) for line in m.owners)
    assert m.summary().startswith("OK: sglang gdn: 60 steps")


def test_every_live_row_owns_its_slot_at_its_step(built):
    m = built
    assert m.trace is not None
    for i, step in enumerate(m.trace.steps):
        for row in step.rows:
            assert m.owners[i][row.slot] == row.id, (step.step, row)
        assert m.owners[i][m.dummy] is None  # the dummy slot is never a request's


def test_slot_reuse_is_visible(built):
    reused = built.reused_slots()
    assert reused, "no slot was held by two requests over 60 steps"
    slot, ids = next(iter(reused.items()))
    held = [line[slot] for line in built.owners if line[slot] is not None]
    assert held[0] == ids[0] and ids[1] in held


def test_select_and_the_step_table(built):
    m = built
    assert m.trace is not None
    i = next(k for k, s in enumerate(m.trace.steps) if len(s.rows) >= 2)
    assert m.select(i) and m.selected == i
    table = m.step_table()
    assert [list(r) for r in table] == [list(ROW_COLUMNS)] * len(table)
    assert [r["id"] for r in table] == [r.id for r in m.trace.steps[i].rows]
    pad = m.step_padding()
    assert pad is not None and pad.live_rows == len(table)
    if pad.bucket is not None:
        assert pad.padded_rows == pad.bucket - pad.live_rows >= 0
    assert m.step_text().startswith(f"step {m.trace.steps[i].step}")
    assert not m.select(len(m.owners)) and m.error_control == "step" and "step" in (m.error or "")
    assert m.selected == i


def test_graph_steps_name_their_bucket(built):
    graph = [p for p in built.padding if p.bucket is not None]
    assert graph and all(p.bucket in (1, 2, 4, 8) and p.bucket >= p.live_rows for p in graph)
    assert any("above the largest captured bucket 8" in p.how for p in built.padding)


@pytest.mark.parametrize("steps", [MAX_STEPS + 1, 0, "60"])
def test_a_refused_steps_value_is_an_error_beside_steps(steps):
    m = TimelineModel()
    assert not m.build(steps=steps)
    assert m.error_control == "steps" and "steps" in (m.error or "") and not m.built
    assert "steps" in CONTROLS


def test_a_simulator_refusal_names_its_control():
    m = TimelineModel(prefix_cache="align")  # vLLM's strategy on the sglang profile: the profile is refused
    assert not m.build() and m.error_control == "profile" and "prefix_cache = 'align'" in (m.error or "")
    assert not m.build(profile="nope") and m.error_control == "profile"
    assert not m.build(nonsense=1) and m.error_control == "general"


def test_a_failed_build_drops_the_earlier_results():
    m = TimelineModel(steps=10)
    assert m.build() and m.built
    assert not m.build(steps=MAX_STEPS + 1)
    assert not m.built and m.owners == [] and m.summary() == ""


def test_speculative_vllm_requests_own_their_d_slots():
    m = TimelineModel(profile="vllm", spec=2, steps=30)
    assert m.build(), m.error
    assert m.trace is not None
    for i, step in enumerate(m.trace.steps):
        for row in step.rows:
            assert m.owners[i][row.slot] == row.id == m.owners[i][row.slot + 1]


def test_the_figure_marks_the_selected_step(built):
    pytest.importorskip("plotly")
    from workbench.viz.timeline import DUMMY, FREE, slot_timeline, timeline_codes

    data = built.figure_data()
    fig = slot_timeline(**data)
    assert fig.layout.title.text and fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    (shape,) = fig.layout.shapes
    assert shape.x0 < data["selected"] < shape.x1
    codes = timeline_codes(data["owners"], data["slots"], dummy=data["dummy"], steps=data["steps"])
    assert set(codes[data["dummy"]]) == {DUMMY} and FREE in {c for line in codes for c in line}
    foreign = slot_timeline(**{**data, "foreign": {(data["steps"][3], 1)}, "divergence": (3, 1, "foreign")})
    assert timeline_codes(data["owners"], data["slots"], dummy=0, foreign={(3, 1)}, steps=data["steps"])[1][3] == 2
    assert any("first divergence: step 3" in (t.name or "") for t in foreign.data)


def test_the_view_slider_moves_the_selection():
    pytest.importorskip("ipywidgets")
    from workbench.widgets import ServingTimeline

    view = ServingTimeline(steps=20)
    m = view.model
    assert m.built and view.slider.max == 19 and view.play.max == 19
    assert "OK: sglang gdn: 20 steps" in view.summary.value
    view.slider.value = 7
    assert m.selected == 7 and view.step_line.value.count("step 7") == 1
    assert view.figure.layout.shapes[0].x0 == 6.5
    view.steps.value = MAX_STEPS + 1
    view.build_button.click()
    assert "steps" in view.notes["steps"].value and not m.built and view.table.value == ""
    view.steps.value = 12
    view.build_button.click()
    assert m.built and view.notes["steps"].value == "" and view.slider.max == 11


def test_a_given_trace_shows_its_checkpoints_green_or_vermillion_and_its_copies():
    from workbench.viz.timeline import CHECKPOINT, FOREIGN, timeline_codes
    from workbench.zoo import prefix_over_reuse, unwritten_track_slot

    m = TimelineModel()
    assert m.show(unwritten_track_slot.scenario_trace(True)) and m.result is not None and m.result.ok
    assert m.checkpoints and all(cp.ok and cp.tokens == 8 for cp in m.checkpoints.values())
    assert {(c.step, c.src, c.dst, c.before) for c in m.copies} == {(0, 1, 5, False), (2, 5, 2, True)}
    data = m.figure_data()
    codes = timeline_codes(
        data["owners"], data["slots"], dummy=data["dummy"], steps=data["steps"], checkpoints=data["checkpoints"]
    )
    assert codes[5] == [CHECKPOINT] * 4  # slot 5 holds the verified checkpoint from step 0 on
    assert m.show(prefix_over_reuse.scenario_trace(False))
    bad = [k for k, cp in m.checkpoints.items() if not cp.ok]
    assert bad and bad[0] == (2, 1)  # published off its prefix at step 2, and stays so
    data = m.figure_data()
    codes = timeline_codes(
        data["owners"], data["slots"], dummy=data["dummy"], steps=data["steps"], checkpoints=data["checkpoints"]
    )
    assert codes[1][2:] == [FOREIGN] * 3
    assert not m.show("nope") and "expected a workbench.traces.Trace" in (m.error or "")


def test_the_figure_draws_copies_as_arrows_and_names_checkpoints_in_the_hover():
    pytest.importorskip("plotly")
    from workbench.viz.timeline import slot_timeline
    from workbench.zoo import unwritten_track_slot

    m = TimelineModel()
    m.show(unwritten_track_slot.scenario_trace(True))
    fig = slot_timeline(**m.figure_data())
    arrows = [(a.x, a.y, a.ay) for a in fig.layout.annotations]
    assert arrows == [(0.3, 5, 1), (1.7, 2, 5)]  # after step 0's forward 1 -> 5; before step 2's 5 -> 2
    hover = fig.data[0].customdata
    assert "checkpoint of request 0's first 8 tokens (verified against its float64 state)" in hover[5][0]


def test_a_prefix_cache_trace_builds_and_says_its_work_per_step():
    m = TimelineModel(steps=60, prefix_cache="no_buffer")
    assert m.build() and m.result is not None and m.result.ok, m.summary()
    assert m.result.checkpoints > 0 and m.result.verified == m.result.checkpoints
    assert "prefix cache:" in m.summary() and m.checkpoints and m.copies
    said = [m.step_text(i) for i in range(len(m.step_numbers))]
    assert any("publishes request" in line for line in said) and any(" -> " in line for line in said)
    assert not m.build(prefix_cache="lru") and m.error_control == "prefix_cache" and "'lru'" in (m.error or "")


def test_the_view_shows_a_given_trace_and_offers_the_prefix_cache():
    pytest.importorskip("ipywidgets")
    from workbench.widgets import ServingTimeline
    from workbench.zoo import unwritten_track_slot

    view = ServingTimeline(trace=unwritten_track_slot.scenario_trace(False))
    assert view.model.built and "FAIL" in view.summary.value and view.slider.max == 3
    assert (view.profile.value, view.steps.value) == ("sglang", 4)  # the controls say what is shown
    assert "publishes request 0&#x27;s first 8 tokens in slot 5" in view.step_line.value
    assert view.prefix_cache.options == ("none", "no_buffer", "extra_buffer", "align")
