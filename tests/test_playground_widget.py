"""``KernelPlayground`` driven as a user would (set ``.value``, click), without a browser: Triton that
cannot run says how to restart beside its control, a huge request is refused beside the sizes before any
work, clamped values are said, a result goes stale when the controls change, and the heatmaps' row labels
have room of their own."""

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("plotly")

import workbench.widgets.playground_model as pm  # noqa: E402
from workbench.widgets import KernelPlayground  # noqa: E402


def test_choosing_triton_where_it_cannot_run_says_how_to_restart_beside_the_control(monkeypatch):
    from kernels.dispatch import triton_importable

    assert triton_importable()  # imported under conftest's TRITON_INTERPRET=1: an import under 0 would stick
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    k = KernelPlayground(op="causal_conv1d.update")
    assert k.impl.value == "reference" and not k.errors["impl"].value and not k.run_button.disabled
    k.impl.value = "triton"
    assert "restart the kernel with %env TRITON_INTERPRET=1 as its first cell" in k.errors["impl"].value
    assert k.run_button.disabled
    monkeypatch.setattr(pm, "check_kernel", lambda *a, **kw: pytest.fail("a check ran where Triton cannot"))
    assert k.do_run() is None and k.result.value == ""  # one line beside the control, not four failures
    k.impl.value = "reference"
    assert not k.errors["impl"].value and not k.run_button.disabled


def test_a_huge_size_is_refused_beside_the_sizes_in_well_under_a_second(monkeypatch):
    k = KernelPlayground(op="gated_delta_rule.recurrent", variant="decode", impl="reference")
    monkeypatch.setattr(pm, "check_kernel", lambda *a, **kw: pytest.fail("a refused request ran"))
    t0 = time.perf_counter()
    for name, value in (("K", 8192), ("V", 8192), ("HV", 64), ("rows", 64)):
        k.shape_controls[name].value = value
    assert k.do_run() is None
    took = time.perf_counter() - t0
    assert took < 0.5, took
    assert "would hold" in k.errors["shapes"].value and "at most 256 MiB" in k.errors["shapes"].value
    assert k.run_button.disabled and k.result.value == ""


def test_a_typed_value_that_is_clamped_says_so_and_the_box_shows_what_ran():
    k = KernelPlayground(op="causal_conv1d.update", variant="decode", impl="reference")
    k.shape_controls["padded"].value = 500
    assert "padded: 500 clamped to 64" in k.errors["shapes"].value  # said as soon as it is typed
    k.shape_controls["padded"].value = 2
    k.shape_controls["dim"].value = 100_000
    res = k.do_run()
    assert res is not None and res.ok
    assert k.shape_controls["dim"].value == 8192 and "dim: 100,000 clamped to 8192" in k.errors["shapes"].value


def test_a_result_goes_stale_when_a_control_changes_and_a_refusal_clears_it():
    k = KernelPlayground(op="causal_conv1d.update", variant="decode", impl="reference", capture=False)
    k.do_run()
    assert "data-ok='true'" in k.result.value and "stale" not in k.figure.layout.title.text
    k.shape_controls["rows"].value = 4
    assert "data-ok='stale'" in k.result.value and "data-ok='true'" not in k.result.value
    assert "stale: the controls changed since this check ran" in k.result.value
    assert k.figure.layout.title.text.endswith("(stale)")
    k.shape_controls["dim"].value = 8192
    k.shape_controls["rows"].value = 64
    k.shape_controls["D"].value = 8192
    k.variant.value = "verify"
    assert k.do_run() is None and k.result.value == ""
    assert all(list(t.y) == [""] for t in k.figure.data)  # nothing of the previous run left on screen


def test_both_forms_of_padded_rows_by_default_and_the_heatmap_shows_the_failing_one():
    def unguarded(**kw):
        from kernels.linear_attn import recurrent

        kw["pad_slot_id"] = None if kw["pad_slot_id"] == 0 else kw["pad_slot_id"]  # vLLM's null slot processed
        recurrent(**kw, impl="reference")

    k = KernelPlayground(op="linear_attn.recurrent", variant="decode", impl="reference", capture=False)
    assert k.padded_rows.value == "both"
    k.use_kernel(unguarded)
    res = k.do_run()
    assert res is not None and res.failures == ["decode: vllm+tokens"]
    titles = [a.text for a in k.figure.layout.annotations]
    assert titles == ["sglang (zero-length padded rows)", "sglang-ascend", "vllm (padded rows with tokens)"]
    k.padded_rows.value = "zero-length"
    res = k.do_run()
    assert res is not None and res.ok and [c.key for c in res.results] == ["sglang", "sglang-ascend", "vllm"]


def test_the_heatmaps_row_labels_have_room_of_their_own():
    k = KernelPlayground(op="gated_delta_rule.recurrent", variant="extend", impl="reference", capture=False)
    k.do_run()
    layout = k.figure.layout
    axes = [layout[name] for name in layout if name.startswith("xaxis")]
    assert len(axes) == 3 and all(tuple(a.domain) == (0.0, 1.0) for a in axes)  # stacked: none beside another
    labels = [y for t in k.figure.data for y in t.y]
    assert max(len(y) for y in labels) * 7 <= layout.margin.l  # 12 px labels, about 7 px a character
    assert all(layout[n].automargin for n in layout if n.startswith("yaxis"))


@pytest.mark.slow  # a fresh interpreter importing triton
def test_triton_imported_before_the_variable_was_set_asks_for_a_restart():
    """``%env TRITON_INTERPRET=1`` after triton was imported is too late: its own helpers are compiled."""
    code = (
        "import os, triton\n"
        "os.environ['TRITON_INTERPRET'] = '1'\n"
        "from workbench.widgets.playground_model import TRITON_HINT, default_impl, triton_problem\n"
        "print(triton_problem().endswith(TRITON_HINT), default_impl())\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert res.stdout.split() == ["True", "reference"], res.stderr
