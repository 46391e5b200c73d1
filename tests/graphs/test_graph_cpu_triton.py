"""Triton kernels under the cpu recorder (Triton's interpreter, TRITON_INTERPRET=1 from conftest.py).

Registered as a custom op, a kernel is one recorded op whose mutation replays. Launched raw, the
interpreter's work is invisible to the dispatcher -- replay would silently skip it -- so capture refuses it.
"""

from __future__ import annotations

import os

import pytest
import torch

from workbench.errors import CaptureError
from workbench.graphs import CpuBackend

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask) + alpha * tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, y, mask=mask)


@torch.library.custom_op("wbtest::axpy_", mutates_args=("y",))
def axpy_(x: torch.Tensor, y: torch.Tensor, alpha: float) -> None:
    _axpy_kernel[(1,)](x, y, x.numel(), alpha, BLOCK=triton.next_power_of_2(x.numel()))


def test_triton_custom_op_is_one_op_and_replays() -> None:
    x, y = torch.arange(6.0), torch.zeros(6)
    g = CpuBackend().capture(lambda: axpy_(x, y, 0.5), warmup=1)
    assert [(op.name, op.mutates, op.replay) for op in g.ops] == [("wbtest.axpy_.default", ("y",), "in place")]
    assert torch.equal(y, x * 0.5)  # the warm-up ran, the capture did not
    x.copy_(torch.ones(6))
    g.replay()
    g.replay()
    assert torch.equal(y, torch.arange(6.0) * 0.5 + 1.0)


def test_raw_triton_launch_is_refused() -> None:
    x, y = torch.arange(4.0), torch.zeros(4)
    with pytest.raises(CaptureError, match=r"aten\.set_.*custom_op"):
        CpuBackend().capture(lambda: _axpy_kernel[(1,)](x, y, 4, 1.0, BLOCK=4), warmup=0)
    assert torch.equal(y, torch.zeros(4))
