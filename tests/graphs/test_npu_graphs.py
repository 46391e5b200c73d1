"""NPU graphs through the backend; run only where torch_npu imports and sees an Ascend device."""

from __future__ import annotations

import pytest
import torch

from workbench.errors import CaptureError
from workbench.graphs import NpuBackend

_OK, _WHY = NpuBackend.is_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"needs an Ascend NPU: {_WHY}")


@pytest.fixture
def npu() -> NpuBackend:
    return NpuBackend()


def test_capture_replay_static_outputs(npu: NpuBackend) -> None:
    x, w = torch.randn(8, 16, device=npu.device), torch.randn(16, 4, device=npu.device)
    calls = []

    def fn() -> torch.Tensor:
        calls.append(1)
        return torch.softmax(x @ w, -1)

    g = npu.capture(fn, warmup=2)
    assert len(calls) == 3
    out, ptr = g.outputs, g.outputs.data_ptr()
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        g.replay()
        assert g.outputs is out and out.data_ptr() == ptr
        torch.testing.assert_close(out, torch.softmax(x @ w, -1))


def test_shared_pool_across_buckets(npu: NpuBackend) -> None:
    pool = npu.new_pool()
    graphs = []
    for bs in (8, 4, 1):
        x = torch.randn(bs, 32, device=npu.device)
        graphs.append((x, npu.capture(lambda x=x: (x * 2).relu(), pool=pool)))
    for x, g in graphs:
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.testing.assert_close(g.outputs, (x * 2).relu())


def test_reset(npu: NpuBackend) -> None:
    g = npu.capture(lambda: torch.ones(2, device=npu.device) * 3)
    g.reset()
    with pytest.raises(CaptureError, match="after reset"):
        g.replay()
