"""The widget views, driven as a user would (set .value, .click()), without a browser: the figures are
updated in place and show the model's data; bad input shows in words beside its control."""

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("plotly")

from workbench.viz import metadata as vm  # noqa: E402
from workbench.widgets import CaptureReplayLab, KernelPlayground, MetadataExplorer  # noqa: E402
from workbench.widgets.stale import is_stale  # noqa: E402


def _cells(fig, name):
    t = next(t for t in fig.data if t.name == name)
    return sorted((y, int(b + 0.5)) for y, b in zip(t.y, t.base, strict=True))


def test_explorer_slider_updates_the_same_figure_in_place():
    e = MetadataExplorer(profile="all", raw_batch_size=5, pool_size=64)
    fig, traces = e.padding_fig, e.padding_fig.data
    assert [t.name for t in traces] == list(vm.PADDING_TRACES)
    assert len(_cells(fig, vm.LIVE_ROW)) == 15 and len(_cells(fig, vm.PAD_PROCESSED)) == 3
    e.controls["raw_batch_size"].value = 9  # -> bucket 12: 3 padded rows per profile
    assert e.padding_fig is fig and e.padding_fig.data[0] is traces[0]  # updated in place
    assert len(_cells(fig, vm.LIVE_ROW)) == 27
    processed = _cells(fig, vm.PAD_PROCESSED)
    assert {y for y, _ in processed} == {"sglang-ascend decode 9->12"} and [r for _, r in processed] == [9, 10, 11]
    skipped = _cells(fig, vm.PAD_SKIPPED)
    assert {y for y, _ in skipped} == {"sglang decode 9->12", "vllm decode 9->16"}  # vLLM: its own bucket list
    assert list(e.qsl_fig.data[0].y) == list(e.model.state.metas[0].query_start_loc.tolist())
    assert "<b>raw_bs</b>=9" in e.table.value and "padded rows 9-11: processed on the dummy slot" in e.table.value


def test_explorer_bad_typed_list_shows_beside_its_control_and_keeps_the_figure():
    e = MetadataExplorer(profile="sglang", raw_batch_size=4)
    before = list(e.padding_fig.data[0].base)
    e.controls["seq_lens"].value = "3, four, 5"  # never raises
    assert "item 1 is &#x27;four&#x27;" in e.errors["seq_lens"].value
    assert all(not w.value for n, w in e.errors.items() if n != "seq_lens")
    assert list(e.padding_fig.data[0].base) == before
    e.controls["seq_lens"].value = "3, 4, 5"
    assert e.errors["seq_lens"].value == "" and e.controls["raw_batch_size"].value == 3
    e.controls["buckets"].value = "4, 0"
    assert "buckets[1] must be a positive int" in e.errors["buckets"].value


def test_explorer_bucket_warning_stays_while_the_field_is_wrong_whatever_the_mode():
    e = MetadataExplorer(profile="sglang", raw_batch_size=4, buckets="8, 4")
    for mode in ("decode", "extend", "target_verify", "idle", "extend"):
        e.controls["mode"].value = mode
        assert "strictly increasing" in e.errors["buckets"].value, mode
        assert "data-stale='true'" in e.table.value, mode  # the table dims under the stale line
    e.controls["buckets"].value = "4, 8"
    assert e.errors["buckets"].value == "" and e.model.state.ok


def test_explorer_slot_map_focus_follows_the_dropdown():
    e = MetadataExplorer(profile="all", raw_batch_size=3)
    e.focus.value = "sglang-ascend"
    t = {tr.name: tr for tr in e.slot_fig.data}
    assert list(t[vm.SLOT_PROCESSED].x) == [0] and len(t[vm.SLOT_SKIPPED].x) == 0
    e.focus.value = "sglang"
    t = {tr.name: tr for tr in e.slot_fig.data}
    assert list(t[vm.SLOT_SKIPPED].x) == [-1] and len(t[vm.SLOT_PROCESSED].x) == 0


def test_explorer_focus_names_the_single_profile_shown():
    e = MetadataExplorer(profile="all", raw_batch_size=3)
    e.focus.value = "vllm"
    e.controls["profile"].value = "sglang-ascend"
    assert e.focus.disabled and e.focus.value == "sglang-ascend"  # not the stale "vllm"
    t = {tr.name: tr for tr in e.slot_fig.data}
    assert list(t[vm.SLOT_PROCESSED].x) == [0]  # the slot map does show sglang-ascend
    e.controls["profile"].value = "all"
    assert not e.focus.disabled and e.focus.value == "sglang-ascend"


def test_lab_capture_replay_accept_by_clicks():
    lab = CaptureReplayLab(backend="cpu", buckets="1, 2, 4")
    assert lab.replay_button.disabled
    lab.capture_button.click()
    assert lab.progress.value == lab.progress.max == 6 and not lab.replay_button.disabled
    lab.batch_size.value = 3
    lab.replay_button.click()
    assert "data-ok='true'" in lab.result.value and "integrity: clean" in lab.result.value
    assert "replay" in lab.timing.value and "<table" in lab.ops.value
    z = lab.heatmap.data[0].z
    assert len(z) == 2 and z[0][0] == vm.CHANGED_DUMMY and vm.CHANGED_BAD not in z[1]
    lab.mode.value = "target_verify"
    lab.replay_button.click()
    assert not lab.accept_button.disabled
    lab.accepted_text.value = "1, 2, 9"
    lab.accept_button.click()
    assert "num_accepted" in lab.notes["accepted"].value  # a bad typed list, in words, beside its control
    lab.accepted_text.value = ""
    lab.accept_button.click()
    assert (
        "&#10004; accepted" in lab.accept_result.value and "holds its accepted state: True" in lab.accept_result.value
    )


def test_lab_unavailable_backends_are_disabled_with_the_reason():
    import html

    from workbench.graphs import available_backends

    lab = CaptureReplayLab()
    for name, why in available_backends().items():
        if why != "ok":
            assert html.escape(why) in lab.backend_note.value
            lab.backend.value = name
            assert lab.capture_button.disabled and html.escape(why) in lab.notes["backend"].value
    lab.backend.value = "cpu"
    assert not lab.capture_button.disabled


def test_playground_runs_and_fills_one_heatmap_per_convention():
    k = KernelPlayground(op="causal_conv1d.update", impl="reference")
    k.run_button.click()
    assert "data-ok='true'" in k.result.value
    assert [len(t.y) for t in k.figure.data] == [5, 5, 5]  # 3 live + 2 padded rows, each convention

    def broken(**kw):
        out = kw.pop("out")
        out.zero_()
        return out

    k.use_kernel(broken)
    k.run_button.click()
    assert "data-ok='false'" in k.result.value and "off the float64 reference" in k.result.value

    k.use_kernel(None)
    k.op.value = "causal_conv1d.varlen"  # the variant follows the op (kernels.testing.OPS)
    assert list(k.variant.options) == ["extend"] and k.variant.value == "extend"
    k.preset.value = "quarter"
    assert k.shape_controls["dim"].value == 2048
    k.preset.value = "small"
    k.shape_controls["dim"].value = 8
    k.run_button.click()
    assert "data-ok='true'" in k.result.value and k.model.shapes["dim"] == 8
    assert [t.y[-1] for t in k.figure.data] == ["padding tokens"] * 3 and len(k.figure.data[0].x) == 8


@pytest.mark.slow  # the real widget benchmark; tests/test_cli_bench.py checks its output fast
def test_bench_widgets_quick_writes_json(tmp_path, capsys):
    import json

    from workbench.cli import main

    path = tmp_path / "widgets.json"
    assert main(["bench", "widgets", "--quick", "--json", str(path)]) == 0
    from workbench.measure.timing import Results

    res = Results.load(path)  # the one schema every benchmark writes
    assert res.meta["benchmark"] == "widgets" and json.loads(path.read_text())
    rows = {(r.what, r.shape["raw_batch_size"]) for r in res}
    assert ("explorer: raw batch size +-1", 64) in rows and all(r.median_us > 0 and r.n == 10 for r in res)
    assert "worst median at bs 64" in capsys.readouterr().out


@pytest.mark.slow  # a timing sweep
def test_timing_dashboard_sweep_load_and_waste_update_the_same_figures(tmp_path):
    from workbench.widgets import TimingDashboard

    d = TimingDashboard(batch_sizes="1, 2", min_run_time=0.01)
    lat, waste = d.latency_fig, d.waste_fig
    d.sweep_button.click()
    assert d.progress.value == d.progress.max == 2 and d.latency_fig is lat
    names = {t.name for t in lat.data}
    assert {"eager", "replay"} <= names  # one impl: lines named by mode, each with its IQR band
    saved = d.model.results.save(tmp_path / "gpu_like_cpu.json")
    d.path.value = str(saved)
    d.load_button.click()
    lines = {t.name: t.line.color for t in lat.data if not t.name.endswith("IQR")}
    assert {"this run eager", "this run replay", "gpu_like_cpu eager", "gpu_like_cpu replay"} == set(lines)
    assert lines["gpu_like_cpu eager"] not in (lines["this run eager"], lines["this run replay"])  # its own colour
    assert "loaded 4 records" in d.status.value
    d.path.value = str(tmp_path / "nope.json")
    d.load_button.click()
    assert "nope.json" in d.errors["path"].value and d.status.value == ""  # no success line left standing
    n = len(waste.data)
    d.buckets.value = "1, 4, 16, 64"
    assert d.waste_fig is waste and len(waste.data) > n  # a third list beside the engines'
    d.buckets.value = "4, x"
    assert "item 1 is &#x27;x&#x27;" in d.errors["buckets"].value and is_stale(waste)
    d.buckets.value = "4, 8"
    assert d.errors["buckets"].value == "" and not is_stale(waste)


def test_bug_zoo_shows_broken_and_fixed_side_by_side():
    from workbench.widgets import BugZoo

    z = BugZoo()
    z.case.value = z.case.options[-1][1]
    assert z.model.case(z.case.value).explanation[:30] in z.explanation.value.replace("&#x27;", "'")
    z.run_button.click()
    assert "data-broken='true'" in z.unfixed.value and "data-broken='false'" in z.fixed.value
