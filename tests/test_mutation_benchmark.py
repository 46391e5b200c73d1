"""benchmarks/mutation.py's mutants (the benchmark itself runs apart from the suite): every one compiles and
changes the module, a sample is deterministic, and a sandbox never writes outside its private copy."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mutation():
    spec = importlib.util.spec_from_file_location("mutation_benchmark", ROOT / "benchmarks" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


SOURCE = '''"""Docstring: never mutated."""


def f(xs: list[int], n: int = 2) -> int:
    """Neither is this one."""
    out = 0
    for x in xs:
        if x < n and not x == 0:
            out += x - 1
        elif x is None or True:
            continue
    print(f"{n + 1}")
    return out
'''


def test_every_mutant_compiles_and_changes_the_module(mutation, tmp_path):
    (tmp_path / "m.py").write_text(SOURCE)
    mutants = mutation.mutants_of("t", "m.py", tmp_path)
    original = ast.dump(ast.parse(SOURCE))
    dumps = {ast.dump(ast.parse(m.apply(SOURCE.encode()))) for m in mutants}
    assert len(dumps) == len(mutants) and original not in dumps
    kinds = {m.kind for m in mutants}
    assert kinds == {"compare", "arith", "boolop", "bool", "constant", "negate", "delete"}
    changes = {m.change for m in mutants}
    assert {"x < n  ->  x <= n", "x < n  ->  x >= n", "x == 0  ->  x != 0", "x is None  ->  x is not None"} <= changes
    assert {
        "x - 1  ->  x + 1",
        "out += x - 1  ->  out -= x - 1",
        "2  ->  3",
        "True  ->  False",
        "return out  ->  pass",
    } <= changes
    assert "continue  ->  pass" in changes and any(c.startswith("print(") for c in changes)
    assert not any("Docstring" in m.change or m.change.startswith("n + 1") for m in mutants)  # docstrings, f-strings
    assert all(m.line > 3 for m in mutants) and [m.line for m in mutants] == sorted(m.line for m in mutants)


def test_a_sample_is_deterministic_and_in_source_order(mutation):
    every = mutation.mutants_of("integrity", "workbench/measure/integrity.py")
    a, b = (mutation.select(every, 10, seed=3) for _ in range(2))
    assert a == b and len(a) == 10 and [every.index(m) for m in a] == sorted(every.index(m) for m in a)
    assert mutation.select(every, 10, seed=4) != a and mutation.select(every, None, 0) == every


def test_targets_name_files_and_tests_that_exist(mutation):
    for target in mutation.TARGETS.values():
        assert all((ROOT / f).is_file() for f in target.files)
        assert all((ROOT / t.split("::")[0]).is_file() for t in target.tests)


def test_a_sandbox_writes_only_inside_its_copy(mutation, tmp_path, monkeypatch):
    monkeypatch.setattr(mutation, "COPIED", ("pyproject.toml",))
    box = mutation.Sandbox(tmp_path, 0)
    box.write("pyproject.toml", b"x = 1\n")
    assert (box.dir / "pyproject.toml").read_bytes() == b"x = 1\n"
    for outside in ("../escape.py", str(ROOT / "pyproject.toml")):
        with pytest.raises(RuntimeError, match="outside the private copy"):
            box.write(outside, b"")
    assert (ROOT / "pyproject.toml").read_bytes() != b""
