"""``kernels._triton_helpers.skip_dead_overflow_checks``: under Triton's interpreter the integer-overflow checks
that ``device_assert`` would drop (no ``debug``) are not built, and nothing a kernel computes changes."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is not installed")
import triton.language as tl  # noqa: E402

from kernels import _triton_helpers  # noqa: E402  (imported for its side effect on the interpreter too)
from kernels.dispatch import interpreter_on  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreter_on(), reason="the checks concern Triton's interpreter only")


@pytest.fixture
def builder():
    """The interpreter's builder, its options put back after the test."""
    import triton.runtime.interpreter as interpreter

    b = interpreter.interpreter_builder
    saved = b.options
    yield b
    b.options = saved


@triton.jit
def _wraps(x_ptr, out_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i)  # int32
    tl.store(out_ptr + i, x * 65536 * 65536 + x * 3 - 7)  # wraps around in int32 for any x != 0


def _run_wraps() -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's input (int32, seeded) and its output."""
    x = torch.randint(-(2**20), 2**20, (16,), generator=torch.Generator().manual_seed(3), dtype=torch.int32)
    out = torch.full_like(x, -1)
    _wraps[(1,)](x, out, BLOCK=16)
    return x, out


def test_a_kernel_module_turns_the_dead_checks_off(builder):
    assert builder.options.debug is False
    assert builder.options.sanitize_overflow is False


def test_the_same_results_with_the_checks_built_or_not(builder):
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=True)
    _, built = _run_wraps()  # the overflow is computed and tested, and the test dropped: no assertion
    assert _triton_helpers.skip_dead_overflow_checks() is True
    assert builder.options.sanitize_overflow is False
    x, skipped = _run_wraps()
    assert torch.equal(built, skipped)
    want = (x.long() * 65536 * 65536 + x.long() * 3 - 7).to(torch.int32)  # two's-complement wrap-around
    assert torch.equal(skipped, want)


def test_with_debug_the_checks_stay(builder):
    builder.options = dataclasses.replace(builder.options, debug=True, sanitize_overflow=True)
    assert _triton_helpers.skip_dead_overflow_checks() is False
    assert builder.options.sanitize_overflow is True


def test_outside_the_interpreter_nothing_changes(builder, monkeypatch):
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert _triton_helpers.skip_dead_overflow_checks() is False
    assert builder.options.sanitize_overflow is True


def test_an_interpreter_laid_out_otherwise_is_left_alone(builder):
    # the same fields, but not the dataclass this release has: nothing to replace them in
    builder.options = SimpleNamespace(debug=False, sanitize_overflow=True)
    assert _triton_helpers.skip_dead_overflow_checks() is False
    assert builder.options == SimpleNamespace(debug=False, sanitize_overflow=True)
