"""Test-suite setup. The interpreter flag must be set before any kernel module is imported."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
# torch_npu, if someone installed it by hand, must not break `import torch` for the suite.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

from workbench import threads  # noqa: E402

# One intra-op thread, as the commands run (workbench.threads): on a shared 2-core machine torch's default
# pool costs the replay and the CPU kernels 3-4x the CPU time (issue 33). LINATTN_THREADS=default keeps it.
threads.configure()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
