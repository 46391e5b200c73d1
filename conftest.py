"""Root conftest: loaded before any test module or doctest of workbench/ and kernels/ is imported.

The Triton interpreter flag must be set before a kernel module is imported, and torch_npu (if someone
installed it by hand) must not break ``import torch`` for the suite.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

# Never imported by doctest collection: modules that run a command line when imported (any __main__.py;
# fnmatch's * crosses folders), and the contract checker's fixtures (sources it reads; some import packages
# that do not exist, on purpose).
collect_ignore = ["tests/fixtures"]
collect_ignore_glob = ["workbench/*__main__.py", "kernels/*__main__.py"]
