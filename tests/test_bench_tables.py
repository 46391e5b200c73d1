"""The `workbench bench` tables: a noisy median (IQR over NOISY_IQR of it) and a ratio built on one carry a
``!``, a quiet one does not, and every table ends with a legend line per column a reader could not guess."""

import pytest

from workbench.bench import kernels, metadata, replay
from workbench.measure.ceilings import Ceilings
from workbench.measure.timing import NOISY_IQR, Results, TimingRecord


def _rec(what, bs, impl, mode, median, iqr, **kw):
    return TimingRecord(what, "cpu", {"bs": bs, **kw.pop("shape", {})}, impl, mode, median, iqr, 9, 1, **kw)


def _rows(out: str, first: str) -> dict[str, str]:
    """Table lines by their first two words (e.g. "reference 2"), legend lines excluded."""
    lines = [ln for ln in out.splitlines() if ln and not ln.startswith("legend:") and not ln.startswith(first)]
    return {" ".join(ln.split()[:2]): ln for ln in lines}


def _legend(out: str) -> list[str]:
    return [ln.removeprefix("legend: ") for ln in out.splitlines() if ln.startswith("legend: ")]


def test_replay_table_flags_noisy_medians_and_explains_its_columns(capsys):
    res = Results(
        [
            _rec("gdn_decode_step", 1, "reference", "eager", 100.0, 10.0),
            _rec("gdn_decode_step", 1, "reference", "replay", 80.0, 4.0),
            _rec("gdn_decode_step", 2, "reference", "eager", 100.0, 500.0),  # IQR 5x the median
            _rec("gdn_decode_step", 2, "reference", "replay", 80.0, 4.0),
        ]
    )
    replay.print_table(res)
    out = capsys.readouterr().out
    rows = _rows(out, "impl")
    assert "!" not in rows["reference 1"] and rows["reference 1"].rstrip().endswith("1.25x")
    assert "100.0!" in rows["reference 2"] and rows["reference 2"].rstrip().endswith("1.25x!")
    legend = _legend(out)
    assert any(ln.startswith("speedup: eager us / replay us") for ln in legend)
    assert any(ln.startswith("replay us:") for ln in legend) and any(ln.startswith("eager us:") for ln in legend)
    assert legend[-1].startswith(
        f"! after a median or ratio: its IQR (or an IQR it is built on) is over {NOISY_IQR:.0%}"
    )


def test_metadata_table_prints_iqrs_flags_noise_and_explains_in_place_and_engine_style(capsys):
    res = Results(
        [
            _rec("metadata_update", 8, "in_place", "update", 11.0, 0.2, shape={"raw_bs": 5}),
            _rec("metadata_update", 8, "engine_style", "update", 26.0, 0.5, shape={"raw_bs": 5}),
            _rec("metadata_update", 32, "in_place", "update", 11.7, 0.4, shape={"raw_bs": 25}),
            _rec("metadata_update", 32, "engine_style", "update", 30.6, 20.4, shape={"raw_bs": 25}),
        ]
    )
    metadata.print_table(res)
    out = capsys.readouterr().out
    rows = _rows(out, "   bs")
    assert "!" not in rows["8 5"] and "2.36x" in rows["8 5"]
    assert "30.60!" in rows["32 25"] and "20.40" in rows["32 25"] and rows["32 25"].rstrip().endswith("2.62x!")
    legend = _legend(out)
    for column in ("bs:", "in-place us:", "engine-style us:", "IQR:", "ratio: engine-style us / in-place us"):
        assert any(ln.startswith(column) for ln in legend), column


def test_kernels_table_explains_floor_ratio_and_the_cache_flag(capsys):
    ceil = Ceilings(copy_gbps=10.0, matmul_tflops=1.0, copy_runs=(8.0, 10.0, 12.0), cache_bytes=2**25, cache_name="L3")
    res = Results(
        [
            _rec("gdn", 1, "reference", "kernel", 100.0, 500.0, bytes=2_000_000),  # 20 GB/s, noisy, in the L3
            _rec("gdn", 1, "copy", "copy-floor", 50.0, 1.0, bytes=2_000_000),
            _rec("gdn", 64, "reference", "kernel", 10_000.0, 100.0, bytes=64 * 2**20),  # beyond the L3
            _rec("gdn", 64, "copy", "copy-floor", 8_000.0, 100.0, bytes=64 * 2**20),
        ],
        meta={"ceilings": ceil.to_dict()},
    )
    kernels.print_table(res)
    out = capsys.readouterr().out
    rows = _rows(out, "op")
    assert "100.0!" in rows["gdn 1"] and "2.00!" in rows["gdn 1"] and rows["gdn 1"].rstrip().endswith("200.0%c")
    assert "!" not in rows["gdn 64"] and not rows["gdn 64"].rstrip().endswith("c")
    legend = _legend(out)
    assert any(ln.startswith("floor us: one dst.copy_(src) of the same state bytes") for ln in legend)
    assert any(ln.startswith("ratio: median / floor us") for ln in legend)
    assert any("10.0 GB/s (median of 3: 8.0-12.0)" in ln for ln in legend)
    assert any(ln.startswith("c after of copy: the bytes fit the L3 32 MiB") for ln in legend)


@pytest.mark.parametrize("iqr, flagged", [(NOISY_IQR * 100.0, False), (NOISY_IQR * 100.0 + 0.1, True)])
def test_the_flag_is_the_reports_threshold(capsys, iqr, flagged):
    res = Results(
        [
            _rec("step", 4, "reference", "eager", 100.0, iqr),
            _rec("step", 4, "reference", "replay", 50.0, 1.0),
        ]
    )
    replay.print_table(res)
    assert ("100.0!" in capsys.readouterr().out) is flagged
