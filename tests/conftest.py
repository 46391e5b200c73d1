"""Test-suite setup. The interpreter flag must be set before any kernel module is imported."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
# torch_npu, if someone installed it by hand, must not break `import torch` for the suite.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
