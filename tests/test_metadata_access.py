"""What the kernels do with each row (``row_fate``) and which slots they touch (``predicted_access``), from
their home ``workbench.metadata``, on the profile's one skip rule (``Convention.skips``)."""

import pytest
import torch

from workbench import Batch, MetadataBuffers, MetadataError, StatePool, build_metadata, get_profile
from workbench.metadata import predicted_access, row_fate
from workbench.metadata.access import ROW_FATES

PROFILES = ["sglang", "sglang-ascend", "vllm"]
# what a padded row's kernel does, per profile: sglang skips -1, vLLM skips its null slot 0, Ascend skips nothing
PADDED_FATE = {"sglang": "skipped", "sglang-ascend": "processed", "vllm": "skipped"}


def _decode(profile: str, raw: int = 3, bucket: int = 8) -> tuple[StatePool, object]:
    pool = StatePool(16, profile)
    pool.free(pool.alloc(4)[::2])  # holes: live slots are not 1..n
    meta = build_metadata(Batch.decode(pool.alloc(raw), [5] * raw), pool, bucket=bucket, buckets=[bucket])
    return pool, meta


@pytest.mark.parametrize("profile", PROFILES)
def test_row_fate_per_profile(profile):
    _, meta = _decode(profile)
    fates = [row_fate(meta, i) for i in range(meta.batch_size)]
    assert fates == ["live"] * 3 + [PADDED_FATE[profile]] * 5
    assert set(fates) <= set(ROW_FATES)
    convention = get_profile(profile).convention
    for i in range(3, meta.batch_size):  # the same rule as the convention's, row by row
        assert (row_fate(meta, i) == "skipped") == convention.skips(int(meta.state_indices[i]))


@pytest.mark.parametrize("profile", PROFILES)
def test_predicted_access_per_profile_in_decode(profile):
    pool, meta = _decode(profile)
    live = meta.state_indices[:3].tolist()
    read, written = predicted_access(meta)
    dummy = [get_profile(profile).dummy_slot] if PADDED_FATE[profile] == "processed" else []
    assert read == written == sorted(live + dummy)
    assert all(pool.mapping[r, 0] in live for r in meta.req_pool_indices[:3].tolist())


@pytest.mark.parametrize("profile", PROFILES)
def test_predicted_access_in_verify_writes_nothing_to_the_pool(profile):
    d = 2
    pool = StatePool(16, profile, slots_per_request=get_profile(profile).slots_per_request(d))
    meta = build_metadata(Batch.target_verify(pool.alloc(2), [5, 6], d), pool, bucket=4, buckets=[4])
    read, written = predicted_access(meta)
    live = sorted(torch.as_tensor(meta.state_indices[:2]).flatten().tolist())
    dummy = [0] if PADDED_FATE[profile] == "processed" else []
    assert read == sorted(set(live + dummy)) and written == []
    assert [row_fate(meta, i) for i in range(4)] == ["live", "live", PADDED_FATE[profile], PADDED_FATE[profile]]


def test_predicted_access_skips_the_reads_of_a_row_without_initial_state():
    pool = StatePool(16, "sglang")
    rows = pool.alloc(2)
    meta = build_metadata(Batch.extend(rows, [3, 2], [0, 4]), pool, bucket=None)
    read, written = predicted_access(meta)
    slots = meta.state_indices.tolist()
    assert read == [slots[1]] and written == sorted(slots)


def test_fates_read_the_graph_buffers_too():
    pool = StatePool(16, "sglang-ascend")
    meta = MetadataBuffers(pool, "decode", buckets=[4]).update(Batch.decode(pool.alloc(1), [5]))
    assert [row_fate(meta, i) for i in range(4)] == ["live", "processed", "processed", "processed"]


@pytest.mark.parametrize("row", [-1, 8, True, 1.0])
def test_row_fate_names_a_bad_row(row):
    _, meta = _decode("sglang")
    with pytest.raises(MetadataError, match=rf"^row: expected a batch row in \[0, batch_size=8\), got {row!r}$"):
        row_fate(meta, row)


def test_viz_and_the_record_view_use_the_one_rule():
    """The figures import the rule; the record's table (what the widgets show) has a kernel column that
    follows it row by row, processed padding in vermillion."""
    import workbench.viz.metadata as vm
    from workbench.widgets import html as wh

    assert vm.row_fate is row_fate and vm.predicted_access is predicted_access
    for profile, fate in (("sglang", "skipped"), ("sglang-ascend", "processed"), ("vllm", "skipped")):
        pool = StatePool(8, profile)
        meta = build_metadata(Batch.decode(pool.alloc(2), [3, 4]), pool, bucket=4, buckets=[4])
        assert [r["kernel"] for r in meta.rows()] == [row_fate(meta, i) for i in range(4)] == ["live"] * 2 + [fate] * 2
        page = wh.metadata_html(meta)
        assert page == meta._repr_html_() and f"padded rows 2-3: {fate if fate == 'processed' else 'skipped'}" in page
        assert ('class="wb-fail"' in page) == (fate == "processed")
