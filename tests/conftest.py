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


# The notebook runs stay in one process, the browser's first: `test_notebooks.py` skips what the browser
# already checked (`_notebook_claims.CHECKED_IN_BROWSER`, a per-process stash). `make test` runs them in a
# session of their own; when the whole suite runs on workers (`pytest -n 2 --dist loadgroup`) the group
# sends them to one worker as a whole, first. Without xdist this only orders the collection.
NOTEBOOK_MODULES = ("test_browser.py", "test_notebooks.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return NOTEBOOK_MODULES.index(name) if name in NOTEBOOK_MODULES else len(NOTEBOOK_MODULES)

    for item in items:
        if rank(item) < len(NOTEBOOK_MODULES):
            item.add_marker(pytest.mark.xdist_group("notebooks"))
    items.sort(key=rank)  # stable: each module keeps its own order
