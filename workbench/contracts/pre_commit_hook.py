#!/usr/bin/env python3
"""The pre-commit hook ``check-contracts`` (``language: script``): runs from pre-commit's checkout of this
repository with the interpreter on PATH, nothing installed (``workbench.contracts`` needs only the standard
library; the package's own dependencies, torch among them, are never fetched)."""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from workbench.contracts.cli import main

    raise SystemExit(main(["--allow-nothing", *sys.argv[1:]]))
