"""What `workbench bench` prints while it runs (issue 33): `bench kernels` prints each case's line as soon as it
is measured, then the whole table; the widget benchmark says what it leaves out (the browser's redraw)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from _cli_run import run

from workbench.measure.ceilings import Ceilings
from workbench.measure.timing import Results


@pytest.fixture
def tiny_kernels(monkeypatch):
    """`bench kernels --quick` on the small preset, bs 1 and 2, two ops: the printing, not the figures."""
    from workbench.bench import kernels
    from workbench.sweeps import kernels as kernel_sweep

    # measured ceilings are tests/test_report.py's; here a fixed pair keeps the run to its cases
    ceil = Ceilings(copy_gbps=10.0, matmul_tflops=0.1, copy_runs=(9.0, 10.0, 11.0), cache_bytes=2**25, cache_name="L3")
    monkeypatch.setattr(kernels, "measure_ceilings", lambda *a, **kw: ceil)
    monkeypatch.setattr(kernels, "QUICK_BATCHES", (1, 2))
    monkeypatch.setattr(kernels, "QUICK_PRESET", "small")
    monkeypatch.setattr(kernel_sweep, "DECODE_OPS", ("causal_conv1d.update", "linear_attn.recurrent"))
    return kernel_sweep


def test_bench_kernels_prints_each_case_as_it_is_measured(tiny_kernels, monkeypatch, tmp_path):
    printed_before: dict[tuple[str, int], str] = {}
    real = tiny_kernels.make_case

    def make_case(op, variant, *, rows, **kwargs):
        printed_before[(op, rows)] = sys.stdout.getvalue()  # what the run had printed when this case began
        return real(op, variant, rows=rows, **kwargs)

    monkeypatch.setattr(tiny_kernels, "make_case", make_case)
    path = tmp_path / "k_cpu.json"
    code, out, err = run(["bench", "kernels", "--quick", "--device", "cpu", "--json", str(path)])
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("bench kernels on cpu, 1 torch thread") and lines[1].startswith("Ceilings(")
    cases = [("causal_conv1d.update", 1), ("causal_conv1d.update", 2), ("linear_attn.recurrent", 1),
             ("linear_attn.recurrent", 2)]  # fmt: skip
    assert list(printed_before) == cases
    for before, after in zip(cases, cases[1:], strict=False):
        row = [ln for ln in printed_before[after].splitlines() if ln.split()[:2] == [before[0], str(before[1])]]
        assert len(row) == 1, f"{before} was not printed before {after} began"
    for op, bs in cases:  # once as it went, once in the final table
        assert sum(ln.split()[:2] == [op, str(bs)] for ln in lines) == 2
    assert out.count("legend: floor us") == 1 and f"wrote {path}" in out
    res = Results.load(path)
    assert {(r.what, r.shape["bs"], r.mode) for r in res} == {
        (op, bs, mode) for op, bs in cases for mode in ("kernel", "copy-floor")
    }
    assert res.meta["threads"] == 1 and res.meta["variants"] == {op: "decode" for op, _ in cases}
    assert res.meta["benchmark"] == "kernels" and res.meta["errors"] == {} and res.meta["environment"]


def test_a_broken_op_prints_its_error_once_and_the_others_go_on(tiny_kernels, monkeypatch, tmp_path):
    real = tiny_kernels.make_case
    calls: list[tuple[str, int]] = []

    def make_case(op, variant, *, rows, **kwargs):
        calls.append((op, rows))
        if op == "causal_conv1d.update":
            raise RuntimeError("no such kernel")
        return real(op, variant, rows=rows, **kwargs)

    monkeypatch.setattr(tiny_kernels, "make_case", make_case)
    code, out, err = run(["bench", "kernels", "--quick", "--device", "cpu", "--json", str(tmp_path / "k_cpu.json")])
    assert code == 1 and "bench kernels: failed: causal_conv1d.update" in err
    assert calls == [("causal_conv1d.update", 1), ("linear_attn.recurrent", 1), ("linear_attn.recurrent", 2)]
    assert "causal_conv1d.update                    1 error: RuntimeError: no such kernel" in out


def test_bench_kernels_from_python_without_progress_prints_only_the_table(tiny_kernels, capsys):
    from workbench.bench import kernels

    kernels.run(quick=True, device="cpu", progress=False)
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("causal_conv1d.update")]
    assert len(rows) == 2  # bs 1 and 2, in the final table only


def test_the_widget_benchmark_says_it_leaves_out_the_browsers_redraw(monkeypatch, tmp_path):
    import workbench.widgets.bench as bench
    import workbench.widgets.explorer as explorer

    # the printing and the JSON under test, not the explorer (tests/test_widgets.py times the real one)
    class Explorer:
        def __init__(self, **kw):
            self.controls = {
                n: SimpleNamespace(value=None) for n in ("raw_batch_size", "mode", "fragmentation", "seq_lens")
            }
            self.errors = {"any": SimpleNamespace(value="")}

    monkeypatch.setattr(explorer, "MetadataExplorer", Explorer)
    path = tmp_path / "w_cpu.json"
    code, out, err = run(["bench", "widgets", "--quick", "--device", "cpu", "--json", str(path)])
    assert code == 0, err
    assert out.splitlines()[0] == "bench widgets on cpu, 1 torch thread, quick"
    assert f"not timed: {bench.LEAVES_OUT}" in out and "Python side only" in out
    assert "redraw" in bench.LEAVES_OUT and "plotly.js" in bench.LEAVES_OUT
    meta = Results.load(path).meta
    assert meta["leaves_out"] == bench.LEAVES_OUT and meta["threads"] == 1 and "no browser" in meta["timed"]
