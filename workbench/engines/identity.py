"""Which engine is here: its name, version, commit and where it comes from, read without importing it.

An engine developer runs a clone of the engine's main branch (``pip install -e``), a nightly, or a tree that
is not installed at all. Their version strings look like ``0.5.24.dev12+g1a2b3c4`` or
``0.26.1rc1.dev693+g7f7a32cfe``; the adapters judge such an engine by what it can do (its probes,
``workbench.engines.probes``), and this module says what it is:

- **installed**: the distribution's version (its metadata) and the commit its generated ``_version.py``
  carries (``__commit_id__``: vLLM fills it; sglang's wheels leave it ``None``);
- **a tree** (``--engine-root DIR``): the package is looked for at ``DIR/<engine>`` and ``DIR/python/<engine>``
  (sglang's repository layout); the version is the tree's generated ``_version.py`` when an install made one,
  else what ``git describe`` gives, spelled as setuptools-scm spells it (``0.5.23`` on a tag,
  ``0.5.24.dev12+g1a2b3c4`` twelve commits after it, ``.d20261202`` appended when the tree has changes), and
  the commit is the tree's ``HEAD``. :func:`use_tree` puts the tree first on ``sys.path``.

    >>> scm_version("v0.5.23", 0, "1a2b3c4"), scm_version("v0.5.23", 12, "1a2b3c4")
    ('0.5.23', '0.5.24.dev12+g1a2b3c4')
    >>> scm_version("v0.26.1rc1", 693, "7f7a32cfe")
    '0.26.1rc2.dev693+g7f7a32cfe'

Nothing here imports torch or an engine.
"""

from __future__ import annotations

import ast
import datetime
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from workbench.engine_versions import ENGINE_NAMES, verified_versions
from workbench.engines.errors import EngineError

TREE_LAYOUTS: tuple[str, ...] = ("{engine}", "python/{engine}")
"""Where a tree keeps the engine's package, relative to the tree's root: vLLM's ``vllm/``, sglang's
``python/sglang/``."""


@dataclass(frozen=True)
class EngineIdentity:
    """What engine a check runs on.

    ``name``: ``"sglang"`` or ``"vllm"``; ``version``: as the engine reports it (a tree: its ``_version.py``
    or ``git describe``); ``commit``: the engine's commit (``HEAD`` of a tree, ``__commit_id__`` of an
    installed build) or None; ``root``: the tree's directory (``--engine-root``), None for an installed engine;
    ``package``: the package directory the engine is imported from; ``verified``: ``version`` is one of
    :data:`workbench.engine_versions.VERIFIED`'s; ``adapter``: the verified release whose adapter runs it (set
    once chosen); ``probes``: ``"passed"`` once the adapter's probes passed; ``runner``: vLLM's model runner the
    adapter emulates (``"v2"``, ``"v1"``), None for sglang.
    """

    name: str
    version: str
    commit: str | None = None
    root: str | None = None
    package: str | None = None
    verified: bool = False
    adapter: str | None = None
    probes: str | None = None
    runner: str | None = None

    @property
    def status(self) -> str:
        """``"verified"`` or ``"unverified: probes passed"`` (``"unverified"`` before the probes ran)."""
        if self.verified:
            return "verified"
        return f"unverified: probes {self.probes}" if self.probes else "unverified"

    def __str__(self) -> str:
        commit = f" (commit {self.commit})" if self.commit else ""
        tree = f", tree {self.root}" if self.root else ""
        adapter = f", adapter of {self.name} {self.adapter}" if self.adapter and self.adapter != self.version else ""
        runner = f", model runner {self.runner}" if self.runner else ""
        return f"{self.name} {self.version}{commit}: {self.status}{adapter}{runner}{tree}"

    def to_dict(self) -> dict[str, Any]:
        """The ``engine`` object of ``engine-check --json``."""
        return {
            "name": self.name,
            "version": self.version,
            "commit": self.commit,
            "verified": self.verified,
            "status": self.status,
            "adapter": self.adapter,
            "runner": self.runner,
            "root": self.root,
            "package": self.package,
        }

    def with_(self, **changes: Any) -> EngineIdentity:
        """A copy with ``changes`` (``adapter``, ``probes``, ``runner``)."""
        return replace(self, **changes)


# -- versions -----------------------------------------------------------------------------------------
_TAG = re.compile(r"^v?(?P<base>\d+(?:\.\d+)*)(?P<pre>(?:a|b|rc)\d+)?$")


def scm_version(tag: str, distance: int, sha: str, *, dirty: bool = False, date: datetime.date | None = None) -> str:
    """The version setuptools-scm's default scheme gives a commit ``distance`` commits after ``tag`` (the
    last number bumped, ``.devN``, ``+g<sha>``; ``.dYYYYMMDD`` on a tree with changes). :class:`EngineError`
    for a tag that is no release version."""
    m = _TAG.match(tag)
    if m is None:
        raise EngineError(f"tag: {tag!r} is not a release tag (vX.Y.Z)")
    if distance == 0 and not dirty:
        return tag.lstrip("v")
    base, pre = m["base"], m["pre"]
    if pre:  # a pre-release is bumped in its own number: 0.26.1rc1 -> 0.26.1rc2
        kind, n = re.match(r"([a-z]+)(\d+)", pre).groups()  # type: ignore[union-attr]
        nxt = f"{base}{kind}{int(n) + 1}"
    else:
        parts = base.split(".")
        parts[-1] = str(int(parts[-1]) + 1)
        nxt = ".".join(parts)
    local = f"+g{sha}"
    if dirty:
        local += f".d{(date or datetime.date.today()).strftime('%Y%m%d')}"
    return f"{nxt}.dev{distance}{local}"


def read_version_file(package: Path) -> tuple[str | None, str | None]:
    """``(version, commit)`` from the package's generated ``_version.py`` (parsed, not imported), or
    ``(None, None)`` when it has none."""
    path = package / "_version.py"
    if not path.is_file():
        return None, None
    values: dict[str, Any] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    values[target.id] = node.value.value
    version = values.get("__version__", values.get("version"))
    commit = values.get("__commit_id__", values.get("commit_id"))
    return (str(version) if version else None), (str(commit) if commit else None)


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_version(root: Path) -> tuple[str | None, str | None]:
    """``(version, commit)`` of a git tree: setuptools-scm's version from ``git describe`` (None without a
    release tag) and ``HEAD``'s full hash (None outside git)."""
    commit = _git(root, "rev-parse", "HEAD")
    if commit is None:
        return None, None
    described = _git(root, "describe", "--tags", "--long", "--match", "v[0-9]*")
    dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    if not described:
        return None, commit
    tag, distance, sha = described.rsplit("-", 2)
    try:
        return scm_version(tag, int(distance), sha.removeprefix("g"), dirty=dirty), commit
    except EngineError:
        return None, commit


# -- finding the engine -------------------------------------------------------------------------------
def _check_engine(engine: str) -> None:
    if engine not in ENGINE_NAMES:
        raise EngineError(f"engine: {engine!r} is not one of {ENGINE_NAMES}")


def tree_package(engine: str, root: str | os.PathLike[str]) -> Path:
    """The engine's package directory in the tree at ``root`` (:data:`TREE_LAYOUTS`), or an
    :class:`EngineError` naming where it looked."""
    _check_engine(engine)
    base = Path(root).expanduser().resolve()
    if not base.is_dir():
        raise EngineError(f"--engine-root: {os.fspath(root)!r} is not a directory")
    tried = [base / layout.format(engine=engine) for layout in TREE_LAYOUTS]
    for package in tried:
        if (package / "__init__.py").is_file():
            return package
    raise EngineError(f"--engine-root: no {engine} package in {base} (looked for {', '.join(map(str, tried))})")


def identify_tree(engine: str, root: str | os.PathLike[str]) -> EngineIdentity:
    """The engine in the tree at ``root``: its version (the tree's ``_version.py``, else ``git describe``)
    and commit (``git rev-parse HEAD``, else the ``_version.py``'s)."""
    package = tree_package(engine, root)
    base = Path(root).expanduser().resolve()
    file_version, file_commit = read_version_file(package)
    scm, head = git_version(base)
    version = file_version or scm
    if version is None:
        raise EngineError(
            f"--engine-root: {base} says no {engine} version (no {package.name}/_version.py, no release tag "
            "reachable from HEAD: fetch the tags, or pip install -e the tree once to generate the file)"
        )
    return EngineIdentity(
        engine, version, head or file_commit, str(base), str(package), version in verified_versions(engine)
    )


def identify_installed(engine: str) -> EngineIdentity:
    """The installed engine: its distribution's version and its ``_version.py``'s commit, or an
    :class:`EngineError` saying it is not installed."""
    _check_engine(engine)
    try:
        version = importlib.metadata.version(engine)
    except importlib.metadata.PackageNotFoundError:
        raise EngineError(
            f"{engine} is not installed (make engines installs the verified releases, CPU torch kept; or pass "
            "--engine-root DIR for a source tree)"
        ) from None
    package = _package_dir(engine)
    commit = read_version_file(package)[1] if package is not None else None
    return EngineIdentity(
        engine, version, commit, None, str(package) if package else None, version in verified_versions(engine)
    )


def _package_dir(engine: str) -> Path | None:
    """Where ``engine`` is (or would be) imported from: the loaded module's file (an adapter's shell module
    has no ``__spec__``), else what the import system finds, without importing it."""
    loaded = sys.modules.get(engine)
    origin = getattr(loaded, "__file__", None) if loaded is not None else None
    if origin is None and loaded is None:
        spec = importlib.util.find_spec(engine)
        origin = spec.origin if spec is not None else None
    return Path(origin).parent if origin else None


_TREES: dict[str, EngineIdentity] = {}


def use_tree(engine: str, root: str | os.PathLike[str]) -> EngineIdentity:
    """Import ``engine`` from the tree at ``root`` from now on in this process (its package's parent first on
    ``sys.path``) and return its identity. :class:`EngineError` when the engine is already imported from
    elsewhere (a process imports one copy) or another tree was chosen."""
    ident = identify_tree(engine, root)
    chosen = _TREES.get(engine)
    if chosen is not None and chosen.root != ident.root:
        raise EngineError(f"--engine-root: {engine} already comes from {chosen.root} in this process")
    loaded = sys.modules.get(engine)
    if loaded is not None:
        where = Path(os.path.abspath(getattr(loaded, "__file__", "") or "")).parent  # a symlinked file stays put
        if str(where) != ident.package:
            raise EngineError(f"--engine-root: {engine} is already imported from {where}, not from {ident.package}")
    parent = str(Path(ident.package or "").parent)
    if parent not in sys.path:
        sys.path.insert(0, parent)
    importlib.invalidate_caches()
    _TREES[engine] = ident
    return ident


def identify(engine: str) -> EngineIdentity:
    """The engine this process uses: the tree :func:`use_tree` chose, else the installed one."""
    _check_engine(engine)
    return _TREES.get(engine) or identify_installed(engine)


__all__ = [
    "TREE_LAYOUTS",
    "EngineIdentity",
    "git_version",
    "identify",
    "identify_installed",
    "identify_tree",
    "read_version_file",
    "scm_version",
    "tree_package",
    "use_tree",
]
