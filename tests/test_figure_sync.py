"""A FigureWidget edited in place keeps the state a browser view is drawn from (``_widget_data``,
``_widget_layout``) equal to its figure, after every kind of edit each widget makes: a view drawn late (its
5 MB module still loading when the edit was sent, so the edit message was dropped) shows the edit, not the
placeholder it was built with."""

import json

import pytest

pytest.importorskip("ipywidgets")
go = pytest.importorskip("plotly.graph_objects")

from plotly.utils import PlotlyJSONEncoder  # noqa: E402

from workbench.widgets.figure_sync import refill, resync, updating  # noqa: E402


def _js(x) -> str:
    return json.dumps(x, cls=PlotlyJSONEncoder, sort_keys=True)


def _figure_widgets(view) -> dict[str, go.FigureWidget]:
    return {n: v for n, v in vars(view).items() if isinstance(v, go.FigureWidget)}


def assert_view_state_current(view) -> None:
    figs = _figure_widgets(view)
    assert figs, f"{type(view).__name__} has no FigureWidget"
    for name, fw in figs.items():
        assert _js(fw._widget_data) == _js(fw._data), f"{type(view).__name__}.{name}: data a late view draws is stale"
        assert _js(fw._widget_layout) == _js(fw._layout_obj._props), f"{type(view).__name__}.{name}: layout stale"


def test_updating_and_refill_resend_the_full_state():
    fw = go.FigureWidget(go.Figure(go.Scatter(x=[0], y=[0])))
    with updating(fw):
        fw.data[0].y = [5]
        fw.layout.title.text = "edited"
    assert fw._widget_data[0]["y"] == [5] and fw._widget_layout["title"]["text"] == "edited"
    refill(fw, go.Figure([go.Bar(x=[1, 2], y=[3, 4])], layout=dict(height=321)))
    assert [t["type"] for t in fw._widget_data] == ["bar"] and fw._widget_layout["height"] == 321
    plain = go.Figure()
    with updating(plain):  # a plain figure has no view: edited as it is
        plain.layout.height = 200
    resync(plain)
    assert plain.layout.height == 200


def test_explorer_edits_reach_a_late_view():
    from workbench.widgets import MetadataExplorer

    e = MetadataExplorer(profile="all", raw_batch_size=5, pool_size=64)
    e.controls["raw_batch_size"].value = 9
    e.focus.value = "sglang"
    assert_view_state_current(e)
    e.controls["seq_lens"].value = "3, four"  # an error veils the figures
    assert_view_state_current(e)


def test_playground_lab_timeline_and_dashboard_edits_reach_a_late_view():
    from workbench.widgets import CaptureReplayLab, KernelPlayground, ServingTimeline, TimingDashboard

    k = KernelPlayground(op="causal_conv1d.update", impl="reference")
    k.run_button.click()
    assert [len(t.y) for t in k.figure.data] == [5, 5, 5]
    assert_view_state_current(k)

    lab = CaptureReplayLab(backend="cpu", buckets="1, 2")
    lab.capture_button.click()
    lab.batch_size.value = 2
    lab.replay_button.click()
    assert_view_state_current(lab)

    t = ServingTimeline(steps=6)
    t.build_button.click()
    t.slider.value = 3
    assert_view_state_current(t)

    d = TimingDashboard(batch_sizes="1", min_run_time=0.01)
    d.sweep_button.click()
    d.buckets.value = "1, 4"
    assert_view_state_current(d)
