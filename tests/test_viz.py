"""viz: data in, figure out; padded rows visible and labelled with the profile's sentinel."""

from workbench import Batch, StatePool, build_metadata, get_profile
from workbench.viz import padded_batch


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
