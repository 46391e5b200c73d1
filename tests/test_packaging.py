"""pyproject.toml is the source of truth; environment.yml must describe the same dependencies."""

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
# conda-forge names that differ from PyPI's
CONDA_NAMES = {"torch": "pytorch"}
# extras that never go in the default (conda) environment
NOT_IN_ENV = {"npu"}


def _split(req: str) -> tuple[str, str]:
    req = req.split(";")[0].strip()
    m = re.match(r"([A-Za-z0-9_.\-]+)\s*(.*)", req)
    return m.group(1).lower().replace("_", "-"), m.group(2).replace(" ", "")


def _pyproject() -> dict[str, str]:
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(proj["dependencies"])
    for extra, items in proj["optional-dependencies"].items():
        if extra not in NOT_IN_ENV:
            reqs += items
    return dict(_split(r) for r in reqs)


def _environment() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    out = {}
    for dep in env["dependencies"]:
        if isinstance(dep, str) and not dep.startswith(("python", "pip")):
            name, spec = _split(dep)
            out[name] = spec
    return out


def test_environment_matches_pyproject():
    py = {CONDA_NAMES.get(k, k): v for k, v in _pyproject().items()}
    env = _environment()
    assert sorted(py) == sorted(env), (
        f"only in pyproject: {set(py) - set(env)}; only in environment.yml: {set(env) - set(py)}"
    )
    for name, spec in py.items():
        assert env[name] == spec, f"{name}: pyproject says {spec!r}, environment.yml says {env[name]!r}"


def test_npu_is_an_extra_never_default():
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any("npu" in d.lower() for d in proj["dependencies"])
    assert any("torch_npu" in d for d in proj["optional-dependencies"]["npu"])


@pytest.mark.slow  # a fresh interpreter (subprocess)
def test_import_workbench_does_not_import_torch_npu():
    import subprocess
    import sys

    code = "import sys, workbench; print('torch_npu' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"
