"""viz: data in, figure out. Figures built from known metadata carry the expected traces and values, and
each profile's padded rows sit in the trace the legend names for what the kernel does with them."""

import pytest

pytest.importorskip("plotly")

from workbench import Batch, StatePool, build_metadata, get_profile  # noqa: E402
from workbench.viz import integrity_heatmap, padded_batch, padding_map, qsl_staircase, slot_map  # noqa: E402
from workbench.viz import metadata as vm  # noqa: E402
from workbench.viz.palette import VERMILLION  # noqa: E402


def _decode(profile, seq_lens=(7, 3, 9, 4, 12), num_slots=32, buckets=None):
    pool = StatePool(num_slots, profile)
    scratch = pool.alloc(6)
    pool.free(scratch[::2])  # scattered slots, as in a busy server
    rows = pool.alloc(len(seq_lens))
    return build_metadata(Batch.decode(rows, list(seq_lens)), pool, bucket="auto", buckets=buckets), pool


def test_padded_batch_figure_shows_live_and_padded_rows():
    metas = []
    for profile in ("sglang", "vllm"):
        pool = StatePool(16, profile, slots_per_request=get_profile(profile).slots_per_request(3))
        metas.append(build_metadata(Batch.target_verify(pool.alloc(3), [4, 5, 6], 3), pool, bucket=4, buckets=[4]))
    fig = padded_batch(metas)
    bars = {(t.name, t.xaxis): t for t in fig.data}
    assert len(fig.data) == 4 and len(fig.layout.annotations) == 2  # live + pad trace per panel, one title each
    live, pad = bars[("live rows", "x")], bars[("pad rows", "x")]
    assert list(live.x) == [3, 3, 3] and list(live.base) == [0, 3, 6]
    assert list(pad.base) == [9] and 0 < pad.x[0] < 1  # a zero-length row drawn as a visible sliver
    assert list(pad.text) == ["slot -1"] and list(bars[("pad rows", "x2")].text) == ["slot [0, 0, 0]"]


def test_padded_batch_takes_one_metadata_or_a_list():
    meta, _ = _decode("sglang")
    one, listed = padded_batch(meta), padded_batch([meta])
    assert [t.name for t in one.data] == ["live rows", "pad rows"] and len(one.layout.annotations) == 1
    assert one.to_plotly_json() == listed.to_plotly_json()


def test_layout_helpers_are_what_the_figures_apply():
    """The widgets update figures in place with these; the figures themselves are laid out by them."""
    metas = [_decode(p)[0] for p in ("sglang", "sglang", "vllm")]
    assert vm.unique_labels(metas) == ["sglang decode 5->8", "sglang decode 5->8 (2)", "vllm decode 5->8"]
    layout = vm.padding_map_layout(metas)
    fig = padding_map(metas)
    assert fig.layout.height == layout["height"] == 140 + 60 * 3
    assert list(fig.layout.xaxis.range) == layout["xaxis_range"] == [-0.6, 7.6]
    assert list(fig.layout.yaxis.categoryarray) == layout["yaxis_categoryarray"] == vm.unique_labels(metas)[::-1]
    assert vm.padding_cells([0, 3]) == {"x": [1, 1], "base": [-0.5, 2.5]}
    meta, pool = _decode("sglang")
    sl = vm.slot_map_layout(meta, pool)
    smap = slot_map(meta, pool)
    assert smap.layout.title.text == sl["title_text"] and smap.layout.height == sl["height"]
    assert list(smap.layout.xaxis2.tickvals) == sl["xaxis2_tickvals"] and sl["xaxis2_ticktext"][0] == "sentinel"


def test_padding_map_puts_each_profiles_padded_rows_in_the_trace_the_legend_names():
    metas = [_decode(p)[0] for p in ("sglang", "sglang-ascend", "vllm")]
    fig = padding_map(metas)
    traces = {t.name: t for t in fig.data}
    assert list(traces) == [vm.LIVE_ROW, vm.PAD_SKIPPED, vm.PAD_PROCESSED]
    labels = [vm.panel_label(m) for m in metas]  # "sglang decode 5->8", ...

    def cells(name, label):
        t = traces[name]
        return sorted(int(b + 0.5) for b, y in zip(t.base, t.y, strict=True) if y == label)

    for label in labels:
        assert cells(vm.LIVE_ROW, label) == [0, 1, 2, 3, 4]
    # sglang (-1) and vLLM (null slot 0) skip rows 5..7; Ascend processes them on dummy slot 0
    assert cells(vm.PAD_SKIPPED, labels[0]) == [5, 6, 7]
    assert cells(vm.PAD_SKIPPED, labels[2]) == [5, 6, 7]
    assert cells(vm.PAD_PROCESSED, labels[1]) == [5, 6, 7]
    assert cells(vm.PAD_PROCESSED, labels[0]) == [] and cells(vm.PAD_SKIPPED, labels[1]) == []
    # the cell text is the state index the kernel is handed
    skipped = traces[vm.PAD_SKIPPED]
    assert {t for t, y in zip(skipped.text, skipped.y, strict=True) if y == labels[0]} == {"-1"}
    assert {t for t, y in zip(skipped.text, skipped.y, strict=True) if y == labels[2]} == {"0"}
    assert set(traces[vm.PAD_PROCESSED].text) == {"0"}
    live = traces[vm.LIVE_ROW]
    assert [t for t, y in zip(live.text, live.y, strict=True) if y == labels[0]] == [
        str(int(s)) for s in metas[0].state_indices[:5]
    ]
    # skipped vs processed: visibly different (colour and hatch), never both grey
    assert traces[vm.PAD_PROCESSED].marker.color == VERMILLION
    assert traces[vm.PAD_SKIPPED].marker.color != traces[vm.PAD_PROCESSED].marker.color
    assert traces[vm.PAD_SKIPPED].marker.pattern.shape != traces[vm.PAD_PROCESSED].marker.pattern.shape
    # hover names the profile, the row and the fate; axes carry units
    assert any("processed on dummy slot 0" in c[4] for c in traces[vm.PAD_PROCESSED].customdata)
    # what "processed" means, truthfully: the conv writes the slot, the recurrence sees a zero-length row
    assert all("conv update writes it" in c[4] and "zero-length" in c[4] for c in traces[vm.PAD_PROCESSED].customdata)
    assert "batch row" in fig.layout.xaxis.title.text


def test_padding_map_of_one_unpadded_step_keeps_every_trace():
    meta, _ = _decode("sglang", seq_lens=(5, 6, 7, 8), buckets=[4])
    fig = padding_map(meta)
    assert [len(t.y) for t in fig.data] == [4, 0, 0]


def test_slot_map_shows_rows_slots_sentinel_dummy_and_access():
    meta, pool = _decode("sglang")
    fig = slot_map(meta, pool)
    t = {tr.name: tr for tr in fig.data}
    live_slots = meta.state_indices[:5].tolist()
    assert list(t[vm.SLOT_LIVE].x) == live_slots and list(t[vm.SLOT_LIVE].y) == [0, 1, 2, 3, 4]
    assert list(t[vm.SLOT_SKIPPED].x) == [-1, -1, -1] and list(t[vm.SLOT_SKIPPED].y) == [5, 6, 7]
    assert len(t[vm.SLOT_PROCESSED].x) == 0
    assert list(t[vm.POOL_DUMMY].x) == [0]
    assert sorted(t[vm.POOL_BATCH].x) == sorted(live_slots)
    others = set(pool.owned_slots()) - set(live_slots)
    assert set(t[vm.POOL_OTHER].x) == others and others  # a fragmented pool: requests outside this batch
    assert sorted(t[vm.POOL_READ].x) == sorted(live_slots) == sorted(t[vm.POOL_WRITTEN].x)
    assert "request row" in t[vm.SLOT_LIVE].customdata[0]

    ascend, apool = _decode("sglang-ascend")
    t = {tr.name: tr for tr in slot_map(ascend, apool).data}
    assert list(t[vm.SLOT_PROCESSED].x) == [0, 0, 0] and len(t[vm.SLOT_SKIPPED].x) == 0
    assert 0 in t[vm.POOL_WRITTEN].x  # the dummy slot is really written

    t = {tr.name: tr for tr in slot_map(ascend, apool, read=[3], written=[3, 9]).data}
    assert list(t[vm.POOL_READ].x) == [3] and list(t[vm.POOL_WRITTEN].x) == [3, 9]


def test_slot_map_of_vllm_verify_has_d_slots_per_row_and_writes_nothing_to_the_pool():
    pool = StatePool(32, "vllm", slots_per_request=3)
    meta = build_metadata(Batch.target_verify(pool.alloc(3), [4, 5, 6], 3), pool, bucket=4, buckets=[4])
    t = {tr.name: tr for tr in slot_map(meta, pool).data}
    assert len(t[vm.SLOT_LIVE].x) == 9 and list(t[vm.SLOT_LIVE].y) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert list(t[vm.SLOT_SKIPPED].x) == [0, 0, 0]  # the null slot, skipped
    assert len(t[vm.POOL_WRITTEN].x) == 0  # verify writes the intermediate buffer, not the pool


def test_qsl_staircase_decode_and_verify():
    decode, _ = _decode("sglang")
    pool = StatePool(32, "sglang")
    verify = build_metadata(Batch.target_verify(pool.alloc(3), [4, 5, 6], 4), pool, bucket=4, buckets=[4])
    fig = qsl_staircase([decode, verify])
    a, b = fig.data
    assert list(a.y) == [0, 1, 2, 3, 4, 5, 5, 5, 5] and list(b.y) == [0, 4, 8, 12, 12]
    assert a.line.shape == "hv" and a.name == "sglang decode 5->8"
    assert list(b.marker.symbol) == ["circle"] * 4 + ["circle-open"]  # the padded row's end is open
    assert "padded row 3" in b.customdata[4]
    assert fig.layout.yaxis.title.text == "token offset (tokens)"


def test_integrity_heatmap_codes_violations_red():
    changed = [[True, False, False, False], [True, True, False, True]]
    allowed = [[False, False, False, False], [False, True, False, False]]
    fig = integrity_heatmap(changed, slots=[0, 1, 2, 3], steps=["capture", "replay"], dummy_slot=0, allowed=allowed)
    (hm,) = fig.data
    assert [list(r) for r in hm.z] == [[2, 0, 0, 0], [2, 1, 0, 3]]
    red = [c for v, c in hm.colorscale if abs(v - 1.0) < 1e-9]
    assert red == [VERMILLION]  # the top code (a violation) is vermillion
    assert hm.customdata[1][3] == "replay, slot 3: changed but should not have (lost state)"
    # torch input works; no allowed mask: every change but the dummy's is a violation
    import torch

    fig = integrity_heatmap(torch.tensor([[True, True]]), slots=[0, 5], steps=["s"], dummy_slot=0)
    assert [list(r) for r in fig.data[0].z] == [[2, 3]]


def test_a_k_first_read_of_a_v_first_slot_takes_the_transposed_element_at_k_eq_v_and_others_elsewhere():
    from workbench.errors import MetadataError
    from workbench.profiles import PROFILES
    from workbench.viz.layout import ELSEWHERE, RIGHT, TRANSPOSED, layout_codes, layout_reads, state_layout_map

    assert {p.state_layout for p in PROFILES.values()} == {"v_first"}  # both released engines keep V-first pools
    for K, V in ((4, 4), (12, 20), (20, 12)):
        reads = layout_reads(K, V, written="v_first", read="k_first")
        for k in range(K):
            for v in range(V):  # independent arithmetic: the offset a [K, V] reader asks for, decoded as [V, K]
                offset = k * V + v
                assert reads[k][v] == (offset % K, offset // K)
        assert layout_reads(K, V, written="k_first", read="k_first") == [[(k, v) for v in range(V)] for k in range(K)]
    square = [c for row in layout_codes(4, 4) for c in row]
    assert square.count(RIGHT) == 4 and square.count(TRANSPOSED) == 12 and ELSEWHERE not in square
    wide = [c for row in layout_codes(12, 20) for c in row]
    assert wide.count(ELSEWHERE) > 200 and wide[0] == RIGHT
    fig = state_layout_map(12, 20)
    assert "238 of 240 elements" in fig.layout.title.text and len(fig.data[0].z) == 12
    assert "written there as s[k=" in fig.data[0].customdata[0][1]
    with pytest.raises(MetadataError, match=r"read='kv': must be one of"):
        layout_reads(2, 2, read="kv")
    with pytest.raises(MetadataError, match=r"K=0: must be an int"):
        layout_reads(0, 2)
