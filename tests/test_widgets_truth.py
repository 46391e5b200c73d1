"""The explorer and the timing dashboard say only what is true: sizes refused before any work (timed),
results of refused inputs or failed actions marked stale, Triton offered only where it runs, saved runs
overlaid in their own colours and never across benchmark kinds. Models first (plain Python), then views."""

import sys
import time
import types

import pytest

from workbench.measure.timing import Results, TimingRecord
from workbench.widgets.explorer_model import MAX_POOL, MAX_ROWS, SLIDERS, ExplorerModel
from workbench.widgets.timing_model import TRITON_RESTART, TimingModel, check_sweep, impl_problem, layer_state_bytes


def _fast(fn, *args, **kwargs):
    """``fn(...)`` and the seconds it took."""
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t


def _rec(bs, mode, what="gdn_decode_step"):
    return TimingRecord(what, "cpu", {"bs": bs}, "reference", mode, 100.0 * bs, 5.0, 9, 1)


# -- explorer model -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "changes, control, words",
    [
        ({"raw_batch_size": 100_000}, "raw_batch_size", f"raw_batch_size = 100000: must be in [0, {MAX_ROWS:,}]"),
        ({"pool_size": 10**10}, "pool_size", f"pool_size = 10000000000: must be in [2, {MAX_POOL:,}]"),
        ({"seq_lens": ", ".join(["5"] * 100_000)}, "seq_lens", "100,000 lengths typed"),
        ({"buckets": "8, 100000000"}, "buckets", "buckets[1] = 100,000,000: the explorer draws every padded row"),
        ({"mode": "target_verify", "draft_tokens": 10**6}, "draft_tokens", "draft_tokens = 1000000: must be in"),
        ({"raw_batch_size": "5"}, "raw_batch_size", "raw_batch_size must be an int, got '5'"),
    ],
)
def test_explorer_refuses_sizes_before_any_work_in_well_under_a_second(changes, control, words):
    m = ExplorerModel(profile="all")
    st, seconds = _fast(m.update, **changes)
    assert seconds < 0.5, f"{changes} took {seconds:.2f} s to refuse"
    assert control in st.errors and words in st.errors[control], st.errors
    assert not st.metas and "\n" not in st.errors[control]  # one line


def test_explorer_limits_are_only_checked_where_the_step_reads_them():
    # a typed list decides the batch size; idle reads none; D is read only by verify
    assert ExplorerModel(profile="sglang", raw_batch_size=10**6, seq_lens="3, 4").state.ok
    assert ExplorerModel(profile="sglang", raw_batch_size=10**6, mode="idle").state.ok
    assert ExplorerModel(profile="sglang", draft_tokens=10**6, mode="decode").state.ok


def test_explorer_state_says_when_the_figures_show_older_inputs():
    m = ExplorerModel(profile="all", raw_batch_size=5, pool_size=64)
    assert m.stale is None and m.shown is m.state
    st = m.update(raw_batch_size=200, pool_size=2)  # the "slider 200, pool 2"
    assert "pool_size" in st.errors and not st.metas
    assert m.shown is not None and m.shown.metas[0].batch_size == 8  # what the figures still draw
    assert m.stale is not None and m.stale.startswith("stale: ") and "decode 5->8" in m.stale and "pool 64" in m.stale
    m.update(pool_size=400)
    assert m.stale is None and m.shown is m.state and m.shown.metas[0].raw_batch_size == 200
    fresh = ExplorerModel(profile="sglang", raw_batch_size=-1)
    assert fresh.shown is None and fresh.stale is not None and fresh.stale.startswith("nothing built")


def test_explorer_notes_a_slider_at_its_end():
    top = int(SLIDERS["raw_batch_size"][1])
    m = ExplorerModel(profile="sglang", raw_batch_size=top, pool_size=2 * top)
    assert "raw_batch_size" in m.notes() and "cut to it" in m.notes()["raw_batch_size"]
    m.update(raw_batch_size=top - 1)
    assert "raw_batch_size" not in m.notes()
    assert "fragmentation" not in ExplorerModel(fragmentation=1.0).notes()  # its end is the limit: nothing cut


# -- timing model -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params, words",
    [
        ({"batch_sizes": "1, 100000"}, "batch sizes: 100,000 with preset 'small'"),
        ({"batch_sizes": "64", "preset": "engine"}, "dashboard sweeps up to 30 rows"),
        ({"batch_sizes": ", ".join(str(i) for i in range(1, 40))}, "at most 16 at once"),
        ({"batch_sizes": "0, 2"}, "item 0 is 0"),
    ],
)
def test_timing_model_refuses_an_oversized_sweep_before_any_work(params, words):
    m = TimingModel(**params)
    m.results = Results([_rec(1, "eager")])  # an earlier run on screen
    m.status = "4 records"
    out, seconds = _fast(m.sweep)
    assert out is None and seconds < 1.0, seconds
    assert m.error_on == "batch_sizes" and words in m.error, m.error
    assert m.status == "" and m.stale["latency"].startswith("stale: ")  # no success line left, figure marked
    out, seconds = _fast(m.roofline_run)
    assert out is None and seconds < 1.0 and m.error_on == "batch_sizes"


def test_check_sweep_bounds_follow_the_state_a_step_moves():
    per_row = layer_state_bytes("gdn", "quarter")
    assert per_row == 4 * (2048 * 3 + 8 * 128 * 128)
    check_sweep([1, 64], per_row, "cpu", "quarter")  # fine
    with pytest.raises(ValueError, match="moves 134 MiB of state a step; on cpu the dashboard sweeps up to 122 rows"):
        check_sweep([256], per_row, "cpu", "quarter")
    with pytest.raises(ValueError, match="preset: 'huge' is not one of"):
        layer_state_bytes("gdn", "huge")


def test_timing_model_impl_defaults_to_what_runs_here_and_triton_says_how_to_restart(monkeypatch):
    assert TimingModel().impls == ("reference",)  # auto on the CPU: the interpreter is opt-in
    assert impl_problem("triton", "cpu") is None  # conftest set TRITON_INTERPRET=1 before any import
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    m = TimingModel(batch_sizes="1", impls=("triton",))
    assert m.problems() == {"impls": impl_problem("triton", "cpu")}
    out, seconds = _fast(m.sweep)
    assert out is None and seconds < 1.0 and m.error_on == "impls" and TRITON_RESTART in m.error
    assert m.roofline_run() is None and TRITON_RESTART in m.error
    assert impl_problem("cuda", "cpu") == "impls: 'cuda' is not one of ['reference', 'triton']"


def test_impl_problem_names_kernels_imported_before_the_interpreter(monkeypatch):
    fake = types.ModuleType("kernels._compiled")
    fake.kernel = type("JITFunction", (), {})()  # what triton.jit returns without the interpreter
    monkeypatch.setitem(sys.modules, "kernels._compiled", fake)
    problem = impl_problem("triton", "cpu")
    assert problem is not None and "imported before TRITON_INTERPRET=1 was set" in problem
    assert TRITON_RESTART in problem


def test_timing_model_refuses_an_overlay_of_another_benchmark(tmp_path):
    m = TimingModel()
    meta = Results([_rec(1, "update", what="metadata_update")], meta={"benchmark": "metadata"})
    assert m.load(meta.save(tmp_path / "metadata_cpu.json")) is None
    assert m.error_on == "path" and "holds a 'metadata' benchmark (metadata_update)" in m.error and not m.overlays
    unnamed = Results([_rec(1, "kernel", what="gated_delta_rule.recurrent")])  # no meta: read from `what`
    assert m.load(unnamed.save(tmp_path / "kernels.json")) is None and "records of gated_delta_rule" in m.error
    layer = Results([_rec(1, "eager"), _rec(2, "replay")])  # a layer step without meta: still "replay"
    assert m.load(layer.save(tmp_path / "old.json"), label="old") is not None and list(m.overlays) == ["old"]
    assert m.error is None and "loaded 2 records" in m.status


def test_timing_model_failed_waste_marks_only_that_figure():
    m = TimingModel(buckets="1, 4")
    assert m.bucket_lists(16) is not None and not m.stale
    m.buckets = "4, 1"
    assert m.bucket_lists(16) is None and m.error_on == "buckets" and set(m.stale) == {"waste"}
    m.buckets = ""
    assert m.bucket_lists(16) is not None and not m.stale


# -- views --------------------------------------------------------------------------------------------
def test_explorer_veils_its_figures_while_the_inputs_are_refused():
    pytest.importorskip("ipywidgets")
    from workbench.widgets import MetadataExplorer
    from workbench.widgets.stale import is_stale

    e = MetadataExplorer(profile="all", raw_batch_size=5, pool_size=64)
    figs = (e.padding_fig, e.slot_fig, e.qsl_fig)
    assert not any(is_stale(f) for f in figs) and "data-stale" not in e.table.value
    e.controls["raw_batch_size"].value = 200
    e.controls["pool_size"].value = 2
    assert "fewer than the 200 live requests" in e.errors["pool_size"].value
    assert all(is_stale(f) for f in figs)
    assert "data-stale='true'" in e.table.value and "5-&gt;8" in e.table.value
    veil = next(a for a in e.padding_fig.layout.annotations if a.name == "stale")
    assert "stale" in veil.text
    e.controls["pool_size"].value = 400
    assert not any(is_stale(f) for f in figs) and "data-stale" not in e.table.value
    assert "<b>raw_bs</b>=200" in e.table.value


def test_explorer_view_refuses_fast_and_never_cuts_a_value_silently():
    pytest.importorskip("ipywidgets")
    from workbench.widgets import MetadataExplorer

    e = MetadataExplorer(profile="sglang", raw_batch_size=300, pool_size=400)  # past the sliders' defaults
    w = e.controls["raw_batch_size"]
    assert w.value == 300 and w.max >= 300 and e.model.state.ok  # widened, not cut to 256
    _, seconds = _fast(e.set, raw_batch_size=100_000)
    assert seconds < 1.0 and "must be in [0, 1,024]" in e.errors["raw_batch_size"].value
    e.set(raw_batch_size=600, pool_size=700)
    assert w.value == 600 and e.model.state.ok
    e.controls["pool_size"].max = 1024
    e.controls["pool_size"].value = 1024
    assert "slider&#x27;s end" in e.notes["pool_size"].value and not e.errors["pool_size"].value


def test_dashboard_says_beside_the_control_before_any_work(monkeypatch):
    pytest.importorskip("ipywidgets")
    from workbench.widgets import TimingDashboard
    from workbench.widgets.stale import is_stale

    d = TimingDashboard(batch_sizes="1, 2", min_run_time=0.01)
    assert d.impls.value == ("reference",)
    d.model.results = Results([_rec(1, "eager"), _rec(1, "replay")])  # as if a sweep had run
    d.model.status = "2 records"
    d.batch_sizes.value = "100000"  # beside the control as soon as it is typed
    assert "batch sizes: 100,000" in d.errors["batch_sizes"].value
    _, seconds = _fast(d.sweep_button.click)
    assert seconds < 1.0 and d.status.value == "" and is_stale(d.latency_fig)
    d.batch_sizes.value = "1"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    d.impls.value = ("triton",)
    assert "%env TRITON_INTERPRET=1 as its first cell" in d.errors["impls"].value
    d.sweep_button.click()
    assert d.status.value == "" and is_stale(d.latency_fig)
