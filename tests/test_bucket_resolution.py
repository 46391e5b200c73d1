"""One bucket rule for the eager build, the static buffers and the runner; a profile answers how many slots
a request needs; graph buffers are aliased by design, and ``clone()`` keeps a step."""

import pytest
import torch

from workbench import Batch, MetadataBuffers, MetadataError, StatePool, WorkbenchError, build_metadata, get_profile
from workbench.buckets import above_largest, choose_bucket, resolve_bucket
from workbench.layers import GatedDeltaNetLayer, GDNConfig
from workbench.runner import GraphRunner

BUCKETS = [1, 2, 4, 8]


@pytest.mark.parametrize("raw", range(0, 11))
def test_auto_is_bisect_left_and_none_above_the_largest(raw):
    want = next((b for b in BUCKETS if b >= raw), None)
    assert resolve_bucket(raw, BUCKETS) == choose_bucket(raw, BUCKETS) == want


@pytest.mark.parametrize(
    ("bucket", "error"),
    [
        (6, r"bucket 6 was not captured; captured buckets: \[1, 2, 4, 8\]"),
        (2, "raw batch 3 is larger than bucket 2; a batch is never truncated"),
        ("big", "bucket must be 'auto', None or an int, got 'big'"),
        (True, "bucket must be 'auto', None or an int, got True"),
    ],
)
def test_explicit_bucket_errors_name_the_value(bucket, error):
    with pytest.raises(MetadataError, match=error):
        resolve_bucket(3, BUCKETS, bucket)


@pytest.mark.parametrize(
    ("bucket", "error"),
    [(6, "bucket 6 was not captured"), (2, "raw batch 3 is larger than bucket 2")],
)
def test_eager_build_and_static_buffers_refuse_a_bucket_the_same_way(bucket, error):
    pool = StatePool(16, "sglang")
    batch = Batch.decode(pool.alloc(3), [4, 5, 6])
    with pytest.raises(MetadataError, match=error):
        build_metadata(batch, pool, bucket=bucket, buckets=BUCKETS)
    with pytest.raises(MetadataError, match=error):
        MetadataBuffers(pool, "decode", buckets=BUCKETS).update(batch, bucket=bucket)


def test_above_the_largest_bucket_is_worded_once_everywhere():
    pool = StatePool(24, "sglang")
    batch = Batch.decode(pool.alloc(9), [3] * 9)
    said = above_largest(9, BUCKETS)
    assert said == "raw batch 9 is above the largest captured bucket 8"
    meta = build_metadata(batch, pool, bucket="auto", buckets=BUCKETS)
    assert meta.bucket is None and meta.batch_size == 9 and meta.eager_reason.startswith(said)
    with pytest.raises(MetadataError, match=said):
        MetadataBuffers(pool, "decode", buckets=BUCKETS).update(batch)
    layer = GatedDeltaNetLayer(GDNConfig.small(), impl="reference")
    runner = GraphRunner(layer, pool, buckets=BUCKETS, modes=["decode"], backend="cpu", state_seed=1)
    res = runner.replay(batch, torch.randn(9, layer.config.hidden_size))  # eager: nothing captured is needed
    assert not res.replayed and res.reason == said


@pytest.mark.parametrize(("profile", "spr"), [("sglang", 1), ("sglang-ascend", 1), ("vllm", 3)])
def test_profile_says_how_many_slots_a_spec_decode_request_owns(profile, spr):
    prof = get_profile(profile)
    assert prof.slots_per_request(3) == spr
    assert prof.slots_per_request(1) == 1
    # and the pool it sizes is the one the eager build accepts for verify
    pool = StatePool(16, profile, slots_per_request=spr)
    meta = build_metadata(Batch.target_verify(pool.alloc(2), [4, 5], 3), pool, bucket=None)
    assert meta.state_indices.shape == ((2, 3) if spr == 3 else (2,))
    with pytest.raises(MetadataError, match="draft_tokens must be an int >= 1, got 0"):
        prof.slots_per_request(0)


def test_buffers_update_aliases_the_returned_metadata_and_clone_keeps_a_step():
    pool = StatePool(16, "sglang")
    bufs = MetadataBuffers(pool, "decode", buckets=[4])
    first = bufs.update(Batch.decode(pool.alloc(2), [5, 6]))
    address = first.state_indices.data_ptr()
    kept = first.clone()
    want_first = first.state_indices.tolist()
    second = bufs.update(Batch.decode(pool.alloc(3), [7, 8, 9]))
    # graph mode: the same static buffer, rewritten in place (a captured graph reads these addresses)
    assert second is first and first.state_indices.data_ptr() == address
    assert first.raw_batch_size == 3 and first.state_indices.tolist() == [3, 4, 5, -1]
    # the clone owns its tensors and host fields: it still says what the first step was
    assert kept.raw_batch_size == 2 and kept.state_indices.tolist() == want_first == [1, 2, -1, -1]
    assert kept.seq_lens.tolist() == [5, 6, 1, 1]
    for name, t in kept.tensors().items():
        assert t.data_ptr() != getattr(first, name).data_ptr(), name


def test_runner_graph_lookup_names_what_is_captured():
    pool = StatePool(12, "sglang")
    layer = GatedDeltaNetLayer(GDNConfig.small(), impl="reference")
    runner = GraphRunner(layer, pool, buckets=[2, 4], modes=["decode"], backend="cpu")
    with pytest.raises(WorkbenchError, match=r"bucket 4 of 'decode' is not captured: call capture\(\) first"):
        runner.graph("decode", 4)
    runner.capture(progress=False)
    assert runner.captured == [("decode", 2), ("decode", 4)]
    assert runner.graph("decode", 4) is not runner.graph("decode", 2)
    with pytest.raises(WorkbenchError, match=r"bucket 3 of 'decode' is not captured; captured: \[\('decode', 2\)"):
        runner.graph("decode", 3)
