"""The padding rule is written once (``workbench.metadata.padding``): the eager build and the in-place graph
update give the same tensors for every profile and mode, padded rows hold ``PaddedRow``'s values, and
``bucket`` means one thing (``None`` is "no padding", only where a step can be unpadded)."""

import inspect
from pathlib import Path

import pytest
import torch

from workbench import Batch, MetadataBuffers, MetadataError, StatePool, build_metadata, get_profile, validate
from workbench.metadata import buffers as buffers_module
from workbench.metadata import build as build_module
from workbench.metadata.padding import PaddedRow

PROFILES = ["sglang", "sglang-ascend", "vllm"]
BUCKETS = [1, 2, 4, 8]


def _pool(profile: str, d: int = 1) -> tuple[StatePool, torch.Tensor]:
    pool = StatePool(40, profile, slots_per_request=get_profile(profile).slots_per_request(d))
    pool.free(pool.alloc(6)[::2])  # holes: live slots are not 1..n
    return pool, pool.alloc(7)


def _batch(mode: str, rows: torch.Tensor, d: int) -> Batch:
    seq = [5 + i for i in range(rows.numel())]
    if mode == "target_verify":
        return Batch.target_verify(rows, seq, d, num_accepted_tokens=[1 + i % d for i in range(rows.numel())])
    return Batch.decode(rows, seq) if rows.numel() else Batch.idle()


def _stale(bufs: MetadataBuffers) -> None:
    """Leave a previous step's garbage in every rewritten buffer: the update must overwrite all of it."""
    for m in bufs.static.values():
        for name, t in m.tensors().items():
            if name != "intermediate_state_indices":  # a constant arange, never rewritten
                t.random_(0, 2 if t.dtype == torch.bool else 100)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize(("mode", "d"), [("decode", 1), ("target_verify", 3)])
@pytest.mark.parametrize("raw", [0, 1, 3, 4, 5, 7])
def test_graph_update_equals_eager_build_for_every_profile_and_mode(profile, mode, d, raw):
    pool, rows = _pool(profile, d)
    batch = _batch(mode, rows[:raw], d)
    bufs = MetadataBuffers(pool, mode, buckets=BUCKETS, draft_tokens=d)
    _stale(bufs)
    got = bufs.update(batch)
    want = build_metadata(batch, pool, buckets=BUCKETS)
    assert got.batch_size == want.batch_size == next(b for b in BUCKETS if b >= raw)
    for name, t in want.tensors().items():
        g = getattr(got, name)
        if raw == 0 and g.dim() > t.dim():
            g = g[:, 0]  # an idle step run by a vLLM verify graph keeps the graph's [bs, D] shape
        assert torch.equal(g, t), name
    validate(got, pool)
    validate(want, pool)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("mode", ["decode", "target_verify", "extend", "idle"])
def test_padded_rows_hold_the_padded_row_values(profile, mode):
    d = 2 if mode == "target_verify" else 1
    pool, rows = _pool(profile, d)
    r = 0 if mode == "idle" else 3
    batch = Batch.extend(rows[:r], [4, 1, 6], [0, 3, 2]) if mode == "extend" else _batch(mode, rows[:r], d)
    meta = build_metadata(batch, pool, bucket=8, buckets=BUCKETS)
    pad = PaddedRow.of(get_profile(profile))
    tail = slice(r, None)
    assert meta.state_indices[tail].eq(pad.state_index).all()
    assert meta.seq_lens[tail].eq(pad.seq_len).all()
    assert meta.req_pool_indices[tail].eq(pad.req_pool_index).all()
    assert not meta.has_initial_state[tail].any()
    qsl = meta.query_start_loc.tolist()
    assert qsl[r:] == [qsl[r]] * (8 - r + 1)  # zero-length padded rows
    if meta.extend_lens is not None:
        assert meta.extend_lens[tail].eq(PaddedRow.num_tokens).all()
    if meta.num_accepted_tokens is not None:
        assert pad.num_accepted == 1 and meta.num_accepted_tokens[tail].eq(pad.num_accepted).all()
    validate(meta, pool)


def test_padded_row_values_per_profile():
    got = {p: PaddedRow.of(get_profile(p)) for p in PROFILES}
    assert got["sglang"] == PaddedRow(state_index=-1, seq_len=1, req_pool_index=0, num_accepted=None)
    assert got["sglang-ascend"] == PaddedRow(state_index=0, seq_len=0, req_pool_index=0, num_accepted=None)
    assert got["vllm"] == PaddedRow(state_index=0, seq_len=0, req_pool_index=0, num_accepted=1)
    assert (PaddedRow.has_initial_state, PaddedRow.num_tokens) == (False, 0)


@pytest.mark.parametrize("module", [build_module, buffers_module], ids=["build", "buffers"])
def test_the_eager_build_and_the_buffers_restate_no_fill_value(module):
    # the fill values are PaddedRow's: a second copy of the rule here could drift from the first
    source = Path(inspect.getsourcefile(module)).read_text()
    for word in ("sentinel", "seq_len_fill", "reserved_request_row", "torch.full(", "num_accepted_fill)"):
        assert word not in source, f"{module.__name__} restates the padding rule: {word!r}"


def test_bucket_defaults_to_auto_in_the_build_and_the_buffers():
    assert inspect.signature(build_metadata).parameters["bucket"].default == "auto"
    assert inspect.signature(MetadataBuffers.update).parameters["bucket"].default == "auto"


@pytest.mark.parametrize("bucket", [None, "none", 2.0, True])
def test_buffers_update_refuses_a_bucket_that_is_not_auto_or_an_int(bucket):
    pool, rows = _pool("sglang")
    bufs = MetadataBuffers(pool, "decode", buckets=BUCKETS)
    before = {k: t.clone() for k, t in bufs.static[4].tensors().items()}
    with pytest.raises(MetadataError, match=rf"^bucket must be 'auto' or a captured bucket \(an int\), got {bucket!r}"):
        bufs.update(Batch.decode(rows[:3], [4, 5, 6]), bucket=bucket)
    assert all(torch.equal(t, before[k]) for k, t in bufs.static[4].tensors().items())  # nothing written


def test_none_means_no_padding_in_the_eager_build_only():
    pool, rows = _pool("sglang")
    batch = Batch.decode(rows[:3], [4, 5, 6])
    unpadded = build_metadata(batch, pool, bucket=None, buckets=BUCKETS)
    assert (unpadded.batch_size, unpadded.bucket, unpadded.eager_reason) == (3, None, None)
    padded = build_metadata(batch, pool, buckets=BUCKETS)
    assert (padded.batch_size, padded.bucket) == (4, 4)
    bufs = MetadataBuffers(pool, "decode", buckets=BUCKETS)
    assert bufs.update(batch).batch_size == bufs.update(batch, bucket="auto").batch_size == 4
    assert bufs.update(batch, bucket=8).batch_size == 8


def test_verify_offsets_of_a_large_bucket_do_not_overflow_int32():
    # (bucket + 1) * D passes int32 while the live tokens fit: padded entries are clamped, never wrapped
    d = 2**29
    pool = StatePool(8, "sglang")
    meta = build_metadata(Batch.target_verify(pool.alloc(1), [5], d), pool, bucket=4, buckets=[1, 4])
    assert meta.query_start_loc.tolist() == [0, d, d, d, d]
    validate(meta, pool)
