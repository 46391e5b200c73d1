"""One median and IQR: ``measure.timing.quartiles`` behind every record, the ceilings and the bench tables."""

from __future__ import annotations

import ast
import random
import statistics
from pathlib import Path

import pytest
import torch

from workbench.measure.ceilings import Ceilings
from workbench.measure.timing import TimingError, TimingRecord, iqr, quartiles, time_fn

ROOT = Path(__file__).resolve().parents[1]


def test_quartiles_interpolate_linearly_as_numpy_torch_and_measurement_do():
    from torch.utils.benchmark.utils.common import Measurement

    rng = random.Random(0)
    for n in (2, 3, 4, 5, 8, 13, 40):
        xs = [rng.uniform(1.0, 1000.0) for _ in range(n)]
        med, spread = quartiles(xs)
        q = statistics.quantiles(xs, n=4, method="inclusive")
        assert (med, spread) == (statistics.median(xs), q[2] - q[0])  # exactly what the timers always used
        t = torch.tensor(xs, dtype=torch.float64)
        linear = float(t.quantile(0.75) - t.quantile(0.25))
        assert spread == pytest.approx(linear, rel=1e-12)  # the same definition as torch.quantile's "linear"
        m = Measurement(number_per_run=1, raw_times=xs, task_spec=None)
        assert spread == pytest.approx(m.iqr, rel=1e-12) and med == pytest.approx(m.median, rel=1e-12)
    assert quartiles([1.0, 2.0, 3.0, 4.0]) == (2.5, 1.5)  # "exclusive" quartiles (the old bench tables') say 2.5
    assert iqr([1.0, 2.0, 3.0, 4.0, 100.0]) == 2.0
    assert quartiles([7.0]) == (7.0, 0.0) and iqr(iter([5.0, 5.0, 5.0])) == 0.0
    with pytest.raises(TimingError, match="no values"):
        quartiles([])


def test_a_record_from_times_takes_its_median_iqr_and_n_from_them():
    times = [12.0, 10.0, 11.0, 30.0, 13.0, 9.0]
    rec = TimingRecord.from_times(
        times, what="op", device="cpu", shape={"bs": 2}, impl="ref", mode="eager", threads=1, extra={"k": 1}
    )
    assert (rec.median_us, rec.iqr_us, rec.n) == (*quartiles(times), 6)
    assert rec.measurement == times and rec.extra == {"k": 1} and rec.bytes is None
    assert TimingRecord.from_dict(rec.to_dict()) == rec  # the times are not part of the saved record
    with pytest.raises(TimingError):
        TimingRecord.from_times([], what="op", device="cpu", shape={}, impl="", mode="eager", threads=1)


def test_the_cpu_timer_and_the_ceilings_use_the_one_iqr():
    rec = time_fn(lambda: sum(range(200)), what="sum", device="cpu", min_run_time=0.02)
    assert (rec.median_us, rec.iqr_us) == quartiles([t * 1e6 for t in rec.measurement.times])
    runs = (8.5, 14.1, 32.4, 42.0, 20.0)
    assert Ceilings(copy_gbps=20.0, matmul_tflops=1.0, copy_runs=runs).copy_iqr == iqr(runs)
    assert Ceilings(copy_gbps=20.0, matmul_tflops=1.0, copy_runs=(9.0,)).copy_iqr is None


def _quantile_calls(path: Path) -> list[int]:
    """Lines of ``path`` that compute quantiles or read a Measurement's own ``iqr``/``median``."""
    tree = ast.parse(path.read_text())
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("quantiles", "quantile", "percentile", "nanquantile"):
            lines.append(node.lineno)
        if isinstance(node, ast.Attribute) and node.attr == "iqr":
            lines.append(node.lineno)
    return lines


@pytest.mark.slow  # parses every source file
def test_no_other_quantile_computation_in_the_workbench_or_the_benchmarks():
    home = ROOT / "workbench" / "measure" / "timing.py"
    files = [*sorted((ROOT / "workbench").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py"))]
    found = {str(p.relative_to(ROOT)): lines for p in files if p != home and (lines := _quantile_calls(p))}
    assert not found, f"quantiles computed outside measure.timing.quartiles: {found}"
    assert _quantile_calls(home), "measure.timing.quartiles no longer computes the quartiles itself"
