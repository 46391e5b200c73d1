"""Every notebook runs top to bottom in a fresh kernel within its time limit, prints what it demonstrates
(``tests/_notebook_claims.py``), and is committed with its outputs stripped. A notebook the browser test
already ran and checked in this session is not run twice."""

import os
import time
from pathlib import Path

import _notebook_claims as claims  # beside this file (tests/ is on sys.path under pytest's default import mode)
import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.notebook
NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert {"00_quickstart.ipynb", "01_capture_and_replay.ipynb", "02_padding_conventions.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stripped(path):
    nb = nbformat.read(path, as_version=4)
    stale = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not stale, f"{path.name}: cells {stale} carry outputs; strip them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, tmp_path, request):
    if path.name in claims.checked_in_browser(request.config):
        pytest.skip(f"{path.name} ran in JupyterLab this session and its browser test checked the same claims")
    nb = nbformat.read(path, as_version=4)
    limit = claims.time_limit(path.name)
    env_before = dict(os.environ)
    os.environ.setdefault("TRITON_INTERPRET", "1")  # inherited by the kernel process
    start = time.monotonic()
    try:
        NotebookClient(
            nb, timeout=limit, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute()
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    elapsed = time.monotonic() - start
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert elapsed < limit, f"{path.name} took {elapsed:.0f} s, over its limit of {limit} s"
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    missing = claims.missing_lines(path.name, text)
    assert not missing, f"{path.name} did not print {missing}"
