"""Lets the kernel tests import ``_kernel_helpers`` (beside them) whatever pytest's import mode: "prepend",
the default, puts this folder on ``sys.path`` by itself; "importlib" does not."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
