"""Fail when a notebook carries outputs or execution counts (the pre-commit hook and CI use it).

Usage: ``python tools/check_notebooks_stripped.py [NOTEBOOK ...]`` (default: every notebook under
notebooks/). Exit status 1 names each notebook and its cells with outputs; ``nbstripout`` fixes them.
Standard library only, so the hook runs before anything else is installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def stale_cells(path: Path) -> list[int]:
    """Indices of code cells that carry outputs or an execution count."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [
        i
        for i, cell in enumerate(nb.get("cells", []))
        if cell.get("cell_type") == "code" and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[1]
    paths = [Path(a) for a in argv] or sorted((root / "notebooks").glob("*.ipynb"))
    bad = 0
    for path in paths:
        cells = stale_cells(path)
        if cells:
            bad += 1
            print(f"{path}: code cells {cells} carry outputs; run `nbstripout {path}` before committing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
