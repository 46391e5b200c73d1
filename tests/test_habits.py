"""The project's habits hold: one version source, the licence pyproject names, strict pytest markers that
the fast target skips, offline pre-commit hooks that exist, a notebook check that fails on outputs, docs that
name every layer."""

import importlib.metadata
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

import workbench

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _build_config() -> dict:
    """The project table as the build backend resolves it (dynamic fields filled in, license files found)."""
    from setuptools.config.pyprojecttoml import read_configuration

    return read_configuration(ROOT / "pyproject.toml")["project"]


def test_one_version_source():
    built = _build_config()
    # the backend reads the version from workbench.__version__ (dynamic), so no second copy can drift
    assert built["version"] == workbench.__version__ and "version" in built["dynamic"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", workbench.__version__)
    assert importlib.metadata.version("linattn-workbench") == workbench.__version__


def test_license_files_the_build_ships_are_the_apache_license_it_declares():
    built = _build_config()
    assert built["license"] == "Apache-2.0"
    files = [ROOT / f for f in built["license-files"]]
    assert files and all(f.is_file() for f in files), files
    text = files[0].read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert (
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "END OF TERMS AND CONDITIONS" in text
    )


def _marker_expressions(target: str) -> list[str]:
    """The ``-m`` expression of each pytest command ``make target`` runs (``make -n``: printed, not run)."""
    out = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        for command in line.split(";"):  # make test runs its sessions in one shell line
            if "-m pytest" in command:
                args = shlex.split(command.split("||")[0])
                after = args[args.index("pytest") :]  # past `python -m pytest`
                found.append(after[after.index("-m") + 1])
    return found


def _fast_target_marker_expression() -> str:
    (expression,) = _marker_expressions("test-fast")
    return expression


@pytest.mark.slow  # two pytest runs in fresh interpreters
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_markers_are_strict_and_the_fast_target_deselects_the_marked_tests(tmp_path):
    (tmp_path / "test_marked.py").write_text(
        "import pytest\n\n"
        + "".join(f"@pytest.mark.{m}\ndef test_{m}():\n    pass\n\n" for m in ("slow", "network", "notebook"))
        + "def test_plain():\n    pass\n"
    )
    (tmp_path / "test_typo.py").write_text("import pytest\n\n@pytest.mark.slwo\ndef test_typo():\n    pass\n")
    # this project's pytest settings (markers, --strict-markers), on these two files only
    pytest_cmd = [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path)]
    pytest_cmd += ["-p", "no:cacheprovider", "-q"]
    fast = subprocess.run(
        [*pytest_cmd, "-m", _fast_target_marker_expression(), "test_marked.py"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert fast.returncode == 0 and "1 passed, 3 deselected" in fast.stdout, fast.stdout + fast.stderr
    typo = subprocess.run([*pytest_cmd, "test_typo.py"], cwd=tmp_path, capture_output=True, text=True)
    assert typo.returncode != 0 and "'slwo' not found in `markers`" in typo.stdout + typo.stderr, typo.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_runs_pytest_where_its_rewritten_test_modules_are_cached():
    """Every pytest session of ``make test`` and ``make test-fast`` runs with ``PYTHONDONTWRITEBYTECODE``
    emptied: where it is set, pytest rewrites every test module again in each session (issue 33)."""
    for target in ("test", "test-fast"):
        out = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        commands = [c.split("||")[0] for line in out.splitlines() for c in line.split(";") if "-m pytest" in c]
        assert commands, (target, out)
        for command in commands:
            args = shlex.split(command)
            env = args[: args.index("-m") - 1]  # the assignments before `python -m pytest`
            assert "PYTHONDONTWRITEBYTECODE=" in env, (target, command)


@pytest.mark.slow  # two pytest collections in fresh interpreters
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_sessions_run_every_test_exactly_once(tmp_path):
    """``make test`` splits pytest into sessions by marker (the notebooks alone, the rest on workers): between
    them every test, whatever its markers, is collected by exactly one."""
    expressions = _marker_expressions("test")
    assert len(expressions) == 2, expressions
    kinds = [(), ("slow",), ("network",), ("notebook",), ("notebook", "slow"), ("engines", "network")]
    (tmp_path / "test_marked.py").write_text(
        "import pytest\n\n"
        + "".join(
            "".join(f"@pytest.mark.{m}\n" for m in kind) + f"def test_{'_'.join(kind) or 'plain'}():\n    pass\n\n"
            for kind in kinds
        )
    )
    pytest_cmd = [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path)]
    pytest_cmd += ["-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--collect-only", "test_marked.py"]
    collected = []
    for expression in expressions:
        run = subprocess.run([*pytest_cmd, "-m", expression], cwd=tmp_path, capture_output=True, text=True)
        assert run.returncode in (0, 5), run.stdout + run.stderr  # 5: this session collects none of them
        collected += [line.split("::")[1] for line in run.stdout.splitlines() if "::" in line]
    want = sorted(f"test_{'_'.join(kind) or 'plain'}" for kind in kinds)
    assert sorted(collected) == want, (expressions, collected)


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


_NUMBER_WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
)
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50}


def _spelled(number: str) -> int | None:
    """``"Nineteen"`` -> 19, ``"twenty-one"`` -> 21, ``"20"`` -> 20; None for any other word."""
    word = number.lower()
    if word.isdigit():
        return int(word)
    if word in _NUMBER_WORDS:
        return _NUMBER_WORDS.index(word)
    tens, _, unit = word.partition("-")
    if tens in _TENS and unit in _NUMBER_WORDS[1:10]:
        return _TENS[tens] + _NUMBER_WORDS.index(unit)
    return None


def test_spelled_number_reads_words_and_digits():
    assert [_spelled(w) for w in ("Nineteen", "twenty", "twenty-one", "20", "several")] == [19, 20, 21, 20, None]


def test_the_readme_counts_the_zoo_as_the_zoo_does():
    """A count of the zoo's bugs written out in the README ("Nineteen bugs ...") goes stale with the next case:
    the README names none, or the one ``workbench.zoo.MODULES`` has."""
    from workbench.zoo import MODULES

    readme = (ROOT / "README.md").read_text()
    zoo = readme.split("## The bug zoo", 1)[1].split("\n## ", 1)[0]
    counts = re.findall(r"\b([A-Za-z]+(?:-[a-z]+)?|\d+)\s+(?:known\s+)?(?:production\s+)?(?:bugs|cases)\b", zoo)
    stated = [(w, _spelled(w)) for w in counts if _spelled(w) is not None]
    assert all(n == len(MODULES) for _, n in stated), f"README's zoo says {stated}; zoo.MODULES has {len(MODULES)}"


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
