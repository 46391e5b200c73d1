"""viz.timing: figures from known records have the traces and values their legends say."""

import pytest

from workbench.measure.ceilings import Ceilings
from workbench.measure.timing import Results, TimingRecord
from workbench.profiles import sglang_buckets
from workbench.viz import bucket_waste, latency, roofline
from workbench.viz.palette import BLUE, ORANGE
from workbench.viz.timing import benchmark_kind, waste_table

pytest.importorskip("plotly")


def _rec(bs, mode, med, iqr, *, what="step", impl="reference", nbytes=None, flops=None):
    return TimingRecord(what, "cpu", {"bs": bs}, impl, mode, med, iqr, 9, 1, nbytes, flops, {})


def _by_name(fig):
    return {t.name: t for t in fig.data}


def test_latency_lines_and_iqr_bands():
    res = Results(
        [
            _rec(1, "eager", 100.0, 10.0),
            _rec(4, "eager", 160.0, 20.0),
            _rec(1, "replay", 40.0, 4.0),
            _rec(4, "replay", 50.0, 6.0),
        ]  # fmt: skip
    )
    fig = latency(res)
    t = _by_name(fig)
    assert set(t) == {"eager", "eager IQR", "replay", "replay IQR"}
    assert list(t["eager"].x) == [1, 4] and list(t["eager"].y) == [100.0, 160.0]
    assert list(t["replay"].y) == [40.0, 50.0] and t["replay"].line.color == BLUE and t["eager"].line.color == ORANGE
    band = t["replay IQR"]  # a closed polygon: upper edge left to right, lower edge back
    assert list(band.x) == [1, 4, 4, 1] and list(band.y) == [42.0, 53.0, 47.0, 38.0] and band.fill == "toself"
    assert fig.layout.yaxis.title.text == "latency per step (us)"
    assert fig.layout.xaxis.title.text.startswith("batch size")


def test_latency_in_ms_when_the_largest_median_passes_10_ms():
    res = Results([_rec(1, "eager", 9_000.0, 400.0), _rec(4, "eager", 72_000.0, 2_000.0)])
    fig = latency(res)
    t = _by_name(fig)
    assert fig.layout.yaxis.title.text == "latency per step (ms)"
    assert list(t["eager"].y) == [9.0, 72.0] and list(t["eager IQR"].y) == pytest.approx([9.2, 73.0, 71.0, 8.8])
    assert " ms" in t["eager"].hovertemplate and " us" not in t["eager"].hovertemplate
    quick = latency(Results([_rec(1, "eager", 9_999.0, 1.0)]))
    assert quick.layout.yaxis.title.text == "latency per step (us)"  # 10 ms is the switch, not before


def test_roofline_fractions_of_the_measured_ceilings():
    ceil = Ceilings(copy_gbps=10.0, matmul_tflops=1.0)
    res = Results(
        [
            _rec(1, "kernel", 100.0, 1.0, what="gdn", nbytes=500_000, flops=10_000_000),  # 5 GB/s, 0.1 TFLOP/s
            _rec(8, "kernel", 200.0, 1.0, what="gdn", nbytes=2_000_000, flops=40_000_000),  # 10 GB/s, 0.2
            _rec(1, "kernel", 100.0, 1.0, what="conv", nbytes=100_000, flops=None),  # 1 GB/s, no FLOP count
        ]
    )
    fig = roofline(res, ceil)
    by = {(t.name, t.xaxis): t for t in fig.data}
    assert list(by[("gdn", "x")].y) == pytest.approx([0.5, 1.0]) and list(by[("gdn", "x")].x) == [1, 8]
    assert list(by[("gdn", "x2")].y) == pytest.approx([0.1, 0.2])
    assert list(by[("conv", "x")].y) == pytest.approx([0.1]) and ("conv", "x2") not in by  # no flops: left out
    assert "10.0 GB/s" in fig.layout.annotations[0].text
    assert roofline(res, ceil.to_dict()).to_dict()["data"] == fig.to_dict()["data"]  # a dict from JSON works too


def test_bucket_waste_two_lists_side_by_side():
    lists = {"engine": sglang_buckets(16), "mine": [1, 2, 4]}
    assert sglang_buckets(16) == [1, 2, 4, 8, 12, 16]
    fig = bucket_waste(lists, 6, state_bytes_per_row=2**20)
    by = {(t.name, t.xaxis, t.yaxis): t for t in fig.data}
    engine_rows = by[("padded rows", "x", "y")]
    assert list(engine_rows.x) == [1, 2, 3, 4, 5, 6] and list(engine_rows.y) == [0, 0, 1, 0, 3, 2]
    mine_rows = by[("padded rows", "x2", "y2")]
    assert list(mine_rows.x) == [1, 2, 3, 4] and list(mine_rows.y) == [0, 0, 1, 0]
    eager = by[("eager: above the largest bucket", "x2", "y2")]
    assert list(eager.x) == [5, 6]  # above bucket 4: no graph, no padding
    traffic = by[("wasted state traffic (MiB)", "x3", "y3")]
    assert list(traffic.y) == [0, 0, 2, 0, 6, 4]  # read + write of 1 MiB per padded row
    assert ("eager: above the largest bucket", "x", "y") not in by  # the engine list covers 1..6
    assert waste_table([1, 2, 4], 5)[-1] == (5, None, 0)


def test_latency_overlays_keep_their_own_colours_and_refuse_other_benchmarks():
    live = Results([_rec(1, "eager", 100.0, 10.0), _rec(1, "replay", 40.0, 4.0)], meta={"benchmark": "replay"})
    saved = Results([_rec(1, "eager", 90.0, 9.0), _rec(1, "replay", 30.0, 3.0)], meta={"benchmark": "replay"})
    fig = latency(live, overlays={"gpu": saved, "older": saved})
    t = _by_name(fig)
    assert t["this run eager"].line.color == ORANGE and t["this run replay"].line.color == BLUE
    assert t["gpu eager"].line.color == t["gpu replay"].line.color  # one colour per saved run
    colours = {t["gpu eager"].line.color, t["older eager"].line.color}
    assert len(colours) == 2 and not colours & {ORANGE, BLUE}  # never the live run's
    assert t["gpu eager"].line.dash == "dot" and t["gpu replay"].line.dash == "solid"
    assert (
        t["gpu replay"].marker.symbol == "diamond" and t["gpu eager IQR"].fillcolor != t["this run eager IQR"].fillcolor
    )
    meta = Results([_rec(1, "update", 11.0, 0.1, what="metadata_update")], meta={"benchmark": "metadata"})
    with pytest.raises(
        ValueError, match=r"overlays\['meta'\]: a 'metadata' benchmark \(metadata_update\), not 'replay'"
    ):
        latency(live, overlays={"meta": meta})
    assert benchmark_kind(Results([_rec(1, "eager", 1.0, 0.0, what="gdn_decode_step")])) == "replay"
    assert benchmark_kind(Results([_rec(1, "kernel", 1.0, 0.0, what="copy")])) == "records of copy"


def _ceil(**kw):
    base = dict(copy_gbps=10.0, matmul_tflops=1.0, copy_bytes=64 * 2**20, copy_runs=(6.0, 10.0, 15.0))
    return Ceilings(**{**base, **kw})


def test_roofline_shows_the_ceilings_spread_and_explains_points_above_100_percent():
    ceil = _ceil(cache_bytes=32 * 2**20, cache_name="L3", matmul_runs=(0.5, 1.0, 1.2))
    res = Results(
        [
            _rec(1, "kernel", 100.0, 1.0, what="gdn", nbytes=1_500_000, flops=10**7),  # 150% of copy, fits the L3
            _rec(8, "kernel", 1000.0, 1.0, what="gdn", nbytes=60 * 2**20),  # 62.9 GB/s, beyond the L3
            _rec(64, "kernel", 100_000.0, 1.0, what="gdn", nbytes=64 * 2**20),  # 0.67 GB/s, beyond, below 100%
        ]
    )
    fig = roofline(res, ceil)
    gdn = next(t for t in fig.data if t.name == "gdn" and t.xaxis == "x")
    assert list(gdn.marker.symbol) == ["diamond-open", "circle", "circle"]
    assert "fits the L3" in gdn.customdata[0][2] and gdn.customdata[1][2] == ""  # said on hover
    assert any(t.name == "bytes fit the L3 32 MiB" for t in fig.data)  # the marker's legend entry
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    assert [(b.y0, b.y1) for b in bands] == [pytest.approx((0.6, 1.5)), pytest.approx((0.5, 1.2))]
    note = next(a for a in fig.layout.annotations if a.name == "notes").text
    assert "Copy ceiling: 10.0 GB/s (median of 3: 6.0-15.0) on a 64 MiB copy" in note
    assert "1 point(s) above 100% move bytes that fit the L3 32 MiB" in note
    assert "read faster than DRAM copy bandwidth" in note
    assert "1 point(s) above 100% move more than the cache holds" in note


def test_roofline_of_an_old_file_says_the_cache_is_unknown():
    old = Ceilings.from_dict({"copy_gbps": 10.0, "matmul_tflops": 1.0, "copy_bytes": 2**26})  # before repeats
    res = Results([_rec(1, "kernel", 100.0, 1.0, what="gdn", nbytes=1_500_000)])
    fig = roofline(res, old)
    note = next(a for a in fig.layout.annotations if a.name == "notes").text
    assert "(1 run: spread unknown)" in note and "no cache size recorded" in note
    assert not [s for s in fig.layout.shapes if s.type == "rect"]  # no spread, no band
    small = _ceil(copy_bytes=2**24, cache_bytes=32 * 2**20, cache_name="L3")
    note = next(a for a in roofline(res, small).layout.annotations if a.name == "notes").text
    assert "The copy itself fits the L3 32 MiB: this ceiling measured the cache, not DRAM" in note
