"""CUDA graphs through the backend; run only where torch sees a CUDA device."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from workbench.errors import CaptureError
from workbench.graphs import CudaBackend, get_backend

_OK, _WHY = CudaBackend.is_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"needs a CUDA device: {_WHY}")


@pytest.fixture
def cuda() -> CudaBackend:
    return CudaBackend()


def test_auto_picks_cuda() -> None:
    assert get_backend("auto").name == "cuda"


def test_capture_replay_static_outputs(cuda: CudaBackend) -> None:
    x, w = torch.randn(8, 16, device=cuda.device), torch.randn(16, 4, device=cuda.device)
    calls = []

    def fn() -> torch.Tensor:
        calls.append(1)
        return torch.softmax(x @ w, -1)

    g = cuda.capture(fn, warmup=2)
    assert len(calls) == 3
    out, ptr = g.outputs, g.outputs.data_ptr()
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        g.replay()
        assert g.outputs is out and out.data_ptr() == ptr
        torch.testing.assert_close(out, torch.softmax(x @ w, -1))
    assert len(calls) == 3


def test_in_place_state_advances_per_replay(cuda: CudaBackend) -> None:
    state = torch.zeros(4, device=cuda.device)
    x = torch.ones(4, device=cuda.device)
    g = cuda.capture(lambda: state.mul_(0.5).add_(x), warmup=1)
    warm = state.clone()  # after one warm-up (capture runs nothing)
    g.replay()
    g.replay()
    torch.testing.assert_close(state, (warm * 0.5 + 1) * 0.5 + 1)


def test_shared_pool_across_buckets(cuda: CudaBackend) -> None:
    pool = cuda.new_pool()
    graphs = {}
    for bs in (8, 4, 2, 1):  # largest first, as engines capture
        x = torch.randn(bs, 32, device=cuda.device)
        graphs[bs] = (x, cuda.capture(lambda x=x: (x * 2).relu(), pool=pool))
    for x, g in graphs.values():
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.testing.assert_close(g.outputs, (x * 2).relu())


def test_host_sync_during_capture_is_a_capture_error() -> None:
    # In a child process: an invalidated capture can leave the CUDA context unusable (PyTorch's own tests
    # do the same).
    code = textwrap.dedent(
        """
        import torch
        from workbench.errors import CaptureError
        from workbench.graphs import CudaBackend
        x = torch.ones(4, device="cuda")
        try:
            CudaBackend().capture(lambda: x * x.sum().item(), warmup=0)
        except CaptureError as e:
            print("CaptureError:", e)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "CaptureError: cuda capture failed" in done.stdout, done.stdout + done.stderr


def test_reset(cuda: CudaBackend) -> None:
    g = cuda.capture(lambda: torch.ones(2, device=cuda.device) * 3)
    g.reset()
    with pytest.raises(CaptureError, match="after reset"):
        g.replay()
