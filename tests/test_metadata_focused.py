"""Metadata build and validate, each rule at its edge (issue 27): the first padded row, the first live row,
a pool with D slots per request (decode and extend read a request's first slot), every layout check of
``validate`` with the words it says. Fast: no graph, no kernel."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from workbench import Batch, MetadataBuffers, MetadataError, StatePool, build_metadata, validate
from workbench.metadata.padding import live_index_table, row_views


def _decode(profile: str = "sglang", n: int = 3, bucket: int = 4, **pool_kw):
    pool = StatePool(12, profile, **pool_kw)
    pool.free(pool.alloc(2)[:1])  # a hole: live rows are not 1..n
    rows = pool.alloc(n)
    meta = build_metadata(Batch.decode(rows, [5 + i for i in range(n)]), pool, bucket=bucket, buckets=[1, 2, 4, 8])
    return pool, rows, meta


# -- a pool with D slots per request (vLLM with speculation) -----------------------------------------------
@pytest.mark.parametrize("profile", ["vllm", "sglang"])
def test_decode_and_extend_on_a_pool_of_d_slots_per_request_read_the_first_slot(profile):
    """Decode and extend read and write a request's running state: column 0 of its D slots, never the last."""
    pool = StatePool(24, profile, slots_per_request=3)
    rows = pool.alloc(3)
    first = pool.mapping[rows, 0].tolist()
    assert all(len(set(pool.slots_of(r))) == 3 for r in rows.tolist()) and first != pool.mapping[rows, 2].tolist()
    for mode in ("decode", "extend"):
        table = live_index_table(pool, mode, 1)
        assert table.shape == (pool.mapping.shape[0],) and torch.equal(table, pool.mapping[:, 0])
    decode = build_metadata(Batch.decode(rows, [4, 5, 6]), pool, bucket=4, buckets=[4])
    assert decode.state_indices.tolist() == [*first, 0 if profile == "vllm" else -1]
    validate(decode, pool)
    extend = build_metadata(Batch.extend(rows, [2, 3, 1], [0, 4, 1]), pool, bucket=None)
    assert extend.state_indices.tolist() == first
    validate(extend, pool)
    bufs = MetadataBuffers(pool, "decode", buckets=[2, 4])
    assert bufs.update(Batch.decode(rows, [4, 5, 6])).state_indices.tolist()[:3] == first
    wrong = decode.clone()
    wrong.state_indices[1] = pool.mapping[rows[1], 2]  # the request's last slot: owned, but not its running one
    with pytest.raises(MetadataError, match=rf"state_indices\[1\]: slot {int(wrong.state_indices[1])}, but request "):
        validate(wrong, pool)


def test_vllm_verify_needs_one_slot_per_draft_position():
    pool = StatePool(24, "vllm", slots_per_request=3)
    rows = pool.alloc(2)
    meta = build_metadata(Batch.target_verify(rows, [5, 6], 3, num_accepted_tokens=[1, 3]), pool, bucket=None)
    assert meta.state_indices.tolist() == pool.mapping[rows].tolist()
    assert live_index_table(pool, "target_verify", 3) is pool.mapping
    with pytest.raises(MetadataError, match=r"^slots_per_request=3: profile 'vllm' keeps one slot per draft .*D=2$"):
        live_index_table(pool, "target_verify", 2)
    sglang = StatePool(24, "sglang", slots_per_request=3)
    assert torch.equal(live_index_table(sglang, "target_verify", 2), sglang.mapping[:, 0])


def test_a_vllm_verify_without_counts_reads_the_fill_and_pads_with_it():
    pool = StatePool(24, "vllm", slots_per_request=2)
    rows = pool.alloc(2)
    meta = build_metadata(Batch.target_verify(rows, [5, 6], 2), pool, bucket=4, buckets=[4])
    assert meta.num_accepted_tokens.tolist() == [1, 1, 1, 1]
    validate(meta, pool)


# -- the first padded row and the first live row ------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "row", "value", "message"),
    [
        ("seq_lens", 3, 5, r"seq_lens\[3\]: padded row holds 5, expected fill 1"),
        ("seq_lens", 0, 0, r"seq_lens\[0\]: live row holds 0, must be >= 1"),
        ("seq_lens", 2, 0, r"seq_lens\[2\]: live row holds 0"),
        ("req_pool_indices", 3, 2, r"req_pool_indices\[3\]: padded row holds 2, expected 0"),
        ("has_initial_state", 3, True, r"has_initial_state\[3\]: padded row claims an initial state"),
        ("has_initial_state", 2, False, r"has_initial_state\[2\]: live decode row must read its state"),
        ("state_indices", 3, 1, r"state_indices\[3\]: padded row holds \[1\], expected the sentinel -1"),
        ("state_indices", 2, -1, r"state_indices\[2\]: live row holds the sentinel -1: padding only at the tail"),
        ("state_indices", 2, 12, r"state_indices\[2\]: slot 12 out of range \[0, 12\)"),
        ("query_start_loc", 3, 4, r"query_start_loc\[3\]: batch row 2 has 2 tokens; decode row has 1 tokens"),
        ("query_start_loc", 4, 4, r"query_start_loc\[4\]: batch row 3 has 1 tokens; padded row must be zero-length"),
    ],
)
def test_each_field_is_checked_at_the_boundary_rows(field, row, value, message):
    pool, rows, meta = _decode()
    validate(meta, pool)
    getattr(meta, field)[row] = value
    with pytest.raises(MetadataError, match=f"^{message}"):
        validate(meta, pool)


def test_a_live_row_of_a_request_not_allocated_is_named():
    pool, rows, meta = _decode()
    pool.free([int(rows[1])])
    with pytest.raises(MetadataError, match=rf"^req_pool_indices\[1\]: row {int(rows[1])} is not an allocated request"):
        validate(meta, pool)


def test_a_slot_of_another_request_is_named_with_the_owner():
    pool, rows, meta = _decode()
    other = pool.alloc(1)
    meta.state_indices[0] = pool.mapping[other, 0]
    with pytest.raises(MetadataError, match=rf"^state_indices\[0\]: slot \d+, but request row {int(rows[0])} owns"):
        validate(meta, pool)


# -- layout: sizes, devices, dtypes, shapes ----------------------------------------------------------------
def _set(name: str, change):
    return lambda m: setattr(m, name, change(getattr(m, name)))


LAYOUT = [
    ("raw above bs", lambda m: setattr(m, "raw_batch_size", 5), r"^raw_batch_size: 5 not in \[0, batch_size=4\]"),
    ("raw negative", lambda m: setattr(m, "raw_batch_size", -1), r"^raw_batch_size: -1 not in \[0, batch_size=4\]"),
    ("device", _set("seq_lens", lambda t: t.to("meta")), r"^seq_lens: on device meta, the pool on cpu"),
    ("qsl dtype", _set("query_start_loc", lambda t: t.long()), r"^query_start_loc: dtype torch.int64"),
    ("seq dtype", _set("seq_lens", lambda t: t.long()), r"^seq_lens: dtype torch.int64, expected torch.int32"),
    ("state 2-D", _set("state_indices", lambda t: t.view(4, 1)), r"^state_indices: shape \(4, 1\), expected \(4,\)"),
    ("seq shape", _set("seq_lens", lambda t: t[:3]), r"^seq_lens: shape \(3,\), expected \(4,\)"),
    ("rpi shape", _set("req_pool_indices", lambda t: t[:3]), r"^req_pool_indices: shape \(3,\)"),
    ("init shape", _set("has_initial_state", lambda t: t[:2]), r"^has_initial_state: shape \(2,\)"),
    ("init dtype", _set("has_initial_state", lambda t: t.int()), r"^has_initial_state: dtype torch.int32, expected"),
    (
        "qsl longer",
        _set("query_start_loc", lambda t: torch.cat([t, t[-1:]])),
        r"^state_indices: shape \(4,\), expected",
    ),
]


@pytest.mark.parametrize(("name", "corrupt", "message"), LAYOUT, ids=[c[0] for c in LAYOUT])
def test_layout_problems_are_named(name, corrupt, message):
    pool, rows, meta = _decode()
    corrupt(meta)
    with pytest.raises(MetadataError, match=message):
        validate(meta, pool)


def test_query_start_loc_starts_at_zero():
    pool, rows, meta = _decode()
    meta.query_start_loc[0] = 1
    with pytest.raises(MetadataError, match=r"^query_start_loc\[0\]: = 1, must be 0"):
        validate(meta, pool)


def test_vllm_counts_must_be_int32_of_the_batch_size():
    pool = StatePool(24, "vllm", slots_per_request=2)
    rows = pool.alloc(2)
    meta = build_metadata(Batch.target_verify(rows, [5, 6], 2, num_accepted_tokens=[2, 1]), pool, bucket=4, buckets=[4])
    validate(meta, pool)
    zero = meta.clone()
    zero.num_accepted_tokens[2] = 0  # the first padded row: named as padding, not as a live row out of 1..D
    with pytest.raises(MetadataError, match=r"^num_accepted_tokens\[2\]: padded row holds 0, expected fill 1"):
        validate(zero, pool)
    for bad in (meta.num_accepted_tokens.long(), meta.num_accepted_tokens[:3], torch.ones(5, dtype=torch.int32)):
        wrong = dataclasses.replace(meta, num_accepted_tokens=bad)
        with pytest.raises(MetadataError, match=r"^num_accepted_tokens: torch.int\d+\[\d\], expected torch.int32\[4\]"):
            validate(wrong, pool)


def test_an_extend_step_without_its_lengths_is_refused():
    pool = StatePool(12, "sglang")
    rows = pool.alloc(2)
    meta = build_metadata(Batch.extend(rows, [3, 2], [0, 1]), pool, bucket=None)
    validate(meta, pool)
    assert meta.has_initial_state.tolist() == [False, True]  # a prefill row reads its state iff cached
    meta.has_initial_state[0] = True
    validate(meta, pool)  # extend rows may read or not: only graph modes must
    with pytest.raises(MetadataError, match=r"^extend_lens: missing: an extend step needs its per-row lengths"):
        validate(dataclasses.replace(meta, extend_lens=None), pool)


@pytest.mark.parametrize(("length", "row"), [(3, 3), (5, 4)])
def test_intermediate_indices_of_another_length_name_the_first_row_off(length, row):
    pool = StatePool(12, "sglang")
    rows = pool.alloc(3)
    meta = build_metadata(Batch.target_verify(rows, [5, 6, 7], 2), pool, bucket=4, buckets=[4])
    wrong = dataclasses.replace(meta, intermediate_state_indices=torch.arange(length, dtype=torch.int32))
    with pytest.raises(MetadataError, match=rf"^intermediate_state_indices\[{row}\]: must be the batch row"):
        validate(wrong, pool)


# -- the build's inputs and bucket -------------------------------------------------------------------------
def test_default_buckets_come_from_the_pool_and_the_mode():
    pool = StatePool(22, "sglang")
    rows = pool.alloc(9)
    assert build_metadata(Batch.decode(rows, [3] * 9), pool).batch_size == 12  # 1, 2, 4, 8, 12, 16, 20, 21
    assert build_metadata(Batch.target_verify(rows, [3] * 9, 2), pool).batch_size == 10  # 1..8, 10, 12, ...
    eager = build_metadata(Batch.decode(rows, [3] * 9), pool, buckets=[2, 4])
    assert (eager.batch_size, eager.bucket) == (9, None)
    assert eager.eager_reason.endswith(": runs eagerly") and "above the largest captured bucket 4" in eager.eager_reason
    padded = build_metadata(Batch.decode(rows, [3] * 9), pool, bucket=16, buckets=[2, 16])
    assert (padded.batch_size, padded.bucket, padded.eager_reason) == (16, 16, None)


def test_bad_inputs_of_the_build_are_one_line():
    pool = StatePool(12, "sglang")
    rows = pool.alloc(2)
    with pytest.raises(MetadataError, match=r"^pool must be a workbench.StatePool, got dict"):
        build_metadata(Batch.decode(rows, [3, 4]), {})  # type: ignore[arg-type]
    with pytest.raises(MetadataError, match=r"^batch.req_pool_indices is on meta, the pool on cpu"):
        build_metadata(Batch.decode(torch.tensor(rows.tolist(), device="meta"), [3, 4], device="meta"), pool)


def test_extend_offsets_are_the_running_sum_and_verify_offsets_step_by_d():
    pool = StatePool(12, "sglang")
    rows = pool.alloc(3)
    ext = build_metadata(Batch.extend(rows, [4, 1, 6], [0, 3, 2]), pool, bucket=None)
    assert ext.query_start_loc.tolist() == [0, 4, 5, 11] and ext.extend_lens.tolist() == [4, 1, 6]
    ver = build_metadata(Batch.target_verify(rows, [5, 6, 7], 3), pool, bucket=8, buckets=[8])
    assert ver.query_start_loc.tolist() == [0, 3, 6, 9, 9, 9, 9, 9, 9]
    idle = build_metadata(Batch.idle(), pool, bucket=2, buckets=[2])
    assert idle.query_start_loc.tolist() == [0, 0, 0] and idle.draft_tokens == 0


def test_row_views_are_fixed_once_made():
    """The buffers cache each (bucket, rows) pair's views: one rebound by mistake would write elsewhere."""
    pool, rows, meta = _decode()
    views = row_views(meta, 3)
    assert views.state_live.data_ptr() == meta.state_indices.data_ptr() and views.state_pad.numel() == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        views.state_pad = meta.state_indices  # type: ignore[misc]


def test_a_bucket_past_the_free_memory_is_refused_before_anything_is_allocated(monkeypatch):
    from workbench import limits

    monkeypatch.setattr(limits, "host_memory_bytes", lambda: 10_000)
    pool = StatePool(12, "sglang")
    rows = pool.alloc(2)
    with pytest.raises(MetadataError, match=r"^bucket=4096 needs .* for metadata of 4,096 padded rows"):
        build_metadata(Batch.decode(rows, [3, 4]), pool, bucket=4096, buckets=[2, 4096])
    assert build_metadata(Batch.decode(rows, [3, 4]), pool, bucket=2, buckets=[2, 4096]).batch_size == 2


def test_the_padded_row_of_a_profile_is_a_fixed_record():
    from workbench.metadata.padding import PaddedRow
    from workbench.profiles import get_profile

    pad = PaddedRow.of(get_profile("vllm"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        pad.seq_len = 5  # type: ignore[misc]
    assert hash(pad) == hash(PaddedRow.of(get_profile("vllm")))
