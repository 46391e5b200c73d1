"""The project's habits hold: one version source, the licence pyproject names, registered pytest markers,
offline pre-commit hooks that exist, a notebook check that fails on outputs, docs that name every layer."""

import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

import workbench

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_one_version_source():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "workbench.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", workbench.__version__)
    assert importlib.metadata.version("linattn-workbench") == workbench.__version__


def test_license_file_is_the_apache_license_pyproject_names():
    text = (ROOT / "LICENSE").read_text()
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert (
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "END OF TERMS AND CONDITIONS" in text
    )


def test_markers_are_registered_strict_and_used():
    opts = PYPROJECT["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in opts["addopts"] and "--durations=15" in opts["addopts"]
    registered = {m.split(":")[0] for m in opts["markers"]}
    assert registered == {"slow", "network", "notebook"}
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    for marker in registered:
        assert f"pytest.mark.{marker}" in sources, f"marker {marker!r} is registered but no test carries it"
    makefile = (ROOT / "Makefile").read_text()
    assert '-m "not slow and not network and not notebook"' in makefile


def test_pre_commit_hooks_are_local_and_point_at_the_venv():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {h["id"]: h for repo in config["repos"] for h in repo["hooks"]}
    assert [repo["repo"] for repo in config["repos"]] == ["local"]  # nothing fetched
    assert {"ruff-format", "ruff-check", "nbstripout", "notebooks-stripped", "import-linter", "mypy"} <= set(hooks)
    bin_dir = Path(sys.executable).parent
    for hook_id, hook in hooks.items():
        assert hook["language"] == "system", hook_id
        program = hook["entry"].split()[0]
        assert program.startswith(".venv/bin/"), (hook_id, program)
        assert (bin_dir / Path(program).name).exists(), f"{hook_id}: {program} is not installed (dev extra?)"
    script = hooks["notebooks-stripped"]["entry"].split()[1]
    assert (ROOT / script).exists()


def _notebook(path: Path, outputs: bool) -> Path:
    cell = {"cell_type": "code", "metadata": {}, "source": ["print(1)"], "outputs": [], "execution_count": None}
    if outputs:
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["1\n"]}]
        cell["execution_count"] = 1
    nb = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))
    return path


def _checker():
    spec = importlib.util.spec_from_file_location(
        "check_notebooks_stripped", ROOT / "tools" / "check_notebooks_stripped.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_notebook_check_fails_on_outputs_and_passes_once_stripped(tmp_path, capsys):
    check = _checker()
    dirty = _notebook(tmp_path / "dirty.ipynb", outputs=True)
    clean = _notebook(tmp_path / "clean.ipynb", outputs=False)
    assert check.main([str(dirty), str(clean)]) == 1
    said = capsys.readouterr().out
    assert "dirty.ipynb: code cells [0] carry outputs" in said and "clean.ipynb" not in said
    assert check.main([str(clean)]) == 0


@pytest.mark.slow  # nbstripout in a fresh interpreter
def test_nbstripout_hook_leaves_what_the_check_accepts(tmp_path):
    check = _checker()
    dirty = _notebook(tmp_path / "dirty.ipynb", outputs=True)
    assert check.stale_cells(dirty) == [0]
    subprocess.run([sys.executable, "-m", "nbstripout", "--keep-id", str(dirty)], check=True)  # what the hook runs
    assert check.stale_cells(dirty) == [] and check.main([str(dirty)]) == 0


def test_docs_live_in_the_repository_and_name_every_layer():
    readme = (ROOT / "README.md").read_text()
    assert "../shared" not in readme and "docs/design.md" in readme and "docs/architecture.md" in readme
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    design = (ROOT / "docs" / "design.md").read_text()
    layers = PYPROJECT["tool"]["importlinter"]["contracts"][0]["layers"]
    modules = {m.strip(" ()") for layer in layers for m in re.split(r"[:|]", layer)}
    for module in modules:
        assert f"`{module}`" in architecture, f"docs/architecture.md does not list {module}"
        short = module.removeprefix("workbench.")
        assert re.search(rf"\b{short}\b", design), f"docs/design.md's layout misses {module}"
