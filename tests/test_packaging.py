"""What a default install brings is what the code imports: pyproject.toml is the source of truth,
environment.yml describes the same groups, every module-level third-party import is a default dependency,
and every lazy import of anything else goes through ``workbench.extras.require`` naming the right extra."""

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# conda-forge names that differ from PyPI's
CONDA_NAMES = {"torch": "pytorch"}
# extras that never go in the default (conda) environment
NOT_IN_ENV = {"npu", "engines"}  # engines: its own venv (make engines), the engines beside a CPU torch
# imported lazily without require: graphs/npu.py probes torch_npu defensively (a CANN library missing is an
# ImportError too) and its message names the extra itself
LAZY_WITHOUT_REQUIRE = {"torch-npu"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _split(req: str) -> tuple[str, str]:
    req = req.split(";")[0].strip()
    m = re.match(r"([A-Za-z0-9_.\-]+)\s*(.*)", req)
    return _norm(m.group(1)), m.group(2).replace(" ", "")


def _groups() -> dict[str, dict[str, str]]:
    """pyproject's requirements by group: "core" (the default dependencies) and each extra."""
    groups = {"core": dict(map(_split, PROJECT["dependencies"]))}
    groups.update({extra: dict(map(_split, reqs)) for extra, reqs in PROJECT["optional-dependencies"].items()})
    return groups


def _environment_groups() -> dict[str, dict[str, str]]:
    """environment.yml's requirements under its ``# core`` / ``# lab`` / ``# dev`` comments (YAML drops
    comments, so the text is read line by line; the YAML parse checks the same items)."""
    text = (ROOT / "environment.yml").read_text()
    groups: dict[str, dict[str, str]] = {}
    current = None
    for line in text.splitlines():
        head = re.fullmatch(r"\s*#\s*(\w+)\s*", line)
        item = re.fullmatch(r"  - ([A-Za-z].*)", line)  # top-level items only (not the pip: list)
        if head:
            current = head.group(1)
        elif item and current is not None and not item.group(1).startswith(("python", "pip")):
            name, spec = _split(item.group(1))
            groups.setdefault(current, {})[name] = spec
    parsed = yaml.safe_load(text)["dependencies"]
    listed = {_split(d)[0] for d in parsed if isinstance(d, str) and not d.startswith(("python", "pip"))}
    assert listed == {name for g in groups.values() for name in g}, "environment.yml: an item outside a group"
    return groups


def test_environment_has_the_groups_of_pyproject():
    want = {
        group: {CONDA_NAMES.get(k, k): v for k, v in reqs.items()}
        for group, reqs in _groups().items()
        if group not in NOT_IN_ENV
    }
    got = _environment_groups()
    assert sorted(got) == sorted(want)
    for group, reqs in want.items():
        assert got[group] == reqs, f"# {group}: pyproject says {reqs}, environment.yml says {got[group]}"


def test_a_jupyter_first_default_install_has_figures_and_widgets_but_never_torch_npu():
    core = _groups()["core"]
    assert {"plotly", "ipywidgets", "anywidget"} <= set(core)
    assert not any("npu" in name for name in core)
    assert {"jupyterlab", "voila", "pandas"} <= set(_groups()["lab"])


# -- what the code imports -----------------------------------------------------------------------------------
def _imports(tree: ast.Module) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(module-level, inside-a-function) absolute imports as (top-level name, line); ``if TYPE_CHECKING:``
    blocks are left out (they never run)."""
    top: list[tuple[str, int]] = []
    lazy: list[tuple[str, int]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            else:
                names = []
            (lazy if inner else top).extend((n.split(".")[0], child.lineno) for n in names)
            visit(child, inner)

    visit(tree, False)
    return top, lazy


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()  # reads every installed RECORD: seconds, so once


def _distribution(module: str) -> str:
    """The (normalised) distribution that installs top-level ``module`` (its own name when not installed)."""
    found = _distributions().get(module)
    return _norm(found[0] if found else module)


def _sources() -> list[Path]:
    return sorted([*ROOT.glob("workbench/**/*.py"), *ROOT.glob("kernels/**/*.py")])


def _third_party(names: list[tuple[str, int]]) -> list[tuple[str, int]]:
    return [(n, line) for n, line in names if n not in sys.stdlib_module_names and n not in ("workbench", "kernels")]


@pytest.mark.slow  # parses every source file
def test_every_module_level_import_is_a_default_dependency():
    core = set(_groups()["core"])
    bad = []
    for path in _sources():
        top, _ = _imports(ast.parse(path.read_text()))
        bad += [
            f"{path.relative_to(ROOT)}:{line}: {n}" for n, line in _third_party(top) if _distribution(n) not in core
        ]
    assert not bad, f"imported at module level but not a default dependency (import it through require): {bad}"


@pytest.mark.slow  # parses every source file
def test_every_lazy_import_of_an_optional_package_goes_through_require():
    core = set(_groups()["core"])
    bad = []
    for path in _sources():
        _, lazy = _imports(ast.parse(path.read_text()))
        for n, line in _third_party(lazy):
            dist = _distribution(n)
            if dist not in core and dist not in LAZY_WITHOUT_REQUIRE:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {n}")
    assert not bad, f"optional packages imported without workbench.extras.require: {bad}"


def _require_calls() -> list[tuple[str, str, str | None]]:
    """Every ``require("module", extra, ...)`` call in workbench/: (where, module, extra)."""
    calls = []
    for path in ROOT.glob("workbench/**/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name == "require" and all(isinstance(a, ast.Constant) for a in node.args[:2]):
                calls.append((f"{path.relative_to(ROOT)}:{node.lineno}", node.args[0].value, node.args[1].value))
    return calls


def test_each_require_names_the_extra_that_really_installs_the_package():
    groups = _groups()
    calls = _require_calls()
    assert {m for _, m, _ in calls} >= {"pandas", "plotly.graph_objects"}  # the scan sees them
    for where, module, extra in calls:
        group = "core" if extra is None else extra
        assert group in groups, f"{where}: no extra {extra!r} in pyproject.toml"
        dist = _distribution(module.partition(".")[0])
        assert dist in groups[group], (
            f"{where}: {module} is not in {group!r} but in {[g for g in groups if dist in groups[g]]}"
        )


@pytest.mark.slow  # a fresh interpreter (subprocess)
def test_import_workbench_does_not_import_torch_npu():
    import subprocess

    code = "import sys, workbench; print('torch_npu' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"
