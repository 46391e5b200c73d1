"""What engine is here (``workbench.engines.identity``, issue 30): versions and commits of installed engines
and source trees, read without importing them. Runs without any engine: the trees are made here."""

from __future__ import annotations

import datetime
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from workbench.engines import identity
from workbench.engines.identity import (
    EngineIdentity,
    identify_tree,
    read_version_file,
    scm_version,
    tree_package,
    use_tree,
)
from workbench.engines.versions import EngineError

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

VERSION_FILE = "__version__ = version = '{v}'\n__commit_id__ = commit_id = {c}\n"


def _git(root: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True, env=env)
    return done.stdout.strip()


def _tree(tmp_path: Path, layout: str = "python/sglang", version_file: str | None = None) -> Path:
    package = tmp_path / layout
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    if version_file is not None:
        (package / "_version.py").write_text(version_file)
    return tmp_path


def _commit(root: Path, name: str, tag: str | None = None) -> str:
    (root / name).write_text(name)
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", name)
    if tag:
        _git(root, "tag", tag)
    return _git(root, "rev-parse", "HEAD")


@pytest.mark.parametrize(
    ("tag", "distance", "dirty", "want"),
    [
        ("v0.5.23", 0, False, "0.5.23"),
        ("v0.5.23", 12, False, "0.5.24.dev12+g1a2b3c4"),
        ("v0.5.23", 0, True, "0.5.24.dev0+g1a2b3c4.d20261202"),
        ("v0.26.1rc0", 693, False, "0.26.1rc1.dev693+g1a2b3c4"),  # the shape of vLLM's nightlies
        ("0.33.0", 3, True, "0.33.1.dev3+g1a2b3c4.d20261202"),
    ],
)
def test_a_commit_after_a_tag_is_spelled_as_setuptools_scm_spells_it(tag, distance, dirty, want) -> None:
    assert scm_version(tag, distance, "1a2b3c4", dirty=dirty, date=datetime.date(2026, 12, 2)) == want


def test_a_tag_that_is_no_release_is_refused_by_name() -> None:
    with pytest.raises(EngineError, match=r"tag: 'nightly'"):
        scm_version("nightly", 3, "abc")


def test_the_generated_version_file_is_read_without_importing_it(tmp_path: Path) -> None:
    (tmp_path / "_version.py").write_text(
        "raise SystemExit('imported')\n" + VERSION_FILE.format(v="0.33.0", c="'g4ba'")
    )
    assert read_version_file(tmp_path) == ("0.33.0", "g4ba")
    (tmp_path / "_version.py").write_text(VERSION_FILE.format(v="0.5.23", c="None"))
    assert read_version_file(tmp_path) == ("0.5.23", None)
    assert read_version_file(tmp_path / "missing") == (None, None)


@pytest.mark.parametrize(("engine", "layout"), [("sglang", "python/sglang"), ("vllm", "vllm"), ("sglang", "sglang")])
def test_the_package_is_found_in_each_repository_layout(tmp_path: Path, engine: str, layout: str) -> None:
    root = _tree(tmp_path, layout)
    assert tree_package(engine, root) == (root / layout).resolve()


def test_a_tree_without_the_package_names_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"--engine-root: no vllm package in .*looked for .*vllm"):
        tree_package("vllm", tmp_path)
    with pytest.raises(EngineError, match=r"--engine-root: '/nonexistent/x' is not a directory"):
        tree_package("vllm", "/nonexistent/x")
    with pytest.raises(EngineError, match=r"engine: 'tgi'"):
        tree_package("tgi", tmp_path)


@needs_git
def test_a_clone_after_a_release_reports_a_dev_version_and_its_head(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _git(root, "init", "-q")
    _commit(root, "a", tag="v0.5.23")
    ident = identify_tree("sglang", root)
    assert (ident.version, ident.verified, ident.status) == ("0.5.23", True, "verified")
    for name in "bc":
        head = _commit(root, name)
    ident = identify_tree("sglang", root)
    assert ident.version == f"0.5.24.dev2+g{head[:7]}" and ident.commit == head and not ident.verified
    assert ident.root == str(root.resolve()) and ident.package == str((root / "python/sglang").resolve())
    assert ident.status == "unverified"
    done = ident.with_(probes="passed", adapter="0.5.23")
    assert str(done) == (
        f"sglang 0.5.24.dev2+g{head[:7]} (commit {head}): unverified: probes passed, adapter of sglang 0.5.23, "
        f"tree {root.resolve()}"
    )
    assert done.to_dict()["status"] == "unverified: probes passed" and done.to_dict()["root"] == str(root.resolve())


@needs_git
def test_an_installed_tree_reports_its_generated_version_and_gits_head(tmp_path: Path) -> None:
    root = _tree(tmp_path, "vllm", VERSION_FILE.format(v="0.26.1rc1.dev693+g7f7a32cfe", c="'g7f7a32cfe'"))
    _git(root, "init", "-q")
    head = _commit(root, "a")  # no tag: the generated file says the version
    ident = identify_tree("vllm", root)
    assert (ident.version, ident.commit) == ("0.26.1rc1.dev693+g7f7a32cfe", head)


def test_a_tree_that_says_no_version_is_refused_with_what_to_do(tmp_path: Path, monkeypatch) -> None:
    root = _tree(tmp_path)
    monkeypatch.setattr(identity, "_git", lambda root, *args: None)  # not a git tree
    with pytest.raises(EngineError, match=r"says no sglang version .*pip install -e"):
        identify_tree("sglang", root)


def test_use_tree_puts_the_tree_first_and_refuses_a_second_copy(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(identity, "_TREES", {})
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    root = _tree(tmp_path / "one", version_file=VERSION_FILE.format(v="0.5.24.dev1+gabc", c="None"))
    ident = use_tree("sglang", root)
    assert sys.path[0] == str((root / "python").resolve()) and identity.identify("sglang") == ident
    other = _tree(tmp_path / "two", version_file=VERSION_FILE.format(v="0.5.24.dev1+gabc", c="None"))
    with pytest.raises(EngineError, match=r"already comes from .*one"):
        use_tree("sglang", other)
    monkeypatch.setattr(identity, "_TREES", {})
    fake = types.ModuleType("sglang")
    fake.__file__ = str(tmp_path / "elsewhere" / "sglang" / "__init__.py")
    monkeypatch.setitem(sys.modules, "sglang", fake)
    with pytest.raises(EngineError, match=r"already imported from .*elsewhere"):
        use_tree("sglang", other)


def test_an_identity_without_a_tree_prints_its_release() -> None:
    ident = EngineIdentity("vllm", "0.33.0", "g4ba787ec9", verified=True, adapter="0.33.0", runner="v2")
    assert str(ident) == "vllm 0.33.0 (commit g4ba787ec9): verified, model runner v2"
