"""The metadata backends keep the three-method contract; a subclass that breaks it is caught twice:
statically by `workbench check-contracts` (even where its module cannot be imported), and at capture."""

import textwrap

import pytest
import torch

from workbench import Batch, StatePool, contracts
from workbench.backends import BACKENDS, CpuMetadataBackend, MetadataBackend, NpuMetadataBackend
from workbench.layers import GatedDeltaNetLayer, GDNConfig
from workbench.runner import GraphRunner

BASE = "workbench.backends:MetadataBackend"
BROKEN = textwrap.dedent(
    """
    import torch_npu  # only importable on Ascend: the checker must read this file's source

    from workbench.backends import MetadataBackend


    class AscendHybridBackend(MetadataBackend):
        def init_forward_metadata_out_graph(self, batch):
            return super().init_forward_metadata_out_graph(batch)
    """
)


def test_project_backends_pass_the_contract():
    rep = contracts.check("workbench.backends", BASE)
    assert rep.ok, str(rep)
    checked = {getattr(c, "__name__", str(c)) for c in rep.checked}
    assert {cls.__name__ for cls in BACKENDS.values()} <= {n.split(".")[-1].split(":")[-1] for n in checked}


def test_missing_in_capture_is_caught_from_source(tmp_path):
    path = tmp_path / "ascend_backend.py"
    path.write_text(BROKEN)
    rep = contracts.check(str(path), BASE)
    assert str(path) in {str(p) for p in rep.read_from_source}
    (finding,) = rep.findings
    assert finding.method == "init_forward_metadata_out_graph" and finding.line == 8
    assert "unexpected keyword argument 'in_capture'" in finding.message
    assert contracts.main([str(path), "--base", BASE]) == 1


def test_missing_in_capture_crashes_capture_like_the_npu_scheduler():
    class AscendHybridBackend(MetadataBackend):
        def init_forward_metadata_out_graph(self, batch):  # the seed bug: no in_capture
            return super().init_forward_metadata_out_graph(batch)

    pool = StatePool(8, "sglang-ascend")
    layer = GatedDeltaNetLayer(GDNConfig.small(), impl="reference")
    runner = GraphRunner(layer, pool, buckets=[1, 2], backend="cpu", metadata_backend=AscendHybridBackend)
    with pytest.raises(TypeError, match="unexpected keyword argument 'in_capture'"):
        runner.capture(progress=False)


def test_npu_backend_host_extras():
    pool = StatePool(8, "sglang-ascend")
    rows = pool.alloc(3)
    be = NpuMetadataBackend(pool, buckets=[4], draft_tokens=2)
    meta = be.init_forward_metadata_out_graph(Batch.target_verify(rows, [5, 6, 7], 2))
    assert not hasattr(meta, "seq_lens_cpu")  # no kernel here takes host lengths (see backends/npu.py)
    assert meta.seq_lens.tolist() == [5, 6, 7, 0]  # Ascend fill value 0
    assert torch.equal(meta.intermediate_token_indices, torch.arange(8, dtype=torch.int32))
    assert meta.state_indices.tolist()[-1] == 0  # padded row on the dummy slot


def test_capture_metadata_points_at_dummy_slot():
    pool = StatePool(8, "sglang")
    pool.alloc(3)
    be = CpuMetadataBackend(pool, buckets=[4])
    meta = be.init_forward_metadata_out_graph(Batch.for_capture("decode", 4), in_capture=True)
    assert meta.state_indices.tolist() == [0, 0, 0, 0] and meta.num_padding == 0
    with pytest.raises(ValueError, match="'extend' is not captured"):
        be.init_forward_metadata_out_graph(Batch.extend(pool.alloc(1), [3]))


def test_npu_backend_on_a_device_pool_moves_a_host_batch():
    """The pool on another device ("meta" stands in for the NPU): a host batch is moved there; no host copy
    of the lengths is kept (nothing would read it: no NPUGraph.update here)."""
    pool = StatePool(8, "sglang-ascend", device="meta")
    be = NpuMetadataBackend(pool, buckets=[4], draft_tokens=2)
    cap = be.init_forward_metadata_out_graph(Batch.for_capture("decode", 4, device="meta"), in_capture=True)
    assert not hasattr(cap, "seq_lens_cpu")
    host_rows = torch.tensor([1, 2, 3])  # the scheduler's host copy of the request rows
    pool._slots_of.update({1: [1], 2: [2], 3: [3]})  # allocated rows (a meta pool cannot hold values)
    meta = be.init_forward_metadata_out_graph(Batch.decode(host_rows, [5, 6, 7]))
    assert not hasattr(meta, "seq_lens_cpu") and meta.seq_lens.device.type == "meta"
    assert meta.state_indices.device.type == "meta"
