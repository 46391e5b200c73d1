"""The metadata engine: per-profile conventions, bucket choice, validation, and every bad input."""

import pytest
import torch

from workbench import (
    Batch,
    MetadataBuffers,
    MetadataError,
    StatePool,
    build_metadata,
    capture_buckets,
    choose_bucket,
    get_profile,
    validate,
)

PROFILES = ["sglang", "sglang-ascend", "vllm"]


def scattered_pool(profile: str, n: int, num_slots: int = 32, spr: int = 1) -> tuple[StatePool, torch.Tensor]:
    """A pool that has seen frees, so live slots are not 1..n in order."""
    pool = StatePool(num_slots, profile, slots_per_request=spr)
    first = pool.alloc(pool.capacity)
    pool.free(first[torch.randperm(first.numel())[: n + 3]])
    return pool, pool.alloc(n)[torch.randperm(n)]


@pytest.mark.parametrize("profile", PROFILES)
def test_decode_padding_per_profile(profile):
    pool, rows = scattered_pool(profile, 5)
    meta = build_metadata(Batch.decode(rows, [7, 3, 9, 4, 12]), pool, bucket="auto")
    prof = get_profile(profile)
    assert (meta.batch_size, meta.raw_batch_size, meta.num_padding) == (8, 5, 3)
    assert meta.state_indices.dtype == torch.int32 and meta.query_start_loc.dtype == torch.int32
    live = [pool.slots_of(r)[0] for r in rows.tolist()]
    assert meta.state_indices.tolist() == live + [prof.sentinel] * 3
    assert meta.query_start_loc.tolist() == [0, 1, 2, 3, 4, 5, 5, 5, 5]
    assert meta.seq_lens.tolist() == [7, 3, 9, 4, 12] + [prof.seq_len_fill] * 3
    assert meta.req_pool_indices.tolist()[5:] == [0, 0, 0]
    assert meta.has_initial_state.tolist() == [True] * 5 + [False] * 3
    validate(meta, pool)


def test_profile_conventions():
    s, a, v = (get_profile(p) for p in PROFILES)
    assert (s.sentinel, s.kernel_pad_slot_id, s.seq_len_fill, s.reserved_request_row) == (-1, -1, 1, 0)
    assert (a.sentinel, a.kernel_pad_slot_id, a.seq_len_fill) == (0, None, 0)
    assert (v.sentinel, v.kernel_pad_slot_id, v.num_accepted_fill, v.spec_indices_2d) == (0, 0, 1, True)
    for p in (s, a, v):
        assert p.dummy_slot == 0


@pytest.mark.parametrize("profile", ["sglang", "sglang-ascend"])
def test_verify_sglang(profile):
    pool, rows = scattered_pool(profile, 3)
    meta = build_metadata(Batch.target_verify(rows, [10, 11, 12], draft_tokens=4), pool, bucket=4, buckets=[2, 4])
    assert meta.query_start_loc.tolist() == [0, 4, 8, 12, 12]
    assert meta.intermediate_state_indices.tolist() == [0, 1, 2, 3]  # by batch row, not slot
    assert meta.num_accepted_tokens is None
    validate(meta, pool)


def test_verify_vllm_two_d_indices_and_accepted_padding():
    pool, rows = scattered_pool("vllm", 2, num_slots=40, spr=3)
    batch = Batch.target_verify(rows, [5, 6], draft_tokens=3, num_accepted_tokens=[2, 3])
    meta = build_metadata(batch, pool, bucket=4, buckets=[1, 2, 4])
    assert meta.state_indices.shape == (4, 3)
    assert meta.state_indices.tolist()[:2] == [pool.slots_of(r) for r in rows.tolist()]
    assert meta.state_indices.tolist()[2:] == [[0, 0, 0]] * 2
    assert meta.num_accepted_tokens.tolist() == [2, 3, 1, 1]
    assert meta.intermediate_state_indices is None
    validate(meta, pool)
    bufs = MetadataBuffers(pool, "target_verify", buckets=[1, 2, 4], draft_tokens=3)
    idle = bufs.update(Batch.idle())
    assert idle.state_indices.tolist() == [[0, 0, 0]] and idle.num_accepted_tokens.tolist() == [1]
    validate(idle, pool)


def test_extend_and_idle():
    pool, rows = scattered_pool("sglang", 3)
    meta = build_metadata(Batch.extend(rows, [4, 1, 6], [0, 3, 2]), pool, bucket=None)
    assert meta.query_start_loc.tolist() == [0, 4, 5, 11]
    assert meta.has_initial_state.tolist() == [False, True, True]
    assert meta.seq_lens.tolist() == [4, 4, 8]
    validate(meta, pool)
    idle = build_metadata(Batch.idle(), pool, bucket="auto", buckets=[2, 4])
    assert idle.state_indices.tolist() == [-1, -1] and idle.query_start_loc.tolist() == [0, 0, 0]
    validate(idle, pool)


@pytest.mark.parametrize("max_bs", [1, 7, 16, 100, 256, 300, 511, 512, 700])
def test_default_bucket_lists_follow_the_formula(max_bs):
    nospec = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    spec = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, max_bs + 1, 16)]
    for speculative, sizes in ((False, nospec), (True, spec)):
        want = sorted({b for b in sizes if b <= max_bs} | {max_bs})
        assert capture_buckets(max_bs, speculative=speculative) == want


def test_default_bucket_lists():
    assert capture_buckets(20) == [1, 2, 4, 8, 12, 16, 20]
    nospec = capture_buckets(600)
    assert nospec[:6] == [1, 2, 4, 8, 12, 16] and 256 in nospec and 272 in nospec and 496 in nospec
    assert 512 in nospec and 544 in nospec and nospec[-1] == 600 and 264 not in nospec
    spec = capture_buckets(300, speculative=True)
    assert spec[:10] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12] and 34 not in spec and 40 in spec and 44 in spec
    assert 288 in spec and spec[-1] == 300
    assert capture_buckets(24, profile="vllm") == [1, 2, 4, 8, 16, 24]


def test_bucket_choice_and_eager_fallback():
    assert choose_bucket(5, [1, 2, 4, 8]) == 8
    assert choose_bucket(8, [1, 2, 4, 8]) == 8
    assert choose_bucket(9, [1, 2, 4, 8]) is None
    pool, rows = scattered_pool("sglang", 9)
    meta = build_metadata(Batch.decode(rows, [3] * 9), pool, bucket="auto", buckets=[1, 2, 4, 8])
    assert meta.batch_size == 9 and meta.bucket is None and "eager" in meta.eager_reason
    validate(meta, pool)


def test_graph_buffers_equal_eager_and_keep_addresses():
    pool, rows = scattered_pool("sglang", 6)
    bufs = MetadataBuffers(pool, "decode", buckets=[2, 4, 8])
    addr = {bs: m.state_indices.data_ptr() for bs, m in bufs.static.items()}
    for n in (6, 1, 3, 0):
        batch = Batch.decode(rows[:n], list(range(2, 2 + n))) if n else Batch.idle()
        got = bufs.update(batch)
        want = build_metadata(batch, pool, bucket="auto", buckets=[2, 4, 8])
        for name, t in want.tensors().items():
            assert torch.equal(getattr(got, name), t), name
        assert got.state_indices.data_ptr() == addr[got.batch_size]
        validate(got, pool)


def test_capture_state_points_only_at_dummy_slot():
    pool, _ = scattered_pool("sglang", 4)
    bufs = MetadataBuffers(pool, "decode", buckets=[4])
    m = bufs.reset_for_capture(4)
    assert m.state_indices.tolist() == [0, 0, 0, 0]
    assert pool.mapping[m.req_pool_indices].flatten().tolist() == [0, 0, 0, 0]


def test_validate_catches_corruption():
    pool, rows = scattered_pool("sglang", 3)

    def fresh():
        return build_metadata(Batch.decode(rows, [5, 6, 7]), pool, bucket=4, buckets=[4])

    cases = [
        ("state_indices", 3, 5, "sentinel"),  # padded row not the sentinel
        ("state_indices", 1, -1, "padding only at the tail"),
        ("state_indices", 0, 0, "dummy slot"),
        ("state_indices", 0, 99, "out of range"),
        ("query_start_loc", 0, 1, "must be 0"),
        ("query_start_loc", 4, 4, "zero-length"),
        ("seq_lens", 3, 7, "fill"),
    ]
    for field, row, value, words in cases:
        meta = fresh()
        getattr(meta, field)[row] = value
        with pytest.raises(MetadataError, match=rf"{field}\[{row}\].*{words}"):
            validate(meta, pool)
    meta = fresh()
    meta.state_indices[1] = meta.state_indices[0]
    with pytest.raises(MetadataError, match=r"state_indices\[1\].*also used by row 0"):
        validate(meta, pool)
    meta = fresh()
    meta.query_start_loc[2] = 0
    with pytest.raises(MetadataError, match=r"query_start_loc\[2\].*non-decreasing"):
        validate(meta, pool)
    meta = fresh()
    meta.state_indices = meta.state_indices.long()
    with pytest.raises(MetadataError, match="state_indices: dtype torch.int64"):
        validate(meta, pool)


def test_validate_catches_vllm_verify_corruption():
    pool, rows = scattered_pool("vllm", 2, num_slots=40, spr=3)

    def fresh():
        batch = Batch.target_verify(rows, [5, 6], draft_tokens=3, num_accepted_tokens=[2, 3])
        return build_metadata(batch, pool, bucket=4, buckets=[4])

    cases = [
        (lambda m: m.state_indices[3].__setitem__(1, 5), r"state_indices\[3\]: padded row holds \[0, 5, 0\]"),
        (lambda m: m.state_indices[1].__setitem__(0, m.state_indices[0, 2]), r"state_indices\[1\].*also used by row 0"),
        (lambda m: m.num_accepted_tokens.__setitem__(0, 0), r"num_accepted_tokens\[0\]: live row holds 0"),
        (lambda m: m.num_accepted_tokens.__setitem__(1, 4), r"num_accepted_tokens\[1\]: live row holds 4"),
        (lambda m: m.num_accepted_tokens.__setitem__(2, 2), r"num_accepted_tokens\[2\]: padded row holds 2"),
        (lambda m: m.has_initial_state.__setitem__(3, True), r"has_initial_state\[3\]: padded row"),
        (lambda m: m.has_initial_state.__setitem__(0, False), r"has_initial_state\[0\]: live target_verify"),
        (lambda m: setattr(m, "num_accepted_tokens", None), "num_accepted_tokens: missing"),
        (lambda m: setattr(m, "req_pool_indices", m.req_pool_indices.int()), "req_pool_indices: dtype torch.int32"),
    ]
    for corrupt, message in cases:
        meta = fresh()
        validate(meta, pool)
        corrupt(meta)
        with pytest.raises(MetadataError, match=message):
            validate(meta, pool)


def test_validate_catches_wrong_intermediate_indices():
    pool, rows = scattered_pool("sglang", 3)
    meta = build_metadata(Batch.target_verify(rows, [5, 6, 7], 2), pool, bucket=4, buckets=[4])
    meta.intermediate_state_indices[2] = int(meta.state_indices[2])  # a slot, not the batch row
    with pytest.raises(MetadataError, match=r"intermediate_state_indices\[2\]: must be the batch row"):
        validate(meta, pool)


# -- bad input: each case names the field and the value ----------------------------------------------
def _pool():
    pool = StatePool(8, "sglang")
    return pool, pool.alloc(3)


BAD_INPUTS = [
    ("zero seq len", lambda p, r: Batch.decode(r, [3, 0, 2]), r"seq_lens\[1\] = 0"),
    ("negative seq len", lambda p, r: Batch.decode(r, [3, -4, 2]), r"seq_lens\[1\] = -4"),
    ("zero extend len", lambda p, r: Batch.extend(r, [2, 0, 1]), r"extend_lens\[1\] = 0"),
    ("negative prefix", lambda p, r: Batch.extend(r, [2, 2, 1], [0, -1, 0]), r"prefix_lens\[1\] = -1"),
    ("float seq lens", lambda p, r: Batch.decode(r, torch.tensor([1.0, 2.0, 3.0])), "dtype torch.float32"),
    (
        "float list value",
        lambda p, r: Batch.decode(r, [1, 2.5, 3]),
        r"seq_lens\[1\]: expected an int, got 2.5",
    ),
    ("length mismatch", lambda p, r: Batch.decode(r, [1, 2]), "seq_lens: 2 values for 3 requests"),
    (
        "duplicate request",
        lambda p, r: Batch.decode([1, 2, 1], [3, 3, 3]),
        r"req_pool_indices\[2\] = 1: duplicate",
    ),
    (
        "not allocated",
        lambda p, r: build_metadata(Batch.decode([1, 6], [3, 3]), p),
        r"req_pool_indices\[1\] = 6.*not allocated",
    ),
    (
        "D < 1",
        lambda p, r: Batch.target_verify(r, [3, 3, 3], draft_tokens=0),
        "draft_tokens must be an int >= 1, got 0",
    ),
    (
        "accepted > D",
        lambda p, r: Batch.target_verify(r, [3, 3, 3], 2, num_accepted_tokens=[1, 3, 1]),
        r"num_accepted_tokens\[1\] = 3",
    ),
    (
        "batch larger than bucket",
        lambda p, r: build_metadata(Batch.decode(r, [3, 3, 3]), p, bucket=2, buckets=[2, 4]),
        "raw batch 3 is larger than bucket 2",
    ),
    (
        "bucket not captured",
        lambda p, r: build_metadata(Batch.decode(r, [3, 3, 3]), p, bucket=6, buckets=[2, 4]),
        "bucket 6 was not captured",
    ),
    ("pool exhausted", lambda p, r: p.alloc(5), "pool exhausted: asked for 5 requests, 4 free"),
    ("free twice", lambda p, r: (p.free([1]), p.free([1])), r"rows\[0\]=1 is not allocated"),
    ("free unallocated", lambda p, r: p.free([7]), r"rows\[0\]=7 is not allocated"),
    ("slots out of range", lambda p, r: StatePool(1, "sglang"), "num_slots must be >= 2, got 1"),
    ("unknown profile", lambda p, r: StatePool(8, "trtllm"), "profile: unknown profile 'trtllm'"),
    (
        "mixing modes",
        lambda p, r: MetadataBuffers(p, "decode", buckets=[4]).update(Batch.target_verify(r, [3, 3, 3], 2)),
        "buffers captured for 'decode', batch is 'target_verify'",
    ),
    (
        "verify D mismatch",
        lambda p, r: MetadataBuffers(p, "target_verify", [4], draft_tokens=3).update(
            Batch.target_verify(r, [3, 3, 3], 2)
        ),
        "captured for D=3, batch has D=2",
    ),
    (
        "graph extend",
        lambda p, r: MetadataBuffers(p, "extend", buckets=[4]),
        "extend runs eagerly",
    ),
    (
        "above largest bucket (graph)",
        lambda p, r: MetadataBuffers(p, "decode", buckets=[1, 2]).update(Batch.decode(r, [3, 3, 3])),
        "above the largest captured bucket 2: run it eagerly",
    ),
    (
        "bad bucket type",
        lambda p, r: build_metadata(Batch.decode(r, [3, 3, 3]), p, bucket="big"),
        "bucket must be",
    ),
    (
        "non-increasing buckets",
        lambda p, r: build_metadata(Batch.decode(r, [3, 3, 3]), p, buckets=[4, 2]),
        r"buckets\[1\]=2 after 4",
    ),
    ("2-D request tensor", lambda p, r: Batch.decode(r.view(3, 1), [3, 3, 3]), "expected a 1-D tensor"),
    ("negative request", lambda p, r: Batch.decode([-1, 2], [3, 3]), r"req_pool_indices\[0\] = -1"),
    (
        "vllm spec slots",
        lambda p, r: build_metadata(Batch.target_verify([1], [3], 2), _vllm_pool_with_one_request(), bucket=None),
        "needs slots_per_request=D=2",
    ),
    ("not a batch", lambda p, r: build_metadata([1, 2], p), "batch must be a workbench.Batch"),
]


def _vllm_pool_with_one_request():
    pool = StatePool(8, "vllm")
    pool.alloc(1)
    return pool


@pytest.mark.parametrize("name,call,message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_named(name, call, message):
    pool, rows = _pool()
    with pytest.raises(MetadataError, match=message):
        call(pool, rows)


def test_bad_graph_update_leaves_buffers_untouched():
    pool, rows = _pool()
    bufs = MetadataBuffers(pool, "decode", buckets=[2, 4])
    bufs.update(Batch.decode(rows[:2], [5, 6]))
    before = {bs: {k: t.clone() for k, t in m.tensors().items()} for bs, m in bufs.static.items()}
    with pytest.raises(MetadataError):
        bufs.update(Batch.target_verify(rows, [3, 3, 3], 2))
    for bs, m in bufs.static.items():
        for k, t in m.tensors().items():
            assert torch.equal(t, before[bs][k]), (bs, k)


def test_metadata_error_is_value_error():
    assert issubclass(MetadataError, ValueError)
